"""Clustering health from manifest bounds only: how many files a point query reads.

For a clustering column c and a set of data files, each file f covers the closed interval
[min_f(c), max_f(c)] of its manifest bounds (a file without bounds on c covers everything:
Iceberg cannot skip it). The measures, defined so a brute-force loop gives the same numbers:

- **files per point** — the average, over the *points* P = {min_f(c) for every file f with
  bounds}, of the number of files whose interval contains the point: the files Iceberg's
  min/max pruning would plan for `c = value`, with values drawn as the files' lower bounds
  (every lower bound is a value present in the data, one per file, so files weigh equally).
- **overlap depth** — the largest number of files whose intervals contain one common value.

A perfectly clustered set of n files reads about 1 file per point on its first clustering
column; n random files read about n. The compactor uses these to decide merges, records them
with every optimize, and `streamberg status` / `metrics` report them per table and partition.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.conversions import from_bytes
from pyiceberg.schema import Schema
from pyiceberg.types import PrimitiveType

from streamberg.table_meta.table_files import DataFileInfo

Interval = tuple[Any, Any] | None  # None: no bounds, the file covers every value


@dataclass(frozen=True)
class ColumnHealth:
    column: str
    files: int
    files_per_point: float
    overlap_depth: int

    def as_dict(self) -> dict[str, Any]:
        return {"files": self.files, "files_per_point": round(self.files_per_point, 3),
                "overlap_depth": self.overlap_depth}


def column_intervals(files: Iterable[DataFileInfo], schema: Schema, column: str) -> list[Interval]:
    """Each file's [min, max] on `column` decoded from its manifest bounds."""
    field = schema.find_field(column)
    field_type = field.field_type
    if not isinstance(field_type, PrimitiveType):
        return [None for _ in files]
    out: list[Interval] = []
    for f in files:
        low, high = f.lower_bounds.get(field.field_id), f.upper_bounds.get(field.field_id)
        out.append(None if low is None or high is None
                   else (from_bytes(field_type, low), from_bytes(field_type, high)))
    return out


def files_per_point(intervals: Sequence[Interval]) -> float:
    """Average number of intervals containing a point, over the points = the lower ends of the
    bounded intervals; an unbounded interval contains every point (see module doc). With no
    bounded interval at all, every query reads every file."""
    bounded = [i for i in intervals if i is not None]
    unbounded = len(intervals) - len(bounded)
    if not bounded:
        return float(unbounded)
    lows = sorted(low for low, _ in bounded)
    highs = sorted(high for _, high in bounded)
    # Intervals containing p: those starting at or before p, minus those ending before p.
    total = sum(bisect.bisect_right(lows, low) - bisect.bisect_left(highs, low) for low, _ in bounded)
    return total / len(bounded) + unbounded


def overlap_depth(intervals: Sequence[Interval]) -> int:
    """The most intervals that share one value (closed intervals; unbounded ones share all)."""
    bounded = [i for i in intervals if i is not None]
    unbounded = len(intervals) - len(bounded)
    events: list[tuple[Any, int]] = []
    for low, high in bounded:
        events.append((low, 0))  # opens sort before closes at the same value: closed intervals
        events.append((high, 1))
    events.sort(key=lambda e: (e[0], e[1]))
    depth = best = 0
    for _, kind in events:
        depth += 1 if kind == 0 else -1
        best = max(best, depth)
    return best + unbounded


def column_health(files: Sequence[DataFileInfo], schema: Schema, column: str) -> ColumnHealth:
    intervals = column_intervals(files, schema, column)
    return ColumnHealth(column, len(files), files_per_point(intervals), overlap_depth(intervals))


def health(files: Sequence[DataFileInfo], schema: Schema, columns: Sequence[str]) -> dict[str, ColumnHealth]:
    return {c: column_health(files, schema, c) for c in columns}


def health_by_partition(files: Sequence[DataFileInfo], schema: Schema, columns: Sequence[str]
                        ) -> dict[tuple[int, tuple[Any, ...]], dict[str, ColumnHealth]]:
    by_partition: dict[tuple[int, tuple[Any, ...]], list[DataFileInfo]] = defaultdict(list)
    for f in files:
        by_partition[(f.spec_id, f.partition)].append(f)
    return {key: health(part, schema, columns) for key, part in by_partition.items()}
