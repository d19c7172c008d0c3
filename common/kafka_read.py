"""Reading a topic's partitions from given offsets: the one read loop (assign, bounded
consume, end detection, pause) that replay, the positions' reads, a route's sampling, the
fresh tail and its keeper share.

A `PartitionReader` reads the partitions it is given from their start offsets. A partition
is *finished* where its reading ends, and paused there so its later records are not fetched:
- at its end offset, where one is given (exclusive): records at or past it are dropped;
- at its end-of-partition event, unless `until_eof=False` (the consumer must set
  `enable.partition.eof`): every record before the event's offset was delivered first (one
  queue a partition), so that offset is where the partition ended, exactly;
- on a partition error that retrying does not mend (offset out of range, an automatic offset
  reset, a fatal error): the error is kept in `failed` and the caller decides (a fresh read
  refuses, a replay stops, a read of the positions keeps what it saw);
- where the caller ends it by a rule of its own (`finish`: the fresh tail past the end the
  broker listed).
A client-wide fatal error raises `KafkaReadFailed`; a passing error is librdkafka's to retry.
Records of another topic (a reused consumer) or of a finished partition are never returned,
so each offset is handed over once, in its partition's order.

The reader does not own the consumer: the caller makes, reuses and closes it
(fresh/consumers.py lends kept ones).

Every read of a consumer in the product is one `consume_batch`: one bounded consume, the
client-wide events taken out (a fatal one raises KafkaReadFailed). The reader above is built
on it, and so is the ingest's source (ingest/source.py), which reads every table's partitions
continuously through one consumer and hands each partition's messages, their errors included,
to its table's lane: a lane decides on its partition's errors (a refused position, a fatal
one), the client's are decided here, once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

# Partition errors that retrying does not mend: the read of that partition ends there.
_PARTITION_FAILURES = (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET)


class KafkaReadFailed(Exception):
    """The Kafka client failed as a whole (a fatal error no partition names)."""


def consume_batch(consumer: Any, max_records: int, timeout: float) -> tuple[list[Any], int]:
    """One bounded consume: the partitions' messages it gave (their errors included, in order)
    and how many messages it gave in all. A client-wide event (no partition) is taken out: a
    fatal one raises KafkaReadFailed (the client is dead: a reader that went on would wait
    forever), a passing one is librdkafka's to retry."""
    batch = consumer.consume(max_records, timeout)
    messages = []
    for message in batch:
        if message.partition() is None:
            error = message.error()
            if error is not None and error.fatal():
                raise KafkaReadFailed(error.str())
            continue
        messages.append(message)
    return messages, len(batch)


class PartitionReader:
    """The partitions `starts` names, each read from its offset there (see the module)."""

    def __init__(self, consumer: Any, topic: str, starts: Mapping[int, int],
                 ends: Mapping[int, int] | None = None, *, until_eof: bool = True) -> None:
        self.topic = topic
        self.ends = dict(ends or {})  # partition -> its end offset (exclusive), where given
        self.until_eof = until_eof
        self.next_offset = dict(starts)  # partition -> the offset after the last record returned
        self.finished: dict[int, int] = {}  # partition -> where its reading ended
        self.failed: dict[int, str] = {}  # partition -> the error that ended it
        self.received: set[int] = set()  # partitions that returned records
        self.last_batch_size = 0  # messages the last consume() gave, events and dropped ones included
        for partition, start in starts.items():
            end = self.ends.get(partition)
            if end is not None and start >= end:
                self.finished[partition] = start  # nothing to read
        self.consumer = consumer
        self._assign()

    def _assign(self) -> None:
        assigned = [TopicPartition(self.topic, p, self.next_offset[p]) for p in self.unfinished]
        self.consumer.assign(assigned)
        # A reused consumer keeps a partition paused by an earlier read across unassign and
        # assign (librdkafka): it would never be fetched again.
        if assigned:
            self.consumer.resume(assigned)

    @property
    def unfinished(self) -> list[int]:
        return sorted(p for p in self.next_offset if p not in self.finished)

    @property
    def done(self) -> bool:
        return len(self.finished) == len(self.next_offset)

    def reassign(self, consumer: Any) -> None:
        """Go on with another consumer (the kept one stalled): the unfinished partitions are
        assigned to it where their reading stands."""
        self.consumer = consumer
        self._assign()

    def finish(self, partition: int, at: int) -> None:
        """End the partition's reading at `at` and pause it: nothing past it is returned."""
        self.finished[partition] = at
        self.consumer.pause([TopicPartition(self.topic, partition)])

    def read(self, max_records: int, timeout: float) -> list[Any]:
        """One bounded consume: the records it gave that are not past their partition's end,
        in order; the partitions' ends and failures noted on the way."""
        batch, self.last_batch_size = consume_batch(self.consumer, max_records, timeout)
        records: list[Any] = []
        for message in batch:
            partition, offset, error = message.partition(), message.offset(), message.error()
            if message.topic() != self.topic or partition not in self.next_offset or partition in self.finished:
                continue  # another topic's, or past its partition's end (produced during the read)
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    if self.until_eof:
                        self.finish(partition, offset if offset is not None else self.next_offset[partition])
                elif error.fatal() or error.code() in _PARTITION_FAILURES:
                    self.failed[partition] = error.str()
                    self.finish(partition, self.next_offset[partition])
                continue  # else a passing error: librdkafka retries
            if offset is None:
                continue
            end = self.ends.get(partition)
            if end is not None and offset >= end:
                self.finish(partition, end)
                continue
            records.append(message)
            self.next_offset[partition] = offset + 1
            self.received.add(partition)
            if end is not None and offset + 1 >= end:
                self.finish(partition, end)
        return records

    def batches(self, deadline: float, max_records: int = 500, wait: float = 0.5) -> Iterator[list[Any]]:
        """The records, batch by batch, until every partition is finished or `deadline`
        (time.monotonic()) passes; the unfinished ones then stay in `unfinished`."""
        while not self.done and (left := deadline - time.monotonic()) > 0:
            records = self.read(max_records, min(left, wait))
            if records:
                yield records
