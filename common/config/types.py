"""Column types of `table.schema`: what a type written in the config means.

A field's type is a primitive name (`long`, `timestamptz`, ...), `decimal(P,S)`, or a nested
type, in the YAML tree form (canonical)::

    - name: customer
      type: struct
      fields: [{name: id, type: long, required: true}, {name: city, type: string}]
    - {name: tags, type: list, element: string}
    - {name: attrs, type: map, key: string, value: long}
    - {name: items, type: list, element: {type: struct, fields: [{name: sku, type: string}]}}

or a short form: `list<string>`, `map<string,long>`, `struct<a:long,b:list<string>>`. In a short
form every struct field, list element and map value is optional.

Both forms become one :data:`TypeSpec` tree (``Primitive``, ``StructOf``, ``ListOf``,
``MapOf``), which the catalog turns into Iceberg types and the ingest decodes against. Nested
types are bounded (:data:`MAX_TYPE_DEPTH` levels, :data:`MAX_SCHEMA_FIELDS` fields in all) so
a hostile config cannot build a schema no engine would take.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from streamberg.common.config.bounds import DECIMAL_MAX_PRECISION

PRIMITIVE_TYPES = frozenset({
    "boolean", "int", "long", "float", "double", "date", "time",
    "timestamp", "timestamptz", "string", "uuid", "binary",
})
NESTED_KINDS = frozenset({"struct", "list", "map"})
# ASCII digits only: "\d" also matches other scripts' digits, which int() accepts.
DECIMAL = re.compile(r"^decimal\(\s*([0-9]{1,4})\s*,\s*([0-9]{1,4})\s*\)$")
# Iceberg's own limit is far higher; 10,000 fields is past any real event and still a schema
# every engine plans quickly. Depth: what the YAML loader lets through anyway.
MAX_SCHEMA_FIELDS = 10_000
MAX_TYPE_DEPTH = 16
# The longest field name the product adds to a table, from a registry schema or a record's
# field (schema evolution): Hive's and the config's identifier bound.
MAX_FIELD_NAME = 128
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True)
class Primitive:
    name: str  # a PRIMITIVE_TYPES name or a normalised "decimal(P,S)"

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type: TypeSpec
    required: bool = False
    doc: str | None = None
    # Unit of integer epochs in a timestamp field (None: the decoder's default, ms).
    unit: str | None = None


@dataclass(frozen=True)
class StructOf:
    fields: tuple[FieldSpec, ...]

    def __str__(self) -> str:
        return "struct<" + ",".join(f"{f.name}:{f.type}" for f in self.fields) + ">"


@dataclass(frozen=True)
class ListOf:
    element: TypeSpec
    element_required: bool = False

    def __str__(self) -> str:
        return f"list<{self.element}>"


@dataclass(frozen=True)
class MapOf:
    key: TypeSpec
    value: TypeSpec
    value_required: bool = False

    def __str__(self) -> str:
        return f"map<{self.key},{self.value}>"


TypeSpec = Primitive | StructOf | ListOf | MapOf


def primitive(text: str) -> Primitive:
    """A primitive type name, normalised; ValueError naming the accepted ones otherwise."""
    value = text.strip().lower()
    if value in PRIMITIVE_TYPES:
        return Primitive(value)
    if match := DECIMAL.match(value):
        precision, scale = int(match.group(1)), int(match.group(2))
        if not 1 <= precision <= DECIMAL_MAX_PRECISION or not 0 <= scale <= precision:
            raise ValueError(f"{value}: precision must be 1 to {DECIMAL_MAX_PRECISION} and scale 0 to the precision")
        return Primitive(f"decimal({precision},{scale})")
    raise ValueError(f"unknown type {text!r}; use one of {sorted(PRIMITIVE_TYPES)}, decimal(P,S), "
                     "struct, list or map (or list<T>, map<K,V>, struct<name:T,...>)")


# -- the short forms ---------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(decimal\s*\([^)]*\)|[A-Za-z_][A-Za-z0-9_]*|[<>,:])")


def _tokens(text: str) -> list[str]:
    tokens, at = [], 0
    while at < len(text):
        if text[at:].strip() == "":
            break
        match = _TOKEN.match(text, at)
        if match is None:
            raise ValueError(f"type {text!r}: unexpected {text[at:].strip()[:20]!r}")
        tokens.append(match.group(1))
        at = match.end()
    return tokens


def parse_type(text: str) -> TypeSpec:
    """A type written as text: a primitive, decimal(P,S), or a short form such as
    ``map<string,list<struct<sku:string,qty:int>>>``."""
    if len(text) > 10_000:
        raise ValueError("a type of more than 10,000 characters")
    tokens = _tokens(text)
    at = 0

    def take(expected: str | None = None) -> str:
        nonlocal at
        if at >= len(tokens):
            raise ValueError(f"type {text!r}: ends early" + (f", expected {expected!r}" if expected else ""))
        token = tokens[at]
        if expected is not None and token != expected:
            raise ValueError(f"type {text!r}: expected {expected!r}, found {token!r}")
        at += 1
        return token

    def one(depth: int) -> TypeSpec:
        if depth > MAX_TYPE_DEPTH:
            raise ValueError(f"type {text!r}: nested more than {MAX_TYPE_DEPTH} levels deep")
        word = take()
        kind = word.lower()
        if kind not in NESTED_KINDS:
            return primitive(word)
        if at >= len(tokens) or tokens[at] != "<":
            raise ValueError(f"type {text!r}: {kind} needs its parts, e.g. list<string>, map<string,long>, "
                             "struct<a:long> (or the YAML tree form)")
        take("<")
        if kind == "list":
            spec: TypeSpec = ListOf(one(depth + 1))
        elif kind == "map":
            key = one(depth + 1)
            if not isinstance(key, Primitive):
                raise ValueError(f"type {text!r}: a map's key must be a primitive type, not {key}")
            take(",")
            spec = MapOf(key, one(depth + 1))
        else:
            fields: list[FieldSpec] = []
            while True:
                name = take()
                if not _NAME.fullmatch(name):
                    raise ValueError(f"type {text!r}: {name!r} is not a field name")
                if any(f.name == name for f in fields):
                    raise ValueError(f"type {text!r}: field {name!r} twice in one struct")
                take(":")
                fields.append(FieldSpec(name, one(depth + 1)))
                if tokens[at:at + 1] != [","]:
                    break
                take(",")
            spec = StructOf(tuple(fields))
        take(">")
        return spec

    spec = one(1)
    if at != len(tokens):
        raise ValueError(f"type {text!r}: unexpected {tokens[at]!r} after the type")
    return spec


# -- walking a schema --------------------------------------------------------------------------


def walk(fields: tuple[FieldSpec, ...] | list[FieldSpec], prefix: str = "") -> Iterator[tuple[str, FieldSpec, bool]]:
    """Every field at every depth, as (dotted path, field, inside a list or map). List elements
    and map values are walked too; their struct fields' paths go through the collection's name
    (`items.sku`), and the flag says no partition source or clustering column can be there."""
    for f in fields:
        path = f"{prefix}{f.name}"
        yield path, f, False
        yield from _walk_type(f.type, path + ".", False)


def _walk_type(spec: TypeSpec, prefix: str, repeated: bool) -> Iterator[tuple[str, FieldSpec, bool]]:
    if isinstance(spec, StructOf):
        for f in spec.fields:
            path = f"{prefix}{f.name}"
            yield path, f, repeated
            yield from _walk_type(f.type, path + ".", repeated)
    elif isinstance(spec, ListOf):
        yield from _walk_type(spec.element, prefix, True)
    elif isinstance(spec, MapOf):
        yield from _walk_type(spec.value, prefix, True)


def count_fields(spec: TypeSpec) -> int:
    """Iceberg field ids the type takes (its own struct fields, list elements, map keys and values)."""
    if isinstance(spec, StructOf):
        return sum(1 + count_fields(f.type) for f in spec.fields)
    if isinstance(spec, ListOf):
        return 1 + count_fields(spec.element)
    if isinstance(spec, MapOf):
        return 2 + count_fields(spec.key) + count_fields(spec.value)
    return 0


def depth(spec: TypeSpec) -> int:
    if isinstance(spec, StructOf):
        return 1 + max((depth(f.type) for f in spec.fields), default=0)
    if isinstance(spec, ListOf):
        return 1 + depth(spec.element)
    if isinstance(spec, MapOf):
        return 1 + max(depth(spec.key), depth(spec.value))
    return 0


def find(fields: tuple[FieldSpec, ...] | list[FieldSpec], path: str) -> tuple[FieldSpec, bool] | None:
    """The field a dotted path names, and whether it lies inside a list or map; None if none."""
    for candidate, f, repeated in walk(fields):
        if candidate == path:
            return f, repeated
    return None
