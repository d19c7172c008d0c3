"""The tail of a fresh read: the Kafka records a pinned snapshot lacks, read up to the
captured watermarks (fresh/bounds.py) and decoded by the ingest's own decoder (formats,
envelopes, key field, epoch units, size limit), so a record the ingest would dead-letter is
not returned and a Debezium tombstone is skipped as the ingest skips it.

The consumer is assigned (never subscribed, never committing) at the snapshot's offsets of
every partition at once, and reads each partition to its end: the end its fetch answers
report (`enable.partition.eof`; under read_committed, the last stable offset), or, once it has
passed the end the broker listed when the snapshot was pinned (fresh/bounds.py), wherever it
stands END_GRACE_SECONDS later (sooner once the client holds no more of it): while records
keep arriving a fetch may never come back empty, and a listed end may lag the last record
(tansu lists its last batch's start). Where a
partition ended is the read's watermark of that partition: every record before it was
delivered in order. Records past it (produced during the read) are dropped and the partition
paused, so each offset below the watermark is returned once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import orjson
import pyarrow as pa
from pyiceberg.schema import Schema

from streamberg.common.config import StreambergConfig
from streamberg.common.config.fleet import route_value
from streamberg.common.errors import FreshReadRefused
from streamberg.common.kafka_read import KafkaReadFailed, PartitionReader
from streamberg.common.kafka_settings import consumer_settings
from streamberg.common.log import get_logger
from streamberg.common.runtime import current
from streamberg.decode.envelopes import record_decoder
from streamberg.fresh.bounds import FreshBounds
from streamberg.fresh.cache import cache_folder, cached_rows
from streamberg.fresh.consumers import borrowed
from streamberg.table_meta.tail_segments import TailIdentity, alive

# Records decoded together (the ingest's poll batch is of the same order).
DECODE_BATCH = 20_000
# How long a partition read past the end listed at the pin may wait for its fetch's end
# before it ends where it stands (under a steady stream a fetch may never come back empty).
# A partition that got records in this read ends sooner, once the client's queue holds no
# more of it: a record batch is delivered whole, so the rest of the batch holding the listed
# end is already there.
END_GRACE_SECONDS = 0.1
# A read whose consumer hands over nothing at all (no record, no end event) this long while
# partitions are unfinished goes on with a new consumer, once: with enable.partition.eof a
# live connection answers every fetch, with records or an end (a kept consumer's connection
# may have died while it was idle). A broker that is only slow is then waited for.
STALL_SECONDS = 5.0


class _Stalled(Exception):
    """The consumer handed over nothing for STALL_SECONDS."""


@dataclass
class Tail:
    """The decoded tail: rows in the table's Arrow schema, and what the records were."""

    rows: pa.Table
    records: int  # Kafka records read below the watermarks
    rejected: int  # of them, records the ingest dead-letters (not returned)
    skipped: int  # of them, records that are no row (Debezium tombstones)
    seconds: float
    ends: dict[int, int]  # partition -> the offset its end was reached at (the read's watermark)
    cached: int = 0  # of the records, those whose rows came from the kept tail (fresh/cache.py)
    elsewhere: int = 0  # of them, records of a field-routed topic that are another table's


def routed_here(value: bytes | None, field: str, wanted: str) -> bool:
    """Whether a field-routed topic's record is the table's of route value `wanted`: the
    writers' rule (ingest/writer.py): a JSON object whose `field` is that value as a table-name
    part. A record that is not (not JSON, no valid value) is another table's, or its route's
    unrouted dead letters."""
    try:
        record = orjson.loads(value) if value is not None else None
    except orjson.JSONDecodeError:
        return False
    if not isinstance(record, dict):
        return False
    try:
        return route_value(record.get(field)) == wanted
    except ValueError:
        return False


def tail_identity(config: StreambergConfig, table: object) -> TailIdentity:
    """What the table's kept tail must be of to serve this read: the table's UUID and its
    topic (name and id, a fact the runtime keeps for a few seconds: a read to the kept tail's
    end makes no broker round trip of its own); segments of anything else are never taken
    (table_meta/tail_segments.py)."""
    topic = config.kafka.topic
    return TailIdentity(str(table.metadata.table_uuid), topic,  # type: ignore[attr-defined]
                        current().topic_id(consumer_settings(config), topic))


def kept_tail_alive(config: StreambergConfig) -> bool:
    """Whether a live keeper (the ingest under ingest.keep_tail, or `streamberg tail`) keeps
    this table's tail where this process can read it. A field-routed table's is never kept."""
    return config.route_field is None and alive(cache_folder(config))


def read_kept(config: StreambergConfig, schema: Schema, bounds: FreshBounds, identity: TailIdentity) -> Tail:
    """The tail as far as the kept tail chains from the snapshot's offsets, no further: each
    partition's watermark is where its chain ends (every record below it is in the snapshot
    or in the segments, so the read is exact to it). No broker round trip."""
    started = time.monotonic()
    parts, ends, cached = cached_rows(cache_folder(config), identity, schema.schema_id, dict(bounds.committed))
    rows = pa.concat_tables(parts) if parts else record_decoder(config, schema).file_schema.empty_table()
    return Tail(rows, cached, 0, 0, time.monotonic() - started, ends, cached)


def read_tail(config: StreambergConfig, schema: Schema, bounds: FreshBounds, timeout_seconds: float,
              route_value_of_table: str | None = None, identity: TailIdentity | None = None) -> Tail:
    """Read and decode every record after the snapshot's offsets up to each partition's end;
    raise FreshReadRefused when Kafka does not hand them over within `timeout_seconds`.
    A field-routed topic's table (config.route_field) decodes its route value's records
    alone (`route_value_of_table`; None: the route's unrouted table, which holds no rows)."""
    started = time.monotonic()
    decoder = record_decoder(config, schema)
    starts = {p: start for p, start in bounds.committed.items() if p in bounds.watermarks}
    parts: list[pa.Table] = []
    counts = {"records": 0, "rejected": 0, "skipped": 0, "elsewhere": 0}
    if not starts:
        return Tail(decoder.file_schema.empty_table(), 0, 0, 0, time.monotonic() - started, {})
    routed = config.route_field is not None
    cached = 0
    if not routed and identity is not None:  # the kept tail first (fresh/cache.py): Kafka then only past it
        parts, starts, cached = cached_rows(cache_folder(config), identity, schema.schema_id, starts)
    counts["records"] = cached
    pending: list = []

    def decode() -> None:
        if not pending:
            return
        counts["records"] += len(pending)
        mine = pending
        if routed:
            assert config.route_field is not None
            mine = [] if route_value_of_table is None else \
                [m for m in pending if routed_here(m.value(), config.route_field, route_value_of_table)]
            counts["elsewhere"] += len(pending) - len(mine)
        if mine:
            keys = [m.key() for m in mine] if decoder.needs_keys else None
            result = decoder.decode([m.value() for m in mine], keys,
                                    ([m.partition() for m in mine], [m.offset() for m in mine]))
            counts["rejected"] += len(result.rejected)
            counts["skipped"] += result.skipped
            if result.table.num_rows:
                parts.append(result.table)
        pending.clear()

    # partition -> when the read passed the end the broker listed at the pin: it ends at its
    # fetch's end (the reader's end-of-partition), or END_GRACE_SECONDS later where it stands
    # (records may never stop coming). Where a partition ended is the read's watermark of it.
    passed: dict[int, float] = {p: time.monotonic() for p, start in starts.items() if start >= bounds.watermarks[p]}

    def _follow(reader: PartitionReader, may_stall: bool) -> None:
        """Read every unfinished partition to its end; _Stalled (if `may_stall`) when nothing at
        all (no record, no end event) came for STALL_SECONDS."""
        heard = time.monotonic()
        while not reader.done:
            left = deadline - time.monotonic()
            if left <= 0:
                unfinished = ", ".join(f"{p} at {reader.next_offset[p]} of {bounds.watermarks[p]}"
                                       for p in reader.unfinished)
                raise FreshReadRefused(
                    f"{bounds.table}: Kafka did not hand over the tail within {timeout_seconds:g} s (partition "
                    f"{unfinished}, from {', '.join(f'{p}: {o}' for p, o in sorted(starts.items()))}); raise the "
                    f"read's timeout or read without --fresh")
            # Ask for about what is left (records below the broker's watermarks, one end event a
            # partition): consume() returns once that many arrived instead of waiting out its timeout.
            # Past the listed end: what the queue holds (a partition ends when it holds no more).
            past = [p for p in passed if p not in reader.finished]
            wanted = DECODE_BATCH if past else \
                max(1, min(DECODE_BATCH, sum(max(0, bounds.watermarks[p] - reader.next_offset[p]) + 1
                                             for p in reader.unfinished)))
            waiting = (0.002 if any(p in reader.received for p in past) else 0.01) if past else 0.5
            try:
                records = reader.read(wanted, min(left, waiting))
            except KafkaReadFailed as exc:
                raise FreshReadRefused(f"{bounds.table}: the Kafka client failed: {exc}") from None
            if reader.failed:
                partition, error = min(reader.failed.items())
                raise FreshReadRefused(f"{bounds.table}: partition {partition} of {bounds.topic!r}: {error}")
            now = time.monotonic()
            if reader.last_batch_size:
                heard = now
            elif may_stall and now - heard >= STALL_SECONDS:
                raise _Stalled()
            got: set[int] = set()  # partitions that got records in this batch
            for message in records:
                partition, offset = message.partition(), message.offset()
                pending.append(message)
                got.add(partition)
                if partition not in passed and offset + 1 >= bounds.watermarks[partition]:
                    passed[partition] = time.monotonic()
            now = time.monotonic()
            drained = reader.last_batch_size < wanted  # the queue gave all it held
            for partition, since in passed.items():
                if partition not in reader.finished and (
                        now - since >= END_GRACE_SECONDS or
                        (drained and partition in reader.received and partition not in got)):
                    # Every record before where it stands was delivered, in order: exact there.
                    reader.finish(partition, reader.next_offset[partition])
            if len(pending) >= DECODE_BATCH:
                decode()
    deadline = time.monotonic() + timeout_seconds
    stalls = 0
    reader: PartitionReader | None = None
    while reader is None or not reader.done:
        try:
            # After a stall, a new consumer: the kept one's connection may be dead (a fetch on it
            # would wait out socket.timeout.ms while the broker has the records).
            with borrowed(config, fresh=stalls > 0) as consumer:
                if reader is None:
                    reader = PartitionReader(consumer, bounds.topic, starts)
                else:
                    reader.reassign(consumer)
                _follow(reader, may_stall=stalls == 0)  # once: a broker slow to answer is waited for
        except _Stalled:
            stalls += 1
            assert reader is not None
            get_logger("fresh.tail", table=bounds.table, topic=bounds.topic).warning(
                "Kafka handed over nothing for a while; reading on with a new consumer", stalls=stalls,
                positions={p: reader.next_offset[p] for p in reader.unfinished})
    assert reader is not None  # `starts` is not empty: the loop made one
    decode()
    rows = pa.concat_tables(parts) if parts else decoder.file_schema.empty_table()
    return Tail(rows, counts["records"], counts["rejected"], counts["skipped"], time.monotonic() - started,
                dict(reader.finished), cached, counts["elsewhere"])
