"""Lag as the ingest will read it (monitoring/lag.py, pure)."""

from __future__ import annotations

from streamberg.common.watermarks import Watermarks
from streamberg.monitoring.lag import compute_lag


def test_a_partition_added_to_an_ingested_topic_is_all_lag_even_with_latest() -> None:
    marks = Watermarks(exists=True, partitions={0: (0, 10), 1: (2, 7)})
    # The topic's first start with latest: nothing before it is lag.
    assert compute_lag({}, marks, "latest").total == 0
    # The table ingests the topic already: partition 1 is new and will be read from its start.
    lag = compute_lag({0: 10}, marks, "latest")
    assert lag.partitions["0"].lag == 0 and lag.partitions["1"].lag == 5 and lag.total == 5
    assert compute_lag({0: 4}, marks, "earliest").total == 6 + 5


def test_every_partitions_watermarks_in_two_requests_are_what_the_broker_lists_one_by_one(broker: str) -> None:
    """common/watermarks.partition_watermarks asks all partitions at once (two ListOffsets): the
    same (low, high) as get_watermark_offsets asked per partition, empty partitions included;
    a partition the topic lacks and a broker that is not there are named, not raised raw."""
    import uuid

    import pytest
    from confluent_kafka import Producer, TopicPartition

    from streamberg.common.broker import ensure_topic
    from streamberg.common.errors import BrokerUnreachable
    from streamberg.common.watermarks import marks_consumer, partition_watermarks

    topic = f"marks-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker, topic, 3)
    producer = Producer({"bootstrap.servers": broker, "linger.ms": 0})
    for partition, count in ((0, 5), (2, 3)):  # partition 1 stays empty
        for i in range(count):
            producer.produce(topic, f"{partition}-{i}".encode(), partition=partition)
            producer.flush(10)  # a batch a record: the broker's listed end is the true end
    consumer = marks_consumer({"bootstrap.servers": broker, "group.id": "marks", "isolation.level": "read_committed"}, 10)
    try:
        one_by_one = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                      for p in range(3)}
        assert partition_watermarks(consumer, topic, [2, 0, 1], 10, broker) == one_by_one == {
            0: (0, 5), 1: (0, 0), 2: (0, 3)}
        assert partition_watermarks(consumer, topic, [], 10, broker) == {}
        with pytest.raises(BrokerUnreachable, match=rf"{topic}\[7\]"):
            partition_watermarks(consumer, topic, [0, 7], 5, broker)
    finally:
        consumer.close()
    absent = marks_consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "marks"}, 1)
    try:
        with pytest.raises(BrokerUnreachable, match=r"broker 127\.0\.0\.1:1: offsets of"):
            partition_watermarks(absent, topic, [0], 1, "127.0.0.1:1")
    finally:
        absent.close()
