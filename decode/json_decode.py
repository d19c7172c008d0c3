"""Vectorised decode of a batch of Kafka record values (JSON) into an Arrow table.

The hot path is one pyarrow.json parse over the whole batch: the values are joined into
one newline-delimited buffer by Arrow kernels, without a Python loop over records. Only
when a batch holds malformed records does the decoder split it to find them, so a clean
stream pays nothing for the check.

Every record ends up either in the returned table or in `rejected` with a reason; no input
can crash or stop the decoder.

The work is split by concern: decode/json_screen.py checks the raw bytes before the parse
(records that are not exactly one JSON object, invalid UTF-8, NUL, NaN/Infinity, huge
exponents), decode/json_values.py holds the rules and conversions for each Iceberg type,
and this module parses (grouping records by the shape of their timestamp fields) and
bisects a failing block to the records that fail.

Nested columns: structs and lists, to any depth, parse into nested Arrow in the same one
parse, and every rule below holds at every depth (json_values.convert_value); a refused part
refuses its record, named by its dotted path (`items.qty`). Maps, which pyarrow's reader
cannot parse, are read from the records' bytes in decode/json_maps.py (lists holding maps too).

Keys: a schema field that appears twice in an object (at the top level or inside a struct)
is refused (json.loads would silently keep the last one); duplicate keys outside the
schema's fields are ignored. Numbers beyond a double's range in fields the schema lacks may
be dead-lettered (`Number too big to be stored in double`), depending on how they are
written; RFC 8259 section 6 lets a parser limit the range of numbers.

Fields the schema lacks, at any depth: with `unknown="ignore"` they are dropped; with
`unknown="report"` (what the ingest uses) each is named, typed by inference and tied to the
records that carry it (DecodeResult.unknown, decode/unknown_fields.py), and the caller
decides: hold those records for a schema change (`ingest.schema_evolution: add`) or count
them (`off`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType, ListType, StructType

from streamberg.decode import json_screen
from streamberg.decode.interface import DecodeResult
from streamberg.decode.json_maps import map_columns
from streamberg.decode.json_values import (
    DEFAULT_EPOCH_UNIT,
    EPOCH_UNITS,
    check_supported,
    convert_value,
    epoch_units,
    has_decimals,
    outside_parse,
    parse_type,
    timestamp_paths,
)
from streamberg.decode.required_fields import missing as missing_field
from streamberg.decode.unknown_fields import carries_unknown, collect, find_unknown, merge_found

# The decoder's API: callers check a schema and read epoch units through this module.
__all__ = ["DecodeResult", "JsonDecoder", "check_supported", "epoch_units"]

# Records nested deeper are refused by a decoder that reports unknown fields (see screen()).
MAX_REPORTED_DEPTH = 256

_ROW = re.compile(r" in row (\d+)$")
_TYPE_CHANGE = re.compile(r"Column\(/(.+)\) changed from (?:string to number|number to string)")
_ANY_CHANGE = re.compile(r"Column\(/(.+)\) changed from (\w+) to (\w+)")

class _BadBlock(Exception):
    """A block of records failed a check; carries the reason, and the row when known."""

    def __init__(self, reason: str, row: int | None = None):
        super().__init__(reason)
        self.row = row


_SPACE = np.zeros(256, dtype=bool)
_SPACE[[0x20, 0x09, 0x0A, 0x0D]] = True


def _number_follows(raw: pa.BinaryArray, key: str) -> np.ndarray:
    """Per record: does the first `"key"` in it hold a number (`"key" : -1...`)?

    A guess used only to choose the parse schema of a timestamp field (a string-and-number
    union): one substring search plus a few numpy steps, instead of a regex pass. A wrong
    guess (the first match is a nested key or a string, or over 8 spaces around the colon)
    costs a few small parses, never a wrong result: the decoder retries the record with the
    other type.
    """
    n = len(raw)
    found = pc.find_substring(raw, key).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(found >= 0)
    result = np.zeros(n, dtype=bool)
    if not len(rows) or raw.buffers()[2] is None:
        return result
    offsets = np.frombuffer(raw.buffers()[1], dtype=np.int32, count=n + 1, offset=raw.offset * 4)
    data = np.frombuffer(raw.buffers()[2], dtype=np.uint8)
    top = len(data) - 1
    at = offsets[rows].astype(np.int64) + found[rows] + len(key.encode())

    def skip_space(at: np.ndarray) -> np.ndarray:
        for _ in range(8):
            space = _SPACE[data[np.minimum(at, top)]]
            if not space.any():
                break
            at = at + space
        return at

    at = skip_space(at)
    colon = data[np.minimum(at, top)] == 0x3A
    at = skip_space(at + 1)
    at = np.where(data[np.minimum(at, top)] == 0x2D, at + 1, at)  # '-'
    first = data[np.minimum(at, top)]
    result[rows] = colon & (first >= 0x30) & (first <= 0x39)
    return result


class JsonDecoder:
    """Decodes JSON record values against an Iceberg schema.

    `epoch_units` maps timestamp field names to the unit of integer epochs (default ms).
    """

    def __init__(self, schema: Schema, max_record_bytes: int, epoch_units: Mapping[str, str] | None = None,
                 unknown: Literal["ignore", "report"] = "ignore"):
        check_supported(schema)
        self.report_unknown = unknown == "report"
        units = dict(epoch_units or {})
        for name, unit in units.items():
            if unit not in EPOCH_UNITS:
                raise ValueError(f"field {name!r}: unknown epoch unit {unit!r}; use one of {', '.join(EPOCH_UNITS)}")
        self.schema = schema
        self.file_schema = schema_to_pyarrow(schema)  # with PARQUET:field_id metadata
        self.required = [f.name for f in schema.fields if f.required]
        self.max_record_bytes = max_record_bytes
        # Timestamp fields at any depth, by dotted path (json_values.timestamp_paths).
        self.timestamp_fields = timestamp_paths(schema)
        self.has_decimals = has_decimals(schema)
        self.units = {path: units.get(path, DEFAULT_EPOCH_UNIT) for path in self.timestamp_fields}
        # A timestamp field holds a string or an integer, which one JSON parse cannot read
        # into one column: records are grouped by which timestamp fields carry a number
        # (a regex over the bytes) and each group is parsed with its own schema.
        self._options: dict[tuple[frozenset[str], bool], pj.ParseOptions] = {}
        # Maps, read outside the parse from the records' own bytes (decode/json_maps.py).
        self.maps = map_columns(schema, self.file_schema, max_record_bytes, units, JsonDecoder, unknown)
        # Maps are not in the parse schema, yet they are no unknown fields.
        self._map_paths = frozenset(tuple(m.path.split(".")) for m in self.maps)
        self._raw: list[bytes | None] = []
        self._found: dict = {}  # unknown fields of the batch being decoded (unknown_fields.find_unknown)
        # Declared fields by the parser's dotted path (list levels left out), with their types.
        self._known = _field_types(schema)

    # -- parsing one block -------------------------------------------------------------
    def _parse_options(self, numbers: frozenset[str], infer: bool = True) -> pj.ParseOptions:
        infer = infer and self.report_unknown
        if (numbers, infer) not in self._options:
            fields = [pa.field(f.name, parse_type(f.name, f.field_type, af.type, numbers))
                      for f, af in zip(self.schema.fields, self.file_schema) if not outside_parse(f.field_type)]
            self._options[numbers, infer] = pj.ParseOptions(explicit_schema=pa.schema(fields),
                                                            unexpected_field_behavior="infer" if infer else "ignore")
        return self._options[numbers, infer]

    def _parse(self, lines: pa.BinaryArray, numbers: frozenset[str], infer: bool = True) -> pa.Table:
        """Parse a block of newline-terminated values; raise _BadBlock if it isn't clean."""
        # A sliced BinaryArray shares its parent's buffers: find this block's byte range.
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32, count=len(lines) + 1, offset=lines.offset * 4)
        buffer = lines.buffers()[2][int(offsets[0]):int(offsets[-1])]
        try:
            # One parse block for the whole buffer, so a reported row number is absolute.
            parsed = pj.read_json(pa.BufferReader(buffer), parse_options=self._parse_options(numbers, infer),
                                  read_options=pj.ReadOptions(use_threads=False, block_size=max(len(buffer) + 1, 1 << 20)))
        except Exception as exc:  # noqa: BLE001 - any parser error is this block's fault, never the job's
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            row = _ROW.search(message)
            raise _BadBlock(_clean_reason(_ROW.sub("", message)), int(row.group(1)) if row else None) from None
        if parsed.num_columns == 0:
            # Every field is read outside the parse (a map's value that is itself a map or a
            # list of maps): the parse only checked the syntax; the rows are the records.
            parsed = pa.Table.from_batches([pa.RecordBatch.from_struct_array(
                pa.array([{}] * len(lines), type=pa.struct([])))])
        if parsed.num_rows != len(lines):
            # Every record starts with '{' and ends with '}', so each gives at least one row
            # and none runs into the next: extra rows mean a record holding several values.
            raise _BadBlock("more than one JSON value in one record")
        return parsed

    # -- converting parsed columns to the table's types ------------------------------------
    def _convert(self, parsed: pa.Table, numbers: frozenset[str], index: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """Cast to the file schema; return (table of the good rows, per-row reason or None).
        `index`: the rows' places in the batch (maps are read from those records' bytes)."""
        n = len(index)  # a parse of no columns (every field read outside it) has no rows of its own
        reasons = np.full(n, None, dtype=object)

        def flag(mask: np.ndarray, reason: str) -> None:
            reasons[mask & (reasons == None)] = reason  # noqa: E711 - numpy elementwise

        maps: dict[str, pa.Array] = {}
        if self.maps:
            raws = [self._raw[int(i)] or b"" for i in index]
            for reader in self.maps:
                maps[reader.path], refused, unknown = reader.read(raws)
                for row in np.flatnonzero(refused != None):  # noqa: E711 - numpy elementwise
                    if reasons[row] is None:
                        reasons[row] = refused[row]
                for path, t, rows in unknown:
                    merge_found(self._found, path, t, index[rows])
        for name in self.required:
            column = maps[name] if name in maps else parsed.column(name)
            if column.null_count:
                flag(pc.is_null(column).to_numpy(zero_copy_only=False), missing_field(name))
        columns = []
        for f, target in zip(self.schema.fields, self.file_schema):
            if f.name in maps:
                columns.append(maps[f.name])
                continue
            column = parsed.column(f.name).combine_chunks()
            if column.null_count == n:  # absent everywhere: nothing to check
                columns.append(pa.nulls(n, target.type))
                continue
            values, problems = convert_value(f.name, f.field_type, target.type, column, numbers, self.units, maps)
            for mask, reason in problems:
                flag(mask, reason)
            columns.append(values)
        table = pa.Table.from_arrays(columns, schema=self.file_schema)
        bad = reasons != None  # noqa: E711
        if bad.any():
            table = table.filter(pa.array(~bad))
        return table, reasons


    # -- splitting a failing block -----------------------------------------------------
    def _bisect(self, lines: pa.BinaryArray, index: np.ndarray, numbers: frozenset[str],
                parsed: dict, rejected: list, tried: frozenset = frozenset(), infer: bool = True) -> None:
        """Parse `lines`; on failure isolate each bad record and parse the rest.

        The parser stops at the first bad value and names its row: the records before it
        are parsed as one block, the bad one set aside, and the scan goes on after it (a
        failing parse costs only the bytes up to its error, so this is linear). When the
        records before parsed as exactly one row each, the failing row is that record and
        the block's error is its reason; otherwise the record is parsed alone. Errors
        without a usable row (values that fail to convert, several values in one record)
        split the block in halves. Parsed blocks are collected per parse schema in
        `parsed` and converted together afterwards, so the per-call cost of the conversion
        is paid once per batch, not per block.
        """
        start, window = 0, len(lines)
        while start < len(lines):
            # After an error the next block is small (a few times the clean run before it),
            # then doubles while it parses: total bytes handed to the parser stay linear
            # however the bad records are spread.
            size = min(window, len(lines) - start)
            block, block_index = lines.slice(start, size), index[start:start + size]
            try:
                table = self._parse(block, numbers, infer)
            except _BadBlock as bad:
                row = bad.row
                if size == 1:
                    # The timestamp-field grouping guessed wrong (a key written with escapes,
                    # or a nested key of the same name): try the record with the field flipped.
                    flip = self._flip(bad, tried)
                    if flip:
                        self._bisect(block, block_index, numbers ^ {flip}, parsed, rejected, tried | {flip}, infer)
                    elif self.report_unknown and infer:
                        self._alone_without_inference(block, block_index, numbers, parsed, rejected, bad, tried)
                    else:
                        rejected.append((int(block_index[0]), self._reason(bad)))
                elif row is None or not 0 <= row < size:
                    half = size // 2
                    self._bisect(block.slice(0, half), block_index[:half], numbers, parsed, rejected, tried, infer)
                    self._bisect(block.slice(half), block_index[half:], numbers, parsed, rejected, tried, infer)
                else:
                    aligned = row == 0
                    if row:
                        try:
                            self._keep(parsed, numbers, self._parse(block.slice(0, row), numbers, infer), block_index[:row])
                            aligned = True  # one row per record before `row`: the error is in record `row`
                        except _BadBlock:
                            self._bisect(block.slice(0, row), block_index[:row], numbers, parsed, rejected, tried, infer)
                    # Reporting, a record's error may come from inferring what the schema lacks
                    # (or a map, which the parse infers too): it is parsed alone to tell.
                    if aligned and not self._flip(bad, tried) and not (self.report_unknown and infer):
                        rejected.append((int(block_index[row]), self._reason(bad)))
                    else:
                        self._bisect(block.slice(row, 1), block_index[row:row + 1], numbers, parsed, rejected, tried, infer)
                    start, window = start + row + 1, max(16, 4 * (row + 1))
                    continue
                start += size
                continue
            self._keep(parsed, numbers, table, block_index)
            start, window = start + size, window * 2

    def _keep(self, parsed: dict, numbers: frozenset[str], table: pa.Table, index: np.ndarray) -> None:
        """Collect a parsed block; fields the schema lacks are noted and cast away first, so
        blocks of one parse schema concatenate whatever extra fields each held."""
        if self.report_unknown:
            table = find_unknown(self._parse_options(numbers).explicit_schema, table, index, self._map_paths, self._found)
        parsed.setdefault(numbers, []).append((table, index))

    def _reason(self, bad: _BadBlock) -> str:
        """The parser's reason, led by the field's path and both types when a value's JSON type
        contradicts a declared field (`field 'score': a string where the table has long`)."""
        change = _ANY_CHANGE.search(str(bad))
        if change is None:
            return str(bad)
        name = ".".join(part for part in change.group(1).split("/") if part != "[]")
        declared = self._known.get(name)
        if declared is None:
            return str(bad)
        return f"field {name!r}: a JSON {change.group(3)} where the table has {declared} ({bad})"

    def _alone_without_inference(self, block: pa.BinaryArray, index: np.ndarray, numbers: frozenset[str],
                                 parsed: dict, rejected: list, bad: _BadBlock, tried: frozenset) -> None:
        """One record the reporting parse refused. Parsed as the plain decoder parses it
        (fields the schema lacks ignored; timestamp guesses retried): if that refuses it too,
        that reason stands; if not, the inference failed on it (values of two JSON types for
        one field in one record, a field given twice, or a map's values, which the parse
        infers too). Then the record is refused only if it really carries a field the schema
        lacks (no type can be inferred for it), and otherwise kept."""
        plain: dict = {}
        self._bisect(block, index, numbers, plain, rejected, tried, infer=False)
        if not plain:
            return  # refused without inference too, with its reason
        if not carries_unknown(self._raw[int(index[0])] or b"", self.schema):
            for key, blocks in plain.items():
                parsed.setdefault(key, []).extend(blocks)
            return
        change = _ANY_CHANGE.search(str(bad))
        reason = self._reason(bad) if change is None else (
            f"field {'.'.join(p for p in change.group(1).split('/') if p != '[]')!r}: values of different JSON types "
            "in one record; a field the table lacks takes one type (declare it in table.schema to choose)")
        rejected.append((int(index[0]), reason))

    def _flip(self, bad: _BadBlock, tried: frozenset) -> str | None:
        """The timestamp field whose string/number guess the error shows wrong, if not yet retried."""
        change = _TYPE_CHANGE.search(str(bad))
        # The parser names a nested column by its JSON path (`items/[]/at`); ours is `items.at`.
        name = ".".join(part for part in change.group(1).split("/") if part != "[]") if change else None
        return name if name in self.units and name not in tried else None

    def _convert_rows(self, table: pa.Table, index: np.ndarray, numbers: frozenset[str],
                      good: list, kept: list, rejected: list) -> None:
        """Convert parsed rows; rows failing a type's rules are rejected with their reason."""
        try:
            converted, reasons = self._convert(table, numbers, index)
        except Exception as exc:  # noqa: BLE001 - a conversion failure must not stop the job
            if table.num_rows <= 1:  # nothing left to split
                rejected.extend((int(i), f"decode error: {type(exc).__name__}: {_clean_reason(str(exc))}")
                                for i in index)
                return
            half = table.num_rows // 2
            self._convert_rows(table.slice(0, half), index[:half], numbers, good, kept, rejected)
            self._convert_rows(table.slice(half), index[half:], numbers, good, kept, rejected)
            return
        bad_rows = reasons != None  # noqa: E711
        if bad_rows.any():
            # Reasons stay what they are (a Widening tells schema evolution what would take the value).
            rejected.extend((int(i), r if isinstance(r, str) else str(r)) for i, r in zip(index[bad_rows], reasons[bad_rows]))
            index = index[~bad_rows]
        if converted.num_rows:
            good.append(converted)
            kept.append(index)

    # -- public ---------------------------------------------------------------------
    def screen(self, raw: pa.BinaryArray) -> np.ndarray:
        """Per-record reason (or None) from the checks over the bytes, before any parse
        (decode/json_screen.py)."""
        # Reporting infers a type for every field the schema lacks, recursively (pyarrow's
        # inference crashes past ~10,000 levels; ours recurses in Python): deeper records are
        # refused first. Nothing that deep can become a column (16 levels at most).
        return json_screen.screen(raw, self.max_record_bytes, huge_exponents=self.has_decimals,
                                  max_depth=MAX_REPORTED_DEPTH if self.report_unknown else None)


    def decode(self, values: list[bytes | None]) -> DecodeResult:
        self._raw = values
        self._found = {}
        raw = pa.array(values, pa.binary())
        reasons = self.screen(raw)
        screened = reasons != None  # noqa: E711
        rejected: list[tuple[int, str]] = [(int(i), str(reasons[i])) for i in np.flatnonzero(screened)]
        candidates = np.flatnonzero(~screened)
        if len(candidates) < len(raw):
            raw = raw.take(pa.array(candidates))
        # Group by which timestamp fields carry a number (bit j: field j).
        group = np.zeros(len(raw), dtype=np.int64)
        for j, path in enumerate(self.timestamp_fields):
            # The key as written (its last part); a key of that name elsewhere can mislead the
            # guess, which the parse then shows and _flip corrects.
            group |= _number_follows(raw, f'"{path.rsplit(".", 1)[-1]}"').astype(np.int64) << j
        # Raw line ends may only be whitespace between JSON tokens: as tabs they stay
        # whitespace there, and inside a string they stay the invalid control characters
        # they were, while one record keeps one line.
        flat = pc.replace_substring(pc.replace_substring(raw, "\n", "\t"), "\r", "\t")
        lines = pc.binary_join_element_wise(flat, pa.scalar(b"", pa.binary()), pa.scalar(b"\n", pa.binary()))
        parsed: dict[frozenset[str], list] = {}
        keys = np.unique(group)
        for key in keys:
            numbers = frozenset(n for j, n in enumerate(self.timestamp_fields) if key >> j & 1)
            members = np.flatnonzero(group == key)
            block = lines if len(keys) == 1 else lines.take(pa.array(members))
            self._bisect(block, candidates[members], numbers, parsed, rejected)
        good: list[pa.Table] = []
        kept: list[np.ndarray] = []
        for numbers, blocks in parsed.items():
            table = blocks[0][0] if len(blocks) == 1 else pa.concat_tables([t for t, _ in blocks])
            self._convert_rows(table, np.concatenate([i for _, i in blocks]), numbers, good, kept, rejected)
        table = pa.concat_tables(good) if good else self.file_schema.empty_table()
        kept_index = np.concatenate(kept) if kept else np.empty(0, dtype=np.int64)
        if np.any(np.diff(kept_index) < 0):  # several parse groups, or records retried in another
            order = np.argsort(kept_index, kind="stable")
            table, kept_index = table.take(pa.array(order)), kept_index[order]
        rejected.sort()
        unknown = []
        for found in collect(self._found):
            found.rows = found.rows[np.isin(found.rows, kept_index)]  # refused records are dead letters
            if len(found.rows):
                unknown.append(found)
        self._found = {}
        return DecodeResult(table=table, kept=kept_index, rejected=rejected, unknown=unknown)


def _field_types(schema: Schema) -> dict[str, IcebergType]:
    """Every field's dotted path as the parser names it (list levels left out), and its type."""
    out: dict[str, IcebergType] = {}

    def visit(t: IcebergType, path: str) -> None:
        if isinstance(t, StructType):
            for f in t.fields:
                child = f"{path}.{f.name}" if path else f.name
                out[child] = f.field_type
                visit(f.field_type, child)
        elif isinstance(t, ListType):
            visit(t.element_type, path)

    visit(schema.as_struct(), "")
    return out


def _clean_reason(text: str) -> str:
    text = text.replace("JSON parse error: ", "not valid JSON for the schema: ")
    text = re.sub(r"decimal256\(76, (\d+)\)", r"decimal (scale \1)", text)
    return text.splitlines()[0][:300] if text else "unknown decode error"
