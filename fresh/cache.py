"""A table's tail kept decoded (`streamberg tail`): fresh reads then cost what is left past it,
not the whole commit interval.

A keeper per table follows the table's topic from the offsets its snapshot recorded, decodes
the records as a fresh read would (fresh/tail.py: the ingest's decoder for the table's
schema) and writes them as Arrow files, one per partition and range of offsets, in
`<ingest.state_dir>/tail-cache/<table>/`:

    seg-<identity>-s<schema id>-p<partition>-<first offset>-<next offset>.arrow

A segment holds the decoded rows of every record in [first, next) of its partition, with
each row's offset (`__streamberg_offset`); records the ingest dead-letters are not in it.
Segments of a partition are contiguous: each starts where the one before ended. When a
commit covers a segment it is deleted; when the table's schema changes, every segment of
the older schema is dropped and the tail decoded again; segments of another identity (another
table under the same name, another topic) are removed and never read. A heartbeat file says
the keeper is alive (and which process it is); a reader uses segments only under a fresh
heartbeat of a live keeper, starting at the snapshot's own
offset, chaining segments while they are contiguous, and reading the rest from Kafka: exact
whether the cache is ahead, behind, absent or mid-write (segments appear by rename, whole).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer

from streamberg.common.catalog import shared_catalog
from streamberg.common.config import StreambergConfig
from streamberg.common.kafka_read import PartitionReader
from streamberg.common.kafka_settings import consumer_settings
from streamberg.common.log import get_logger
from streamberg.common.runtime import current as current_runtime
from streamberg.common.watermarks import topic_partitions
from streamberg.decode.envelopes import record_decoder
from streamberg.table_meta.offsets import committed_position
from streamberg.table_meta.tail_segments import (
    OFFSET_COLUMN,
    SegmentRefused,
    TailIdentity,
    alive,
    beat,
    cache_folder,
    chains,
    drop,
    end_beat,
    make_folder,
    merge,
    mergeable,
    read_segment,
    remove_foreign,
    segments,
    write_segment,
)

SEGMENT_RECORDS = 50_000  # a segment is written at this many records of a partition ...
SEGMENT_SECONDS = 0.25  # ... or this long after its first record
LOOK_SECONDS = 2.0  # how often the keeper reads the table's committed offsets and schema
BEAT_SECONDS = 1.0  # how often the keeper writes its heartbeat


def cached_rows(folder: Path, identity: TailIdentity, schema_id: int,
                starts: dict[int, int]) -> tuple[list[pa.Table], dict[int, int], int]:
    """The cached rows (of `identity` alone) from each partition's start, as far as its
    segments chain; the offsets where Kafka must take over, and the records the segments
    covered. A segment whose content disagrees with its name ends its chain there."""
    if not alive(folder):
        return [], dict(starts), 0
    parts: list[pa.Table] = []
    resume = dict(starts)
    covered = 0
    for partition, chain in chains(folder, starts, schema_id, identity).items():
        position = starts[partition]
        for segment in chain:
            try:
                rows = read_segment(segment, identity)
            except SegmentRefused as exc:
                get_logger("fresh.cache", topic=identity.topic).warning(
                    "kept tail segment refused; Kafka from its start", segment=segment.path.name, why=str(exc)[:200])
                break
            if rows is None:
                break  # deleted under us (a commit covered it): Kafka from here
            if position > segment.first:
                rows = rows.filter(pc.greater_equal(rows[OFFSET_COLUMN], position))
            parts.append(rows.drop_columns([OFFSET_COLUMN]))
            covered += segment.next - position
            position = segment.next
        resume[partition] = position
    return parts, resume, covered


class TailKeeper:
    """Keeps one table's tail decoded in its cache folder until `stop` is set."""

    def __init__(self, config: StreambergConfig, stop: threading.Event) -> None:
        self.config, self.stop = config, stop
        self.folder = cache_folder(config)
        self.log = get_logger("fresh.cache", table=config.table.identifier, topic=config.kafka.topic)
        self.segments_written = 0

    def run(self) -> None:
        make_folder(self.folder)
        try:
            while not self.stop.is_set():
                try:
                    self._follow()
                except Exception as exc:  # noqa: BLE001 - this table's keeper starts over; readers fall back to Kafka
                    end_beat(self.folder)
                    self.log.warning("tail keeper restarts", reason=f"{type(exc).__name__}: {str(exc)[:300]}")
                    self.stop.wait(2.0)
        finally:
            end_beat(self.folder)  # on every exit: readers stop trusting the kept tail at once

    def _table(self) -> tuple[Any, dict[int, int]]:
        # One catalog a process: a new one a look held its SQLite connections until a full collection.
        table = shared_catalog(self.config.catalog).load_table(self.config.table.identifier)
        return table, dict(committed_position(table, self.config.kafka.topic).offsets)

    def _follow(self) -> None:
        table, committed = self._table()
        schema = table.schema()
        decoder = record_decoder(self.config, schema)
        topic = self.config.kafka.topic
        self.identity = TailIdentity(str(table.metadata.table_uuid), topic,
                                     current_runtime().topic_id(consumer_settings(self.config), topic))
        remove_foreign(self.folder, self.identity)  # another table's or topic's: never a reader's
        self._drop(lambda s: s.schema_id != schema.schema_id)
        consumer = Consumer({**consumer_settings(self.config), "group.id": f"streamberg-tail-{self.config.table.identifier}",
                             "isolation.level": "read_committed", "fetch.wait.max.ms": 50})
        try:
            partitions = topic_partitions(consumer, topic, timeout=10)
            position = {p: self._chain_end(p, committed[p], schema.schema_id) for p in partitions if p in committed}
            # Read on and on (no end): an end-of-partition event only says it caught up.
            reader = PartitionReader(consumer, topic, position, until_eof=False)
            pending: dict[int, list] = {}
            started: dict[int, float] = {}
            next_look = time.monotonic() + LOOK_SECONDS
            next_beat = 0.0
            while not self.stop.is_set():
                if time.monotonic() >= next_beat:
                    beat(self.folder)
                    next_beat = time.monotonic() + BEAT_SECONDS
                for message in reader.read(10_000, 0.1):
                    partition = message.partition()
                    pending.setdefault(partition, []).append(message)
                    started.setdefault(partition, time.monotonic())
                if reader.failed:  # the keeper starts over from the table's offsets
                    raise RuntimeError("; ".join(f"partition {p}: {e}" for p, e in sorted(reader.failed.items())))
                now = time.monotonic()
                for partition in list(pending):
                    if len(pending[partition]) >= SEGMENT_RECORDS or now - started[partition] >= SEGMENT_SECONDS:
                        position[partition] = self._write(decoder, schema.schema_id, partition,
                                                          position[partition], pending.pop(partition))
                        started.pop(partition)
                if now >= next_look:
                    next_look = now + LOOK_SECONDS
                    table, committed = self._table()
                    if str(table.metadata.table_uuid) != self.identity.table_uuid:
                        self.log.info("the table was made again: its tail is kept anew")
                        return
                    if table.schema().schema_id != schema.schema_id:
                        self.log.info("schema changed: the tail is decoded again", schema=table.schema().schema_id)
                        return
                    self._drop(lambda s, done=committed: s.next <= done.get(s.partition, 0))
                    for partition in position:
                        for _ in range(32):  # bounded work a look; the next look goes on
                            if not self._merge(partition, schema.schema_id):
                                break
        finally:
            consumer.close()

    def _chain_end(self, partition: int, start: int, schema_id: int) -> int:
        """Where the partition's segments, chained from `start`, end; those off the chain are
        dropped (a reader could never reach them)."""
        chain = chains(self.folder, {partition: start}, schema_id, self.identity)[partition]
        chained = {segment.path for segment in chain}
        self._drop(lambda s: s.partition == partition and s.path not in chained)
        return chain[-1].next if chain else start

    def _write(self, decoder: Any, schema_id: int, partition: int, first: int, messages: list) -> int:
        """One segment of a partition's records from `first` (the previous segment's end)."""
        keys = [m.key() for m in messages] if decoder.needs_keys else None
        offsets = [m.offset() for m in messages]
        result = decoder.decode([m.value() for m in messages], keys, ([partition] * len(messages), offsets))
        kept = pa.array([offsets[int(i)] for i in result.kept], type=pa.int64()) if len(result.kept) else \
            pa.array([], type=pa.int64())
        rows = result.table.append_column(OFFSET_COLUMN, kept)
        end = offsets[-1] + 1
        write_segment(self.folder, self.identity, schema_id, partition, first, end, rows)
        self.segments_written += 1
        return end

    def _merge(self, partition: int, schema_id: int) -> bool:
        """One merge of a size tier of the partition's segments (table_meta/tail_segments.py)."""
        run = mergeable([s for s in segments(self.folder, self.identity)
                         if s.partition == partition and s.schema_id == schema_id])
        return run is not None and merge(self.folder, self.identity, run) is not None

    def _drop(self, covered: Any) -> None:
        drop(self.folder, covered)
