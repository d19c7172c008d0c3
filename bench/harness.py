"""What the benchmarks share: a work folder with an embedded broker, a process tree's facts
read from /proc (CPU, resident memory, open descriptors), percentiles, and where results go
(bench/results/ for the whole record, bench/summaries/ for the small one kept in the
repository beside the figures it backs).

A bench script imports it as `streamberg.bench.harness` (the package is installed with the
project), so it needs no path of its own; a bench that reuses a test's helper (the in-process
writer, the registry stand-in) asks for the checkout's tests here (`checkout_tests`), the one
place a bench adds to the import path. The architecture test holds the benches to it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")
CLOCK = os.sysconf("SC_CLK_TCK")


def stamp() -> str:
    """A run's name: its UTC start, to the second."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile by nearest rank (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def checkout_tests() -> None:
    """Make the checkout's `tests` package importable (a bench reusing a test's helper): the
    checkout's own folder, never the working directory's."""
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))


def results_path(name: str, run: str, suffix: str = ".json") -> Path:
    """bench/results/<name>-<run><suffix>: where a run's whole record (and its plot) go."""
    out = ROOT / "bench" / "results" / f"{name}-{run}{suffix}"
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def write_results(name: str, run: str, result: dict[str, Any], summary: dict[str, Any] | None = None) -> Path:
    """bench/results/<name>-<run>.json (the whole record) and, given, the summary in
    bench/summaries/ (kept in the repository). Returns the summary's path, else the record's."""
    record = results_path(name, run)
    record.write_text(json.dumps(result, indent=1, default=str))
    if summary is None:
        return record
    kept = ROOT / "bench" / "summaries" / f"{name}-{run}.json"
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps(summary, indent=1, default=str))
    return kept


@dataclass(frozen=True)
class Work:
    folder: Path
    bootstrap: str


@contextmanager
def broker_in(folder: Path) -> Iterator[str]:
    """An embedded broker keeping its log under `folder`/broker on a free loopback port: its
    bootstrap address, the broker stopped after (whatever the bench raised)."""
    from streamberg.common.broker import EmbeddedBroker, free_port

    broker = EmbeddedBroker(Path(folder) / "broker")
    info = broker.start(port=free_port())
    try:
        yield info.bootstrap
    finally:
        broker.stop()


@contextmanager
def work_with_broker(prefix: str) -> Iterator[Work]:
    """A temporary work folder and an embedded broker of its own, stopped and removed after."""
    with tempfile.TemporaryDirectory(prefix=prefix) as folder, broker_in(Path(folder)) as bootstrap:
        yield Work(Path(folder), bootstrap)


# -- a process tree, from /proc ---------------------------------------------------------------------

def process_tree() -> dict[int, list[int]]:
    """Every live process's children, by parent pid."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def tree_pids(pid: int, tree: dict[int, list[int]] | None = None) -> list[int]:
    tree = tree if tree is not None else process_tree()
    out, stack = [], [pid]
    while stack:
        here = stack.pop()
        out.append(here)
        stack.extend(tree.get(here, []))
    return out


def rss_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except OSError:
        return 0


def tree_rss(pid: int, tree: dict[int, list[int]] | None = None) -> int:
    """Resident bytes of a process and every descendant."""
    return sum(rss_bytes(p) for p in tree_pids(pid, tree))


def tree_cpu_seconds(pid: int, tree: dict[int, list[int]] | None = None) -> float:
    """User + system CPU of a process tree: the live processes', and the root's reaped children's."""
    total = 0.0
    for p in tree_pids(pid, tree):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if p == pid else 0)
        total += ticks / CLOCK
    return total


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of one process alone (not its children)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK


def tree_descriptors(pid: int, tree: dict[int, list[int]] | None = None) -> int:
    """Open file descriptors of a process tree (sockets, files, pipes)."""
    total = 0
    for p in tree_pids(pid, tree):
        try:
            total += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            continue
    return total


def descriptor_kinds(pid: int, tree: dict[int, list[int]] | None = None) -> dict[str, int]:
    """What a process tree holds open, counted by kind: `socket`, `pipe`, `anon_inode:...`, or a
    file's folder (where a leak shows which resource it is)."""
    kinds: dict[str, int] = {}
    for p in tree_pids(pid, tree):
        try:
            names = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for name in names:
            try:
                target = os.readlink(f"/proc/{p}/fd/{name}")
            except OSError:
                continue
            kind = target.split(":", 1)[0] if target.startswith(("socket:", "pipe:")) else \
                target if target.startswith("anon_inode:") else str(Path(target).parent)
            key = f"{p == pid and 'root' or 'child'} {kind}"
            kinds[key] = kinds.get(key, 0) + 1
    return dict(sorted(kinds.items(), key=lambda item: -item[1]))
