"""Where a writer reads, checked against the broker: a position Kafka lost never passes in silence.

The table records, per partition, the next offset to read. Kafka can lose that position:
retention (or DeleteRecords) deletes records before they were ingested, so the committed
offset falls below the partition's low watermark; or the partition's offsets go back (a
recreated topic, a failover to a cluster with lower offsets, an unclean leader election), so
it lies beyond the partition's end. librdkafka would answer either with a silent reset to
`auto.offset.reset`, and a consumer assigned beyond the end gets nothing and no error; the
ingest would then commit the gap, or a lower offset, as if all were well.

So the writers check their committed offsets against the watermarks before they read, their
consumer has `auto.offset.reset=error` (an out-of-range fetch while running is reported, not
reset), and the first offset delivered after each positioning is compared with the one asked
for. What a lost position leads to is the operator's choice, `ingest.on_lost_offsets`:
`fail` stops the run with the partition, the committed offset and the watermarks; and
`skip-and-record` reads on from the low watermark and records the jump (an `OffsetSkip`) in
the table's snapshot summary, which status, metrics and `streamberg table` report.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from streamberg.common.config import StreambergConfig
from streamberg.common.errors import LostOffsetsError
from streamberg.common.watermarks import WatermarkReader, Watermarks
from streamberg.table_meta.offsets import OffsetSkip

BROKER_TIMEOUT_SECONDS = 30.0
RUNBOOK = "docs/runbooks/lost-offsets.md"


@dataclass(frozen=True)
class PositionProblem:
    """A partition whose committed offset the broker no longer has."""

    topic: str
    partition: int
    committed: int
    low: int
    end: int

    @property
    def kind(self) -> str:
        return "lost" if self.committed < self.low else "rewound"

    def describe(self) -> str:
        where = f"{self.topic}[{self.partition}]: the table's committed offset {self.committed}"
        marks = f"(watermarks: low {self.low}, end {self.end})"
        if self.kind == "lost":
            return (f"{where} is below the low watermark {marks}: offsets [{self.committed}, {self.low}) were "
                    f"deleted by Kafka (retention, DeleteRecords) before they were ingested")
        return (f"{where} is beyond the partition's end {marks}: its offsets went back (a recreated topic, a "
                f"failover to another cluster, an unclean leader election)")

    def skip(self) -> OffsetSkip:
        """The jump skip-and-record makes: on from the low watermark."""
        return OffsetSkip(self.partition, self.committed, self.low, int(time.time() * 1000))


def position_problems(topic: str, committed: Mapping[int, int], marks: Watermarks) -> list[PositionProblem]:
    """The partitions whose committed offset lies outside [low watermark, end] (pure)."""
    problems = []
    for partition, offset in sorted(committed.items()):
        low, end = marks.low(partition), marks.end(partition)
        if offset < low or offset > end:
            problems.append(PositionProblem(topic, partition, offset, low, end))
    return problems


def refusal(problems: Iterable[PositionProblem], table: str) -> LostOffsetsError:
    """The error of on_lost_offsets=fail: every problem, and what the operator can do."""
    described = "; ".join(p.describe() for p in problems)
    return LostOffsetsError(
        f"table {table}: {described}. Nothing was committed past the table's offsets. To read on from the low "
        f"watermark and record the loss in the table, set ingest.on_lost_offsets: skip-and-record ({RUNBOOK})")


def broker_positions(config: StreambergConfig, partitions: Iterable[int], committed: Mapping[int, int],
                     timeout_seconds: float = BROKER_TIMEOUT_SECONDS, reader: WatermarkReader | None = None,
                     present: Collection[int] | None = None) -> Watermarks:
    """The watermarks of `partitions`; for those whose committed offset is past the high
    watermark, the true end too (tansu's watermark can lag by a batch: a committed offset
    just past it is normal there, common/watermarks.py). `reader`: the writer's, shared by
    its tables (else one of its own for this call); `present`: the topic's partitions as the
    writer's metadata has them."""
    if reader is not None:
        return reader.read(config.kafka.topic, set(partitions), ends_past=committed, present=present)
    with WatermarkReader(positions_settings(config), timeout_seconds) as own:
        return own.read(config.kafka.topic, set(partitions), ends_past=committed, present=present)


def positions_settings(config: StreambergConfig) -> dict:
    """What a consumer that only asks the broker for positions is given: the servers and the
    security settings (a group id only names it: it never joins)."""
    kafka = config.kafka
    return {**kafka.consumer, "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": f"{config.ingest_target.consumer_group}-positions"}
