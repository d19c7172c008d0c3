"""A writer subtask's Kafka source: one consumer for every partition it owns of every table's
topic, assigned at the positions the table lanes ask for (ingest/writer.py). It never joins
a consumer group and never commits: positions come from the tables (exactly-once), and a
reassignment is the one way it moves.
"""

from __future__ import annotations

from confluent_kafka import Consumer, TopicPartition

from streamberg.common.config import StreambergConfig
from streamberg.common.kafka_read import consume_batch
from streamberg.common.kafka_settings import consumer_settings
from streamberg.common.watermarks import WatermarkReader, topic_partitions
from streamberg.ingest.positions import BROKER_TIMEOUT_SECONDS, positions_settings


def owned_partitions(partitions: list[int], index: int, parallelism: int) -> list[int]:
    return sorted(p for p in partitions if p % parallelism == index)


class KafkaSource:
    """The consumer of one writer subtask, for every table it writes."""

    def __init__(self, settings: StreambergConfig, run_id: str) -> None:
        # Assigned, never subscribed: the group id only names the client (librdkafka wants one).
        self.consumer = Consumer({**consumer_settings(settings), "group.id": f"streamberg-ingest-{run_id}"})
        self.partitions: dict[str, list[int]] = {}  # topic -> its partitions, as the last listing had them
        # Positions of every table's partitions through one consumer (ingest/positions.py).
        self.marks = WatermarkReader(positions_settings(settings), BROKER_TIMEOUT_SECONDS)

    def topics(self, timeout: float = 30.0) -> list[str]:
        """The broker's topics now; their partitions are kept for the lanes opened after it
        (a hundred tables' lanes open without a hundred more metadata requests)."""
        listed = self.consumer.list_topics(timeout=timeout).topics
        self.partitions = {name: sorted(meta.partitions) for name, meta in listed.items()
                           if meta.error is None and meta.partitions}
        return sorted(listed)

    def partitions_of(self, topic: str) -> list[int]:
        """The topic's partitions: from the last listing, else asked (waiting for a new topic)."""
        return self.partitions.get(topic) or topic_partitions(self.consumer, topic)

    def assign(self, positions: dict[tuple[str, int], int]) -> None:
        """Read each (topic, partition) from the offset given (the lowest its tables ask for)."""
        self.consumer.assign([TopicPartition(t, p, o) for (t, p), o in positions.items()])

    def read(self, max_records: int, timeout: float) -> list:
        """One bounded read of every assigned partition (common/kafka_read.consume_batch): the
        partitions' messages, errors included, for their tables' lanes to decide on; a fatal
        client-wide error raises KafkaReadFailed (the task fails and starts again from the
        positions its tables recorded)."""
        messages, _ = consume_batch(self.consumer, max_records, timeout)
        return messages

    def close(self) -> None:
        self.marks.close()
        self.consumer.close()
