"""The driver of `streamberg ingest`: run the job of ingest/job.py locally and watch it.

Top to bottom: start the slow parts first (the workers' fork server, the gateway JVM),
prepare the tables, submit the job, then poll until a bound is reached, a signal arrives, the
run is fenced or the job fails. A stop is graceful: the driver drops a `stop` marker, each
writer flushes a final unit, the committer commits it and drops a `drained` marker, and the
job is cancelled. The outcome counts only this run's own commits.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

from streamberg.common.config import FleetConfig, StreambergConfig
from streamberg.common.config.sealing import export, job_document
from streamberg.common.errors import IngestFenced, JobFailed, LostOffsetsError
from streamberg.common.log import get_logger, renders_json
from streamberg.common.stop import stop_on_signals
from streamberg.common.tables import run_settings
from streamberg.ingest.local.fork_server import ForkServer, ForkServerUnavailable
from streamberg.ingest.local.gateway import python_worker_mode, start_local_gateway
from streamberg.ingest.local.worker_logs import WORKER_LOG_NAME, WorkerLogRelay, WorkerLogTarget
from streamberg.ingest.run_folder import RunFolder, new_run_id, prune_runs

DRIVER_TICK_SECONDS = 0.25  # how often the driver looks at the run's markers
TABLE_LOOK_SECONDS = 1.0  # how often it reads the catalog and the job status


@dataclass
class RunOutcome:
    run_id: str
    consumed: int  # records (valid + dead-lettered) committed by this run
    seconds: float
    stopped_because: str


@dataclass(frozen=True)
class RunBounds:
    max_records: int | None = None
    duration: float | None = None


def run_ingest(fleet: FleetConfig, parallelism: int | None = None, max_records: int | None = None,
               duration: float | None = None, progress: bool = True, engine: str | None = None) -> RunOutcome:
    """Run the ingest job of the tables `fleet` routes (one table: a config of one route,
    common/config/loading.load_tables); return when a bound is reached (or run until
    interrupted). `engine`: `flink` or `processes` (default: ingest.engine)."""
    settings = run_settings(fleet)  # the run-wide settings: state folder, parallelism, Python workers
    engine = engine or settings.ingest.engine
    flink = engine == "flink"
    if flink:
        # The job graph carries no secret: the workers started below read them from the environment.
        export(job_document(fleet))
    worker_mode = python_worker_mode() if flink else "process"
    # The slow starts first, before anything else is imported or read: the workers' fork
    # server and the gateway JVM come up while the driver imports the job's API (PyFlink's
    # DataStream, the committers: ~0.6 s) and prepares the tables.
    with _python_workers(settings, worker_mode) if flink else nullcontext() as fork_server:
        if flink:
            start_local_gateway(settings)
        from streamberg.ingest.routes import prepare_routes
        from streamberg.ingest.tasks import job_name

        run_id = new_run_id()
        log = get_logger("ingest.driver", job=job_name(fleet), run=run_id)
        topics = prepare_routes(fleet, log)
        folder = RunFolder.of(settings, run_id).create()
        prune_runs(folder)
        worker_log = (folder.path / WORKER_LOG_NAME).resolve()
        parallelism = parallelism or settings.ingest.parallelism
        log.info("starting ingest", engine=engine, parallelism=parallelism, routes=len(fleet.tables), topics=topics,
                 max_records=max_records, duration_s=duration,
                 python_workers=worker_mode + (", forked" if fork_server else ""),
                 worker_logs=str(worker_log.with_name(f"{worker_log.stem}-*{worker_log.suffix}")))
        run = _Run(settings, run_id, folder, RunBounds(max_records, duration), time.monotonic(), log,
                   _drain_seconds(fleet))
        bar = _progress_bar(max_records, enabled=progress)
        relay = WorkerLogRelay(worker_log, write=None if bar is None else lambda text: bar.write(text, end="")).start()
        log_target = WorkerLogTarget(str(worker_log), renders_json())
        job: RunningJob
        if flink:
            from streamberg.ingest.job import FlinkJob, build_job

            job = FlinkJob(build_job(fleet, parallelism, run_id, log_target=log_target,
                                     python_workers=fork_server.launcher if fork_server else None,
                                     ).execute_async(job_name(fleet)))
        else:
            from streamberg.ingest.processes import ProcessesJob

            job = ProcessesJob(fleet, parallelism, run_id, log_target, log).start()
        stop = _StopRequest(folder, log)
        fenced = None
        try:
            with stop_on_signals(stop, lambda: stop.reason is not None):
                fenced = _watch(run, job, stop, bar)
        except KeyboardInterrupt:  # a second signal: stop now (safe: nothing is half-visible)
            stop.reason = stop.reason or "interrupted"
        finally:
            if bar is not None:
                bar.close()
            try:
                job.cancel()
            except Exception:  # noqa: BLE001 - already terminal
                pass
            relay.stop()
        outcome = RunOutcome(run_id=run_id, consumed=folder.records_committed(),
                             seconds=time.monotonic() - run.started,
                             stopped_because="fenced" if fenced else stop.reason or "unknown")
        if fenced:
            log.error("ingest fenced", consumed=outcome.consumed, seconds=round(outcome.seconds, 1))
            raise IngestFenced(f"FencedError: {fenced}", outcome)
        log.info("ingest stopped", consumed=outcome.consumed, seconds=round(outcome.seconds, 1),
                 reason=outcome.stopped_because)
        return outcome


class RunningJob(Protocol):
    """What the driver needs of a running job, whatever its engine (ingest/job.py's FlinkJob,
    ingest/processes.py's ProcessesJob)."""

    def ended(self) -> str | None:
        """None while it runs; why, once it ended for good."""

    def cancel(self) -> None: ...


def _drain_seconds(fleet: FleetConfig) -> float:
    """How long writers get to flush and commit after a stop: three of the longest commit
    interval any table has, and a minute."""
    intervals = [fleet.defaults.ingest.commit_interval_seconds,
                 *(r.commit_interval_seconds for r in fleet.tables if r.commit_interval_seconds is not None)]
    if not fleet.many:
        intervals.append(run_settings(fleet).ingest.commit_interval_seconds)
    return 3 * max(intervals) + 60


@dataclass(frozen=True)
class _Run:
    """One run of the job, as the driver knows it."""
    config: StreambergConfig  # the run-wide settings
    run_id: str
    folder: RunFolder  # stop/drained/fenced markers, read and committed progress, the workers' logs
    bounds: RunBounds
    started: float  # time.monotonic()
    log: Any
    drain_seconds: float


class _StopRequest:
    """Why the run stops (the first reason wins); requesting it drops the writers' stop marker."""

    def __init__(self, folder: RunFolder, log: Any) -> None:
        self.folder, self.log = folder, log
        self.reason: str | None = None

    def __call__(self, reason: str, until_read: int | None = None) -> None:
        if self.reason is None:
            self.reason = reason
            self.folder.request_stop(reason, until_read)
            self.log.info("stopping: writers flush and commit what they have", reason=reason)


def _watch(run: _Run, job: RunningJob, stop: _StopRequest, bar: Any) -> str | None:
    """Poll until the writers drained after a stop (or did not in time); return the fence
    reason if another instance fenced this run. Raises JobFailed if the job ended for good
    (Flink gave it up; the processes' attempts were spent)."""
    folder, bounds = run.folder, run.bounds
    stop_deadline = None
    next_look = 0.0
    catalog = _CatalogWatch(run)
    while True:
        time.sleep(DRIVER_TICK_SECONDS)
        if bounds.max_records is not None and folder.records_read() >= bounds.max_records:
            stop(f"max_records {bounds.max_records} read", until_read=bounds.max_records)
        if stop.reason and folder.drained():
            return None
        if time.monotonic() < next_look:
            continue
        next_look = time.monotonic() + TABLE_LOOK_SECONDS
        if (reason := folder.fenced()) is not None:  # before the job status: Flink is restarting or failed it
            run.log.error("fenced: another ingest instance is writing this table; stopping without restart",
                          reason=reason)
            return reason
        if (reason := folder.lost_offsets()) is not None:  # on_lost_offsets=fail: a restart finds the same
            run.log.error("a Kafka position was lost; stopping without restart", reason=reason)
            raise LostOffsetsError(reason)
        catalog.look()
        if (failure := job.ended()) is not None:
            raise JobFailed(failure)
        if bar is not None:
            bar.n = folder.records_committed()
            bar.refresh()
        if bounds.duration is not None and time.monotonic() - run.started >= bounds.duration:
            stop(f"duration {bounds.duration}s elapsed")
        if stop.reason:  # the drained marker is looked for at every tick, above
            stop_deadline = stop_deadline or time.monotonic() + run.drain_seconds
            if time.monotonic() > stop_deadline:
                run.log.warning("writers did not drain in time; cancelling (uncommitted work will be re-read)")
                return None


class _CatalogWatch:
    """One round trip to the catalog at every look: every table of the job commits through
    it, so a catalog database that went away stops the run at once (SQLAlchemy's
    OperationalError, which `streamberg ingest` reports as the catalog being down) rather
    than leaving every table failing its commits in the workers. Any other trouble (a REST
    server's passing error) is logged and looked at again."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.catalog: Any = None

    def look(self) -> None:
        import sqlalchemy.exc

        from streamberg.common.catalog import shared_catalog

        try:
            if self.catalog is None:
                self.catalog = shared_catalog(self.run.config.catalog)
            self.catalog.list_namespaces()
        except sqlalchemy.exc.OperationalError:
            raise
        except Exception as exc:  # noqa: BLE001 - the workers' commits retry; the next look tells
            self.run.log.warning("the catalog did not answer the driver's look", reason=type(exc).__name__)


@contextmanager
def _python_workers(config: StreambergConfig, worker_mode: str) -> Iterator[ForkServer | None]:
    """The fork server of a local run in process mode, started before anything else so its
    imports overlap the JVM's start-up (ingest/local/fork_server.py); None if not used."""
    if worker_mode != "process" or not config.ingest.fork_python_workers:
        yield None
        return
    try:
        server = ForkServer().start()
    except ForkServerUnavailable as exc:
        get_logger("ingest.driver").warning("Python workers start without the fork server (slower start-up)",
                                            reason=str(exc))
        yield None
        return
    try:
        yield server
    finally:
        server.stop()


def _progress_bar(total: int | None, enabled: bool) -> Any:  # a tqdm bar, or None off a terminal
    if not enabled or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="rec", unit_scale=True, desc="committed", file=sys.stderr)
