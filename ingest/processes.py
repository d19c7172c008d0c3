"""A local run with no JVM: the ingest's tasks (ingest/tasks.py) in processes of their own.

`ingest.engine: processes` (or `streamberg ingest --engine processes`). The driver forks P
writer processes and one committer process; each writer hands its units (file lists and
offsets, never records) to the committer over a pipe of its own, as Flink hands them from
the writers' operator to the committer's.

Why: the tasks are plain Python in either engine (Kafka read with confluent-kafka, Iceberg
written with pyiceberg), so on one machine Flink adds a JVM, a MiniCluster and Beam's
workers around them: ~3.5 s before the first poll and ~0.5 GB of memory (make bench-peers,
docs/performance.md). Exactly-once does not depend on the engine: offsets live in the table
and every run is fenced (ingest/committer.py), so a task that dies loses nothing committed
and its records are read again.

Failures are handled as the Flink job's restart strategy does (ingest/tasks.py): a task that
ends stops every task of the run, and all start again from the tables' offsets after
RESTART_DELAY_SECONDS, RESTART_ATTEMPTS times; then the run fails with the task's own error.
The driver asks (`ended()`) at each of its looks. The tasks die with the driver (the kernel
sends them SIGKILL when it goes, PR_SET_PDEATHSIG) and leave Ctrl-C and SIGTERM to it, which
turns them into a graceful stop.

What Flink gives and this does not: a cluster (`streamberg deploy`, `flink run`), Flink's web
UI and metrics. Both engines read the same config and write the same tables.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from streamberg.common.config import FleetConfig
from streamberg.common.tables import run_settings
from streamberg.ingest.local.fork_server import name_process
from streamberg.ingest.local.worker_logs import WorkerLogTarget
from streamberg.ingest.run_folder import RunFolder
from streamberg.ingest.tasks import RESTART_ATTEMPTS, RESTART_DELAY_SECONDS, CommitterTask, WriterTask, log_restart

FAILURE_FILE = "task-failed-{name}.txt"  # in the run folder: a task's own error, for the driver
STOP_WAIT_SECONDS = 5.0  # how long a killed task's exit is waited for
PR_SET_PDEATHSIG = 1


def process_name(task: str) -> bytes:
    """A task process's name as `ps` shows it (/proc/PID/comm, 15 bytes at most): sb-writer-0,
    sb-committer."""
    return f"sb-{task}".encode()[:15]


class ProcessesJob:
    """One local run's tasks as processes: start(), ended() at each look, cancel()."""

    def __init__(self, fleet: FleetConfig, parallelism: int, run_id: str, log_target: WorkerLogTarget | None,
                 log: Any) -> None:
        self.fleet, self.parallelism, self.run_id = fleet, parallelism, run_id
        self.log_target, self.log = log_target, log
        self.folder = RunFolder.of(run_settings(fleet), run_id)
        self.attempt = 0
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self._restart_at: float | None = None
        self._failure: str | None = None

    def start(self) -> ProcessesJob:
        context = multiprocessing.get_context("fork")  # the driver's imports shared, nothing loaded again
        pipes = [context.Pipe(duplex=False) for _ in range(self.parallelism)]  # (committer's end, writer's end)
        readers = [r for r, _ in pipes]
        ends: list[Connection] = [c for pipe in pipes for c in pipe]
        parent = os.getpid()
        attempt = self.attempt
        self.processes = [context.Process(
            target=_child, name="committer", daemon=True,
            args=("committer", parent, self.log_target, self.folder.path, ends, readers,
                  lambda: _commit(self.fleet, self.parallelism, self.run_id, readers, attempt)))]
        for index, (_, sender) in enumerate(pipes):
            self.processes.append(context.Process(
                target=_child, name=f"writer-{index}", daemon=True,
                args=(f"writer-{index}", parent, self.log_target, self.folder.path, ends, [sender],
                      lambda index=index, sender=sender: _write(self.fleet, index, self.parallelism, self.run_id,
                                                                sender, attempt))))
        for process in self.processes:
            process.start()
        for end in ends:  # the children hold theirs; a writer's death reaches the committer as EOF
            end.close()
        return self

    def ended(self) -> str | None:
        """None while the run goes on (restarting it when a task ended and attempts are
        left); the reason once it failed for good."""
        if self._failure is not None:
            return self._failure
        if self._restart_at is not None:
            if time.monotonic() < self._restart_at:
                return None
            self._restart_at = None
            self.attempt += 1
            self.start()
            return None
        gone = [p for p in self.processes if p.exitcode is not None]
        if not gone:
            return None
        reason = self._reason(gone[0])
        self._stop()
        if self.attempt >= RESTART_ATTEMPTS:
            self._failure = reason
            return reason
        self.log.warning("a task ended; every task starts again from the tables' offsets", task=gone[0].name,
                         reason=reason, attempt=self.attempt + 1, of=RESTART_ATTEMPTS, delay_s=RESTART_DELAY_SECONDS)
        self._restart_at = time.monotonic() + RESTART_DELAY_SECONDS
        return None

    def cancel(self) -> None:
        self._stop()

    def _reason(self, process: multiprocessing.process.BaseProcess) -> str:
        name = process.name  # the task's name, as the task wrote its failure file
        path = self.folder.path / FAILURE_FILE.format(name=name)
        with contextlib.suppress(OSError):
            text = path.read_text().strip()
            path.unlink()
            if text:
                return text
        code = process.exitcode or 0
        return f"task {name} was killed by signal {-code}" if code < 0 else f"task {name} ended (exit code {code})"

    def _stop(self) -> None:
        """End every task at once: what they have not committed is read again by the next
        attempt or run (a stop that drains commits it first, through the run's markers)."""
        for process in self.processes:
            if process.exitcode is None:
                process.kill()
        for process in self.processes:
            process.join(STOP_WAIT_SECONDS)
        self.processes = []


def _write(fleet: FleetConfig, index: int, parallelism: int, run_id: str, sender: Connection, attempt: int) -> None:
    task = WriterTask(fleet, index, parallelism, run_id)
    log_restart("writers", index, attempt)
    try:
        task.open()
        while True:
            for unit in task.step():
                sender.send(unit)
    finally:
        task.close()


def _commit(fleet: FleetConfig, parallelism: int, run_id: str, readers: list[Connection], attempt: int) -> None:
    task = CommitterTask(fleet, parallelism, run_id)
    log_restart("committer", 0, attempt)
    live = list(readers)
    try:
        task.open()
        warming = True  # the tables' committers opened while no unit waits (Committers.warm_up)
        while live:
            ready = wait(live, timeout=0.0 if warming else None)
            if not ready:
                warming = task.warm_up()
                continue
            for conn in [c for c in live if c in ready]:
                try:
                    unit = conn.recv()
                except EOFError:  # that writer is gone: the driver restarts the run
                    live.remove(conn)
                    continue
                task.offer(unit)
    finally:
        task.close()
    raise RuntimeError("every writer is gone")


def _child(name: str, parent: int, log_target: WorkerLogTarget | None, folder: Path, ends: list[Connection],
           keep: list[Connection], body: Callable[[], None]) -> None:
    """A task process: dies with the driver, leaves Ctrl-C to it, logs where the workers log,
    and leaves its error for the driver (no traceback on the terminal)."""
    with contextlib.suppress(Exception):  # Linux; elsewhere the parent check below is all
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    name_process(process_name(name))
    if os.getppid() != parent:  # the driver went before the line above
        os._exit(1)
    # The driver owns the run's lifetime: a stop sent to the whole process group (Ctrl-C, a
    # supervisor's SIGTERM) is its to turn into a drain; a task dying of it first would only
    # be restarted. The driver ends its tasks with SIGKILL (safe at any moment), and the
    # kernel does when the driver dies.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    for end in ends:
        if end not in keep:
            end.close()
    if log_target is not None:
        log_target.configure()
    try:
        body()
    except BaseException as exc:  # noqa: BLE001 - every way out of a task is the driver's to report
        with contextlib.suppress(OSError):
            (folder / FAILURE_FILE.format(name=name)).write_text(f"{type(exc).__name__}: {exc}"[:2000])
        os._exit(1)
    os._exit(0)
