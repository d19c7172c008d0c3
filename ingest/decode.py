"""Vectorised decode of a batch of Kafka record values (JSON) into an Arrow table.

The hot path is one pyarrow.json parse over the whole batch: the values are joined into
one newline-delimited buffer by Arrow kernels, without a Python loop over records. Only
when a batch holds malformed records does the decoder bisect it to find them (each bad
record costs O(log n) small parses), so a clean stream pays nothing for the check.

Every record ends up either in the returned table or in `rejected` with a reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import DateType, DecimalType, PrimitiveType

# Iceberg types a JSON record can carry, and how pyarrow.json should read each. Dates
# arrive as strings ("2026-11-21"), which pyarrow.json will not read as date32 directly:
# they are read as strings and cast afterwards (a vectorised, validating cast).
SUPPORTED_TYPES = ("boolean", "int", "long", "float", "double", "date", "timestamp", "timestamptz", "string", "decimal")


class UnsupportedSchemaError(ValueError):
    pass


@dataclass
class DecodeResult:
    table: pa.Table  # decoded rows, in the table's Arrow schema (with field ids)
    kept: np.ndarray  # indexes (into the input batch) of the decoded rows, in order
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (index, reason)


def _parse_type(iceberg_type: PrimitiveType, arrow_type: pa.DataType) -> pa.DataType:
    if isinstance(iceberg_type, DateType):
        return pa.string()
    if pa.types.is_large_string(arrow_type):
        return pa.string()
    return arrow_type


def check_supported(schema: Schema) -> None:
    for f in schema.fields:
        name = str(f.field_type)
        if not (name in SUPPORTED_TYPES or isinstance(f.field_type, DecimalType)):
            raise UnsupportedSchemaError(
                f"column {f.name!r} has type {name}, which JSON records cannot carry; "
                f"supported: {', '.join(SUPPORTED_TYPES)}, decimal(P,S)"
            )


class _BadBlock(Exception):
    """A block of records failed a check; carries the reason, and the row when known."""

    def __init__(self, reason: str, row: int | None = None):
        super().__init__(reason)
        self.row = row


_ROW = re.compile(r" in row (\d+)$")


class JsonDecoder:
    """Decodes JSON record values against an Iceberg schema."""

    def __init__(self, schema: Schema, max_record_bytes: int):
        check_supported(schema)
        self.file_schema = schema_to_pyarrow(schema)  # with PARQUET:field_id metadata
        self.parse_schema = pa.schema([
            pa.field(f.name, _parse_type(f.field_type, af.type)) for f, af in zip(schema.fields, self.file_schema)
        ])
        self.required = [f.name for f in schema.fields if f.required]
        self.max_record_bytes = max_record_bytes
        self._options = pj.ParseOptions(explicit_schema=self.parse_schema, unexpected_field_behavior="ignore")

    # -- parsing one block -------------------------------------------------------------
    def _parse(self, lines: pa.BinaryArray, expected_rows: int) -> pa.Table:
        """Parse a block of newline-terminated values; raise _BadBlock if it isn't clean."""
        if expected_rows == 0:
            return self.parse_schema.empty_table()
        # A sliced BinaryArray shares its parent's buffers: find this block's byte range.
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32, count=len(lines) + 1, offset=lines.offset * 4)
        buffer = lines.buffers()[2][int(offsets[0]):int(offsets[-1])]
        try:
            # One parse block for the whole buffer, so a reported row number is absolute.
            parsed = pj.read_json(pa.BufferReader(buffer), parse_options=self._options,
                                  read_options=pj.ReadOptions(use_threads=False, block_size=max(len(buffer) + 1, 1 << 20)))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            message = str(exc).splitlines()[0] if str(exc) else ""
            row = _ROW.search(message)
            raise _BadBlock(_clean_reason(_ROW.sub("", message)), int(row.group(1)) if row else None) from None
        if parsed.num_rows != expected_rows:
            # Blank values were removed beforehand, so extra rows mean a record holding
            # several JSON values; equal counts guarantee rows align with records.
            raise _BadBlock("more than one JSON value in one record")
        return parsed

    def _convert(self, parsed: pa.Table) -> tuple[pa.Table, np.ndarray, str]:
        """Cast to the file schema; return (table, missing-required mask, reason).

        Rows missing a required field are located directly from the null masks (no
        re-parsing); a failed cast raises _BadBlock for the block.
        """
        missing = np.zeros(parsed.num_rows, dtype=bool)
        reason = ""
        for name in self.required:
            column = parsed.column(name)
            if column.null_count:
                nulls = pc.is_null(column).to_numpy(zero_copy_only=False)
                reason = reason or f"missing required field {name!r}"
                missing |= nulls
        if missing.any():
            parsed = parsed.filter(pa.array(~missing))
        columns = []
        for target in self.file_schema:
            column = parsed.column(target.name)
            if column.type != target.type:
                try:
                    column = column.cast(target.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise _BadBlock(f"field {target.name!r}: {_clean_reason(str(exc))}") from None
            columns.append(column)
        return pa.Table.from_arrays(columns, schema=self.file_schema), missing, reason

    def _bisect(self, lines: pa.BinaryArray, index: np.ndarray, good: list, kept: list, rejected: list) -> None:
        """Decode `lines`; on failure isolate each bad record and decode the rest.

        The parser names the row it choked on: that record is checked on its own and the
        blocks before and after it are decoded. Without a usable row number the block is
        split in halves.
        """
        try:
            try:
                lines.cast(pa.string())  # UTF-8 validation: JSON text must be UTF-8
            except pa.ArrowInvalid:
                raise _BadBlock("value is not valid UTF-8") from None
            table, missing, reason = self._convert(self._parse(lines, len(lines)))
        except _BadBlock as bad:
            if len(lines) == 1:
                rejected.append((int(index[0]), str(bad)))
                return
            row = bad.row
            if row is not None and 0 <= row < len(lines):
                # Records before `row` parsed; the rest is unknown. Halving the rest keeps
                # a batch with many bad records from re-parsing one long suffix per record.
                middle = (row + 1 + len(lines)) // 2
                split = [(0, row), (row, row + 1), (row + 1, middle), (middle, len(lines))]
            else:
                half = len(lines) // 2
                split = [(0, half), (half, len(lines))]
            for lo, hi in split:
                if hi > lo:
                    self._bisect(lines.slice(lo, hi - lo), index[lo:hi], good, kept, rejected)
            return
        if missing.any():
            if len(self.required) > 1:  # name the first missing field of each record
                rejected.extend((int(i), self._missing_reason(lines.slice(int(j), 1))) for j, i in
                                zip(np.flatnonzero(missing), index[missing]))
            else:
                rejected.extend((int(i), reason) for i in index[missing])
            index = index[~missing]
        if table.num_rows:
            good.append(table)
            kept.append(index)

    def _missing_reason(self, line: pa.BinaryArray) -> str:
        parsed = self._parse(line, 1)
        absent = [n for n in self.required if parsed.column(n).null_count]
        return f"missing required field {absent[0]!r}" if absent else "missing required field"

    # -- public ---------------------------------------------------------------------
    def decode(self, values: list[bytes | None]) -> DecodeResult:
        raw = pa.array(values, pa.binary())
        n = len(raw)
        rejected: list[tuple[int, str]] = []
        lengths = pc.binary_length(raw)
        is_null = pc.is_null(raw).to_numpy(zero_copy_only=False)
        oversized = pc.fill_null(pc.greater(lengths, self.max_record_bytes), False).to_numpy(zero_copy_only=False)
        for i in np.flatnonzero(is_null):
            rejected.append((int(i), "null value (tombstone)"))
        for i in np.flatnonzero(oversized):
            rejected.append((int(i), f"oversized: {lengths[int(i)].as_py()} bytes > max_record_bytes {self.max_record_bytes}"))
        # Blank values would make the parser skip a line and misalign rows with records.
        blank = pc.fill_null(pc.match_substring_regex(raw, r"^[ \t\r\n]*$"), False).to_numpy(zero_copy_only=False)
        blank &= ~(is_null | oversized)
        for i in np.flatnonzero(blank):
            rejected.append((int(i), "empty or blank value"))
        candidates = np.flatnonzero(~(is_null | oversized | blank))
        if len(candidates) < n:
            raw = raw.take(pa.array(candidates))
        # Raw newlines may only be whitespace between JSON tokens (inside strings they must
        # be escaped), so flattening them keeps one record per line without changing it.
        flat = pc.replace_substring(pc.replace_substring(raw, "\n", " "), "\r", " ")
        lines = pc.binary_join_element_wise(flat, pa.scalar(b"", pa.binary()), pa.scalar(b"\n", pa.binary()))
        good: list[pa.Table] = []
        kept: list[np.ndarray] = []
        self._bisect(lines, candidates, good, kept, rejected)
        table = pa.concat_tables(good) if good else self.file_schema.empty_table()
        kept_index = np.concatenate(kept) if kept else np.empty(0, dtype=np.int64)
        rejected.sort()
        return DecodeResult(table=table, kept=kept_index, rejected=rejected)


def _clean_reason(text: str) -> str:
    text = text.replace("JSON parse error: ", "not valid JSON for the schema: ")
    return text.splitlines()[0][:300] if text else "unknown decode error"
