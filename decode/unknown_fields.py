"""Fields the records carry and the table lacks: found in the decoder's own parse, typed by
inference from the JSON values.

The decoder parses with pyarrow's `unexpected_field_behavior="infer"` (measured: the same
cost as "ignore" on records without such fields): the schema's fields keep their declared
parse types, and members the schema lacks, at any depth (inside structs and list elements),
come back as extra Arrow columns with inferred types. This module walks the parsed block
against the parse schema, names every extra field by its Iceberg path
(`customer.email`, `items.element.color`), types it by the rules of schema evolution and
says which records carry a value there. The extra columns are then cast away, so the rest
of the decoder sees exactly the blocks it always did.

Inference (JSON value -> Iceberg type): integer -> long, other number -> double (an integer
and a fraction in one field -> double), string -> string (pyarrow reads ISO-8601 strings as
timestamps; they stay strings: no guessing), boolean -> boolean, object -> struct of its
members, array -> list of its elements' type. A field whose values carry no type (only
nulls, empty arrays, empty objects) holds nothing to lose and is not reported. Values of
conflicting types for one field (a number here, a string there) fail pyarrow's parse of the
block: the decoder then parses such records alone, and a record that conflicts with itself
(`[1, "a"]`) is dead-lettered with the reason.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DoubleType,
    IcebergType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
)

from streamberg.common.config.types import MAX_FIELD_NAME
from streamberg.decode.types import join

Path = tuple[str, ...]  # Iceberg names from the top, "element" for a list's elements


def display(path: Path) -> str:
    """A path as reasons, logs and snapshot summaries show it: a name past MAX_FIELD_NAME
    characters is cut (a hostile record's 100 KB field name must not reach the metadata)."""
    return ".".join(p if len(p) <= MAX_FIELD_NAME else f"{p[:MAX_FIELD_NAME]}...({len(p):,} characters)" for p in path)


@dataclass
class UnknownField:
    """One field the schema lacks, as one decode batch found it."""

    path: Path
    type: IcebergType  # inferred
    rows: np.ndarray  # batch indexes of the records carrying a value there (sorted, unique)


def infer_type(arrow_type: pa.DataType) -> IcebergType | None:
    """The Iceberg type of an inferred Arrow type (None: the values carry no type)."""
    ids = itertools.count(1)  # placeholders: the schema update assigns the table's ids
    return _infer(arrow_type, ids)


def _infer(t: pa.DataType, ids: itertools.count) -> IcebergType | None:
    if pa.types.is_boolean(t):
        return BooleanType()
    if pa.types.is_integer(t):
        return LongType()
    if pa.types.is_floating(t):
        return DoubleType()
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_timestamp(t) or pa.types.is_date(t):
        return StringType()
    if pa.types.is_struct(t):
        fields = []
        for child in t:
            inner = _infer(child.type, ids)
            if inner is not None:
                fields.append(NestedField(next(ids), child.name, inner, required=False))
        return StructType(*fields) if fields else None
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        element = _infer(t.value_type, ids)
        return ListType(next(ids), element, element_required=False) if element is not None else None
    return None  # null, and nothing else the JSON reader infers


def _carried(values: pa.Array, rows: np.ndarray) -> np.ndarray:
    """The batch rows of the values that are not null."""
    valid = pc.is_valid(values).to_numpy(zero_copy_only=False)
    return rows[valid]


def _walk(expected: pa.DataType, array: pa.Array, rows: np.ndarray, path: Path, skip: frozenset[Path],
          out: dict[Path, tuple[IcebergType, list[np.ndarray]]]) -> None:
    if pa.types.is_struct(array.type) and pa.types.is_struct(expected):
        known = {f.name for f in expected}
        children = array.flatten()  # with the struct's own nulls applied to its fields
        for i, child in enumerate(array.type):
            child_path = (*path, child.name)
            if child_path in skip:
                continue
            if child.name in known:
                _walk(expected.field(child.name).type, children[i], rows, child_path, skip, out)
                continue
            inferred = infer_type(child.type)
            if inferred is None:
                continue
            carried = _carried(children[i], rows)
            if len(carried):
                merge_found(out, child_path, inferred, carried)
    elif pa.types.is_list(array.type) and pa.types.is_list(expected):
        if not pa.types.is_struct(expected.value_type) and not pa.types.is_list(expected.value_type):
            return  # primitive elements: nothing unknown below
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
        _walk(expected.value_type, array.flatten(), rows[parents], (*path, "element"), skip, out)


def _valid(array: pa.Array) -> bool:
    try:
        array.validate()
    except pa.ArrowInvalid:
        return False
    return True


def repaired(array: pa.Array) -> pa.Array:
    """`array` with every list's values (and struct's children) padded to the lengths its
    offsets (and the struct) say. pyarrow 16's JSON reader drops the leading nulls of an
    inferred list (`[null, null]`, `[null, false]`), leaving values shorter than the offsets:
    any validation of an array holding one fails. The search for unknown fields needs only
    the inferred types and which rows carry a value, which padding keeps; the values are never
    written (records carrying unknown fields are decoded again against the evolved schema)."""
    t = array.type
    mask = array.is_null() if array.null_count else None
    if pa.types.is_list(t):
        offsets = array.offsets
        end = offsets[-1].as_py() if len(offsets) else 0
        values = repaired(array.values)
        if len(values) < end:
            values = pa.concat_arrays([values, pa.nulls(end - len(values), values.type)])
        return pa.ListArray.from_arrays(offsets, values, mask=mask)
    if pa.types.is_struct(t):
        children = []
        for i in range(t.num_fields):
            child = repaired(array.field(i))
            if len(child) < len(array):
                child = pa.concat_arrays([child, pa.nulls(len(array) - len(child), child.type)])
            children.append(child)
        return pa.StructArray.from_arrays(children, fields=[t.field(i) for i in range(t.num_fields)], mask=mask)
    return array


def find_unknown(parse_schema: pa.Schema, parsed: pa.Table, rows: np.ndarray, skip: frozenset[Path],
                 found: dict[Path, tuple[IcebergType, list[np.ndarray]]]) -> pa.Table:
    """Record in `found` the fields of `parsed` that `parse_schema` lacks (with the batch rows,
    `rows`, that carry them), and return `parsed` without them. `skip`: paths that are not
    unknown although the parse schema lacks them (the maps, read outside the parse)."""
    if parsed.schema.equals(parse_schema):
        return parsed
    # Chunk by chunk, and without the top-level columns read outside the parse: what the
    # parser inferred for those is never looked at (and pyarrow 16 cannot always concatenate
    # the lists of objects it infers for them).
    fields = [(i, f) for i, f in enumerate(parsed.schema) if (f.name,) not in skip]
    offset = 0
    for batch in parsed.to_batches():
        columns = [c if _valid(c) else repaired(c) for c in (batch.column(i) for i, _ in fields)]
        _walk(pa.struct(list(parse_schema)), pa.StructArray.from_arrays(
            columns, fields=[pa.field(f.name, c.type) for (_, f), c in zip(fields, columns)]),
            rows[offset:offset + batch.num_rows], (), skip, found)
        offset += batch.num_rows
    return parsed.select(parse_schema.names).cast(parse_schema)


def collect(found: dict[Path, tuple[IcebergType, list[np.ndarray]]]) -> list[UnknownField]:
    return [UnknownField(path, t, np.unique(np.concatenate(parts))) for path, (t, parts) in found.items()]


def carries_unknown(raw: bytes, schema: Schema) -> bool:
    """Whether a record holds a value (not null, not empty) in a field the schema lacks, outside
    maps: the check, in Python, for the rare record whose fields the parse could not infer."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return True  # the parse took it, so this is only a limit of json.loads: say yes, refuse
    return _unknown_in(value, schema.as_struct())


def _holds(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_holds(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds(v) for v in value)
    return value is not None


def _unknown_in(value: Any, t: IcebergType) -> bool:
    if isinstance(t, StructType) and isinstance(value, dict):
        fields = {f.name: f.field_type for f in t.fields}
        return any((_holds(v) if k not in fields else _unknown_in(v, fields[k])) for k, v in value.items())
    if isinstance(t, ListType) and isinstance(value, list):
        return any(_unknown_in(v, t.element_type) for v in value)
    if isinstance(t, MapType) and isinstance(value, dict):
        return any(_unknown_in(v, t.value_type) for v in value.values())
    return False


def merge_found(found: dict[Path, tuple[IcebergType, list[np.ndarray]]], path: Path, t: IcebergType,
                rows: np.ndarray) -> None:
    """Add one sighting to `found`; two types for one path merge (types.join)."""
    if path in found:
        found[path] = (join(found[path][0], t), found[path][1] + [rows])
    else:
        found[path] = (t, [rows])


