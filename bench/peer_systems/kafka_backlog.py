"""Reading a topic's backlog from offset 0 with confluent-kafka, as a user of a batch loader
writes it: assign every partition, consume until N records came. Shared by the peer scripts
(copied into no venv: the scripts put bench/peer_systems on their path)."""

from __future__ import annotations

from collections.abc import Iterator

from confluent_kafka import Consumer, TopicPartition


def batches(bootstrap: str, topic: str, partitions: int, records: int, size: int = 10_000) -> Iterator[list[bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "peer-bench", "enable.auto.commit": False,
                         "fetch.max.bytes": 64 * 1024 * 1024})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen = 0
    try:
        while seen < records:
            values = [m.value() for m in consumer.consume(size, 1.0) if m.error() is None]
            if values:
                seen += len(values)
                yield values
    finally:
        consumer.close()
