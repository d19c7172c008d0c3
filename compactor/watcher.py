"""The snapshot watcher: a Spark Structured Streaming query over the table's snapshots.

``spark.readStream.format("iceberg")`` emits the files of each new ``append`` snapshot; the
compactor's own ``replace`` snapshots are skipped by Iceberg's source, and overwrite/delete
snapshots are skipped by option. Each micro-batch triggers one optimize pass bounded to the
snapshots the batch covers. The batch's rows are never read: the batch's end offset
(snapshot id) is taken from Spark's offset log in the checkpoint, which Spark writes before
running the batch, so a trigger costs metadata reads only.

Progress and restarts: Spark's checkpoint records the last completed batch, so a restarted
compactor resumes after it instead of replaying history; a batch that was interrupted is
re-run by Spark with the same end offset, and because pending files are derived from the
table (planner.py), the re-run rewrites exactly the files the interrupted run had not
committed. ``--once`` uses Trigger.AvailableNow: everything pending is processed, then the
query stops.

Expiry: the stream must load the snapshots its checkpoint names (the last batch's end, and
for AvailableNow the checkpoint's initial offset, apache/iceberg#18000). Before it starts, and
whenever it fails because one was expired, the checkpoint is reset and the stream started
again from the oldest snapshot; pending files come from the table, so nothing is skipped.

A rule can become true without any new snapshot (``max_delay_seconds``, and
``seal_after_seconds`` finishing an idle partition): when either is on, the watcher also runs
a pass between triggers (continuous mode) or after the stream (``--once``). A lock keeps
passes strictly one at a time.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from streamberg.common.errors import StreamFailed
from streamberg.common.log import get_logger
from streamberg.common.spark import activate, release_callback_connections
from streamberg.compactor.compactor import Compactor, PassReport

SKIP_OPTIONS = {
    "streaming-skip-overwrite-snapshots": "true",
    "streaming-skip-delete-snapshots": "true",
}


@dataclass
class WatchReport:
    batches: int = 0
    passes: list[PassReport] = field(default_factory=list)

    def totals(self) -> dict[str, int]:
        keys = ("commits", "groups", "files_in", "files_out", "bytes_in", "bytes_out", "conflicts", "groups_failed")
        out = {k: 0 for k in keys}
        for report in self.passes:
            for k, v in report.totals().items():
                out[k] += v
        return out


# Iceberg's streaming source fails so once the snapshot of an offset it must start from was
# expired (apache/iceberg#18000: Trigger.AvailableNow plans from the checkpoint's *initial*
# offset, so every `--once` run fails for good once that one snapshot is gone).
EXPIRED_OFFSET = "the snapshot was expired or removed"
# Resets of the checkpoint in a row before the failure is reported (expiry racing every start).
MAX_RESETS = 3


def _read_text(spark: Any, path_text: str) -> str | None:
    """A checkpoint file's text through Hadoop's FileSystem (any location Spark can use)."""
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(path_text)
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(path):
        return None
    stream = fs.open(path)
    try:
        return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
    finally:
        stream.close()


def checkpoint_snapshots(spark: Any, checkpoint_dir: str, *, initial: bool) -> list[int]:
    """The snapshot ids the stream must load to start again from `checkpoint_dir`: the last
    planned batch's end offset, and (`initial`: Trigger.AvailableNow reads it) the offset the
    checkpoint first started at. Empty for a new or unreadable checkpoint."""
    jvm = spark._jvm
    root = checkpoint_dir.rstrip("/")
    ids: list[int] = []
    try:
        folder = jvm.org.apache.hadoop.fs.Path(f"{root}/offsets")
        fs = folder.getFileSystem(spark._jsc.hadoopConfiguration())
        batches = [int(str(s.getPath().getName())) for s in (fs.listStatus(folder) if fs.exists(folder) else [])
                   if str(s.getPath().getName()).isdigit()]
        texts = [_read_text(spark, f"{root}/offsets/{max(batches)}")] if batches else []
        if initial:
            texts.append(_read_text(spark, f"{root}/sources/0/offsets/0"))
        for text in texts:
            for line in reversed((text or "").strip().splitlines()):
                if '"snapshot_id"' in line:
                    ids.append(int(json.loads(line)["snapshot_id"]))
                    break
    except Exception:  # noqa: BLE001 - unreadable: the stream itself reports what is wrong
        return ids
    return ids


def reset_checkpoint(spark: Any, checkpoint_dir: str) -> None:
    """Delete the stream's checkpoint: it only saves re-reading history, because the files a
    pass rewrites are found from the table (planner.py), never from the stream's offsets."""
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(checkpoint_dir)
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    if fs.exists(path):
        fs.delete(path, True)


def read_batch_end_snapshot(spark: Any, checkpoint_dir: str, batch_id: int) -> int | None:
    """The Iceberg snapshot id a micro-batch ends at, from Spark's offset log (None if unreadable).

    The log file ``offsets/<batch>`` is: a version line, a metadata JSON line, then one
    offset JSON per source; Iceberg's is ``{"version":1,"snapshot_id":..,"position":..}``.
    """
    try:
        text = _read_text(spark, f"{checkpoint_dir.rstrip('/')}/offsets/{batch_id}")
        for line in reversed((text or "").strip().splitlines()):
            if '"snapshot_id"' in line:
                return int(json.loads(line)["snapshot_id"])
    except Exception:  # noqa: BLE001 - the bound is an optimisation; without it the pass plans to now
        return None
    return None


class SnapshotWatcher:
    def __init__(self, compactor: Compactor, *, once: bool) -> None:
        self.compactor = compactor
        self.spark = compactor.spark
        self.settings = compactor.settings
        self.once = once
        self.report = WatchReport()
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._stopping = False
        self._query: Any = None
        self.log = get_logger("compactor.stream", table=compactor.identifier,
                              checkpoint=self.settings.checkpoint_dir)

    def _on_batch(self, batch_df: Any, batch_id: int) -> None:
        if self._stopping:
            self.log.info("micro-batch skipped: stopping", batch_id=batch_id)
            return
        end = read_batch_end_snapshot(self.spark, self.settings.checkpoint_dir, batch_id)
        self.log.info("micro-batch", batch_id=batch_id, end_snapshot_id=end)
        try:
            with self._lock:
                if self._stopping:
                    return
                self.report.batches += 1
                self.report.passes.append(self.compactor.run_pass(batch_id=batch_id, up_to_snapshot_id=end))
        except BaseException as exc:
            self._error = exc  # re-raised with its own message after the query stops
            raise

    def _timer_pass(self) -> None:
        if self.settings.max_delay_seconds is None and self.settings.seal_after_seconds is None:
            return  # no rule that time alone makes true
        with self._lock:
            self.report.passes.append(self.compactor.run_pass())

    def start(self) -> Any:
        activate(self.spark)
        stream = (self.spark.readStream.format("iceberg").options(**SKIP_OPTIONS)
                  .load(self.compactor.spark_table))
        writer = (stream.writeStream.foreachBatch(self._on_batch)
                  .option("checkpointLocation", self.settings.checkpoint_dir)
                  .queryName(f"streamberg-compactor-{self.compactor.identifier}"))
        if self.once:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{self.settings.trigger_interval_seconds:g} seconds")
        self._query = writer.start()
        self.log.info("watching snapshots", once=self.once, trigger_interval_seconds=self.settings.trigger_interval_seconds)
        return self._query

    def run(self, stop: threading.Event | None = None) -> WatchReport:
        """Run until done (--once) or until `stop` is set / the process is interrupted.

        A checkpoint whose offsets name an expired snapshot (maintenance expired it while the
        compactor was down, or faster than a trigger) is reset and the stream started again
        from the table's oldest snapshot: nothing is lost, because a pass plans every pending
        file from the table."""
        stop = stop or threading.Event()
        self._reset_if_expired()
        resets, batches_then = 0, -1
        while True:
            self._stopping = False
            try:
                return self._watch(stop)
            except StreamFailed as exc:
                if EXPIRED_OFFSET not in str(exc):
                    raise
                if stop.is_set():
                    return self.report  # stopping anyway: the next start resets the checkpoint
                if self.report.batches != batches_then:  # batches ran since the last reset: not a loop
                    resets, batches_then = 0, self.report.batches
                if resets >= MAX_RESETS:
                    raise
                resets += 1
                self._error = None
                self.log.warning("the stream's checkpoint names an expired snapshot; it is reset and the stream "
                                 "starts again from the oldest snapshot (pending files come from the table)",
                                 resets=resets, error=str(exc)[:300])
                reset_checkpoint(self.spark, self.settings.checkpoint_dir)

    def _reset_if_expired(self) -> None:
        """Before the stream starts: reset a checkpoint it could not start from."""
        wanted = checkpoint_snapshots(self.spark, self.settings.checkpoint_dir, initial=self.once)
        table = self.compactor.load()
        gone = [sid for sid in wanted if table.snapshot_by_id(sid) is None]
        if gone:
            self.log.warning("the stream's checkpoint names expired snapshots; it is reset (pending files come "
                             "from the table, so nothing is skipped)", expired_snapshot_ids=gone)
            reset_checkpoint(self.spark, self.settings.checkpoint_dir)

    def _watch(self, stop: threading.Event) -> WatchReport:
        query = self.start()
        try:
            if self.once:
                self._await(query, None)
                if self.report.batches == 0 and not stop.is_set():
                    # No batch ran: nothing new since the checkpoint, or a batch an interrupted
                    # run skipped while stopping (Spark then counts it done). --once promises
                    # everything pending: one pass plans it from the table.
                    with self._lock:
                        self.report.passes.append(self.compactor.run_pass())
                else:
                    self._timer_pass()
                return self.report
            last_timer = time.monotonic()
            while not stop.is_set():
                # Short waits so a stop request is honoured promptly.
                if self._await(query, min(1.0, self.settings.trigger_interval_seconds)):
                    return self.report  # stopped from elsewhere (query.stop())
                if time.monotonic() - last_timer >= self.settings.trigger_interval_seconds:
                    self._timer_pass()
                    last_timer = time.monotonic()
            return self.report
        finally:
            # Let a running pass finish (stopping the query would interrupt its Spark jobs),
            # and make batches that start from now on return without work: they are safe
            # to skip because pending files are found from the table, not from the batch.
            self._stopping = True
            with self._lock:
                pass
            if query.isActive:
                query.stop()
            # The query's JVM thread is gone; its connection back to this process is not
            # (py4j keeps it): a governor running a query a compaction leaked one each.
            release_callback_connections(self.spark)

    def _await(self, query: Any, timeout: float | None) -> bool:
        try:
            finished = query.awaitTermination(timeout) if timeout is not None else query.awaitTermination()
        except Exception:  # noqa: BLE001 - StreamingQueryException: report the cause below
            finished = True
        if finished is None or finished:
            self._raise_if_failed(query)
            return True
        return False

    def _raise_if_failed(self, query: Any) -> None:
        failure = query.exception()
        if failure is None and self._error is None:
            return
        if self._error is not None:
            raise StreamFailed(f"optimize pass failed: {self._error}") from self._error
        raise StreamFailed(f"streaming query failed: {str(failure)[:2000]}")

    @property
    def query(self) -> Any:
        return self._query

