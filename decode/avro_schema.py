"""Avro schemas as Iceberg types and back: what a registry's writer schema means for the table.

Avro -> Iceberg (a visitor over the parsed JSON schema):
- record -> struct, array -> list, map -> map<string, V>;
- a union of "null" and one type -> that type, optional (a field, an array element, a map
  value); any other union has no Iceberg type and is refused with its path;
- enum -> string; bytes -> binary; fixed -> fixed[n];
- logical types: date -> date, time-millis/-micros -> time, timestamp-millis/-micros ->
  timestamptz (Avro's timestamps are UTC instants), local-timestamp-millis/-micros ->
  timestamp, decimal (on bytes or fixed) -> decimal(P,S), uuid -> string (every engine reads
  a string; Iceberg's uuid type is not read alike by Spark, DuckDB and pyiceberg 0.8.1);
- a field is required when its type is not nullable and it has no default of null.

Iceberg -> Avro (`avro_schema`) is the inverse, for `streamberg produce --format avro` and the
tests: every optional type becomes ["null", T] with a null default.

Field ids are placeholders (a table assigns its own); names are kept.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from streamberg.common.config.bounds import DECIMAL_MAX_PRECISION
from streamberg.common.config.types import MAX_FIELD_NAME, MAX_SCHEMA_FIELDS, MAX_TYPE_DEPTH
from streamberg.common.errors import UnsupportedSchemaError

_PRIMITIVES: dict[str, IcebergType] = {
    "boolean": BooleanType(), "int": IntegerType(), "long": LongType(), "float": FloatType(),
    "double": DoubleType(), "string": StringType(), "bytes": BinaryType(),
}
_LOGICAL: dict[str, IcebergType] = {
    "date": DateType(), "time-millis": TimeType(), "time-micros": TimeType(),
    "timestamp-millis": TimestamptzType(), "timestamp-micros": TimestamptzType(),
    "local-timestamp-millis": TimestampType(), "local-timestamp-micros": TimestampType(),
    "uuid": StringType(),
}
# Iceberg types written as an Avro primitive with a logical type (Iceberg -> Avro).
_AVRO_LOGICAL: dict[type, tuple[str, str]] = {
    DateType: ("int", "date"), TimeType: ("long", "time-micros"), TimestamptzType: ("long", "timestamp-micros"),
    TimestampType: ("long", "local-timestamp-micros"), UUIDType: ("string", "uuid"),
}
# How deep a writer schema may nest, and how many fields it may hold once its named types are
# expanded: the table's own bounds (common/config/types.py), checked before anything is expanded.
MAX_AVRO_DEPTH = MAX_TYPE_DEPTH
MAX_AVRO_FIELDS = MAX_SCHEMA_FIELDS


def _parse(avro: Any) -> tuple[Any, dict[str, Any]]:
    """fastavro's reading of a schema: names resolved as the Avro specification says (a name
    without a dot takes the enclosing namespace; references by full name), every named type
    by its full name. Nothing is expanded."""
    from fastavro import parse_schema

    named: dict[str, Any] = {}
    try:
        parsed = parse_schema(avro, named_schemas=named, _write_hint=False)
    except Exception as exc:  # noqa: BLE001 - fastavro's refusals are many classes; each is the schema's fault
        raise UnsupportedSchemaError(f"Avro schema: not a valid schema ({type(exc).__name__}: {str(exc)[:200]})") \
            from None
    return parsed, named


class _Converter:
    """One writer schema, parsed by fastavro; its named types looked up by full name."""

    def __init__(self, named: dict[str, Any]) -> None:
        self.ids = itertools.count(1)
        self.named = named
        self.sizes: dict[str, tuple[int, int]] = {}  # full name -> (fields, depth) once expanded

    def nullable(self, schema: Any) -> tuple[Any, bool]:
        """(the type inside an optional union, True) or (the schema, False)."""
        if isinstance(schema, list):
            others = [s for s in schema if s != "null"]
            if len(others) == 1 and len(schema) == 2:
                return others[0], True
        return schema, False

    # -- the bounds, before any expansion -----------------------------------------------
    def check_bounds(self, schema: Any) -> None:
        fields, depth = self.measure(schema, ())
        if depth > MAX_AVRO_DEPTH:
            raise UnsupportedSchemaError(f"Avro schema: nests {depth} levels deep; at most {MAX_AVRO_DEPTH}")
        if fields > MAX_AVRO_FIELDS:
            raise UnsupportedSchemaError(f"Avro schema: holds {fields:,} fields once its named types are expanded; "
                                         f"at most {MAX_AVRO_FIELDS:,} (a record reused many times over)")

    def measure(self, schema: Any, visiting: tuple[str, ...]) -> tuple[int, int]:
        """(fields, depth) of a type with its references expanded, each named type measured
        once: a schema that reuses a record a million times is measured in its own size."""
        if isinstance(schema, str):
            if schema in self.named:
                if schema in visiting:
                    raise UnsupportedSchemaError(f"Avro schema: type {schema!r} contains itself; a table has no "
                                                 "recursive types")
                if schema not in self.sizes:
                    self.sizes[schema] = self.measure(self.named[schema], visiting)
                return self.sizes[schema]
            return 0, 0
        if isinstance(schema, list):
            sizes = [self.measure(s, visiting) for s in schema]
            return sum(f for f, _ in sizes), max((d for _, d in sizes), default=0)
        if not isinstance(schema, dict):
            return 0, 0
        kind = schema.get("type")
        name = schema.get("name")
        if kind in ("record", "error") and isinstance(name, str):
            if name in visiting:
                raise UnsupportedSchemaError(f"Avro schema: type {name!r} contains itself; a table has no recursive "
                                             "types")
            visiting = (*visiting, name)
        if kind in ("record", "error"):
            inner = [self.measure(f.get("type"), visiting) for f in schema.get("fields", []) if isinstance(f, dict)]
            fields = len(inner) + sum(f for f, _ in inner)
            depth = 1 + max((d for _, d in inner), default=0)
        elif kind in ("array", "map"):
            fields, depth = self.measure(schema.get("items" if kind == "array" else "values"), visiting)
            depth += 1
        else:
            return 0, 0
        if fields > MAX_AVRO_FIELDS or depth > MAX_AVRO_DEPTH:
            raise UnsupportedSchemaError(
                f"Avro schema: {('type ' + repr(name)) if isinstance(name, str) else 'a type'} holds more than "
                f"{MAX_AVRO_FIELDS:,} fields or nests more than {MAX_AVRO_DEPTH} levels once expanded")
        return fields, depth

    # -- the conversion ---------------------------------------------------------------------
    def convert(self, schema: Any, path: str, depth: int = 0) -> IcebergType:
        if depth > MAX_AVRO_DEPTH:
            raise UnsupportedSchemaError(f"Avro schema: {path or 'the record'} nests more than {MAX_AVRO_DEPTH} levels")
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return _PRIMITIVES[schema]
            if schema in self.named:
                return self.convert(self.named[schema], path, depth)
            raise UnsupportedSchemaError(f"Avro schema: {path or 'the record'} has type {schema!r}, which a table "
                                         "column cannot hold (null alone, or an unknown name)")
        if isinstance(schema, list):
            inner, _ = self.nullable(schema)
            if inner is schema:
                raise UnsupportedSchemaError(f"Avro schema: {path or 'the record'} is a union of {len(schema)} types "
                                             f"({', '.join(json.dumps(s)[:40] for s in schema)}); only [\"null\", T] maps "
                                             "to a column")
            return self.convert(inner, path, depth)
        if not isinstance(schema, dict):
            raise UnsupportedSchemaError(f"Avro schema: {path or 'the record'}: {json.dumps(schema)[:80]} is not a type")
        kind, logical = schema.get("type"), schema.get("logicalType")
        if logical == "decimal" and kind in ("bytes", "fixed"):
            precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
            if not 0 < precision <= DECIMAL_MAX_PRECISION or not 0 <= scale <= precision:
                raise UnsupportedSchemaError(f"Avro schema: {path or 'the record'} is decimal({precision},{scale}); "
                                             f"a table's decimal has a precision of 1 to {DECIMAL_MAX_PRECISION} and a "
                                             "scale within it")
            return DecimalType(precision, scale)
        if logical in _LOGICAL:
            return _LOGICAL[logical]
        if kind in ("record", "error"):
            return StructType(*self.fields(schema.get("fields", []), path, depth + 1))
        if kind == "array":
            element, optional = self.nullable(schema["items"])
            return ListType(next(self.ids), self.convert(element, f"{path}[]", depth + 1), element_required=not optional)
        if kind == "map":
            value, optional = self.nullable(schema["values"])
            return MapType(next(self.ids), StringType(), next(self.ids), self.convert(value, f"{path}{{}}", depth + 1),
                           value_required=not optional)
        if kind == "enum":
            return StringType()
        if kind == "fixed":
            return FixedType(int(schema["size"]))
        return self.convert(kind, path, depth)

    def fields(self, fields: list[dict], path: str, depth: int) -> Iterator[NestedField]:
        for f in fields:
            name = f["name"]
            child = f"{path}.{name}" if path else name
            if len(name) > MAX_FIELD_NAME:
                raise UnsupportedSchemaError(f"Avro schema: a field name of {len(name):,} characters at "
                                             f"{path or 'the record'}; at most {MAX_FIELD_NAME}")
            inner, optional = self.nullable(f["type"])
            optional = optional or ("default" in f and f["default"] is None)
            yield NestedField(next(self.ids), name, self.convert(inner, child, depth), required=not optional,
                              doc=f.get("doc") if isinstance(f.get("doc"), str) else None)


def _converted(avro: Any) -> IcebergType:
    parsed, named = _parse(avro)
    converter = _Converter(named)
    converter.check_bounds(parsed)
    inner, _ = converter.nullable(parsed)
    return converter.convert(inner, "")


def iceberg_type(avro: str | dict | list) -> IcebergType:
    """The Iceberg type of any Avro schema (a Kafka key's: a primitive often; parsed JSON)."""
    return _converted(avro)


def iceberg_schema(avro: str | dict) -> Schema:
    """The Iceberg schema of an Avro record schema (JSON text or parsed)."""
    parsed = json.loads(avro) if isinstance(avro, str) else avro
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise UnsupportedSchemaError("Avro schema: a table is made from a record schema (the value's type is "
                                     f"{json.dumps(parsed)[:60]})")
    struct = _converted(parsed)
    assert isinstance(struct, StructType)
    return Schema(*struct.fields)


def avro_schema(schema: Schema, name: str = "Record") -> dict:
    """An Avro record schema for records of `schema` (every optional type nullable)."""
    names = itertools.count()

    def of(t: IcebergType, required: bool, hint: str) -> Any:
        avro = _avro_type(t, hint)
        return avro if required else ["null", avro]

    def _avro_type(t: IcebergType, hint: str) -> Any:
        if isinstance(t, StructType):
            return {"type": "record", "name": f"{hint}_{next(names)}",
                    "fields": [{"name": f.name, "type": of(f.field_type, f.required, f.name),
                                **({} if f.required else {"default": None})} for f in t.fields]}
        if isinstance(t, ListType):
            return {"type": "array", "items": of(t.element_type, t.element_required, hint)}
        if isinstance(t, MapType):
            return {"type": "map", "values": of(t.value_type, t.value_required, hint)}
        if isinstance(t, DecimalType):
            return {"type": "bytes", "logicalType": "decimal", "precision": t.precision, "scale": t.scale}
        if isinstance(t, FixedType):
            return {"type": "fixed", "name": f"{hint}_{next(names)}", "size": len(t)}
        logical = _AVRO_LOGICAL.get(type(t))
        if logical is not None:
            return {"type": logical[0], "logicalType": logical[1]}
        primitive = next((k for k, v in _PRIMITIVES.items() if v == t), None)
        if primitive is None:
            raise UnsupportedSchemaError(f"column type {t} has no Avro counterpart here")
        return primitive

    record = _avro_type(schema.as_struct(), name)
    record["name"] = name
    return record
