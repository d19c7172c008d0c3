"""The predicates the benchmark plans: point, two-column and range filters drawn from the data.

- point: ``col = v`` for values drawn uniformly (seeded) from the column's distinct values,
  which is what the study's "per point query" figures average over.
- two-column: ``a = x AND b = y`` for pairs of the benchmark columns, the case a multi-column
  layout is for (a linear sort can only serve its first column).
- range: ``col BETWEEN lo AND hi`` over a run of consecutive distinct values, 1/25 of the
  column's domain: for SSB cities as wide as one nation's ten cities, for brands as one
  category's forty brands (SSB's Q2.x/Q3.x filters have that width), at a seeded random start.
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pyiceberg.expressions import And, BooleanExpression, EqualTo, GreaterThanOrEqual, LessThanOrEqual

Kind = Literal["point", "two-column", "range"]

# A range covers this share of a column's distinct values (SSB: one nation of 25, one category of 25).
RANGE_FRACTION = 1 / 25


def _literal(value: Any) -> Any:
    """A value pyiceberg can bind: dates/timestamps as ISO strings, everything else as is."""
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


@dataclass(frozen=True)
class Predicate:
    """One filter: its kind, the columns it touches and the values (pairs for ranges)."""

    kind: Kind
    columns: tuple[str, ...]
    values: tuple[Any, ...]

    @property
    def label(self) -> str:
        """The group the predicate is reported under (a column, or 'a+b' for two columns)."""
        return "+".join(self.columns)

    def expression(self) -> BooleanExpression:
        if self.kind == "point":
            return EqualTo(self.columns[0], _literal(self.values[0]))
        if self.kind == "two-column":
            return And(EqualTo(self.columns[0], _literal(self.values[0])), EqualTo(self.columns[1], _literal(self.values[1])))
        low, high = self.values
        return And(GreaterThanOrEqual(self.columns[0], _literal(low)), LessThanOrEqual(self.columns[0], _literal(high)))

    def sql(self) -> str:
        """Human-readable form for logs, the JSON file and the report."""
        q = lambda v: repr(_jsonable(v))  # noqa: E731
        if self.kind == "point":
            return f"{self.columns[0]} = {q(self.values[0])}"
        if self.kind == "two-column":
            return f"{self.columns[0]} = {q(self.values[0])} AND {self.columns[1]} = {q(self.values[1])}"
        return f"{self.columns[0]} BETWEEN {q(self.values[0])} AND {q(self.values[1])}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "columns": list(self.columns), "values": [_jsonable(v) for v in self.values], "sql": self.sql()}


@dataclass(frozen=True)
class SamplerSpec:
    points_per_column: int = 20
    pairs_per_column_pair: int = 5
    ranges_per_column: int = 5
    seed: int = 7


def sample_predicates(distinct: Mapping[str, Sequence[Any]], spec: SamplerSpec) -> list[Predicate]:
    """Draw the benchmark's predicates from each column's sorted distinct values.

    Deterministic for a given seed and data; a column with fewer distinct values than asked
    for gets one point predicate per value.
    """
    rng = random.Random(spec.seed)
    columns = list(distinct)
    out: list[Predicate] = []
    for column in columns:
        values = list(distinct[column])
        if not values:
            continue
        chosen = rng.sample(values, min(spec.points_per_column, len(values)))
        out.extend(Predicate("point", (column,), (v,)) for v in sorted(chosen))
    for a, b in itertools.combinations(columns, 2):
        if not distinct[a] or not distinct[b]:
            continue
        for _ in range(spec.pairs_per_column_pair):
            out.append(Predicate("two-column", (a, b), (rng.choice(list(distinct[a])), rng.choice(list(distinct[b])))))
    for column in columns:
        values = list(distinct[column])
        width = max(2, round(len(values) * RANGE_FRACTION))
        if len(values) < width:
            continue
        for _ in range(spec.ranges_per_column):
            start = rng.randrange(0, len(values) - width + 1)
            out.append(Predicate("range", (column,), (values[start], values[start + width - 1])))
    return out
