"""The PyFlink ingest job: parallel writers -> one committer, for one table or many.

    ticks (NumberSequenceSource, parallelism P)
      -> WriterFunction   (flat_map, parallelism P): a Writer (ingest/writer.py): poll Kafka,
                           decode, write Parquet, a lane a table; emits each table's FlushUnit
                           at the end of its commit interval
      -> CommitterFunction (map, parallelism 1): the Committers (ingest/committers.py): one
                           Iceberg snapshot per table per interval
      -> discarding sink

A config of one table is a config of one route (common/config/loading.as_fleet): the job
always takes routes.

No Flink Kafka or Iceberg connector ships with the apache-flink wheel (and no JVM artifact can
be fetched where streamberg is built and tested), so Kafka is read with confluent-kafka and
Iceberg written with pyiceberg inside Python operators. The tick stream only drives the
writers' poll loop; offsets live in the table, not in Flink state, so no checkpointing is
needed for exactly-once (see README).

A bounded run (--max-records/--duration, tests, demos) ends gracefully: the driver
(ingest/driver.py) drops a `stop` marker, each writer flushes a final unit, the committer
commits it and drops a `drained` marker, and the driver cancels the job. Cancelling at any
other moment is also safe: uncommitted files are orphans and their records are read again on
the next start.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyflink.common import Configuration, Types, WatermarkStrategy
from pyflink.datastream import StreamExecutionEnvironment
from pyflink.datastream.connectors import Sink
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.datastream.functions import FlatMapFunction, MapFunction, RuntimeContext

from streamberg.common.config import FleetConfig, StreambergConfig
from streamberg.common.config.sealing import job_document as job_dump
from streamberg.common.config.sealing import seal, unseal
from streamberg.common.errors import named_in
from streamberg.common.log import get_logger
from streamberg.common.tables import run_settings
from streamberg.ingest.committers import Committers
from streamberg.ingest.local.gateway import start_local_gateway
from streamberg.ingest.local.settings import configuration, local_settings
from streamberg.ingest.local.worker_logs import WorkerLogTarget
from streamberg.ingest.run_folder import RunFolder
from streamberg.ingest.writer import Writer

STOP_CHECK_SECONDS = 0.5  # how often a writer reports what it read and looks for the stop marker


class WriterFunction(FlatMapFunction):
    def __init__(self, config: dict, run_id: str, log_target: WorkerLogTarget | None):
        self.config_dump, self.run_id, self.log_target = config, run_id, log_target

    def open(self, runtime_context: RuntimeContext) -> None:
        if self.log_target is not None:
            self.log_target.configure()
        _log_restart(runtime_context, "writers")
        index = runtime_context.get_index_of_this_subtask()
        parallelism = runtime_context.get_number_of_parallel_subtasks()
        with _failure_logged("writers", subtask=index):
            # The job graph carries no secret: this worker's environment does.
            fleet = FleetConfig.model_validate(unseal(self.config_dump))
            self.folder = folder = RunFolder.of(run_settings(fleet), self.run_id)
            self.writer = Writer(fleet, index, parallelism, self.run_id)
            with _lost_offsets_marked(folder):
                self.writer.open()
            self.progress = folder.progress(index, self.writer.position)
            self._next_stop_check = 0.0

    def _stop_requested(self) -> bool:
        """Every STOP_CHECK_SECONDS: report what was read, then look for the stop marker."""
        now = time.monotonic()
        if now < self._next_stop_check:
            return False
        self._next_stop_check = now + STOP_CHECK_SECONDS
        self.progress.update(self.writer.position)
        return self.folder.stop_due()

    def flat_map(self, tick):  # noqa: ANN001, ANN201 - Flink's signature
        if self.writer.finished:
            time.sleep(0.2)  # done; keep the (unbounded) tick stream from spinning
            return
        with _failure_logged("writers", subtask=self.writer.index), _lost_offsets_marked(self.folder):
            yield from self.writer.poll()
            if self._stop_requested():
                yield from self.writer.finish()

    def close(self) -> None:
        if getattr(self, "writer", None) is not None:
            self.writer.close()


class CommitterFunction(MapFunction):
    def __init__(self, config: dict, parallelism: int, run_id: str, log_target: WorkerLogTarget | None):
        self.config_dump, self.parallelism, self.run_id = config, parallelism, run_id
        self.log_target = log_target

    def open(self, runtime_context: RuntimeContext) -> None:
        if self.log_target is not None:
            self.log_target.configure()
        _log_restart(runtime_context, "committer")
        with _failure_logged("committer"):
            self.committer = Committers(FleetConfig.model_validate(unseal(self.config_dump)), self.parallelism,
                                        self.run_id)
            self.committer.open()

    def map(self, unit: Any) -> int:
        with _failure_logged("committer"):
            return self.committer.offer(unit)

    def close(self) -> None:
        if getattr(self, "committer", None) is not None:
            self.committer.close()


@contextmanager
def _failure_logged(operator: str, **context: Any) -> Iterator[None]:
    """Log a task's exception before Flink gets it. Local Python workers run in processes of
    their own, whose output the driver relays from their log only (worker_logs.py), and a job
    that fails for good shuts its MiniCluster down before the driver can ask why: this line
    is how the cause reaches the operator."""
    try:
        yield
    except Exception as exc:
        get_logger("ingest.job").error("task failed; Flink restarts the job (or fails it after its attempts)",
                                       operator=operator, error=f"{type(exc).__name__}: {exc}", **context)
        raise


@contextmanager
def _lost_offsets_marked(folder: RunFolder) -> Iterator[None]:
    """A lost Kafka position under ingest.on_lost_offsets=fail: tell the driver, which stops
    the run at once (a Flink restart would only find the same position lost again)."""
    from streamberg.common.errors import LostOffsetsError

    try:
        yield
    except LostOffsetsError as exc:
        folder.mark_lost_offsets(str(exc))
        raise


def _log_restart(runtime_context: RuntimeContext, operator: str) -> None:
    """Say so when Flink restarted this task (after a failure anywhere in the job)."""
    attempt = runtime_context.get_attempt_number()
    if attempt > 0:
        get_logger("ingest.job").warning("task restarted by Flink after a failure; resuming from the table's offsets",
                                         operator=operator, subtask=runtime_context.get_index_of_this_subtask(),
                                         attempt=attempt)


def job_name(fleet: FleetConfig) -> str:
    """The Flink pipeline's name: the tables it writes (its routes' identifiers)."""
    names = ", ".join(r.identifier for r in fleet.tables)
    return f"streamberg-ingest {names if len(names) <= 120 else names[:117] + '...'}"


def flink_configuration(config: StreambergConfig, parallelism: int, cluster: bool = False,
                        python_workers: str | None = None, name: str = "streamberg-ingest") -> Configuration:
    """The job's Flink settings. `cluster`: submitted with `flink run` (cli/flink_submit.py).
    `python_workers`: what starts a local run's Python workers (the fork server's launcher,
    ingest/local/fork_server.py), by default this environment's interpreter.

    Settings given here override those of `flink run`, so on a cluster the Python
    interpreter (-pyexec / -pyarch) and the slots (the TaskManagers' own config) are left to
    the cluster; locally the MiniCluster gets this environment's interpreter and enough slots.
    """
    local = {} if cluster else local_settings(parallelism, python_workers)
    settings = {
        **local,
        # Hand every unit downstream at once; the committer's timing depends on it.
        "python.fn-execution.bundle.size": "1",
        "python.fn-execution.bundle.time": "100",
        "parallelism.default": str(parallelism),
        # A failure restarts the whole job; every task re-reads its position from the table.
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": "3",
        "restart-strategy.fixed-delay.delay": "5 s",
        "pipeline.name": name,
        **config.ingest.flink,
    }
    return configuration(settings)


def build_job(fleet: FleetConfig, parallelism: int, run_id: str, cluster: bool = False,
              log_target: WorkerLogTarget | None = None, python_workers: str | None = None) -> StreamExecutionEnvironment:
    """The job graph of the tables `fleet` routes (one table: a config of one route).
    `log_target`: where local worker processes log (None: their stderr, which on a cluster is
    the TaskManager's log); `python_workers`: see flink_configuration."""
    settings = run_settings(fleet)  # the run-wide settings: state folder, Flink, Python workers
    if not cluster:
        start_local_gateway(settings).join()
    env = StreamExecutionEnvironment.get_execution_environment(
        flink_configuration(settings, parallelism, cluster, python_workers, job_name(fleet)))
    dump, _ = seal(job_dump(fleet))  # secrets stay in the environment (common/config/sealing.py)
    ticks = env.from_source(NumberSequenceSource(0, 2**62), WatermarkStrategy.no_watermarks(), "ticks")
    units = (ticks.flat_map(WriterFunction(dump, run_id, log_target), output_type=Types.PICKLED_BYTE_ARRAY())
             .name("writers").set_parallelism(parallelism))
    commits = (units.map(CommitterFunction(dump, parallelism, run_id, log_target), output_type=Types.LONG())
               .name("committer").set_parallelism(1))
    from pyflink.java_gateway import get_gateway

    discard = get_gateway().jvm.org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink()
    commits.sink_to(Sink(discard)).name("discard").set_parallelism(1)
    return env


def failure_message(client: Any, status: str) -> str:
    """One line on why the job ended: a streamberg error raised in a worker, or the root cause."""
    try:
        client.get_job_execution_result().result()
    except Exception as exc:  # noqa: BLE001 - we want the root cause text
        text = str(exc)
        named = named_in(text)  # a streamberg error raised in a Python worker, e.g. FencedError
        if named is not None:
            return f"{named[0].__name__}: {named[1]}"
        lines = [line for line in text.splitlines() if "Error" in line or "Exception" in line]
        return f"ingest job {status}: " + (lines[-1].strip() if lines else text[:500])
    return f"ingest job ended unexpectedly ({status})"
