"""A topic's positions on the broker: every partition's low and high watermark, and its true end.

Shared by the ingest (its committed offsets are checked against them before it reads, so a
position Kafka lost is never passed over in silence) and by monitoring (lag).

The embedded tansu broker reports as high watermark the base offset of the partition's last
record batch + 1, short of the true end by the rest of that batch (README, Known limits). So
where the true end matters, the last batch is also read: the partition is assigned one record
before its watermark and polled until end-of-partition, and the end is one past the last
offset seen. On Kafka that costs one small fetch per partition and changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaException, TopicPartition

from streamberg.common.errors import BrokerUnreachable
from streamberg.common.kafka_read import PartitionReader


@dataclass(frozen=True)
class Watermarks:
    """A topic's (low, high) watermark per partition, `ends` the true end where read;
    `exists` False when the broker lacks the topic."""

    exists: bool
    partitions: dict[int, tuple[int, int]]
    ends: dict[int, int] = field(default_factory=dict)

    def low(self, partition: int) -> int:
        return self.partitions.get(partition, (0, 0))[0]

    def end(self, partition: int) -> int:
        high = self.partitions.get(partition, (0, 0))[1]
        return max(high, self.ends.get(partition, high))


def kafka_error_text(exc: KafkaException) -> str:
    error: Any = exc.args[0] if exc.args else None
    return str(error.str()) if hasattr(error, "str") else str(exc)


def marks_consumer(settings: Mapping[str, Any], timeout_seconds: float) -> Consumer:
    """A consumer that only asks for positions: it never joins its group or commits, reports
    end-of-partition, and never jumps elsewhere on a bad offset. `settings` carry the
    bootstrap servers, a group id and the security settings."""
    return Consumer({
        **settings,
        "enable.auto.commit": False,
        # librdkafka would print connection failures itself; callers report them once.
        "log_level": 0,
        "socket.connection.setup.timeout.ms": max(1000, int(timeout_seconds * 1000)),
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
        "fetch.wait.max.ms": 100,
    })


def topic_partitions_of(consumer: Consumer, topic: str, timeout_seconds: float, bootstrap: str) -> list[int] | None:
    """The topic's partitions; None when the broker lacks the topic."""
    try:
        meta = consumer.list_topics(topic, timeout=timeout_seconds)
    except KafkaException as exc:
        raise BrokerUnreachable(f"broker {bootstrap}: {kafka_error_text(exc)}") from exc
    found = meta.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        return None
    return sorted(found.partitions)


def topic_partitions(consumer: Consumer, topic: str, timeout: float = 30.0) -> list[int]:
    """The topic's partitions, waiting up to `timeout` for it to be made (RuntimeError after)."""
    deadline = time.monotonic() + timeout
    while True:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is not None and meta.error is None and meta.partitions:
            return sorted(meta.partitions)
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic!r} not found on {consumer}; create it first")
        time.sleep(0.5)


# ListOffsets' special timestamps: the partition's first offset, and its end (the last stable
# offset for a read_committed consumer), as get_watermark_offsets asks them.
_EARLIEST, _LATEST = -2, -1


def partition_watermarks(consumer: Consumer, topic: str, partitions: Collection[int], timeout_seconds: float,
                         bootstrap: str) -> dict[int, tuple[int, int]]:
    """(low, high) watermark of each of `partitions`, all within `timeout_seconds`: two
    ListOffsets requests for all of them (offsets_for_times with the special timestamps),
    not two per partition as get_watermark_offsets would ask (a fresh read pins its tail's end
    in one round trip of each, and an ingest of many tables checks its positions the same way)."""
    wanted = sorted(partitions)
    if not wanted:
        return {}
    deadline = time.monotonic() + timeout_seconds
    answers: dict[int, dict[int, int]] = {}
    for timestamp in (_EARLIEST, _LATEST):
        try:
            listed = consumer.offsets_for_times([TopicPartition(topic, p, timestamp) for p in wanted],
                                                timeout=max(0.5, deadline - time.monotonic()))
        except KafkaException as exc:
            raise BrokerUnreachable(f"broker {bootstrap}: offsets of {topic}: {kafka_error_text(exc)}") from exc
        failed = [tp for tp in listed if tp.error is not None or tp.offset < 0]
        if failed:
            raise BrokerUnreachable(f"broker {bootstrap}: offsets of " + ", ".join(
                f"{topic}[{tp.partition}]: {tp.error.str() if tp.error is not None else 'none listed'}"
                for tp in failed))
        answers[timestamp] = {tp.partition: tp.offset for tp in listed}
    missing = [p for p in wanted if p not in answers[_EARLIEST] or p not in answers[_LATEST]]
    if missing:
        raise BrokerUnreachable(f"broker {bootstrap}: no offsets listed for {topic} partitions {missing}")
    return {p: (answers[_EARLIEST][p], answers[_LATEST][p]) for p in wanted}


def read_true_ends(consumer: Consumer, topic: str, marks: dict[int, tuple[int, int]],
                   deadline: float) -> dict[int, int]:
    """One past the last offset readable in each partition, reading from the watermark's
    batch on (all partitions fetched together, common/kafka_read.py) to its end-of-partition.
    A partition not done by the deadline, or whose read failed, keeps what was seen, which
    is still no less than its watermark."""
    starts = {p: high - 1 for p, (low, high) in marks.items() if high > low}
    if not starts:
        return {}
    try:
        reader = PartitionReader(consumer, topic, starts)
        for _ in reader.batches(deadline):
            pass
        return {p: reader.next_offset[p] for p in reader.received}
    finally:
        consumer.unassign()


def read_timestamps(consumer: Consumer, topic: str, offsets: Mapping[int, int], deadline: float) -> dict[int, int]:
    """The timestamp (ms since the epoch, as the record carries it) of the record at each
    partition's offset (or the first after it: a transaction's marker holds no record), all
    partitions fetched together; a partition not answered by the deadline, or whose record has
    no timestamp, is left out."""
    if not offsets:
        return {}
    found: dict[int, int] = {}
    taken: set[int] = set()  # partitions whose first record was read (with a timestamp or not)
    try:
        reader = PartitionReader(consumer, topic, offsets)
        for records in reader.batches(deadline):
            for message in records:
                partition = message.partition()
                if partition in taken:
                    continue  # its first record was taken
                taken.add(partition)
                reader.finish(partition, message.offset())
                kind, at_ms = message.timestamp()
                if kind != TIMESTAMP_NOT_AVAILABLE and at_ms is not None and at_ms >= 0:
                    found[partition] = at_ms
        return found
    finally:
        consumer.unassign()


class WatermarkReader:
    """Watermarks of many topics through one consumer of its own, made at the first read and
    closed with the reader: a writer opening a hundred tables asks the broker a hundred
    times, not a hundred consumers' connections and metadata (each ~30 ms on a local broker).
    `settings` carry the bootstrap servers, a group id and the security settings."""

    def __init__(self, settings: Mapping[str, Any], timeout_seconds: float) -> None:
        self.settings, self.timeout_seconds = dict(settings), timeout_seconds
        self.bootstrap = str(settings.get("bootstrap.servers", "?"))
        self._consumer: Consumer | None = None

    def __enter__(self) -> WatermarkReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = marks_consumer(self.settings, self.timeout_seconds)
        return self._consumer

    def read(self, topic: str, partitions: Collection[int] | None = None, read_ends: bool = False,
             ends_past: Mapping[int, int] | None = None, present: Collection[int] | None = None) -> Watermarks:
        """The topic's watermarks (all its partitions, or those given). The true end is read for
        every partition with `read_ends`, else for those whose offset in `ends_past` is beyond
        the high watermark (on tansu that is normal just past it). `present`: the topic's
        partitions as the caller's metadata has them (else asked here). Raises BrokerUnreachable."""
        deadline = time.monotonic() + self.timeout_seconds
        listed = sorted(present) if present else topic_partitions_of(self.consumer, topic, self.timeout_seconds,
                                                                      self.bootstrap)
        if listed is None:
            return Watermarks(exists=False, partitions={})
        wanted = [p for p in listed if partitions is None or p in partitions]
        marks = partition_watermarks(self.consumer, topic, wanted, self.timeout_seconds, self.bootstrap)
        past = marks if read_ends else {p: marks[p] for p, offset in (ends_past or {}).items()
                                        if p in marks and offset > marks[p][1]}
        ends = read_true_ends(self.consumer, topic, past, deadline) if past else {}
        return Watermarks(exists=True, partitions=marks, ends=ends)

    def timestamps(self, topic: str, offsets: Mapping[int, int]) -> dict[int, int]:
        """The timestamp of the record at each partition's offset (read_timestamps)."""
        return read_timestamps(self.consumer, topic, offsets, time.monotonic() + self.timeout_seconds)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def read_topic_watermarks(settings: Mapping[str, Any], topic: str, timeout_seconds: float,
                          partitions: Collection[int] | None = None, read_ends: bool = False,
                          ends_past: Mapping[int, int] | None = None) -> Watermarks:
    """One topic's watermarks with a consumer of its own (WatermarkReader.read). Raises
    BrokerUnreachable."""
    with WatermarkReader(settings, timeout_seconds) as reader:
        return reader.read(topic, partitions, read_ends=read_ends, ends_past=ends_past)
