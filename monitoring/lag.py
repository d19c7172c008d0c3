"""Ingest lag: the table's recorded offsets against the broker's end offsets.

The recorded offsets come from the table (table_meta/offsets.py committed_position), the
source of truth ingest resumes from; consumer-group offsets are never used. The end of a
partition is the broker's high watermark, or with `monitoring.read_last_batch` (default) the
true end read from the last batch (common/watermarks.py: on tansu that makes lag exact).
"""

from __future__ import annotations

import json
from dataclasses import replace

from streamberg.common.config import StreambergConfig
from streamberg.common.watermarks import WatermarkReader, Watermarks
from streamberg.monitoring.model import Lag, PartitionLag
from streamberg.table_meta.offsets import PartitionOffsets


def read_lag(config: StreambergConfig, recorded: PartitionOffsets | None, timeout_seconds: float,
             now_ms: int, reader: WatermarkReader | None = None,
             marks: Watermarks | None = None) -> tuple[Watermarks, Lag | None]:
    """The broker's watermarks and, where the table records its offsets, its lag in records
    and in seconds (the oldest record it does not hold yet, read from Kafka: one record a
    lagging partition, all fetched together). `reader`: one a collection of many tables
    shares (lag_reader), left open; else one of the call's own. `marks`: the topic's
    watermarks where the caller read them already (tables of one topic in one pass). Raises
    BrokerUnreachable."""
    if reader is None:
        with lag_reader(config, timeout_seconds) as own:
            return read_lag(config, recorded, timeout_seconds, now_ms, own, marks)
    if marks is None:
        marks = reader.read(config.kafka.topic, read_ends=config.monitoring.read_last_batch)
    if recorded is None or not marks.exists:
        return marks, None
    lag = compute_lag(recorded, marks, config.kafka.start_offset)
    waiting = {int(p): (v.committed if v.committed is not None else marks.partitions[int(p)][0])
               for p, v in lag.partitions.items() if v.lag > 0}
    if not waiting:
        return marks, replace(lag, seconds=0.0)
    stamps = reader.timestamps(config.kafka.topic, waiting)
    oldest = min(stamps.values(), default=None)
    return marks, replace(lag, seconds=round(max(0.0, (now_ms - oldest) / 1000), 3) if oldest is not None else None)


def lag_reader(config: StreambergConfig, timeout_seconds: float) -> WatermarkReader:
    """The watermark reader status uses for a table's broker (its security settings too)."""
    return WatermarkReader(_settings(config), timeout_seconds)


def lag_reader_key(config: StreambergConfig) -> str:
    """Tables whose lag one reader may read: the same broker and client settings. The group id
    is left out: the reader never joins a group nor commits (it asks metadata, offsets and
    records of assigned partitions), so the first table's serves a pass of many."""
    return json.dumps({k: v for k, v in _settings(config).items() if k != "group.id"}, sort_keys=True, default=str)


def _settings(config: StreambergConfig) -> dict:
    kafka = config.kafka
    return {
        **kafka.consumer,  # security settings must apply to this client too
        "bootstrap.servers": kafka.bootstrap_servers,
        # Required by librdkafka for any consumer; this one never joins or commits.
        "group.id": f"{config.ingest_target.consumer_group}-status",
    }


def compute_lag(recorded: PartitionOffsets, watermarks: Watermarks, start_offset: str) -> Lag:
    """Per-partition lag of the table behind the broker (pure).

    A partition the table has never recorded starts at its low watermark with
    kafka.start_offset=earliest (all of it is lag), and with latest at its end (no lag)
    unless the table already holds positions of the topic: then it is a partition added
    since, which the ingest reads from its start (ingest/writer.py).
    """
    partitions: dict[str, PartitionLag] = {}
    ahead, behind_low = [], []
    for p in sorted(set(watermarks.partitions) | set(recorded)):
        low = watermarks.partitions.get(p, (0, 0))[0]
        high = watermarks.end(p)
        committed = recorded.get(p)
        if committed is None:
            lag = high - low if start_offset == "earliest" or recorded else 0
        else:
            lag = max(0, high - committed)
            if committed > high:
                ahead.append(str(p))
            elif committed < low:
                behind_low.append(str(p))
        partitions[str(p)] = PartitionLag(committed=committed, end=high, lag=lag,
                                          watermark=watermarks.partitions.get(p, (0, 0))[1])
    return Lag(total=sum(p.lag for p in partitions.values()), partitions=partitions, ahead_partitions=ahead,
               behind_low_partitions=behind_low)
