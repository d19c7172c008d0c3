"""The single committer: makes writers' files visible, one Iceberg snapshot per interval.

Exactly-once rests on what it checks before every commit:
- Chain: for every Kafka partition, the units it commits start exactly where the table's
  recorded offsets end, in order, with no gap and no overlap.
- Fence: the offsets recorded in the table are still the ones this committer last saw.
  If they moved, another instance committed, and this one refuses rather than duplicate.
- Optimistic concurrency: the append is validated against the snapshot it read (Iceberg's
  AssertRefSnapshotId); on a conflict (e.g. the compactor committed) it re-reads, re-checks
  the fence and retries with the same files.
Dead letters go to their own Iceberg table first, filtered by the offsets recorded there,
so a crash between the two commits cannot duplicate them either.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from streamberg.common.catalog import DEAD_LETTER_SCHEMA, ensure_dead_letter_table, load_catalog
from streamberg.common.config import StreambergConfig
from streamberg.common.errors import CommitRetriesExhausted, FencedError, OffsetChainError
from streamberg.common.log import get_logger
from streamberg.common.offsets import FENCED_MESSAGE, PartitionOffsets, committed_position, encode_offsets
from streamberg.common.retry import commit_retrying, is_instance
from streamberg.common.summary_keys import SummaryKeys, kafka_offsets_key
from streamberg.ingest.units import DeadLetter, FlushUnit


@dataclass
class CommitResult:
    snapshot_id: int
    files: int
    records: int
    dead_letters: int
    offsets: PartitionOffsets
    seconds: float
    attempts: int


@dataclass
class _Pending:
    units: list[FlushUnit] = field(default_factory=list)

    def writers(self) -> set[int]:
        return {u.writer for u in self.units}

    def epochs(self) -> set[int]:
        return {u.epoch for u in self.units}


def chain_offsets(expected: PartitionOffsets, units: list[FlushUnit]) -> PartitionOffsets:
    """The offsets after committing `units` on top of `expected`; raise if they don't chain."""
    result = dict(expected)
    by_partition: dict[int, list[tuple[int, int]]] = {}
    for unit in units:
        for p, rng in unit.ranges.items():
            by_partition.setdefault(p, []).append(rng)
    for p, ranges in by_partition.items():
        for start, end in sorted(ranges):
            if p in result and start != result[p]:
                kind = "gap" if start > result[p] else "overlap"
                raise OffsetChainError(
                    f"partition {p}: a unit starts at offset {start} but the committed offset is {result[p]} ({kind})"
                )
            result[p] = end
    return result


class Committer:
    def __init__(self, config: StreambergConfig, parallelism: int, run_id: str):
        self.config, self.parallelism, self.run_id = config, parallelism, run_id
        self.topic = config.kafka.topic
        self.log = get_logger("ingest.committer", job=config.job_id, table=config.table.identifier, run=run_id)
        self.pending = _Pending()
        self.finished_writers: set[int] = set()
        self.commit_seq = 0
        self.expected: PartitionOffsets = {}
        self.consumed_total = 0
        self.drained = False
        self._group_consumer = None

    # -- life cycle -------------------------------------------------------------------
    def open(self) -> None:
        self.catalog = load_catalog(self.config.catalog)
        table = self.catalog.load_table(self.config.table.identifier)
        position = committed_position(table, self.topic)
        self.expected = dict(position.offsets)
        self.consumed_total = position.consumed_total
        self.commit_seq = (position.commit_seq or 0) if position.job_id == self.config.job_id else 0
        ensure_dead_letter_table(self.catalog, self.config.dead_letter_table)
        self.log.info("committer opened", offsets=self.expected, snapshot=position.snapshot_id,
                      recorded_by=position.job_id)

    def close(self) -> None:
        if self._group_consumer is not None:
            self._group_consumer.close()
            self._group_consumer = None

    # -- receiving units ----------------------------------------------------------------
    def offer(self, unit: FlushUnit) -> CommitResult | None:
        """Take a unit; commit when every active writer has reported for the interval."""
        self.pending.units.append(unit)
        if unit.final:
            self.finished_writers.add(unit.writer)
        if not self._ready():
            return None
        units, self.pending = self.pending.units, _Pending()
        result = self.commit(units) if any(not u.empty for u in units) else None
        if len(self.finished_writers) == self.parallelism:
            self._mark_drained()
        return result

    def _ready(self) -> bool:
        active = set(range(self.parallelism)) - (self.finished_writers - self.pending.writers())
        reported = self.pending.writers()
        # All writers reported for this interval, or someone is already past it (a slow
        # writer's unit will simply join the next commit; its offsets still chain).
        return active <= reported or len(self.pending.epochs()) > 1

    # -- committing ---------------------------------------------------------------------
    def _check_fence(self, table: Table) -> None:
        position = committed_position(table, self.topic)
        if position.offsets != self.expected:
            message = (
                f"table {self.config.table.identifier}: offsets for topic {self.topic} were moved by "
                f"job {position.job_id!r} (run {position.run_id}, snapshot {position.snapshot_id}); this committer "
                f"expected {self.expected} but found {position.offsets}. Refusing to commit: {FENCED_MESSAGE}."
            )
            self._fenced(message)

    def _check_writers_start(self, units: list[FlushUnit]) -> None:
        """Units that start before the offsets this committer opened with: fenced, not a chain bug.

        Writers and committer read the table's offsets when they open; within one run only
        this committer moves them, by chaining the writers' units. A unit starting before
        them means another instance committed between the writers' and the committer's open.
        """
        for unit in units:
            for p, (start, _end) in unit.ranges.items():
                if p in self.expected and start < self.expected[p]:
                    self._fenced(
                        f"table {self.config.table.identifier}: this run's writers started partition {p} at offset "
                        f"{start}, but the table's offsets had already moved to {self.expected[p]} when its committer "
                        f"opened. Refusing to commit: {FENCED_MESSAGE}.")

    def _fenced(self, message: str) -> None:
        # Tell the driver: a Flink restart would re-read the table and carry on beside the
        # other instance (ingesting twice for nothing, fenced again at random), so the
        # driver stops the whole run at once on this marker instead.
        marker = run_dir(self.config, self.run_id) / "fenced"
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(message)
        raise FencedError(message)

    def commit(self, units: list[FlushUnit]) -> CommitResult:
        started = time.monotonic()
        started_ms = int(time.time() * 1000)
        # Before the chain check: when another instance moved the offsets between this run's
        # writers and committer opening, the chain check would report an "overlap" instead
        # of the real cause (and Flink would restart the job beside the other instance).
        self._check_writers_start(units)
        new_offsets = chain_offsets(self.expected, units)
        files = [f for u in units for f in u.files]
        dead = [d for u in units for d in u.dead_letters]
        records = sum(f.record_count for f in files)
        consumed_total = self.consumed_total + sum(u.messages for u in units)
        self.commit_seq += 1
        dead_written = self._commit_dead_letters(dead, new_offsets) if dead else 0
        properties = {
            kafka_offsets_key(self.topic): encode_offsets(new_offsets),
            SummaryKeys.JOB_ID: self.config.job_id,
            SummaryKeys.RUN_ID: self.run_id,
            SummaryKeys.COMMIT_SEQ: str(self.commit_seq),
            SummaryKeys.CONSUMED_TOTAL: str(consumed_total),
            SummaryKeys.COMMIT_STARTED_MS: str(started_ms),
            SummaryKeys.DEAD_LETTERS: str(dead_written),
        }
        attempts = 0
        try:
            for attempt in commit_retrying(self.config.ingest.commit_retries, is_instance(CommitFailedException),
                                           log=self.log, event="commit conflict, retrying"):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    table = self.catalog.load_table(self.config.table.identifier)
                    self._check_fence(table)  # re-checked at every attempt: FencedError is never retried
                    tx = table.transaction()
                    with tx.update_snapshot(snapshot_properties=properties).fast_append() as append:
                        for f in files:
                            append.append_data_file(f.to_data_file())
                    # The append asserted main was at the snapshot we read, so the new current one is ours.
                    snapshot_id = tx.commit_transaction().current_snapshot().snapshot_id
        except CommitFailedException as exc:
            raise CommitRetriesExhausted(
                f"commit to {self.config.table.identifier} failed {attempts} times; last: {exc}") from exc
        self.expected = new_offsets
        self.consumed_total = consumed_total
        result = CommitResult(snapshot_id=snapshot_id, files=len(files), records=records, dead_letters=dead_written,
                              offsets=new_offsets, seconds=time.monotonic() - started, attempts=attempts)
        self.log.info("committed", snapshot=snapshot_id, files=result.files, records=records,
                      dead_letters=dead_written, offsets=new_offsets, commit_seq=self.commit_seq,
                      attempts=attempts, seconds=round(result.seconds, 3))
        self._commit_group_offsets(new_offsets)
        return result

    def _commit_dead_letters(self, dead: list[DeadLetter], new_offsets: PartitionOffsets) -> int:
        """Append dead letters not yet in the DLQ table (by its recorded offsets); return how many."""
        for attempt in commit_retrying(self.config.ingest.commit_retries, is_instance(CommitFailedException),
                                       log=self.log, event="dead-letter commit conflict, retrying"):
            with attempt:
                dlq = self.catalog.load_table(self.config.dead_letter_table)
                already = committed_position(dlq, self.topic).offsets
                fresh = [d for d in dead if d.offset >= already.get(d.partition, -1)]
                if not fresh:
                    return 0
                now = dt.datetime.now(dt.timezone.utc)
                rows = pa.Table.from_pylist([
                    {"topic": self.topic, "partition": d.partition, "offset": d.offset,
                     "kafka_timestamp": dt.datetime.fromtimestamp(d.timestamp_ms / 1000, dt.timezone.utc) if d.timestamp_ms else None,
                     "key": d.key, "value": d.value, "reason": d.reason, "job_id": self.config.job_id,
                     "dead_lettered_at": now}
                    for d in fresh
                ], schema=_dead_letter_arrow_schema())
                dlq.append(rows, snapshot_properties={
                    kafka_offsets_key(self.topic): encode_offsets({**already, **new_offsets}),
                    SummaryKeys.JOB_ID: self.config.job_id, SummaryKeys.RUN_ID: self.run_id,
                })
                return len(fresh)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _commit_group_offsets(self, offsets: PartitionOffsets) -> None:
        """Best effort: consumer-group offsets for lag dashboards; never used to resume."""
        from confluent_kafka import Consumer, TopicPartition

        from streamberg.ingest.writer import consumer_settings

        try:
            if self._group_consumer is None:
                self._group_consumer = Consumer(consumer_settings(self.config))
            self._group_consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in offsets.items()], asynchronous=True)
        except Exception as exc:  # noqa: BLE001 - monitoring only
            self.log.warning("consumer-group offset commit failed (monitoring only)", error=str(exc))

    def _mark_drained(self) -> None:
        if self.drained:
            return
        self.drained = True
        marker = run_dir(self.config, self.run_id) / "drained"
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"offsets": {str(p): o for p, o in self.expected.items()}}))
        self.log.info("all writers finished and committed", offsets=self.expected)


def run_dir(config: StreambergConfig, run_id: str) -> Path:
    return Path(config.ingest.state_dir) / "runs" / run_id


_DLQ_ARROW = None


def _dead_letter_arrow_schema() -> pa.Schema:
    global _DLQ_ARROW
    if _DLQ_ARROW is None:
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        _DLQ_ARROW = schema_to_pyarrow(DEAD_LETTER_SCHEMA)
    return _DLQ_ARROW
