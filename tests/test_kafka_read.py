"""The one Kafka read loop (common/kafka_read.py) against a real broker: each offset of a
partition handed over once and in order, nothing past a partition's end (given, or its
end-of-partition event), records produced after a partition ended never returned, a partition
without an end event read on, and the readers built on it (the first record's timestamp, the
true end) right where a record and its partition's end come in one batch."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer

from streamberg.common.broker import ensure_topic
from streamberg.common.kafka_read import KafkaReadFailed, PartitionReader
from streamberg.common.watermarks import read_timestamps, read_true_ends

# Records produced into each partition: partition 2 is left empty.
COUNTS = {0: 40, 1: 25, 2: 0}


def _topic(broker: str) -> str:
    topic = f"kread-{time.time_ns()}"
    ensure_topic(broker, topic, len(COUNTS))
    _produce(broker, topic, COUNTS, start_ms=1_700_000_000_000)
    return topic


def _produce(broker: str, topic: str, counts: dict[int, int], start_ms: int) -> None:
    producer = Producer({"bootstrap.servers": broker})
    for partition, count in counts.items():
        for i in range(count):
            producer.produce(topic, value=f"{partition}:{i}".encode(), partition=partition, timestamp=start_ms + i)
    assert producer.flush(30) == 0


def _consumer(broker: str, eof: bool = True) -> Consumer:
    return Consumer({"bootstrap.servers": broker, "group.id": "kread-test", "enable.partition.eof": eof,
                     "isolation.level": "read_committed", "auto.offset.reset": "error"})


def _read_all(reader: PartitionReader, seconds: float = 30) -> dict[int, list[int]]:
    seen: dict[int, list[int]] = {}
    for records in reader.batches(time.monotonic() + seconds, max_records=7, wait=0.2):
        for m in records:
            seen.setdefault(m.partition(), []).append(m.offset())
    return seen


def test_each_offset_once_in_order_and_nothing_past_a_partitions_end(broker: str) -> None:
    topic = _topic(broker)
    consumer = _consumer(broker)
    try:
        # Partition 0 from 5 to its given end 30; partition 1 from 3 to its end-of-partition;
        # partition 2 (empty) to its end-of-partition at 0.
        reader = PartitionReader(consumer, topic, {0: 5, 1: 3, 2: 0}, {0: 30})
        seen = _read_all(reader)
        assert reader.done and not reader.failed
        assert seen == {0: list(range(5, 30)), 1: list(range(3, COUNTS[1]))}
        assert reader.finished == {0: 30, 1: COUNTS[1], 2: 0}
        assert reader.received == {0, 1}
        # Produced after every partition ended: never handed over by this reader.
        _produce(broker, topic, {0: 5, 1: 5, 2: 5}, start_ms=1_800_000_000_000)
        late = [m for _ in range(5) for m in reader.read(100, 0.3)]
        assert late == []
    finally:
        consumer.close()


def test_a_start_at_its_end_reads_nothing_and_a_partition_without_end_events_reads_on(broker: str) -> None:
    topic = _topic(broker)
    consumer = _consumer(broker)
    try:
        reader = PartitionReader(consumer, topic, {0: 12, 1: 0}, {0: 12}, until_eof=False)
        assert reader.finished == {0: 12} and reader.unfinished == [1]
        seen = _read_all(reader, seconds=2)
        # Partition 1 read to the last record, then waited on: an end event does not end it.
        assert seen == {1: list(range(COUNTS[1]))}
        assert not reader.done and reader.unfinished == [1] and reader.next_offset[1] == COUNTS[1]
        # It goes on with another consumer where it stands, as the fresh tail after a stall.
        other = _consumer(broker)
        try:
            reader.reassign(other)
            _produce(broker, topic, {1: 3}, start_ms=1_800_000_000_000)
            more: list[int] = []
            for records in reader.batches(time.monotonic() + 20, wait=0.2):
                more += [m.offset() for m in records if m.partition() == 1]
                if len(more) >= 3:
                    break
            assert more == [COUNTS[1], COUNTS[1] + 1, COUNTS[1] + 2]
        finally:
            other.close()
    finally:
        consumer.close()


def test_the_first_records_timestamp_where_it_is_its_partitions_last(broker: str) -> None:
    """The record and its partition's end event come in one batch: the record is still read
    (an earlier draft took the partition as finished by the event and skipped its record)."""
    topic = _topic(broker)
    consumer = _consumer(broker)
    try:
        found = read_timestamps(consumer, topic, {0: COUNTS[0] - 1, 1: 10, 2: 0}, time.monotonic() + 20)
        assert found == {0: 1_700_000_000_000 + COUNTS[0] - 1, 1: 1_700_000_000_000 + 10}  # 2 holds none
        ends = read_true_ends(consumer, topic, {0: (0, COUNTS[0]), 1: (0, COUNTS[1]), 2: (0, 0)},
                              time.monotonic() + 20)
        assert ends == {0: COUNTS[0], 1: COUNTS[1]}
    finally:
        consumer.close()


class _WithEvents:
    """A real consumer whose next consume also gives client-wide events (librdkafka's own
    Message objects, as its callbacks would hand them): what no healthy broker can be made to
    send on cue."""

    def __init__(self, real: Consumer) -> None:
        self.real, self.events = real, []

    def consume(self, max_records: int, timeout: float) -> list:
        events, self.events = self.events, []
        return events + self.real.consume(max_records, timeout)

    def __getattr__(self, name: str):
        return getattr(self.real, name)


def _event(fatal: bool) -> Message:
    code = KafkaError._FATAL if fatal else KafkaError._ALL_BROKERS_DOWN
    return Message(error=KafkaError(code, "fenced for good" if fatal else "all brokers down", fatal=fatal))


def test_a_passing_client_event_is_dropped_and_a_fatal_one_ends_every_read_the_ingests_too(broker: str,
                                                                                          tmp_path) -> None:
    """Every read of a consumer is one bounded consume (consume_batch): the partition reader's
    and the ingest's source's alike. A passing client-wide event is taken out; a fatal one
    raises, where the ingest's source used to drop it with the messages of no table's topic
    (and would have waited on a dead client for ever)."""
    from streamberg.ingest.source import KafkaSource
    from tests.helpers import config_at, wait_for, write_config

    topic = _topic(broker)
    consumer = _WithEvents(_consumer(broker))
    try:
        reader = PartitionReader(consumer, topic, {0: 0, 1: 0, 2: 0})
        consumer.events = [_event(fatal=False)]
        assert _read_all(reader) == {0: list(range(COUNTS[0])), 1: list(range(COUNTS[1]))}
        consumer.events = [_event(fatal=True)]
        with pytest.raises(KafkaReadFailed, match="fenced for good"):
            reader.read(10, 0.2)
    finally:
        consumer.close()

    source = KafkaSource(config_at(write_config(tmp_path, broker, topic)), "events-test")
    try:
        source.consumer = _WithEvents(source.consumer)
        source.assign({(topic, 0): 0, (topic, 1): 0})
        source.consumer.events = [_event(fatal=False)]
        seen: dict[int, int] = {}

        def read_on() -> bool:
            for m in source.read(100, 0.2):
                assert m.error() is None and m.topic() == topic  # the event is not a table's message
                seen[m.partition()] = seen.get(m.partition(), 0) + 1
            return sum(seen.values()) >= COUNTS[0] + COUNTS[1]

        wait_for(read_on, 30, "the source's read of both partitions", every=0)
        assert seen == {0: COUNTS[0], 1: COUNTS[1]}
        source.consumer.events = [_event(fatal=True)]
        with pytest.raises(KafkaReadFailed, match="fenced for good"):
            source.read(10, 0.2)
    finally:
        source.close()
