"""Map columns from JSON objects: the one part of a record the vectorised parse cannot read.

pyarrow's JSON reader has no map type (an object with keys it does not know becomes a
struct). So the parse leaves map fields out, and lists whose elements hold a map at any
depth, and for the rows of a parsed block each such column is read here:

1. the record is parsed with `json.loads`, keeping every member (duplicates too) and every
   number's literal text;
2. the column's value is found by its path (through structs): a map's object, its keys
   checked (strings, each once); a list's array;
3. every map value or list element is written back as its own one-field record
   `{"v": <value as written>}` and decoded by a JsonDecoder for the value's or element's type,
   so values follow exactly the rules of any other field (types, ranges, decimals,
   timestamps, structs, lists and maps inside: a list element's own maps are that decoder's),
   each value on its own (a timestamp value's epoch-or-string form is its own);
4. the entries are assembled into the column's MapArray or ListArray; a refused key, value or
   element refuses its record, with the reason named by the column's path.

The cost is a Python parse of each record of a schema that has maps; schemas without maps
never come here.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType, ListType, MapType, NestedField, StringType, StructType

from streamberg.decode.json_values import outside_parse
from streamberg.decode.types import Widening

_VALUE = "v"
_DEEP = threading.Lock()


class _Literal(str):
    """A JSON number kept as written."""


class _Pairs(list):
    """A JSON object as its members, in order, duplicates kept."""


def _loads(raw: bytes) -> Any:
    try:
        return json.loads(raw, object_pairs_hook=_Pairs, parse_int=_Literal, parse_float=_Literal,
                          parse_constant=_Literal)
    except RecursionError:
        return _loads_deep(raw)


def _loads_deep(raw: bytes) -> Any:
    """A record nested deeper than Python's recursion limit (in fields the schema lacks: the
    parse took it) is parsed in a thread with a stack and a limit for its size."""
    out: dict[str, Any] = {}

    def run() -> None:
        old = sys.getrecursionlimit()
        try:
            sys.setrecursionlimit(max(old, 3 * len(raw) + 1000))
            out["value"] = json.loads(raw, object_pairs_hook=_Pairs, parse_int=_Literal, parse_float=_Literal,
                                      parse_constant=_Literal)
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            out["error"] = exc
        finally:
            sys.setrecursionlimit(old)

    with _DEEP:  # one at a time: the stack size is process-wide
        size = threading.stack_size(max(64 << 20, min(1 << 30, 64 * len(raw))))
        try:
            worker = threading.Thread(target=run, name="json-maps-deep")
            worker.start()
            worker.join()
        finally:
            threading.stack_size(size)
    if "error" in out:
        raise out["error"]
    return out["value"]


def _dumps(value: Any) -> str:
    """The value as JSON again, numbers as written, members as they came (duplicates too)."""
    if isinstance(value, _Literal):
        return str(value)
    if isinstance(value, _Pairs):
        return "{" + ",".join(f"{json.dumps(k)}:{_dumps(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dumps(v) for v in value) + "]"
    return json.dumps(value)


def _member(obj: _Pairs, name: str) -> tuple[Any, int]:
    """The member's value (None when absent) and how many times it appears."""
    found = [v for k, v in obj if k == name]
    return (found[-1] if found else None), len(found)


def map_paths(t: IcebergType, path: str = "") -> list[tuple[str, MapType | ListType]]:
    """Every column read outside the parse, reached through structs, by dotted path (what
    is inside them is the inner decoder's)."""
    out: list[tuple[str, MapType | ListType]] = []
    if isinstance(t, StructType):
        for f in t.fields:
            child = f"{path}.{f.name}" if path else f.name
            if outside_parse(f.field_type):
                assert isinstance(f.field_type, (MapType, ListType))
                out.append((child, f.field_type))
            else:
                out += map_paths(f.field_type, child)
    return out


@dataclass
class MapColumn:
    """One column read outside the parse (a map, or a list whose elements hold maps): its
    path, and the decoder of its values or elements."""

    path: str
    map_type: MapType | ListType
    target: pa.DataType
    values: Any  # JsonDecoder of {"v": value}

    def rename(self, reason: str) -> str:
        """An inner reason in the record's terms: the value is the column's path. A widening
        keeps its type (schema evolution widens the column inside the map or list)."""
        renamed = (reason.replace(f"'{_VALUE}.", f"'{self.path}.").replace(f"'{_VALUE}'", f"'{self.path}'")
                   .replace(f"Column(/{_VALUE}", "Column(/" + self.path.replace(".", "/")))
        if isinstance(reason, Widening):
            inner = reason.path.split(".")[1:]
            return Widening(renamed, ".".join([self.path, *inner]), reason.wider)
        return renamed

    def read(self, raws: list[bytes]) -> tuple[pa.Array, np.ndarray, list[tuple[tuple[str, ...], IcebergType, np.ndarray]]]:
        """The column for these records (their raw values), per record a reason or None, and
        the fields the map's values carry that the value type lacks (decoder with
        unknown="report"): (Iceberg path, inferred type, rows of `raws`)."""
        parts = self.path.split(".")
        n = len(raws)
        reasons = np.full(n, None, dtype=object)
        null = np.zeros(n, dtype=bool)  # no map in this record (absent, null, or its struct is)
        keys: list[str] = []
        lines: list[bytes] = []
        owner: list[int] = []
        # A record that cannot name the map's first key (as written, or through an escape) has
        # no map: it is not parsed again.
        first = json.dumps(parts[0]).encode()
        for row, raw in enumerate(raws):
            if first not in raw and b"\\u" not in raw:
                null[row] = True
                continue
            value: Any = _loads(raw)
            for depth, part in enumerate(parts):
                if not isinstance(value, _Pairs):
                    value = None  # a struct on the path is null (the parse judged its shape)
                    break
                value, times = _member(value, part)
                if times > 1:
                    reasons[row] = f"not valid JSON for the schema: field {'.'.join(parts[:depth + 1])!r} twice"
                    break
            if reasons[row] is not None or value is None:
                null[row] = True
                continue
            if self.is_list:
                if isinstance(value, _Pairs) or not isinstance(value, list):
                    reasons[row] = f"field {self.path!r}: not a JSON array (a list is read from an array)"
                    continue
                entries: list[tuple[str, Any]] = [("", item) for item in value]
            else:
                if not isinstance(value, _Pairs):
                    reasons[row] = f"field {self.path!r}: not a JSON object (a map is read from an object)"
                    continue
                names = [k for k, _ in value]
                if len(set(names)) != len(names):
                    twice = sorted({k for k in names if names.count(k) > 1})
                    reasons[row] = f"field {self.path!r}: key {twice[0]!r} twice in one map"
                    continue
                entries = list(value)
            for key, item in entries:
                keys.append(key)
                lines.append(b'{"v":' + _dumps(item).encode("utf-8", "surrogatepass") + b"}")
                owner.append(row)
        items, good, unknown = self._items(lines, owner, reasons)
        # A refused record keeps no entries and no map (the row is dropped anyway).
        bad = reasons != None  # noqa: E711
        owners = np.asarray(owner, dtype=np.int64)
        kept = good & ~bad[owners] if len(owners) else np.zeros(0, dtype=bool)
        counts = np.bincount(owners[kept], minlength=n) if len(owners) else np.zeros(n, dtype=np.int64)
        ends = np.concatenate([[0], np.cumsum(counts)])
        # A null offset marks its slot null (pyarrow): the slot before it ends at the next one.
        offsets = [None if null[r] or bad[r] else int(ends[r]) for r in range(n)] + [int(ends[n])]
        kept_items = items.filter(pa.array((~bad[owners])[good])) if len(items) else items
        if self.is_list:
            large = pa.types.is_large_list(self.target)
            kind = pa.LargeListArray if large else pa.ListArray
            column = kind.from_arrays(pa.array(offsets, pa.int64() if large else pa.int32()), kept_items,
                                      type=self.target)
            return column, reasons, unknown
        kept_keys = pa.array([k for k, keep in zip(keys, kept) if keep], self.target.key_type)
        column = pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), kept_keys, kept_items, type=self.target)
        return column, reasons, unknown

    @property
    def is_list(self) -> bool:
        return isinstance(self.map_type, ListType)

    def _items(self, lines: list[bytes], owner: list[int],
               reasons: np.ndarray) -> tuple[pa.Array, np.ndarray, list[tuple[tuple[str, ...], IcebergType, np.ndarray]]]:
        """Decode every entry's value; flag the rows of refused ones. Returns the decoded values
        (one per entry that decoded, in entry order), which entries decoded, and the unknown
        fields of the values, named from the top (`attrs.value.note`) with their records."""
        item_type = self.target.value_type if self.is_list else self.target.item_type
        if not lines:
            return pa.array([], item_type), np.zeros(0, dtype=bool), []
        result = self.values.decode(lines)
        owners = np.asarray(owner, dtype=np.int64)
        prefix = (*self.path.split("."), "element" if self.is_list else "value")
        unknown = [((*prefix, *u.path[1:]), u.type, np.unique(owners[u.rows])) for u in result.unknown]
        good = np.zeros(len(lines), dtype=bool)
        good[result.kept] = True
        for index, reason in result.rejected:
            row = owner[index]
            if reasons[row] is None:
                reasons[row] = self.rename(reason)
        return result.table.column(_VALUE).combine_chunks(), good, unknown


def map_columns(schema: Schema, file_schema: pa.Schema, max_record_bytes: int, units: Mapping[str, str],
                decoder: type, unknown: str = "ignore") -> list[MapColumn]:
    """A MapColumn per column read outside the parse (reached through structs)."""
    columns = []
    for path, map_type in map_paths(schema.as_struct()):
        if isinstance(map_type, ListType):
            value = NestedField(field_id=map_type.element_id, name=_VALUE, field_type=map_type.element_type,
                                required=map_type.element_required)
        else:
            value = NestedField(field_id=map_type.value_id, name=_VALUE, field_type=map_type.value_type,
                                required=map_type.value_required)
        prefix = path + "."
        inner_units = {_VALUE + p[len(path):]: u for p, u in units.items() if p.startswith(prefix) or p == path}
        target = _target_type(file_schema, path)
        columns.append(MapColumn(path, map_type, target, decoder(Schema(value), max_record_bytes, inner_units, unknown)))
    return columns


def _target_type(file_schema: pa.Schema, path: str) -> pa.DataType:
    parts = path.split(".")
    t = file_schema.field(parts[0]).type
    for part in parts[1:]:
        t = t.field(t.get_field_index(part)).type
    return t


def check_map(path: str, map_type: MapType) -> str | None:
    """Why a map cannot be read from JSON, or None."""
    if not isinstance(map_type.key_type, StringType):
        return f"column {path!r} is {map_type}: a map read from JSON has string keys (JSON object keys)"
    return None
