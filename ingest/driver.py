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
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from streamberg.common.changelog import ingest_config
from streamberg.common.config import FleetConfig, StreambergConfig
from streamberg.common.config.sealing import export
from streamberg.common.errors import IngestFenced, JobFailed, LostOffsetsError
from streamberg.common.log import get_logger, renders_json
from streamberg.common.stop import stop_on_signals
from streamberg.ingest.job import build_job, failure_message, job_dump, new_run_id, prepare_tables
from streamberg.ingest.local.fork_server import ForkServer, ForkServerUnavailable
from streamberg.ingest.local.gateway import python_worker_mode, start_local_gateway
from streamberg.ingest.local.worker_logs import WORKER_LOG_NAME, WorkerLogRelay, WorkerLogTarget
from streamberg.ingest.run_folder import RunFolder, prune_runs

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


def run_ingest(config: StreambergConfig, parallelism: int | None = None, max_records: int | None = None,
               duration: float | None = None, progress: bool = True) -> RunOutcome:
    """Run the ingest job; return when a bound is reached (or run until interrupted)."""
    config = ingest_config(config)  # a primary-key table: its change log (common/changelog.py)
    # The job graph carries no secret: the workers started below read them from the environment.
    export(job_dump(config))
    worker_mode = python_worker_mode()
    # The slow starts first, before anything else is imported or read: the workers' fork
    # server and the gateway JVM come up while the driver prepares the tables.
    with _python_workers(config, worker_mode) as fork_server:
        start_local_gateway(config)
        return _run(config, parallelism or config.ingest.parallelism, worker_mode, fork_server,
                    RunBounds(max_records, duration), progress)


def run_fleet_ingest(fleet: FleetConfig, parallelism: int | None = None, max_records: int | None = None,
                     duration: float | None = None, progress: bool = True) -> RunOutcome:
    """Run the ingest of a config of many tables (ingest/fleet.py) as one job."""
    from pyiceberg.exceptions import NoSuchTableError

    from streamberg.ingest.fleet_tables import FleetTables, broker_topics, ensure_fleet_table, exc_reason
    from streamberg.ingest.job import _run_config

    base = ingest_config(_run_config(fleet.model_dump(mode="json", by_alias=True)))
    export(job_dump(base, fleet))  # the job graph carries no secret: the workers read the environment
    worker_mode = python_worker_mode()
    with _python_workers(base, worker_mode) as fork_server:
        start_local_gateway(base)
        run_id = new_run_id()
        log = get_logger("ingest.driver", job="ingest:fleet", run=run_id)
        tables = FleetTables(fleet)
        from confluent_kafka import Consumer

        from streamberg.ingest.writer import consumer_settings

        probe = Consumer({**consumer_settings(base), "group.id": f"streamberg-fleet-{run_id}-driver"})
        try:
            topics = tables.update(broker_topics(probe))
        finally:
            probe.close()
        for topic in topics:  # the tables of the topics there now, before any worker starts
            route = fleet.route_of(topic)
            try:
                ensure_fleet_table(tables.by_topic[topic], topic, anchor_field=route.route_field if route else None)
            except NoSuchTableError as exc:  # schema: infer, no record yet: the writers route it once there is
                tables.wait(topic, str(exc))
            except Exception as exc:  # noqa: BLE001 - that topic's table alone (the writers refuse it and say why)
                tables.refused[topic] = exc_reason(exc)
                log.error("topic not read", topic=topic, reason=tables.refused[topic])
        folder = RunFolder.of(base, run_id).create()
        prune_runs(folder)
        worker_log = (folder.path / WORKER_LOG_NAME).resolve()
        parallelism = parallelism or base.ingest.parallelism
        log.info("starting the ingest of many tables", parallelism=parallelism, routes=len(fleet.tables),
                 tables=len(topics), refused=tables.refused, max_records=max_records, duration_s=duration)
        bounds = RunBounds(max_records, duration)
        run = _Run(base, run_id, folder, None, bounds, time.monotonic(), log)
        relay = WorkerLogRelay(worker_log).start()
        client = build_job(base, parallelism, run_id, log_target=WorkerLogTarget(str(worker_log), renders_json()),
                           python_workers=fork_server.launcher if fork_server else None,
                           fleet=fleet).execute_async("streamberg-ingest fleet")
        stop = _StopRequest(folder, log)
        fenced = None
        try:
            with stop_on_signals(stop, lambda: stop.reason is not None):
                fenced = _watch(run, client, None, stop, None)
        except KeyboardInterrupt:
            stop.reason = stop.reason or "interrupted"
        finally:
            try:
                client.cancel().result()
            except Exception:  # noqa: BLE001 - already terminal
                pass
            relay.stop()
        outcome = RunOutcome(run_id=run_id, consumed=folder.records_read(), seconds=time.monotonic() - run.started,
                             stopped_because="fenced" if fenced else stop.reason or "unknown")
        if fenced:
            raise IngestFenced(f"FencedError: {fenced}", outcome)
        log.info("ingest stopped", read=outcome.consumed, seconds=round(outcome.seconds, 1),
                 reason=outcome.stopped_because)
        return outcome


@dataclass(frozen=True)
class _Run:
    """One run of the job, as the driver knows it."""
    config: StreambergConfig
    run_id: str
    folder: RunFolder  # stop/drained/fenced markers, read progress, the workers' logs
    start_snapshot_id: int | None
    bounds: RunBounds
    started: float  # time.monotonic()
    log: Any


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


def _run(config: StreambergConfig, parallelism: int, worker_mode: str, fork_server: ForkServer | None,
         bounds: RunBounds, progress: bool) -> RunOutcome:
    from streamberg.common.offsets import committed_position

    run_id = new_run_id()
    log = get_logger("ingest.driver", job=config.ingest_target.job_id, table=config.table.identifier, run=run_id)
    catalog, table = prepare_tables(config)
    start = committed_position(table, config.kafka.topic)
    folder = RunFolder.of(config, run_id).create()
    prune_runs(folder)
    worker_log = (folder.path / WORKER_LOG_NAME).resolve()
    log.info("starting ingest", parallelism=parallelism, topic=config.kafka.topic,
             start_offsets=start.offsets, max_records=bounds.max_records, duration_s=bounds.duration,
             python_workers=worker_mode + (", forked" if fork_server else ""),
             worker_logs=str(worker_log.with_name(f"{worker_log.stem}-*{worker_log.suffix}")))
    run = _Run(config, run_id, folder, start.snapshot_id, bounds, time.monotonic(), log)
    bar = _progress_bar(bounds.max_records, enabled=progress)
    relay = WorkerLogRelay(worker_log, write=None if bar is None else lambda text: bar.write(text, end="")).start()
    client = build_job(config, parallelism, run_id, log_target=WorkerLogTarget(str(worker_log), renders_json()),
                       python_workers=fork_server.launcher if fork_server else None,
                       ).execute_async(f"streamberg-ingest {config.table.identifier}")
    stop = _StopRequest(folder, log)
    fenced = None
    try:
        with stop_on_signals(stop, lambda: stop.reason is not None):
            fenced = _watch(run, client, catalog, stop, bar)
    except KeyboardInterrupt:  # a second signal: stop now (safe: nothing is half-visible)
        stop.reason = stop.reason or "interrupted"
    finally:
        if bar is not None:
            bar.close()
        try:
            client.cancel().result()
        except Exception:  # noqa: BLE001 - already terminal
            pass
        relay.stop()
    return _outcome(run, catalog, stop, fenced)


def _watch(run: _Run, client: Any, catalog: Any, stop: _StopRequest, bar: Any) -> str | None:
    """Poll until the writers drained after a stop (or did not in time); return the fence
    reason if another instance fenced this run. Raises JobFailed if Flink gave the job up."""
    from streamberg.common.offsets import consumed_by_run

    config, folder, bounds = run.config, run.folder, run.bounds
    stop_deadline = None
    next_table_look = 0.0
    while True:
        time.sleep(DRIVER_TICK_SECONDS)
        if bounds.max_records is not None and folder.records_read() >= bounds.max_records:
            stop(f"max_records {bounds.max_records} read", until_read=bounds.max_records)
        if stop.reason and folder.drained():
            return None
        if time.monotonic() < next_table_look:
            continue
        next_table_look = time.monotonic() + TABLE_LOOK_SECONDS
        if (reason := folder.fenced()) is not None:  # before the job status: Flink is restarting or failed it
            run.log.error("fenced: another ingest instance is writing this table; stopping without restart",
                          reason=reason)
            return reason
        if (reason := folder.lost_offsets()) is not None:  # on_lost_offsets=fail: a restart finds the same
            run.log.error("a Kafka position was lost; stopping without restart", reason=reason)
            raise LostOffsetsError(reason)
        status = str(client.get_job_status().result())
        if status.endswith(("FAILED", "CANCELED", "FINISHED")):
            raise JobFailed(failure_message(client, status))
        if catalog is None:  # many tables: the bounds are on records read (the writers' reports)
            if bounds.duration is not None and time.monotonic() - run.started >= bounds.duration:
                stop(f"duration {bounds.duration}s elapsed")
            if stop.reason:
                stop_deadline = stop_deadline or time.monotonic() + 3 * config.ingest.commit_interval_seconds + 60
                if time.monotonic() > stop_deadline:
                    run.log.warning("writers did not drain in time; cancelling (uncommitted work will be re-read)")
                    return None
            continue
        table = catalog.load_table(config.table.identifier)
        consumed = consumed_by_run(table, config.kafka.topic, run.run_id, run.start_snapshot_id)
        if bar is not None:
            bar.n = consumed
            bar.refresh()
        if bounds.max_records is not None and consumed >= bounds.max_records:
            stop(f"max_records {bounds.max_records} reached", until_read=bounds.max_records)
        if bounds.duration is not None and time.monotonic() - run.started >= bounds.duration:
            stop(f"duration {bounds.duration}s elapsed")
        if stop.reason:  # the drained marker is looked for at every tick, above
            stop_deadline = stop_deadline or time.monotonic() + 3 * config.ingest.commit_interval_seconds + 60
            if time.monotonic() > stop_deadline:
                run.log.warning("writers did not drain in time; cancelling (uncommitted work will be re-read)")
                return None


def _outcome(run: _Run, catalog: Any, stop: _StopRequest, fenced: str | None) -> RunOutcome:
    from streamberg.common.offsets import committed_position, consumed_by_run

    config = run.config
    table = catalog.load_table(config.table.identifier)
    end = committed_position(table, config.kafka.topic)
    # Only this run's own commits: after a fence the table's totals include the other instance's.
    consumed = consumed_by_run(table, config.kafka.topic, run.run_id, run.start_snapshot_id)
    outcome = RunOutcome(run_id=run.run_id, consumed=consumed, seconds=time.monotonic() - run.started,
                         stopped_because="fenced" if fenced else stop.reason or "unknown")
    if fenced:
        run.log.error("ingest fenced", consumed=consumed, seconds=round(outcome.seconds, 1))
        raise IngestFenced(f"FencedError: {fenced}", outcome)
    run.log.info("ingest stopped", consumed=consumed, seconds=round(outcome.seconds, 1),
                 reason=outcome.stopped_because, end_offsets=end.offsets, snapshot=end.snapshot_id)
    return outcome


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
