"""How many records this run's writers have read, for a bounded run's stop (`--max-records`).

Committed counts arrive once per commit interval; a bounded run that waited for them would
idle up to a whole interval after its last record was read. So every writer keeps a small
file in the run folder: the offsets it started this run from and the offsets it has read
up to. The driver sums (read up to - started from) over all writers and asks for the stop
as soon as the bound is read; the writers then flush and the committer commits at once.

Restart-safe: after a Flink restart a writer resumes from the table's offsets (which may
lie behind what it had read) and keeps the `started` offsets of its first attempt, so the
sum never counts a record twice and never shrinks below what was committed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class ReadProgress:
    """One writer's progress file, written atomically (temp file + rename)."""

    def __init__(self, run_dir: Path, writer: int, position: dict[int, int]):
        self.path = run_dir / f"read-w{writer}.json"
        self.failed = False
        try:  # a restarted attempt keeps where the run began
            self.started = {int(p): o for p, o in json.loads(self.path.read_text())["started"].items()}
        except (OSError, ValueError, KeyError):
            self.started = dict(position)
        self.update(position)

    def update(self, position: dict[int, int]) -> None:
        """Best effort: the file only lets a bounded run stop early. A run folder that cannot be
        written (a cluster's TaskManager, a full disk) must never fail the writer."""
        started = {p: self.started.get(p, o) for p, o in position.items()}
        temporary = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps({"started": started, "position": position}))
            os.replace(temporary, self.path)
        except OSError as exc:
            if not self.failed:
                self.failed = True
                from streamberg.common.log import get_logger

                get_logger("ingest.writer").warning("cannot write the read-progress file (bounded runs then stop "
                                                    "on committed records only)", path=str(self.path), error=str(exc))


def records_read(run_dir: Path) -> int:
    """Records the run's writers have read so far (0 before any writer reported)."""
    total = 0
    for path in run_dir.glob("read-w*.json"):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced right now: counted at the next look
        started = doc.get("started", {})
        total += sum(max(0, o - started.get(p, o)) for p, o in doc.get("position", {}).items())
    return total
