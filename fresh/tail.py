"""The tail of a fresh read: the Kafka records a pinned snapshot lacks, read up to the
captured watermarks (fresh/bounds.py) and decoded by the ingest's own decoder (formats,
envelopes, key field, epoch units, size limit), so a record the ingest would dead-letter is
not returned and a Debezium tombstone is skipped as the ingest skips it.

The consumer is assigned (never subscribed, never committing) at the snapshot's offsets of
every partition at once; a partition is done at its watermark or at its end
(`enable.partition.eof`: a broker whose watermark runs past the last record, or records
hidden by an open transaction under read_committed, end it there). Records at or past the
watermark (produced during the read) are dropped, so each offset below it is returned once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, TopicPartition
from pyiceberg.schema import Schema

from streamberg.common.config import StreambergConfig
from streamberg.common.errors import FreshReadRefused
from streamberg.fresh.bounds import FreshBounds
from streamberg.ingest.decode.envelopes import record_decoder
from streamberg.ingest.source import consumer_settings

# Records decoded together (the ingest's poll batch is of the same order).
DECODE_BATCH = 20_000


@dataclass
class Tail:
    """The decoded tail: rows in the table's Arrow schema, and what the records were."""

    rows: pa.Table
    records: int  # Kafka records read below the watermarks
    rejected: int  # of them, records the ingest dead-letters (not returned)
    skipped: int  # of them, records that are no row (Debezium tombstones)
    seconds: float


def read_tail(config: StreambergConfig, schema: Schema, bounds: FreshBounds, timeout_seconds: float) -> Tail:
    """Read and decode every record of `bounds`' tail; raise FreshReadRefused when Kafka does
    not hand them over within `timeout_seconds`."""
    started = time.monotonic()
    decoder = record_decoder(config, schema)
    wanted = {p: (start, bounds.watermarks[p]) for p, start in bounds.committed.items()
              if p in bounds.watermarks and bounds.watermarks[p] > start}
    parts: list[pa.Table] = []
    counts = {"records": 0, "rejected": 0, "skipped": 0}
    if not wanted:
        return Tail(decoder.file_schema.empty_table(), 0, 0, 0, time.monotonic() - started)
    settings = {**consumer_settings(config), "group.id": f"streamberg-fresh-{config.table.identifier}",
                "enable.partition.eof": True, "isolation.level": "read_committed"}
    consumer = Consumer(settings)
    pending: list = []

    def decode() -> None:
        if not pending:
            return
        keys = [m.key() for m in pending] if decoder.needs_keys else None
        result = decoder.decode([m.value() for m in pending], keys,
                                ([m.partition() for m in pending], [m.offset() for m in pending]))
        counts["records"] += len(pending)
        counts["rejected"] += len(result.rejected)
        counts["skipped"] += result.skipped
        if result.table.num_rows:
            parts.append(result.table)
        pending.clear()

    try:
        consumer.assign([TopicPartition(bounds.topic, p, start) for p, (start, _) in sorted(wanted.items())])
        open_partitions = set(wanted)
        deadline = started + timeout_seconds
        while open_partitions:
            left = deadline - time.monotonic()
            if left <= 0:
                raise FreshReadRefused(
                    f"{bounds.table}: Kafka did not hand over the tail within {timeout_seconds:g} s (partitions "
                    f"{sorted(open_partitions)} unfinished); raise the read's timeout or read without --fresh")
            for message in consumer.consume(DECODE_BATCH, min(left, 0.5)):
                partition = message.partition()
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        open_partitions.discard(partition)
                        continue
                    if error.fatal() or error.code() in (KafkaError.OFFSET_OUT_OF_RANGE,
                                                         KafkaError._AUTO_OFFSET_RESET):
                        raise FreshReadRefused(f"{bounds.table}: partition {partition} of {bounds.topic!r}: "
                                               f"{error.str()}")
                    continue  # a passing error: librdkafka retries
                end = wanted[partition][1]
                offset = message.offset()
                if offset >= end:
                    open_partitions.discard(partition)
                    continue
                pending.append(message)
                if offset == end - 1:
                    open_partitions.discard(partition)
            if len(pending) >= DECODE_BATCH:
                decode()
        decode()
    finally:
        consumer.close()
    rows = pa.concat_tables(parts) if parts else decoder.file_schema.empty_table()
    return Tail(rows, counts["records"], counts["rejected"], counts["skipped"], time.monotonic() - started)
