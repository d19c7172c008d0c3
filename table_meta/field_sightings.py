"""What the ingest records in the table about fields the records carry and the table lacks.

With `ingest.schema_evolution: off` such fields are not written, and never silently: every
ingest commit carries, per field path, how many records held a value there and the first
and last offset per Kafka partition (cumulative, carried forward like the offset skips).
With `add` the committer adds them to the schema; each commit that did says which fields it
added and how many records it decoded after the change. `streamberg status`, `metrics` and
the summary of every ingest snapshot show both (ingest/committer.py writes them).

Paths are Iceberg's full column names (`items.element.qty`, `attrs.value.note`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from streamberg.table_meta.summary_keys import SummaryKeys

# At most this many paths are recorded; the rest are summed under OTHER_PATHS, so a topic
# whose objects use ids as keys cannot grow the snapshot summary without bound.
MAX_RECORDED_PATHS = 200
OTHER_PATHS = "(other paths)"


@dataclass
class FieldSighting:
    """Records that carried a value at one path the table lacks."""

    records: int = 0
    first: dict[int, int] = field(default_factory=dict)  # partition -> first offset seen
    last: dict[int, int] = field(default_factory=dict)  # partition -> last offset seen

    def see_range(self, partition: int, first: int, last: int, records: int) -> None:
        """`records` records of `partition` between offsets `first` and `last` carried it."""
        self.records += records
        self.first[partition] = min(self.first.get(partition, first), first)
        self.last[partition] = max(self.last.get(partition, last), last)

    def add(self, other: FieldSighting) -> None:
        self.records += other.records
        for p, o in other.first.items():
            self.first[p] = min(self.first.get(p, o), o)
        for p, o in other.last.items():
            self.last[p] = max(self.last.get(p, o), o)

    def to_json(self) -> dict:
        return {"records": self.records, "first": {str(p): o for p, o in sorted(self.first.items())},
                "last": {str(p): o for p, o in sorted(self.last.items())}}

    @classmethod
    def from_json(cls, value: Mapping) -> FieldSighting:
        return cls(int(value.get("records", 0)), {int(p): int(o) for p, o in value.get("first", {}).items()},
                   {int(p): int(o) for p, o in value.get("last", {}).items()})


Sightings = dict[str, FieldSighting]


def merge_sightings(into: Sightings, more: Mapping[str, FieldSighting]) -> Sightings:
    """Add `more` to `into` (in place), keeping at most MAX_RECORDED_PATHS paths."""
    for path, seen in more.items():
        if path not in into and path != OTHER_PATHS and len(into) >= MAX_RECORDED_PATHS:
            path = OTHER_PATHS
        into.setdefault(path, FieldSighting()).add(seen)
    return into


def encode_sightings(sightings: Mapping[str, FieldSighting]) -> str:
    return json.dumps({path: seen.to_json() for path, seen in sorted(sightings.items())}, separators=(",", ":"))


def decode_sightings(text: str | None) -> Sightings:
    """The recorded sightings; a value that is not ours to read yields none (status must not fail)."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
        return {str(path): FieldSighting.from_json(value) for path, value in raw.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def sightings_of(summary: Mapping[str, str]) -> Sightings:
    return decode_sightings(summary.get(SummaryKeys.UNKNOWN_FIELDS))


def encode_added(added: list[tuple[str, str]]) -> str:
    return json.dumps([[path, type_name] for path, type_name in added], separators=(",", ":"))


def encode_widened(widened: list[tuple[str, str, str]]) -> str:
    return json.dumps([list(w) for w in widened], separators=(",", ":"))


def widened_fields_of(summary: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """The columns a snapshot widened: (path, from, to)."""
    text = summary.get(SummaryKeys.SCHEMA_WIDENED)
    if not text:
        return []
    try:
        return [(str(p), str(a), str(b)) for p, a, b in json.loads(text)]
    except (ValueError, TypeError):
        return []


def added_fields_of(summary: Mapping[str, str]) -> list[tuple[str, str]]:
    """The fields a snapshot added to the schema: (path, type)."""
    text = summary.get(SummaryKeys.SCHEMA_ADDED)
    if not text:
        return []
    try:
        return [(str(path), str(type_name)) for path, type_name in json.loads(text)]
    except (ValueError, TypeError):
        return []
