"""How often the compactor climbs to the shared floor during one pass.

Follows compactor/app.py:run_compact through one ``--once`` pass on a small table (4 appends
over 2 day partitions, real Spark) and counts the calls from a compactor/ frame into a
common/ or table_meta/ frame: every such call, and the distinct (caller -> callee) edges, listed. A measure
of the house, not a benchmark: it reports what one pass calls, so that two trees can be
compared (issue 19 compared the tree before and after its refactor).

    PYTHONPATH=. .venv/bin/python bench/house_climbs.py
"""

from __future__ import annotations

import collections
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import streamberg.common
from streamberg.compactor.app import CompactOptions, run_compact
from tests.compactor.helpers import DAY, FakeIngest, setup_table

PACKAGE = Path(streamberg.common.__file__).resolve().parent.parent
FLOORS = ("common", "table_meta", "compactor")


def floor(path: str) -> str | None:
    try:
        parts = Path(path).resolve().relative_to(PACKAGE).parts
    except ValueError:
        return None
    return parts[0] if parts[0] in FLOORS else None


def where(frame: Any) -> str:
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"


def main() -> None:
    config, _ = setup_table(Path(tempfile.mkdtemp()), partition_spec=DAY)
    ingest = FakeIngest(config)
    for _ in range(4):
        ingest.append(300, days=2)

    edges: collections.Counter[tuple[str, str]] = collections.Counter()
    entered: collections.Counter[str] = collections.Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or (callee := floor(frame.f_code.co_filename)) is None:
            return
        entered[frame.f_code.co_name] += 1
        caller = frame.f_back
        if caller is not None and callee in ("common", "table_meta") and floor(caller.f_code.co_filename) == "compactor":
            edges[(where(caller), where(frame))] += 1

    threading.setprofile(profile)  # the streaming batches run on py4j's callback thread
    sys.setprofile(profile)
    try:
        summary = run_compact(config, CompactOptions(once=True))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    print("pass:", {k: summary.get(k) for k in ("mode", "commits", "files_in", "files_out")})
    print("calls from compactor/ into common/ and table_meta/:", sum(edges.values()))
    print("distinct edges:", len(edges))
    for (caller, callee), n in sorted(edges.items()):
        print(f"  {caller} -> {callee}  x{n}")
    for name in ("resolve_layout", "from_config"):
        print(f"{name} entered: {entered[name]}")


if __name__ == "__main__":
    main()
