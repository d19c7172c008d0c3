"""Ingest lag: the table's recorded offsets against the broker's end offsets.

The recorded offsets come from the table (common/offsets.py committed_position), the
source of truth ingest resumes from; consumer-group offsets are never used. The end of a
partition is the broker's high watermark (confluent-kafka get_watermark_offsets). With the
embedded tansu broker the watermark can lag the true end by a record batch (README, Known
limits), so lag is then an underestimate and a recorded offset can even be past it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from streamberg.common.config import StreambergConfig
from streamberg.common.offsets import PartitionOffsets
from streamberg.monitoring.model import Lag, PartitionLag


class BrokerUnreachable(RuntimeError):
    """The broker did not answer within the timeout; the message says what failed."""


@dataclass(frozen=True)
class Watermarks:
    """A topic's (low, high) watermark per partition; `exists` False when the broker lacks it."""

    exists: bool
    partitions: dict[int, tuple[int, int]]


def _kafka_error(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return error.str() if hasattr(error, "str") else str(exc)


def read_watermarks(config: StreambergConfig, timeout_seconds: float) -> Watermarks:
    """Ask the broker for every partition's watermarks, all within `timeout_seconds`."""
    kafka = config.kafka
    consumer = Consumer({
        **kafka.consumer,  # security settings must apply to this client too
        "bootstrap.servers": kafka.bootstrap_servers,
        # Required by librdkafka for any consumer; this one never joins or commits.
        "group.id": f"{config.consumer_group}-status",
        "enable.auto.commit": False,
        # librdkafka would print connection failures itself; we report them once, ourselves.
        "log_level": 0,
        "socket.connection.setup.timeout.ms": max(1000, int(timeout_seconds * 1000)),
    })
    deadline = time.monotonic() + timeout_seconds
    try:
        try:
            meta = consumer.list_topics(kafka.topic, timeout=timeout_seconds)
        except KafkaException as exc:
            raise BrokerUnreachable(f"broker {kafka.bootstrap_servers}: {_kafka_error(exc)}") from exc
        topic = meta.topics.get(kafka.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            return Watermarks(exists=False, partitions={})
        marks = {}
        for partition in sorted(topic.partitions):
            left = max(0.5, deadline - time.monotonic())
            try:
                marks[partition] = consumer.get_watermark_offsets(
                    TopicPartition(kafka.topic, partition), timeout=left, cached=False)
            except KafkaException as exc:
                raise BrokerUnreachable(
                    f"broker {kafka.bootstrap_servers}: end offset of {kafka.topic}[{partition}]: {_kafka_error(exc)}"
                ) from exc
        return Watermarks(exists=True, partitions=marks)
    finally:
        consumer.close()


def compute_lag(recorded: PartitionOffsets, watermarks: Watermarks, start_offset: str) -> Lag:
    """Per-partition lag of the table behind the broker (pure).

    A partition the table has never recorded starts at its low watermark with
    kafka.start_offset=earliest (all of it is lag) and at its end with latest (no lag).
    """
    partitions: dict[str, PartitionLag] = {}
    ahead = []
    for p in sorted(set(watermarks.partitions) | set(recorded)):
        low, high = watermarks.partitions.get(p, (0, 0))
        committed = recorded.get(p)
        if committed is None:
            lag = high - low if start_offset == "earliest" else 0
        else:
            lag = max(0, high - committed)
            if committed > high:
                ahead.append(str(p))
        partitions[str(p)] = PartitionLag(committed=committed, end=high, lag=lag)
    return Lag(total=sum(p.lag for p in partitions.values()), partitions=partitions, ahead_partitions=ahead)
