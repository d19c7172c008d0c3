"""What Iceberg's own scan planning does with each predicate, and each file's bounds.

File counts come from pyiceberg's ``table.scan(row_filter=...).plan_files()``: the manifest
evaluator and the inclusive metrics evaluator over each data file's lower/upper bounds,
i.e. the same min/max pruning any Iceberg engine applies before reading a byte. Nothing is
estimated from the layout; if a file is planned, it counts.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.table import Table


def planned_files(table: Table, expression: BooleanExpression) -> int:
    """How many data files Iceberg plans to read for ``expression`` on the current snapshot."""
    return sum(1 for _ in table.scan(row_filter=expression).plan_files())


def total_files(table: Table) -> int:
    return planned_files(table, AlwaysTrue())


@dataclass(frozen=True)
class FileBounds:
    """One data file's lower/upper bound on a column, as recorded in its manifest entry."""

    path: str
    record_count: int
    lower: Any
    upper: Any


def column_bounds(table: Table, column: str) -> list[FileBounds]:
    """Every live data file's bounds on ``column`` (None where the file has no bound)."""
    field = table.schema().find_field(column)
    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    out: list[FileBounds] = []
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            data_file = entry.data_file
            lower = (data_file.lower_bounds or {}).get(field.field_id)
            upper = (data_file.upper_bounds or {}).get(field.field_id)
            out.append(FileBounds(
                path=data_file.file_path,
                record_count=data_file.record_count,
                lower=from_bytes(field.field_type, lower) if lower is not None else None,
                upper=from_bytes(field.field_type, upper) if upper is not None else None,
            ))
    return out


def coverage_depth(bounds: Sequence[FileBounds], values: Sequence[Any]) -> list[int]:
    """For each value (sorted, distinct), how many files' [lower, upper] ranges contain it.

    A file without bounds cannot be pruned, so it covers every value. The mean of this over a
    column's distinct values is the file count a uniformly chosen point query must plan, which
    makes it a full-domain cross-check of the sampled figures.
    """
    n = len(values)
    diff = [0] * (n + 1)
    for b in bounds:
        if b.lower is None or b.upper is None:
            first, last = 0, n - 1
        else:
            first = bisect.bisect_left(values, b.lower)
            last = bisect.bisect_right(values, b.upper) - 1
        if first <= last:
            diff[first] += 1
            diff[last + 1] -= 1
    depth, running = [], 0
    for i in range(n):
        running += diff[i]
        depth.append(running)
    return depth
