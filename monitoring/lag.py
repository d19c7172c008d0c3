"""Ingest lag: the table's recorded offsets against the broker's end offsets.

The recorded offsets come from the table (common/offsets.py committed_position), the
source of truth ingest resumes from; consumer-group offsets are never used. The end of a
partition starts from the broker's high watermark (confluent-kafka get_watermark_offsets).
The embedded tansu broker reports as watermark the base offset of the partition's last
record batch + 1, short of the true end by the rest of that batch (README, Known limits), so
by default (`monitoring.read_last_batch`) the last batch is also read: every partition is
assigned one record before its watermark and polled until end-of-partition, and the end is
one past the last offset seen. On Kafka that costs one small fetch per partition and
changes nothing; on tansu it makes lag exact.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, TopicPartition

from streamberg.common.config import StreambergConfig
from streamberg.common.errors import BrokerUnreachable
from streamberg.common.offsets import PartitionOffsets
from streamberg.monitoring.model import Lag, PartitionLag


@dataclass(frozen=True)
class Watermarks:
    """A topic's (low, high) watermark per partition, `ends` the true end where read;
    `exists` False when the broker lacks the topic."""

    exists: bool
    partitions: dict[int, tuple[int, int]]
    ends: dict[int, int] = field(default_factory=dict)

    def end(self, partition: int) -> int:
        high = self.partitions.get(partition, (0, 0))[1]
        return max(high, self.ends.get(partition, high))


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
        # Reading the last batch: report end-of-partition, never jump elsewhere on a bad offset.
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
        "fetch.wait.max.ms": 100,
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
        ends = _read_last_batches(consumer, kafka.topic, marks, deadline) if config.monitoring.read_last_batch else {}
        return Watermarks(exists=True, partitions=marks, ends=ends)
    finally:
        consumer.close()


def _read_last_batches(consumer: Consumer, topic: str, marks: dict[int, tuple[int, int]],
                       deadline: float) -> dict[int, int]:
    """One past the last offset readable in each partition, reading from the watermark's
    batch on (all partitions fetched together). A partition not done by the deadline keeps
    what was seen, which is still no less than its watermark."""
    waiting = {p for p, (low, high) in marks.items() if high > low}
    if not waiting:
        return {}
    consumer.assign([TopicPartition(topic, p, marks[p][1] - 1) for p in sorted(waiting)])
    ends: dict[int, int] = {}
    while waiting and (left := deadline - time.monotonic()) > 0:
        message = consumer.poll(min(left, 0.5))
        if message is None:
            continue
        partition = message.partition()
        if message.error() is not None:
            waiting.discard(partition)  # end of partition (or an offset error): done with it
            continue
        ends[partition] = max(ends.get(partition, 0), message.offset() + 1)
    return ends


def compute_lag(recorded: PartitionOffsets, watermarks: Watermarks, start_offset: str) -> Lag:
    """Per-partition lag of the table behind the broker (pure).

    A partition the table has never recorded starts at its low watermark with
    kafka.start_offset=earliest (all of it is lag) and at its end with latest (no lag).
    """
    partitions: dict[str, PartitionLag] = {}
    ahead = []
    for p in sorted(set(watermarks.partitions) | set(recorded)):
        low = watermarks.partitions.get(p, (0, 0))[0]
        high = watermarks.end(p)
        committed = recorded.get(p)
        if committed is None:
            lag = high - low if start_offset == "earliest" else 0
        else:
            lag = max(0, high - committed)
            if committed > high:
                ahead.append(str(p))
        partitions[str(p)] = PartitionLag(committed=committed, end=high, lag=lag,
                                          watermark=watermarks.partitions.get(p, (0, 0))[1])
    return Lag(total=sum(p.lag for p in partitions.values()), partitions=partitions, ahead_partitions=ahead)
