"""Where a fresh read's two halves meet: the pinned snapshot, the Kafka offsets it covers, and
the end of the tail (each partition's watermark, captured after the snapshot was pinned).

The ingest records in every commit, per partition, the next offset it has not committed
(table_meta/offsets.committed_position). So the records a snapshot S lacks are exactly those
from S's recorded offset up to the end of each partition; the tail (fresh/tail.py) is read
from there to each partition's end, reached after S was pinned, and that end is the read's
watermark. Whatever commits after S are not seen: S is pinned, and the tail covers them.

Refused, loudly (FreshReadRefused, naming the partition):
- a recorded offset below the partition's first offset (Kafka's retention deleted records
  the table never got: the ingest will report lost offsets; a fresh read cannot be exact);
- a recorded offset above the partition's end (the topic was recreated or truncated: the
  table's offsets are of another log);
- a partition with records the table has recorded no offset for and no start either (the
  ingest records where it begins each partition before its first commit,
  table_meta/offsets.record_starts, so this is only a table whose ingest has not opened it yet):
  where the ingest starts is its own rule (kafka.start_offset); read again once it runs.

Before a partition's first commit the read starts where the ingest recorded it began: the
table holds no row of that partition yet, so the tail from there is exactly its rows to come.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from pyiceberg.table import Table

from streamberg.common.config import StreambergConfig
from streamberg.common.errors import BrokerUnreachable, FreshReadRefused
from streamberg.common.watermarks import partition_watermarks, read_true_ends, topic_partitions_of
from streamberg.table_meta.offsets import committed_position, fresh_start_offsets


@dataclass(frozen=True)
class FreshBounds:
    """One fresh read's boundary: rows of `snapshot_id`, then per partition the records
    with offsets in [committed[p], watermark[p]). Pinned, `watermarks` are the ends the broker
    lists; after the tail was read, the ends it was read to (fresh/tail.py)."""

    table: str
    topic: str
    snapshot_id: int | None
    committed: dict[int, int]  # partition -> the snapshot's next offset (what the tail starts from)
    watermarks: dict[int, int] = field(default_factory=dict)  # partition -> end of the tail (exclusive)
    # A primary-key table (fresh/keyed.py): `snapshot_id` is the table's, the offsets are its
    # change log's, recorded by this change-log snapshot.
    changelog_snapshot_id: int | None = None

    @property
    def tail_records(self) -> int:
        """Kafka records in the tail (rows, dead letters and skipped records together)."""
        return sum(max(0, self.watermarks[p] - self.committed.get(p, 0)) for p in self.watermarks)

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "topic": self.topic, "snapshot_id": self.snapshot_id,
                "committed": {str(p): o for p, o in sorted(self.committed.items())},
                "watermarks": {str(p): o for p, o in sorted(self.watermarks.items())},
                "tail_records": self.tail_records,
                **({"changelog_snapshot_id": self.changelog_snapshot_id}
                   if self.changelog_snapshot_id is not None else {})}


def pin(table: Table, config: StreambergConfig, timeout_seconds: float) -> FreshBounds:
    """Pin the table's current snapshot and its offsets, then capture the watermarks."""
    import time

    from streamberg.fresh.consumers import borrowed

    topic = config.kafka.topic
    snapshot = table.current_snapshot()
    # On the lineage of the same loaded metadata; before a partition's first commit, where the
    # ingest recorded it began (table_meta/offsets.fresh_start_offsets): exact from the first record.
    offsets = fresh_start_offsets(table, topic)
    bootstrap = config.kafka.bootstrap_servers
    try:
        with borrowed(config) as consumer:
            partitions = topic_partitions_of(consumer, topic, timeout_seconds, bootstrap)
            if partitions is None:
                raise FreshReadRefused(f"{config.table.identifier}: topic {topic!r} is not on the broker (deleted?): "
                                       f"the table's recorded offsets have no log to continue from")
            listed = partition_watermarks(consumer, topic, partitions, timeout_seconds, bootstrap)
            # The listed end may lag the last record (tansu answers its last batch's start):
            # where the table's offset is past it, the true end is read before calling the
            # topic recreated.
            past = {p: listed[p] for p, offset in offsets.items() if p in listed and offset > listed[p][1]}
            ends = read_true_ends(consumer, topic, past, time.monotonic() + timeout_seconds) if past else {}
    except BrokerUnreachable as exc:
        raise FreshReadRefused(f"{config.table.identifier}: the broker did not give the tail's end: {exc}") from None
    marks = {p: (low, max(high, ends.get(p, high))) for p, (low, high) in listed.items()}
    bounds = FreshBounds(table=config.table.identifier, topic=topic,
                         snapshot_id=snapshot.snapshot_id if snapshot is not None else None,
                         committed=dict(offsets), watermarks={p: high for p, (_, high) in marks.items()})
    check(bounds, marks)
    return bounds


def pin_snapshot(table: Table, config: StreambergConfig) -> FreshBounds:
    """Pin the table's current snapshot and its offsets alone, asking the broker nothing (a
    committed read; a read to the kept tail's end sets its watermarks when it reads that tail)."""
    topic = config.kafka.topic
    snapshot = table.current_snapshot()
    return FreshBounds(table=config.table.identifier, topic=topic,
                       snapshot_id=snapshot.snapshot_id if snapshot is not None else None,
                       committed=dict(committed_position(table, topic).offsets))


def pin_kept(table: Table, config: StreambergConfig) -> FreshBounds:
    """The pin of a read to the kept tail's end (fresh/tail.read_kept): the snapshot and its
    offsets, watermarks there until the kept tail is read. (The checks against the broker's
    offsets are the live ingest's, which keeps that tail: it reads from the same offsets and
    stops on a lost one.)"""
    bounds = replace(pin_snapshot(table, config), committed=fresh_start_offsets(table, config.kafka.topic))
    return replace(bounds, watermarks=dict(bounds.committed))


def check(bounds: FreshBounds, marks: dict[int, tuple[int, int]]) -> None:
    """Refuse a tail that cannot be read exactly (module docstring), naming every partition."""
    problems = []
    for partition, (low, high) in sorted(marks.items()):
        recorded = bounds.committed.get(partition)
        if recorded is None:
            if high > low:
                problems.append(f"partition {partition} holds offsets {low}..{high - 1} and the table has recorded "
                                f"no position for it yet (its ingest has not opened it): read again once the "
                                f"ingest runs")
        elif recorded < low:
            problems.append(f"partition {partition}: the table stops at offset {recorded} and Kafka's retention "
                            f"deleted everything before {low}: records the table never got are gone")
        elif recorded > high:
            problems.append(f"partition {partition}: the table recorded offset {recorded}, past the log's end "
                            f"{high}: the topic was recreated or truncated")
    for partition in sorted(set(bounds.committed) - set(marks)):
        problems.append(f"partition {partition} is recorded by the table and absent from the broker: the topic "
                        f"was recreated with fewer partitions")
    if problems:
        raise FreshReadRefused(f"{bounds.table}: no exact fresh read of topic {bounds.topic!r}: "
                               + "; ".join(problems))
