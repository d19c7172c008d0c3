"""Kafka offsets recorded in Iceberg snapshot summaries: the source of truth for resuming.

Every ingest commit writes, in the snapshot it creates,
``streamberg.kafka-offsets.<topic>`` = JSON ``{"<partition>": <next offset>, ...}`` (the
offset of the next record to read, as Kafka commits it) and ``streamberg.job-id``.
Snapshots made by others (the compactor's rewrites, maintenance) carry no offsets, so the
committed position is found by walking the current snapshot's ancestry back to the
nearest snapshot that has the key. Iceberg's Kafka Connect sink does the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from streamberg.table_meta.summary_keys import SummaryKeys, kafka_offsets_key, kafka_skips_key

# What a fenced ingest says (committer, CLI) and what `streamberg run` looks for in a
# component's output to know that restarting it is pointless.
FENCED_MESSAGE = "another ingest instance is writing this table"

# partition -> next offset to read
PartitionOffsets = dict[int, int]


def encode_offsets(offsets: PartitionOffsets) -> str:
    return json.dumps({str(p): int(o) for p, o in sorted(offsets.items())}, separators=(",", ":"))


def decode_offsets(text: str) -> PartitionOffsets:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"offsets property is not a JSON object: {text[:80]!r}")
    return {int(p): int(o) for p, o in data.items()}


# How many skips a commit carries forward (the total of lost offsets is kept whole beside them).
MAX_RECORDED_SKIPS = 100


@dataclass(frozen=True)
class OffsetSkip:
    """A jump of the ingest's position that Kafka forced, recorded in the table.

    `from_offset` is where the ingest stood (the next offset it had to read), `to_offset`
    where it went on. Forward (`lost`): the records in between were deleted by the broker
    (retention, DeleteRecords) before they were ingested. Backward (`rewound`): the
    partition's offsets went back (a recreated topic, a failover to a cluster with lower
    offsets, an unclean leader election), so offsets below `from_offset` are read again.
    """

    partition: int
    from_offset: int
    to_offset: int
    at_ms: int = 0  # when the ingest saw it

    @property
    def kind(self) -> str:
        return "lost" if self.to_offset > self.from_offset else "rewound"

    @property
    def lost(self) -> int:
        return max(0, self.to_offset - self.from_offset)

    def describe(self) -> str:
        if self.kind == "lost":
            return (f"partition {self.partition}: offsets [{self.from_offset}, {self.to_offset}) were deleted by "
                    f"Kafka before they were ingested ({self.lost} offsets)")
        return (f"partition {self.partition}: the offsets went back from {self.from_offset} to {self.to_offset} "
                f"(recreated topic or failover); read again from {self.to_offset}")

    def to_json(self) -> list[int]:
        return [self.partition, self.from_offset, self.to_offset, self.at_ms]


def encode_skips(skips: Iterable[OffsetSkip]) -> str:
    return json.dumps([s.to_json() for s in skips][-MAX_RECORDED_SKIPS:], separators=(",", ":"))


def decode_skips(text: str) -> tuple[OffsetSkip, ...]:
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError(f"skips property is not a JSON list: {text[:80]!r}")
    return tuple(OffsetSkip(int(p), int(f), int(t), int(at)) for p, f, t, at in data)


def summary_properties(snapshot: Snapshot) -> dict[str, str]:
    summary = snapshot.summary
    if summary is None:
        return {}
    return dict(summary.additional_properties)


@dataclass(frozen=True)
class CommittedPosition:
    """Where a topic's ingest stands in a table: the offsets and the snapshot that holds them."""

    topic: str
    offsets: PartitionOffsets = field(default_factory=dict)
    snapshot_id: int | None = None
    job_id: str | None = None
    run_id: str | None = None
    commit_seq: int | None = None
    timestamp_ms: int | None = None
    consumed_total: int = 0
    # Every position jump Kafka forced (newest last; at most MAX_RECORDED_SKIPS) and the
    # offsets they passed over, all commits together.
    skips: tuple[OffsetSkip, ...] = ()
    lost_total: int = 0


def ancestors(snapshots: Iterable[Snapshot], snapshot_id: int | None) -> list[Snapshot]:
    """The snapshot `snapshot_id` and its ancestors among `snapshots`, newest first."""
    by_id = {s.snapshot_id: s for s in snapshots}
    current = by_id.get(snapshot_id) if snapshot_id is not None else None
    chain = []
    while current is not None:
        chain.append(current)
        current = by_id.get(current.parent_snapshot_id) if current.parent_snapshot_id is not None else None
    return chain


def ancestry(table: Table) -> list[Snapshot]:
    """The current snapshot and its ancestors, newest first."""
    current = table.current_snapshot()
    return ancestors(table.metadata.snapshots, current.snapshot_id if current is not None else None)


def committed_position(table: Table, topic: str) -> CommittedPosition:
    """The newest recorded offsets for `topic` on the table's current lineage."""
    key = kafka_offsets_key(topic)
    for snapshot in ancestry(table):
        props = summary_properties(snapshot)
        if key in props:
            seq = props.get(SummaryKeys.COMMIT_SEQ)
            return CommittedPosition(
                topic=topic,
                offsets=decode_offsets(props[key]),
                snapshot_id=snapshot.snapshot_id,
                job_id=props.get(SummaryKeys.JOB_ID),
                run_id=props.get(SummaryKeys.RUN_ID),
                commit_seq=int(seq) if seq is not None else None,
                timestamp_ms=snapshot.timestamp_ms,
                consumed_total=int(props.get(SummaryKeys.CONSUMED_TOTAL, 0)),
                skips=decode_skips(props[kafka_skips_key(topic)]) if kafka_skips_key(topic) in props else (),
                lost_total=int(props.get(SummaryKeys.LOST_OFFSETS_TOTAL, 0)),
            )
    return CommittedPosition(topic=topic)


def consumed_by_run(table: Table, topic: str, run_id: str, since_snapshot_id: int | None = None) -> int:
    """Records (valid + dead-lettered) that the ingest run `run_id` itself committed.

    Each ingest commit records the running total of all ingest commits up to it; the run's
    share is the sum, over its own snapshots on the current lineage, of the step from the
    previous offsets-bearing snapshot. A table-wide difference would also count another
    instance's commits (e.g. those of the ingest that fenced this run). `since_snapshot_id`:
    the committed snapshot when the run started; the walk stops there (nothing older is ours).
    """
    key = kafka_offsets_key(topic)
    total, newer = 0, None
    for snapshot in ancestry(table):
        props = summary_properties(snapshot)
        if key not in props:
            continue
        consumed = int(props.get(SummaryKeys.CONSUMED_TOTAL, 0))
        if newer is not None and newer[0] == run_id:
            total += newer[1] - consumed
        if snapshot.snapshot_id == since_snapshot_id:
            newer = None
            break
        newer = (props.get(SummaryKeys.RUN_ID), consumed)
    if newer is not None and newer[0] == run_id:  # the run's commit is the first on the table
        total += newer[1]
    return total


# Where the ingest began reading each partition of a topic the table holds no offsets of yet
# (a table made, or a partition added, before its first commit): `<prefix><topic>` = JSON
# {"<partition>": <first offset>}. A fresh read of the table is exact from its first record
# (the table is empty of those partitions until then), and a restart before the first commit
# begins where the first run began, not at a later "latest". Superseded by the committed
# offsets (committed_position) once a commit records the partition.
START_OFFSETS_PREFIX = "streamberg.ingest.start-offsets."


def recorded_starts(table: Table, topic: str) -> PartitionOffsets:
    """The recorded start offsets of `topic` ({} when none or unreadable)."""
    text = table.properties.get(START_OFFSETS_PREFIX + topic)
    if not text:
        return {}
    try:
        found = decode_offsets(text)
    except (ValueError, TypeError, RecursionError):
        return {}
    return {p: o for p, o in found.items() if p >= 0 and o >= 0}


def record_starts(catalog: Any, identifier: str, topic: str, starts: PartitionOffsets, log: Any = None) -> None:
    """Add `starts` to the table's recorded start offsets of `topic` (writers of other
    partitions record theirs at the same time: a lost race reads the table again and merges)."""
    from pyiceberg.exceptions import CommitFailedException

    from streamberg.common.retry import commit_retrying, is_instance

    for attempt in commit_retrying(8, is_instance(CommitFailedException), log=log,
                                   event="start offsets: commit lost a race; retrying"):
        with attempt:
            table = catalog.load_table(identifier)
            before = recorded_starts(table, topic)
            merged = {**before, **starts}
            if merged == before:
                return
            with table.transaction() as transaction:
                transaction.set_properties({START_OFFSETS_PREFIX + topic: encode_offsets(merged)})


def fresh_start_offsets(table: Table, topic: str) -> PartitionOffsets:
    """Where a fresh read's tail starts per partition: the committed offsets, and for the
    partitions no commit recorded yet, where the ingest recorded it began."""
    committed = committed_position(table, topic).offsets
    return {**{p: o for p, o in recorded_starts(table, topic).items() if p not in committed}, **committed}
