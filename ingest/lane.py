"""A table lane: one table's share of a writer subtask (ingest/writer.py). It reads nothing
itself: the writer's source hands it the records of its table's topic, and it decodes each
batch to Arrow and writes Parquet files, keeping everything one table needs (its positions
from its own committed offsets, its decoder, its open files, dead letters, schema evolution,
lost offsets), and emits its own flush units.

Exactly-once rests on two rules here:
- On open, the lane takes each of its partitions from the offset recorded in its table
  (never consumer-group offsets), so whatever was written but not committed before a crash
  is simply read and written again.
- Every unit it emits covers, per partition, exactly the offsets from where the previous
  unit ended to the next offset to read; the committer checks the chain.
- A position Kafka lost (deleted by retention, or offsets that went back) is never passed
  over in silence: ingest/positions.py checks it at open, on an out-of-range fetch and on
  the first offset delivered, and applies `ingest.on_lost_offsets`.

Partition ownership is `partition % parallelism == writer index`: disjoint, and stable
across restarts with the same parallelism.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pyiceberg.table import Table

from streamberg.common.catalog import shared_catalog
from streamberg.common.config import StreambergConfig
from streamberg.common.errors import LostOffsetsError
from streamberg.common.kafka_settings import consumer_settings
from streamberg.common.log import get_logger
from streamberg.common.runtime import current as current_runtime
from streamberg.common.watermarks import WatermarkReader, Watermarks
from streamberg.decode.envelopes import record_decoder
from streamberg.decode.interface import DecodeResult
from streamberg.decode.unknown_fields import display
from streamberg.ingest.dead_letters import dead_letter_from_message
from streamberg.ingest.evolution import HELD_BYTES_LIMIT, SCHEMA_RECHECK_SECONDS, SchemaChanges, hold_back
from streamberg.ingest.files import PartitionedFileWriter, WrittenFile
from streamberg.ingest.positions import PositionProblem, broker_positions, position_problems, refusal
from streamberg.ingest.source import KafkaSource, owned_partitions
from streamberg.ingest.tail_spool import TailSpool
from streamberg.ingest.units import DeadLetter, FlushUnit, HeldRecord
from streamberg.table_meta.column_lifecycle import ignored_fields
from streamberg.table_meta.field_sightings import FieldSighting, merge_sightings
from streamberg.table_meta.offsets import OffsetSkip, committed_position, record_starts, recorded_starts
from streamberg.table_meta.table_files import target_file_size
from streamberg.table_meta.tail_segments import TailIdentity

# librdkafka's answers to a fetch outside the partition's offsets (with auto.offset.reset=error).
_OUT_OF_RANGE = (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)


class TableLane:
    """One table of a writer subtask: given the writer's consumer (to list and position its
    partitions) and `reassign`, which asks the writer to assign every lane's partitions again
    (after a position the broker refused)."""

    def __init__(self, config: StreambergConfig, index: int, parallelism: int, run_id: str,
                 reassign: Callable[[], None], route_value: str | None = None):
        self.config, self.index, self.parallelism, self.run_id = config, index, parallelism, run_id
        self.reassign = reassign
        self.route_value = route_value  # a table of a field-routed topic: its field's value
        self.topic = config.kafka.topic
        self.interval = config.ingest.commit_interval_seconds
        self.log = get_logger("ingest.lane", job=config.ingest_target.job_id, table=config.table.identifier,
                              writer=index, run=run_id)
        self.consumer: Consumer | None = None
        self.marks: WatermarkReader | None = None  # the writer's positions reader
        self.position: dict[int, int] = {}  # partition -> next offset to read
        self.unit_start: dict[int, int] = {}  # partition -> offset where the open unit began
        # partition -> the offset asked for at the last positioning, until a record arrives
        self.expect_first: dict[int, int] = {}
        self.skips: dict[int, list[OffsetSkip]] = {}  # jumps Kafka forced in the open unit
        self.unrecorded: set[int] = set()  # partitions whose start the table does not hold yet
        self.dead_letters: list[DeadLetter] = []
        self.messages = 0  # records read into the open unit
        self.skipped = 0  # of them, neither rows nor dead letters (decode/envelopes/changes.py)
        # ingest.schema_evolution (ingest/evolution.py): records held for the committer and
        # the fields they carry; files closed when the schema changed mid-unit; sightings (off)
        self.evolution = config.ingest.schema_evolution
        self.held: list[HeldRecord] = []
        self.held_bytes = 0
        self.changes = SchemaChanges()
        self.rolled: list[WrittenFile] = []
        self.spool: TailSpool | None = None  # ingest.keep_tail: the decoded rows kept for fresh reads
        self.sightings: dict[str, FieldSighting] = {}
        self.schema_checked = 0.0
        self.epoch = self.epoch_now()
        self.finished = False
        self.began: dict[int, int] = {}  # the table's recorded start offsets when the lane opened

    def epoch_now(self) -> int:
        """The commit interval now (wall clock // interval): a unit closes when it changes."""
        return int(time.time() // self.interval)

    def open(self, source: KafkaSource) -> None:
        """Position this table's partitions from the table's committed offsets, checked
        against the broker (through the writer's source: its consumer, its listing of the
        topics, its positions reader)."""
        table = shared_catalog(self.config.catalog).load_table(self.config.table.identifier)
        committed = committed_position(table, self.topic)
        self.consumer, self.marks = source.consumer, source.marks
        present = source.partitions_of(self.topic)
        mine = owned_partitions(present, self.index, self.parallelism)
        recorded = {p: committed.offsets[p] for p in mine if p in committed.offsets}
        marks = broker_positions(self.config, mine, recorded, reader=self.marks, present=present)
        began = recorded_starts(table, self.topic)  # an earlier run's start, before any commit
        for p in mine:
            low, high = marks.partitions.get(p, (0, -1))
            if p in recorded:
                self.position[p] = recorded[p]
            elif p in began and low <= began[p] <= high:
                self.unrecorded.add(p)
                self.position[p] = began[p]  # begin where the first run began (a fresh read reads from it)
            else:
                self.position[p] = self._start_of_new_partition(p, marks, topic_started=bool(committed.offsets))
        self.began = began
        self.unit_start = dict(self.position)
        problems = position_problems(self.topic, recorded, marks)
        if problems and self.config.ingest.on_lost_offsets == "fail":
            self.log.error("kafka positions lost; stopping (ingest.on_lost_offsets: fail)",
                           partitions=[p.partition for p in problems])
            raise refusal(problems, self.config.table.identifier)  # every partition, not the first only
        for problem in problems:
            self._position_lost(problem)
        self.expect_first = dict(self.position)
        if self.config.ingest.keep_tail and self.config.route_field is None:
            identity = TailIdentity(str(table.metadata.table_uuid), self.topic,
                                    current_runtime().topic_id(consumer_settings(self.config), self.topic))
            self.spool = TailSpool(self.config, mine, self.log, identity)
        self._decode_with(table)
        self.log.info("lane opened", partitions=mine, start_offsets=self.position,
                      committed_snapshot=committed.snapshot_id)

    def _decode_with(self, table: Table) -> None:
        """Decode and write against the table's current schema."""
        self.schema_id = table.schema().schema_id
        self.decoder = record_decoder(self.config, table.schema())
        if self.spool is not None:
            self.spool.decoding_with(self.schema_id)
        # Fields of columns the governor dropped as unused (table_meta/column_lifecycle.py):
        # counted, never added back, never dead letters.
        # A name of a column the table still has is never ignored (its values would go unwritten):
        # the table's start refuses such a property value (common/catalog._declared_kept).
        self.ignored = ignored_fields(table.properties) - {f.name for f in table.schema().fields}
        self.files = PartitionedFileWriter(
            io=table.io, location=table.location(), schema=table.schema(), spec=table.spec(),
            properties=table.properties,
            target_file_size=target_file_size(table, default=self.config.table.target_file_size_bytes),
            row_group_rows=self.config.ingest.row_group_rows,
            name_prefix=f"{self.run_id}-w{self.index}-s{self.schema_id}",
        )

    def recheck_schema(self) -> None:
        """While records are held, follow the committer's schema changes (at most once a
        second): files written so far are closed into the open unit, and the rest of the
        stream decodes against the evolved schema."""
        now = time.monotonic()
        if now - self.schema_checked < SCHEMA_RECHECK_SECONDS:
            return
        self.schema_checked = now
        table = shared_catalog(self.config.catalog).load_table(self.config.table.identifier)
        if table.schema().schema_id == self.schema_id:
            return
        self.rolled.extend(self.files.flush())
        old = self.schema_id
        self._decode_with(table)
        self.log.info("decoding against the evolved schema", schema_from=old, schema_to=self.schema_id,
                      held=len(self.held))

    # -- positions -----------------------------------------------------------------------
    def record_starts(self) -> None:
        """Record in the table where this lane's partitions without committed offsets begin
        (table_meta/offsets.record_starts): a fresh read is then exact from the table's first
        record, before its first commit. Called once the lane's positions are final."""
        starts = {p: self.position[p] for p in self.unrecorded if self.began.get(p) != self.position[p]}
        if not starts:
            return
        try:
            record_starts(shared_catalog(self.config.catalog), self.config.table.identifier, self.topic, starts,
                          log=self.log)
        except Exception as exc:  # noqa: BLE001 - fresh reads wait for the first commit instead; the ingest goes on
            self.log.warning("start offsets not recorded; fresh reads of these partitions wait for the first commit",
                             partitions=sorted(starts), error=str(exc)[:300])
            return
        self.log.info("start offsets recorded", offsets=starts)

    def _start_of_new_partition(self, partition: int, marks: Watermarks, topic_started: bool) -> int:
        """Where a partition the table never recorded starts; the next unit records it even if
        nothing is read, so a restart starts there too, not at a later "latest".

        `kafka.start_offset` says where the ingest of a topic begins. A partition that
        appears once the table already holds positions of the topic (one added while the
        ingest ran) was written while the table was being fed, so it is read from its
        start, as Flink's Kafka source reads discovered partitions: with "latest", records
        produced between the partition's creation and the restart would otherwise be lost.
        """
        self.unrecorded.add(partition)
        low, high = marks.partitions.get(partition, (0, 0))
        if topic_started and self.config.kafka.start_offset == "latest":
            self.log.warning("a partition new to the table is read from its start (the topic's ingest began "
                             "earlier; kafka.start_offset applies to the first start only)",
                             partition=partition, offset=low, high_watermark=high)
            return low
        return low if self.config.kafka.start_offset == "earliest" else high

    def _position_lost(self, problem: PositionProblem) -> None:
        """Apply ingest.on_lost_offsets: raise (fail), or read on from the low watermark and
        record the jump in the open unit (skip-and-record)."""
        if self.config.ingest.on_lost_offsets == "fail":
            self.log.error("kafka position lost; stopping (ingest.on_lost_offsets: fail)",
                           partition=problem.partition, committed=problem.committed, low=problem.low, end=problem.end)
            raise refusal([problem], self.config.table.identifier)
        skip = problem.skip()
        self.skips.setdefault(problem.partition, []).append(skip)
        self.position[problem.partition] = problem.low
        self.log.warning("kafka position lost; reading on from the low watermark and recording the skip",
                         partition=problem.partition, skip_from=skip.from_offset, skip_to=skip.to_offset,
                         kind=skip.kind, lost=skip.lost, end=problem.end)

    def _out_of_range(self, partition: int) -> None:
        """The broker refused the position while running (retention overtook the writer)."""
        asked = self.position[partition]
        marks = broker_positions(self.config, [partition], {partition: asked}, reader=self.marks)
        problems = position_problems(self.topic, {partition: asked}, marks)
        if problems:
            self._position_lost(problems[0])
        else:  # in range again when asked (a broker between leaders): read on from the same offset
            self.log.warning("the broker refused a position it now has; reading on from it", partition=partition,
                             offset=asked, low=marks.low(partition), end=marks.end(partition))
        self.expect_first[partition] = self.position[partition]

    def _reposition(self) -> None:
        """Assign every partition again at its position (the next offset to read): a
        partition the broker refused cannot be sought (librdkafka's erroneous state), and
        records fetched ahead for the others are simply fetched again."""
        self.reassign()  # the writer's consumer: every lane's partitions at once

    def advance(self, ends: dict[int, int]) -> None:
        """A field-routed topic's batch went past records of other tables: this table has read
        them too (nothing of them is its), so its position moves on to the batch's end."""
        for p, end in ends.items():
            if p in self.position and end > self.position[p]:
                self.position[p] = end

    def assignment(self) -> list[TopicPartition]:
        """This lane's partitions at their positions (the next offsets to read)."""
        return [TopicPartition(self.topic, p, o) for p, o in self.position.items()]

    def _check_first_offsets(self, partitions: list[int], offsets: list[int]) -> None:
        """The first record after a positioning must be the one asked for. Beyond it is normal
        after compaction or transaction markers, but not when the low watermark passed it."""
        firsts = dict(zip(reversed(partitions), reversed(offsets)))
        for p in [p for p in self.expect_first if p in firsts]:
            asked, first = self.expect_first.pop(p), firsts[p]
            if first < asked:
                raise LostOffsetsError(
                    f"{self.topic}[{p}]: the broker delivered offset {first} when offset {asked} was asked for; "
                    f"the partition's offsets went back. Nothing was committed past the table's offsets")
            if first > asked:
                marks = broker_positions(self.config, [p], {p: asked}, reader=self.marks)
                if marks.low(p) > asked:
                    self._position_lost(PositionProblem(self.topic, p, asked, marks.low(p), marks.end(p)))

    # -- reading ----------------------------------------------------------------------
    @property
    def blocked(self) -> bool:
        """Enough records held for the committer's schema change: the lane takes no more until
        it lands (it still flushes each interval); asked again at most once a second."""
        if self.held_bytes < HELD_BYTES_LIMIT:
            return False
        self.recheck_schema()
        return self.held_bytes >= HELD_BYTES_LIMIT

    def process(self, messages: list) -> None:
        """Decode and write a batch of this table's records (errors among them applied)."""
        # The only per-record Python on the hot path: plain list comprehensions over the
        # messages (measured ~2.5M messages/s here; tuples or numpy.fromiter are 3-8x slower).
        errors = [m.error() for m in messages]
        # Not `errors.count(None)`: confluent-kafka's KafkaError compared with None sets a
        # TypeError without raising it, and the next C call fails with a SystemError.
        if any([e is not None for e in errors]):
            messages, refused = self._drop_errors(messages, errors)
            if messages:
                self._take(messages)
            # After the records before it: the jump starts where they left the position.
            for partition in refused:
                self._out_of_range(partition)
            if refused:
                self._reposition()
            return
        self._take(messages)

    def _take(self, messages: list) -> None:
        self.messages += len(messages)
        values = [m.value() for m in messages]
        partitions = [m.partition() for m in messages]
        offsets = [m.offset() for m in messages]
        if self.expect_first:
            self._check_first_offsets(partitions, offsets)
        before = {p: self.position[p] for p in set(partitions)} if self.spool is not None else {}
        keys = [m.key() for m in messages] if self.decoder.needs_keys else None
        result = self.decoder.decode(values, keys, (partitions, offsets))
        self.skipped += result.skipped
        if self.evolution == "add" and self.ignored and result.unknown:
            ignored = [u.path and u.path[0] in self.ignored for u in result.unknown]
            if any(ignored):  # counted as with schema_evolution off, and not held for the committer to add
                self._count_unknown(replace(result, unknown=[u for u, i in zip(result.unknown, ignored) if i]),
                                    partitions, offsets)
                result = replace(result, unknown=[u for u, i in zip(result.unknown, ignored) if not i])
        held = np.empty(0, dtype=np.int64)
        if self.evolution == "add":
            split = hold_back(result, self.decoder.schema, self.changes)
            table, kept, rejected, held = split.table, split.kept, split.rejected, split.held
            if len(held):
                self._hold(messages, held)
        else:
            table, kept, rejected = result.table, result.kept, [(i, str(reason)) for i, reason in result.rejected]
            if result.unknown:
                self._count_unknown(result, partitions, offsets)
        if table.num_rows:
            self.files.write(table)
        self.dead_letters.extend(dead_letter_from_message(messages[i], reason) for i, reason in rejected)
        # Within a partition messages arrive in offset order: the last one seen is the highest.
        for p, last in dict(zip(partitions, offsets)).items():
            self.position[p] = last + 1
        if self.spool is not None:
            self._keep(table, kept, partitions, offsets, before, held)

    def _keep(self, table: pa.Table, kept: np.ndarray, partitions: list[int], offsets: list[int],
              before: dict[int, int], held: np.ndarray) -> None:
        """ingest.keep_tail: the batch's rows for fresh reads (ingest/tail_spool.py); nothing
        for a partition with records held for a schema change (they are not rows yet)."""
        assert self.spool is not None
        after = {p: self.position[p] for p in before}
        if len(kept) != table.num_rows:  # not expected; kept nothing rather than rows of unknown records
            self.spool.gap(set(before))
            return
        parts = np.asarray(partitions)
        kept = np.asarray(kept, dtype=np.int64)
        self.spool.take(table, parts[kept], np.asarray(offsets, dtype=np.int64)[kept], before, after,
                        {int(p) for p in np.unique(parts[held])} if len(held) else set())

    def _count_unknown(self, result: DecodeResult, partitions: list[int], offsets: list[int]) -> None:
        """schema_evolution off: fields the schema lacks are not written, but counted per path."""
        parts, offs = np.asarray(partitions), np.asarray(offsets)
        batch: dict[str, FieldSighting] = {}
        for unknown in result.unknown:
            seen = batch.setdefault(display(unknown.path), FieldSighting())
            for p in np.unique(parts[unknown.rows]):
                mine = offs[unknown.rows][parts[unknown.rows] == p]
                seen.see_range(int(p), int(mine.min()), int(mine.max()), len(mine))
        merge_sightings(self.sightings, batch)

    def _hold(self, messages: list, rows: np.ndarray) -> None:
        """schema_evolution add: records the committer decodes after changing the schema."""
        for i in rows:
            m = messages[int(i)]
            kind, ts = m.timestamp()
            value = m.value()
            self.held.append(HeldRecord(m.partition(), m.offset(), ts if kind else None, m.key(), value))
            self.held_bytes += len(value or b"") + len(m.key() or b"")
        self.recheck_schema()

    def _drop_errors(self, messages: list, errors: list) -> tuple[list, list[int]]:
        """The records, and the partitions whose position the broker refused."""
        kept, refused = [], []
        for m, error in zip(messages, errors):
            if error is None:
                kept.append(m)
            elif error.code() in _OUT_OF_RANGE:
                refused.append(m.partition())
            elif error.code() != KafkaError._PARTITION_EOF:
                if error.fatal():
                    raise KafkaException(error)
                self.log.warning("kafka error", error=str(error))
        return kept, refused

    # -- flushing ---------------------------------------------------------------------
    def flush(self, final: bool) -> FlushUnit:
        """The open unit, closed: its files, ranges, dead letters and schema changes."""
        if self.spool is not None:
            self.spool.cut()  # a unit's end is a segment's: a commit's offsets start a reader's chain
        files = self.rolled + self.files.flush()
        self.rolled = []
        # Partitions that moved, jumped, or whose start the table does not hold yet.
        covered = {p for p, end in self.position.items() if end != self.unit_start[p]} | set(self.skips) \
            | self.unrecorded
        ranges = {p: (self.unit_start[p], self.position[p]) for p in sorted(covered)}
        unit = FlushUnit(run_id=self.run_id, writer=self.index, epoch=self.epoch, topic=self.topic,
                         table=self.config.table.identifier, route_value=self.route_value,
                         ranges=ranges, files=files, dead_letters=self.dead_letters, final=final,
                         messages=self.messages, skipped=self.skipped, skips=self.skips, held=self.held, new_fields=self.changes.add,
                         widen=self.changes.widen,
                         sightings=self.sightings)
        self.held, self.held_bytes, self.changes, self.sightings = [], 0, SchemaChanges(), {}
        self.unit_start = dict(self.position)
        self.skips, self.unrecorded = {}, set()
        self.dead_letters = []
        self.messages = self.skipped = 0
        if not unit.empty:
            self.log.debug("unit flushed", epoch=unit.epoch, files=len(files), records=unit.records,
                           dead_letters=len(unit.dead_letters), ranges=ranges)
        return unit

    def finish(self) -> FlushUnit:
        """Flush what is buffered as this writer's final unit and stop reading."""
        unit = self.flush(final=True)
        self.finished = True
        self.log.info("lane finished", next_offsets=self.position)
        return unit

    def close(self) -> None:
        if getattr(self, "spool", None) is not None:
            try:
                self.spool.close()  # its heartbeat goes: readers stop trusting the kept tail at once
            except OSError as exc:
                self.log.warning("kept tail not closed", error=str(exc)[:200])
        if getattr(self, "files", None) is not None and not self.finished:
            self.files.abort()  # uncommitted files become orphans; the data is re-read
        self.consumer = None  # the writer's: it closes it
