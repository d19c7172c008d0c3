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
from streamberg.common.tables import run_settings
from streamberg.ingest.local.gateway import start_local_gateway
from streamberg.ingest.local.settings import configuration, local_settings
from streamberg.ingest.local.worker_logs import WorkerLogTarget
from streamberg.ingest.tasks import (
    RESTART_ATTEMPTS,
    RESTART_DELAY_SECONDS,
    CommitterTask,
    WriterTask,
    failure_logged,
    job_name,
    log_restart,
)


class WriterFunction(FlatMapFunction):
    """A writer task (ingest/tasks.py) as a Flink operator, driven by the tick stream."""

    def __init__(self, config: dict, run_id: str, log_target: WorkerLogTarget | None):
        self.config_dump, self.run_id, self.log_target = config, run_id, log_target

    def open(self, runtime_context: RuntimeContext) -> None:
        if self.log_target is not None:
            self.log_target.configure()
        index = runtime_context.get_index_of_this_subtask()
        log_restart("writers", index, runtime_context.get_attempt_number())
        with failure_logged("writers", subtask=index):
            # The job graph carries no secret: this worker's environment does.
            fleet = FleetConfig.model_validate(unseal(self.config_dump))
            self.task = WriterTask(fleet, index, runtime_context.get_number_of_parallel_subtasks(), self.run_id)
        self.task.open()

    def flat_map(self, tick):  # noqa: ANN001, ANN201 - Flink's signature
        yield from self.task.step()

    def close(self) -> None:
        if getattr(self, "task", None) is not None:
            self.task.close()


class CommitterFunction(MapFunction):
    """The committer task (ingest/tasks.py) as a Flink operator of parallelism 1."""

    def __init__(self, config: dict, parallelism: int, run_id: str, log_target: WorkerLogTarget | None):
        self.config_dump, self.parallelism, self.run_id = config, parallelism, run_id
        self.log_target = log_target

    def open(self, runtime_context: RuntimeContext) -> None:
        if self.log_target is not None:
            self.log_target.configure()
        log_restart("committer", 0, runtime_context.get_attempt_number())
        with failure_logged("committer"):
            self.task = CommitterTask(FleetConfig.model_validate(unseal(self.config_dump)), self.parallelism,
                                      self.run_id)
        self.task.open()

    def map(self, unit: Any) -> int:
        return self.task.offer(unit)

    def close(self) -> None:
        if getattr(self, "task", None) is not None:
            self.task.close()


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
        "restart-strategy.fixed-delay.attempts": str(RESTART_ATTEMPTS),
        "restart-strategy.fixed-delay.delay": f"{RESTART_DELAY_SECONDS:g} s",
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


class FlinkJob:
    """A submitted job as the driver watches it (ingest/driver.RunningJob)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def ended(self) -> str | None:
        status = str(self.client.get_job_status().result())
        return failure_message(self.client, status) if status.endswith(("FAILED", "CANCELED", "FINISHED")) else None

    def cancel(self) -> None:
        self.client.cancel().result()


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
