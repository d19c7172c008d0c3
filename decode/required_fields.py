"""Required fields at every depth: which rows of a decoded batch lack one.

Arrow keeps a null in a field its schema declares non-nullable (pa.Table.from_pylist does not
refuse it), and a Parquet writer then writes a zero or drops the struct: a required nested
field left null would be silently changed. So every decoder that builds rows from records it
did not parse against the table's types (the registry formats) asks this check, which reads
the table's required flags at every depth (struct fields, list elements, map values) and
names the first missing field of each row. A field counts as missing only where everything
above it is present: a null optional struct carries no required children.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType, ListType, MapType, StructType


def missing(path: str, why: str | None = None) -> str:
    """The one reason of a record that lacks a required field (at `path`, dotted)."""
    return f"missing required field {path!r}" + (f" ({why})" if why else "")


def missing_required(table: pa.Table, schema: Schema) -> dict[int, str]:
    """Row index -> the dotted path of the first required field that row lacks."""
    out: dict[int, str] = {}
    n = table.num_rows
    rows = np.arange(n, dtype=np.int64)
    for field in schema.fields:
        column = table.column(field.name).combine_chunks() if n else None
        if column is None:
            continue
        present = _valid(column)
        if field.required:
            _record(out, rows[~present], field.name)
        _walk(column, field.field_type, rows, present, field.name, out)
    return out


def _valid(array: pa.Array) -> np.ndarray:
    return np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _record(out: dict[int, str], rows: np.ndarray, path: str) -> None:
    for row in rows.tolist():
        out.setdefault(int(row), path)


def _walk(array: pa.Array, kind: IcebergType, rows: np.ndarray, present: np.ndarray, path: str,
          out: dict[int, str]) -> None:
    """Check what lies under `array` (whose entries belong to top-level `rows`, and are
    there where `present`)."""
    if isinstance(kind, StructType):
        for child in kind.fields:
            values = array.field(child.name)
            there = _valid(values)
            where = f"{path}.{child.name}"
            if child.required:
                _record(out, rows[present & ~there], where)
            _walk(values, child.field_type, rows, present & there, where, out)
    elif isinstance(kind, (ListType, MapType)):
        if not len(array):
            return
        # The entries of each list (or map) by its offsets, which hold for a slice too.
        offsets = np.asarray(array.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
        children = array.values if isinstance(kind, ListType) else array.items
        values = children.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        if not len(values):
            return
        parents = np.repeat(np.arange(len(array), dtype=np.int64), np.diff(offsets))
        if isinstance(kind, ListType):
            required, item, where = kind.element_required, kind.element_type, f"{path}[]"
        else:
            required, item, where = kind.value_required, kind.value_type, f"{path}{{}}"
        element_rows, element_present = rows[parents], present[parents]
        there = _valid(values)
        if required:
            _record(out, element_rows[element_present & ~there], where)
        _walk(values, item, element_rows, element_present & there, where, out)
