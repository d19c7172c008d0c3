"""What a writer hands the committer: a flush unit (files + offset ranges + dead letters).

A unit is atomic: the committer takes all of it or none of it. Its ranges are contiguous
per Kafka partition with the writer's previous unit, so the committer can check that it
commits every partition in offset order with no gap and no overlap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyiceberg.types import IcebergType

from streamberg.ingest.files import WrittenFile
from streamberg.table_meta.field_sightings import FieldSighting
from streamberg.table_meta.offsets import OffsetSkip


@dataclass(frozen=True)
class DeadLetter:
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    reason: str


@dataclass(frozen=True)
class HeldRecord:
    """A record carrying fields the writer's schema lacks, for the committer to decode after
    it added them (ingest/evolution.py)."""

    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None


@dataclass
class FlushUnit:
    run_id: str
    writer: int  # the writer subtask's index
    epoch: int  # commit-interval number (wall clock // interval) the unit closes
    topic: str
    # The table the unit is for (the job's committer routes by it; ingest/committers.py).
    table: str = ""
    route_value: str | None = None  # a field-routed table's value (common/config/fleet.py route_field)
    # partition -> (first offset covered, next offset to read); only partitions that moved
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    files: list[WrittenFile] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    final: bool = False  # the writer stops after this unit
    # The writer could not open this table (a side table taken, a cap, the catalog refusing
    # it): nothing else in the unit; the committer pauses the table with this reason.
    refused: str | None = None
    messages: int = 0  # Kafka records read into this unit (valid + dead-lettered + skipped)
    skipped: int = 0  # of them, Debezium's tombstones after deletes (decode/envelopes/changes.py)
    # partition -> the position jumps Kafka forced inside the range, in order
    # (ingest.on_lost_offsets: skip-and-record; ingest/positions.py)
    skips: dict[int, list[OffsetSkip]] = field(default_factory=dict)
    # ingest.schema_evolution: add — records held for the committer, and the fields they carry
    # that the writer's schema lacks (Iceberg path -> inferred type), in the order first seen
    held: list[HeldRecord] = field(default_factory=list)
    new_fields: dict[tuple[str, ...], IcebergType] = field(default_factory=dict)
    # ... and the columns their values need widened (path -> the wider type)
    widen: dict[tuple[str, ...], IcebergType] = field(default_factory=dict)
    # ingest.schema_evolution: off — fields not written, per path (table_meta/field_sightings.py)
    sightings: dict[str, FieldSighting] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return sum(f.record_count for f in self.files)

    @property
    def empty(self) -> bool:
        return not self.ranges and not self.files and not self.dead_letters and not self.skips
