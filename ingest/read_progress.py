"""How many records this run's writers have read, and the stop marker of a bounded run.

Committed counts arrive once per commit interval; a bounded run that waited for them would
idle up to a whole interval after its last record was read. So every writer keeps a small
file in the run folder: the offsets it started this run from and the offsets it has read
up to. The driver sums (read up to - started from) over all writers and asks for the stop
as soon as the bound is read; the writers then flush and the committer commits at once.

Restart-safe: after a Flink restart a writer resumes from the table's offsets (which may
lie behind what it had read) and keeps the `started` offsets of its first attempt, so the
sum never counts a record twice and never shrinks below what was committed.

The stop marker (`stop` in the run folder) says why the run stops. A stop for a record
bound holds only while the writers' reads reach it: a restart during the drain rewinds them
to the committed offsets, and they must read up to the bound again before they finish (else
the run would end with fewer records committed than asked for). Any other stop (Ctrl-C,
SIGTERM, a duration) holds as soon as the marker exists.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from streamberg.ingest.run_folder import STOP_MARKER


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




def request_stop(run_dir: Path, reason: str, until_read: int | None = None) -> None:
    """Ask the writers to flush and finish (once `until_read` records are read, if given)."""
    (run_dir / STOP_MARKER).write_text(json.dumps({"reason": reason, "until_read": until_read}))


def stop_due(run_dir: Path) -> bool:
    """Whether a writer should finish now (see the module doc)."""
    try:
        text = (run_dir / STOP_MARKER).read_text()
    except OSError:
        return False
    try:
        until_read = json.loads(text).get("until_read") if text.strip() else None
    except (ValueError, AttributeError):
        until_read = None  # an old or foreign marker: stop
    return until_read is None or records_read(run_dir) >= until_read
