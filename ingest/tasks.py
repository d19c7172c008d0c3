"""The ingest's two tasks, whatever runs them: a writer task (a Writer polled until the run's
stop marker, then finished) and the committer task (every unit offered to the Committers).

ingest/job.py runs them as PyFlink operators (a MiniCluster locally, a Flink cluster when
submitted); ingest/processes.py runs them as processes of their own, with no JVM. Both
engines restart a failed run the same way (every task again, from the tables' offsets,
RESTART_ATTEMPTS times after RESTART_DELAY_SECONDS), so what a failure costs does not
depend on the engine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from streamberg.common.config import FleetConfig
from streamberg.common.log import get_logger
from streamberg.common.tables import run_settings
from streamberg.ingest.committers import Committers
from streamberg.ingest.run_folder import RunFolder
from streamberg.ingest.units import FlushUnit
from streamberg.ingest.writer import Writer

STOP_CHECK_SECONDS = 0.5  # how often a writer reports what it read and looks for the stop marker
FINISHED_IDLE_SECONDS = 0.2  # a finished writer's pause between two empty steps
# A failure restarts every task of the run; each re-reads its position from the table.
RESTART_ATTEMPTS = 3
RESTART_DELAY_SECONDS = 5.0


def job_name(fleet: FleetConfig) -> str:
    """The run's name (Flink's pipeline name, the driver's `job` in logs): the tables it
    writes (its routes' identifiers)."""
    names = ", ".join(r.identifier for r in fleet.tables)
    return f"streamberg-ingest {names if len(names) <= 120 else names[:117] + '...'}"


class WriterTask:
    """Writer subtask `index` of `parallelism`: `step()` polls once and yields the units due."""

    def __init__(self, fleet: FleetConfig, index: int, parallelism: int, run_id: str) -> None:
        self.folder = RunFolder.of(run_settings(fleet), run_id)
        self.writer = Writer(fleet, index, parallelism, run_id)
        self._next_stop_check = 0.0

    def open(self) -> None:
        with failure_logged("writers", subtask=self.writer.index), lost_offsets_marked(self.folder):
            self.writer.open()
        self.progress = self.folder.progress(self.writer.index, self.writer.position)

    def step(self) -> Iterator[FlushUnit]:
        if self.writer.finished:
            time.sleep(FINISHED_IDLE_SECONDS)  # done: the run ends when the committer drained
            return
        with failure_logged("writers", subtask=self.writer.index), lost_offsets_marked(self.folder):
            yield from self.writer.poll()
            if self._stop_requested():
                yield from self.writer.finish()

    def _stop_requested(self) -> bool:
        """Every STOP_CHECK_SECONDS: report what was read, then look for the stop marker."""
        now = time.monotonic()
        if now < self._next_stop_check:
            return False
        self._next_stop_check = now + STOP_CHECK_SECONDS
        self.progress.update(self.writer.position)
        return self.folder.stop_due()

    def close(self) -> None:
        self.writer.close()


class CommitterTask:
    """The run's one committer: `offer(unit)` commits what is due, returns the records committed."""

    def __init__(self, fleet: FleetConfig, parallelism: int, run_id: str) -> None:
        self.committers = Committers(fleet, parallelism, run_id)

    def open(self) -> None:
        with failure_logged("committer"):
            self.committers.open()

    def offer(self, unit: FlushUnit) -> int:
        with failure_logged("committer"):
            return self.committers.offer(unit)

    def warm_up(self) -> bool:
        """While no unit waits: open one more table's committer ahead of its first unit."""
        with failure_logged("committer"):
            return self.committers.warm_up()

    def close(self) -> None:
        self.committers.close()


@contextmanager
def failure_logged(operator: str, **context: Any) -> Iterator[None]:
    """Log a task's exception before its engine gets it. Local tasks run in processes of
    their own, whose output the driver relays from their log only (ingest/local/worker_logs.py),
    and a Flink job that fails for good shuts its MiniCluster down before the driver can ask
    why: this line is how the cause reaches the operator."""
    try:
        yield
    except Exception as exc:
        get_logger("ingest.job").error("task failed; the run restarts (or fails after its attempts)",
                                       operator=operator, error=f"{type(exc).__name__}: {exc}", **context)
        raise


@contextmanager
def lost_offsets_marked(folder: RunFolder) -> Iterator[None]:
    """A lost Kafka position under ingest.on_lost_offsets=fail: tell the driver, which stops
    the run at once (a restart would only find the same position lost again)."""
    from streamberg.common.errors import LostOffsetsError

    try:
        yield
    except LostOffsetsError as exc:
        folder.mark_lost_offsets(str(exc))
        raise


def log_restart(operator: str, subtask: int, attempt: int) -> None:
    """Say so when a task was restarted (after a failure anywhere in the run)."""
    if attempt > 0:
        get_logger("ingest.job").warning("task restarted after a failure; resuming from the table's offsets",
                                         operator=operator, subtask=subtask, attempt=attempt)
