"""The type rules every decoding path shares: one module, so JSON, Avro, Protobuf, the
envelopes and schema evolution agree on what fits, what widens and what two sightings make.

- `widens`: a column may become a wider type as Iceberg allows it (pyiceberg's own `promote`:
  int -> long, float -> double, a decimal of more precision at the same scale), never past
  Iceberg's decimal precision of 38;
- `Widening`: a refusal that such a widening lifts (its reason, the column, the wider type);
- `readable_as`: a writer type a column takes as it comes (a registry format's reader);
- `join`: one type for a field that two records typed differently (schema evolution's
  inference); `wider_of`: the wider of two widenings asked for one column.
"""

from __future__ import annotations

import itertools

from pyiceberg.exceptions import ResolveError
from pyiceberg.schema import promote
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StructType,
)

from streamberg.common.config.bounds import DECIMAL_MAX_PRECISION


class Widening(str):
    """A refusal that a wider column type would lift (int -> long, float -> double, a decimal of
    more precision at the same scale, as Iceberg allows): the reason, the field's dotted path
    and the narrowest type that takes the refused values. Schema evolution widens the column
    and decodes the record again (ingest/evolution.py); otherwise it is a plain reason."""

    path: str
    wider: IcebergType
    also: tuple[tuple[str, IcebergType], ...]  # further columns the same records need wider

    def __new__(cls, reason: str, path: str, wider: IcebergType,
                also: tuple[tuple[str, IcebergType], ...] = ()) -> Widening:
        made = super().__new__(cls, reason)
        made.path, made.wider, made.also = path, wider, tuple(also)
        return made

    def columns(self) -> tuple[tuple[str, IcebergType], ...]:
        """Every (dotted path, wider type) the refused records need."""
        return ((self.path, self.wider), *self.also)

    def __reduce__(self) -> tuple:
        return Widening, (str(self), self.path, self.wider, self.also)


def widens(current: IcebergType | None, wider: IcebergType) -> bool:
    """Whether Iceberg allows a column of type `current` to become `wider` (int -> long,
    float -> double, decimal(P,S) -> decimal(P',S) with P' > P), by pyiceberg's own rule."""
    if current is None or current == wider or not isinstance(current, (IntegerType, FloatType, DecimalType)):
        return False
    if isinstance(wider, DecimalType) and wider.precision > DECIMAL_MAX_PRECISION:
        return False
    try:
        return promote(current, wider) == wider
    except ResolveError:
        return False


def readable_as(writer: IcebergType, table: IcebergType) -> bool:
    """Whether values of a writer's type are read into a column of `table` type as they come
    (a registry format's reader side: int into long, an integer or float into double, a
    decimal of less precision at the same scale)."""
    if writer == table:
        return True
    if isinstance(table, LongType):
        return isinstance(writer, IntegerType)
    if isinstance(table, DoubleType):
        return isinstance(writer, (IntegerType, LongType, FloatType))
    if isinstance(table, FloatType):
        return isinstance(writer, (IntegerType, LongType))
    if isinstance(table, DecimalType) and isinstance(writer, DecimalType):
        return writer.scale == table.scale and writer.precision <= table.precision
    return False


def join(first: IcebergType, second: IcebergType) -> IcebergType:
    """One type for a field two sightings typed: long and double make double, structs take
    the union of their fields, lists merge their elements; any other pair keeps the first
    (records of the other then fail the decode against it, with the reason)."""
    if first == second:
        return first
    if {type(first), type(second)} == {LongType, DoubleType}:
        return DoubleType()
    if isinstance(first, StructType) and isinstance(second, StructType):
        fields = {f.name: f for f in first.fields}
        for f in second.fields:
            fields[f.name] = (NestedField(f.field_id, f.name, join(fields[f.name].field_type, f.field_type),
                                          required=False) if f.name in fields else f)
        ids = itertools.count(1)
        return StructType(*[NestedField(next(ids), f.name, f.field_type, required=False) for f in fields.values()])
    if isinstance(first, ListType) and isinstance(second, ListType):
        return ListType(1, join(first.element_type, second.element_type), element_required=False)
    return first


def wider_of(a: IcebergType, b: IcebergType) -> IcebergType:
    """The wider of two widenings asked for one column (decimals: the greater precision)."""
    if isinstance(a, DecimalType) and isinstance(b, DecimalType):
        return a if a.precision >= b.precision else b
    return a
