"""A run's folder (`<ingest.state_dir>/runs/<run id>`): how the driver and the workers of one
local run talk without a channel of their own. :class:`RunFolder` names every marker file and
owns the read progress.

- `stop`: the driver asks the writers to flush and finish;
- `drained`: the committer committed every writer's last unit after a stop;
- `fenced`: the committer found another instance's commit (its message inside);
- `lost-offsets`: a writer refused to read on past a lost Kafka position
  (`ingest.on_lost_offsets: fail`, the reason inside);
- `read-w<N>.json`: what writer N has read (below).

On a cluster the driver and the workers do not share a disk; stop the job through Flink.

Read progress: committed counts arrive once per commit interval; a bounded run that waited for them would
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
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamberg.common.config import StreambergConfig
from streamberg.common.tables import run_folder

STOP_MARKER = "stop"
DRAINED_MARKER = "drained"
COMMITTED_FILE = "committed"  # the records the run committed so far (the job's committer writes it)
BASELINES_FILE = "baselines.json"  # each table's consumed total when the run first opened it
FENCED_MARKER = "fenced"
LOST_OFFSETS_MARKER = "lost-offsets"
_PROGRESS_GLOB = "read-w*.json"


# Run folders kept in <state_dir>/runs beside the current one (each holds its markers and its
# workers' logs, up to 64 MB a worker); any touched within the last hour is kept too (a run
# of another instance may still be using it).
KEEP_RUNS = 20
KEEP_RECENT_SECONDS = 3600.0


def prune_runs(keep_besides: RunFolder) -> list[Path]:
    """Delete the oldest run folders beyond KEEP_RUNS (bounded state for months of restarts);
    returns those deleted."""
    runs = keep_besides.path.parent
    try:
        folders = [p for p in runs.iterdir() if p.is_dir() and not p.is_symlink() and p != keep_besides.path]
    except OSError:
        return []
    folders.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    cutoff = time.time() - KEEP_RECENT_SECONDS
    gone = []
    for old in folders[KEEP_RUNS:]:
        if old.stat().st_mtime >= cutoff:
            continue
        shutil.rmtree(old, ignore_errors=True)
        gone.append(old)
    return gone


@dataclass(frozen=True)
class RunFolder:
    """One run's folder; every marker is read and written through it."""

    path: Path

    @classmethod
    def of(cls, config: StreambergConfig, run_id: str) -> RunFolder:
        return cls(run_folder(config.ingest.state_dir, run_id))

    def create(self) -> RunFolder:
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    def _mark(self, marker: str, text: str) -> None:
        self.create()
        (self.path / marker).write_text(text)

    def _marked(self, marker: str) -> str | None:
        """The marker's text, or None when it is not there."""
        try:
            return (self.path / marker).read_text().strip()
        except OSError:
            return None

    # -- what the committer and the writers tell the driver -----------------------------------

    def mark_fenced(self, message: str) -> None:
        self._mark(FENCED_MARKER, message)

    def fenced(self) -> str | None:
        return self._marked(FENCED_MARKER)

    def mark_drained(self, offsets: dict[int, int]) -> None:
        self._mark(DRAINED_MARKER, json.dumps({"offsets": {str(p): o for p, o in offsets.items()}}))

    def record_committed(self, records: int) -> None:
        """The records (rows and dead letters) the run has committed so far, every table:
        the driver's bound, progress and outcome (written atomically)."""
        self.create()
        temporary = self.path / f"{COMMITTED_FILE}.tmp"
        temporary.write_text(str(int(records)))
        os.replace(temporary, self.path / COMMITTED_FILE)

    def record_baselines(self, baselines: dict[str, dict[str, Any]]) -> None:
        """Each table's consumed total when this run first opened it (the committer's count
        after a restart of the same run starts from these; written atomically)."""
        self.create()
        temporary = self.path / f"{BASELINES_FILE}.tmp"
        temporary.write_text(json.dumps(baselines))
        os.replace(temporary, self.path / BASELINES_FILE)

    def baselines(self) -> dict[str, dict[str, Any]]:
        try:
            found = json.loads((self.path / BASELINES_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): v for k, v in found.items() if isinstance(v, dict) and "topic" in v and "total" in v} \
            if isinstance(found, dict) else {}

    def records_committed(self) -> int:
        try:
            return int((self.path / COMMITTED_FILE).read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def drained(self) -> bool:
        return (self.path / DRAINED_MARKER).exists()

    def mark_lost_offsets(self, reason: str) -> None:
        self._mark(LOST_OFFSETS_MARKER, reason)

    def lost_offsets(self) -> str | None:
        return self._marked(LOST_OFFSETS_MARKER)

    # -- the stop and the read progress -------------------------------------------------------

    def progress(self, writer: int, position: dict[int, int]) -> ReadProgress:
        return ReadProgress(self.path, writer, position)

    def records_read(self) -> int:
        """Records the run's writers have read so far (0 before any writer reported)."""
        total = 0
        for path in self.path.glob(_PROGRESS_GLOB):
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being replaced right now: counted at the next look
            started = doc.get("started", {})
            total += sum(max(0, o - started.get(p, o)) for p, o in doc.get("position", {}).items())
        return total

    def request_stop(self, reason: str, until_read: int | None = None) -> None:
        """Ask the writers to flush and finish (once `until_read` records are read, if given)."""
        self._mark(STOP_MARKER, json.dumps({"reason": reason, "until_read": until_read}))

    def stop_due(self) -> bool:
        """Whether a writer should finish now (see the module doc)."""
        text = self._marked(STOP_MARKER)
        if text is None:
            return False
        try:
            until_read = json.loads(text).get("until_read") if text else None
        except (ValueError, AttributeError):
            until_read = None  # an old or foreign marker: stop
        return until_read is None or self.records_read() >= until_read


class ReadProgress:
    """One writer's progress file, written atomically (temp file + rename)."""

    def __init__(self, folder: Path, writer: int, position: dict[Any, int]):
        self.path = folder / f"read-w{writer}.json"
        self.failed = False
        try:  # a restarted attempt keeps where the run began
            self.started = {(int(p) if p.isdigit() else p): o
                            for p, o in json.loads(self.path.read_text())["started"].items()}
        except (OSError, ValueError, KeyError):
            self.started = dict(position)
        self.update(position)

    def update(self, position: dict[Any, int]) -> None:
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


def new_run_id() -> str:
    """A run's id: its start time, then random hex (names its folder and its log lines)."""
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
