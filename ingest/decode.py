"""Vectorised decode of a batch of Kafka record values (JSON) into an Arrow table.

The hot path is one pyarrow.json parse over the whole batch: the values are joined into
one newline-delimited buffer by Arrow kernels, without a Python loop over records. Only
when a batch holds malformed records does the decoder split it to find them, so a clean
stream pays nothing for the check.

Every record ends up either in the returned table or in `rejected` with a reason; no input
can crash or stop the decoder.

**Screen before the parse.** pyarrow 16.1's JSON parser segfaults when a parse block starts
with the literal `null`, accepts `NaN`/`Infinity`, and parses across line ends (an unclosed
object on one line swallows the next line's record). So before the batch parse, vectorised
checks over the batch's bytes (Arrow kernels, no per-record Python) dead-letter every record
that is not exactly one object: after stripping JSON whitespace (space, tab, CR, LF) it must
start with `{` and end with `}`. Also screened: invalid UTF-8 (surrogates and overlong forms
included), raw NUL bytes, a leading UTF-8 byte order mark (refused, not stripped: RFC 8259
forbids it on the wire, and the raw record stays in the dead-letter table for a replay), and
`NaN`/`Infinity`/`-Infinity` outside strings (a substring screen, confirmed per flagged record
only). A record that passes can still hold several values (`{}{}`): the row count of the
parse catches it, and because every record starts with `{` and ends with `}`, no value can
run into the next record, so equal counts mean rows align with records.

**Rules for values** (the fuzz suite's reference decoder, tests/ingest/json_oracle.py,
states the same rules with `json.loads`):

- `boolean`: true/false. `int`/`long`: JSON integers within int32/int64 (`1.0`, `1e2` refused).
- `float`/`double`: any JSON number; the result must be finite (`float` after rounding to
  32 bits); an integer is taken as its nearest double first.
- `decimal(P,S)`: a JSON number or a string holding one (`"12.50"`, no spaces), exact at scale
  S (trailing zeros beyond S are fine, other digits are refused, never rounded) and within P
  digits; at most 76 digits written.
- `date`: a string `YYYY-MM-DD`, years 0001-9999.
- `timestamp`/`timestamptz`: an ISO-8601 string `YYYY-MM-DD[(T| )HH:MM[:SS[.fraction]]][zone]`,
  zone `Z`, `+HH:MM`, `+HHMM` or `+HH` (only after a time), fraction up to 9 digits truncated
  to microseconds; or an integer epoch in the field's unit (`s`, `ms` — the default — `us`,
  `ns`; nanoseconds are floored to microseconds). Without a zone the time is UTC; with one it
  is converted to UTC, for `timestamp` fields too. Years 0001-9999 in UTC.
- `string`: a JSON string. Strings anywhere in the record must not hold lone surrogates
  (`"\\ud800"`).
- A field that appears twice at the top level of a record is refused (json.loads would
  silently keep the last one); duplicate keys outside the schema's fields are ignored, as
  are fields the schema lacks, at any nesting depth.
- `null` or absent: null; refused for a required field.
- Numbers beyond a double's range (about 1.8e308) in fields the schema lacks: the record may
  be dead-lettered (`Number too big to be stored in double`), depending on how the number is
  written (`1e400` is refused, a 400-digit integer is not). RFC 8259 section 6 lets a parser
  limit the range of numbers; such numbers are not interoperable anyway.
- In a schema with decimal fields, a record is refused when some object member's value (any
  depth, any field) is a number or a string written with an exponent of 10,000 or more
  (`1e-99999`, `"1e-99999"`, escapes included): pyarrow 16 crashes converting some of them to
  a decimal (see HUGE_EXPONENT). Records that could hold one and nest deeper than 500
  levels are refused unchecked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    NestedField,
    TimestampType,
    TimestamptzType,
)

from streamberg.common.errors import UnsupportedSchemaError

# Iceberg types a JSON record can carry.
SUPPORTED_TYPES = ("boolean", "int", "long", "float", "double", "date", "timestamp", "timestamptz", "string", "decimal")
# Epoch units of integer timestamps: microseconds per unit (ns is divided instead).
EPOCH_UNITS = ("s", "ms", "us", "ns")
DEFAULT_EPOCH_UNIT = "ms"
_US_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}

# Timestamps and dates must fall in years 0001-9999 (what Python, Spark and most engines
# can represent): microseconds / days since the Unix epoch.
MIN_US = -62_135_596_800_000_000  # 0001-01-01T00:00:00Z
MAX_US = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z
MIN_DAY = -719_162  # 0001-01-01

# Decimals are parsed at 76 digits, then checked against the declared precision: pyarrow's
# JSON reader checks the *written* precision (refuses 99999999.990 for decimal(10,2)) but
# not the value's (it reads 1234567890 into decimal(10,2)).
_DECIMAL_PARSE_PRECISION = 76
_WS = "[ \t\r\n]"
_DATE_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_ZONE = r"(?:Z|[+-][0-9]{2}(?::?[0-9]{2})?)"
_TIME = r"[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,9})?)?"
_TS_RE = rf"^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}(?:{_TIME}{_ZONE}?)?$"
_ZONED_RE = rf"{_TIME}{_ZONE}$"
_ROW = re.compile(r" in row (\d+)$")
_TYPE_CHANGE = re.compile(r"Column\(/(.+)\) changed from (?:string to number|number to string)")
_NONFINITE = re.compile(rb"NaN|Inf")
# pyarrow 16's JSON reader crashes the process (segfault) converting a number with an
# exponent between about -10^7 and -2^31 into a decimal column, written bare or as a string,
# and rounds 1e-1000000 to 0. No decimal holds such a value exactly, so in a schema with
# decimal fields a record is refused before the parse when the value of some object member
# (any depth) is a number, or a string, written with an exponent of 10,000 or more. Records
# holding such an exponent, or an escaped e/E that could spell one, are the suspects; only
# they are parsed in Python to check.
HUGE_EXPONENT = re.compile(r"[+-]?[0-9.]*[eE][+-]?0*[1-9][0-9]{4,}", re.ASCII)
# A suspect holds such a token as a whole member value: after `"` or a `:`/`[`/`,`, and
# before `"` or a `,`/`]`/`}` (so a hex id like "9fe12345ab" is not one), or an escaped e/E
# or digit inside a string (which could spell one).
_HUGE_EXPONENT_SUSPECT = (r'(?:"|[:\[,][ \t\r\n]*)[+-]?[0-9.]*[eE][+-]?0*[1-9][0-9]{4,}(?:"|[ \t\r\n]*[,\]}])'
                          r"|\\u00[46]5|\\u003[0-9]")
SUSPECT_MAX_DEPTH = 500  # suspects nested deeper are refused rather than parsed recursively
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)




@dataclass
class DecodeResult:
    table: pa.Table  # decoded rows, in the table's Arrow schema (with field ids)
    kept: np.ndarray  # indexes (into the input batch) of the decoded rows, in order
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (index, reason)


def check_supported(schema: Schema) -> None:
    for f in schema.fields:
        name = str(f.field_type)
        if not (name in SUPPORTED_TYPES or isinstance(f.field_type, DecimalType)):
            raise UnsupportedSchemaError(
                f"column {f.name!r} has type {name}, which JSON records cannot carry; "
                f"supported: {', '.join(SUPPORTED_TYPES)}, decimal(P,S)"
            )


def epoch_units(fields: object) -> dict[str, str]:
    """{field name: epoch unit} from the config's `table.schema` (FieldConfig objects)."""
    return {f.name: f.unit for f in fields if getattr(f, "unit", None)}  # type: ignore[attr-defined]


class _BadBlock(Exception):
    """A block of records failed a check; carries the reason, and the row when known."""

    def __init__(self, reason: str, row: int | None = None):
        super().__init__(reason)
        self.row = row


def _is_timestamp(f: NestedField) -> bool:
    return isinstance(f.field_type, (TimestampType, TimestamptzType))


def _mask(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean kernel result as a numpy mask, nulls as False."""
    if array.null_count:
        array = pc.fill_null(array, False)
    return array.to_numpy(zero_copy_only=False)


def _cast_locate(array: pa.Array, target: pa.DataType) -> tuple[pa.Array, np.ndarray]:
    """Cast, returning nulls and a mask where single values fail.

    One cast when all values convert; otherwise halves until each failing value is found
    (O(bad * log n) casts of small arrays, no re-parse of JSON).
    """
    try:
        return array.cast(target), np.zeros(len(array), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, OverflowError):
        if len(array) <= 1:
            return pa.nulls(len(array), target), np.ones(len(array), dtype=bool)
        half = len(array) // 2
        a, bad_a = _cast_locate(array.slice(0, half), target)
        b, bad_b = _cast_locate(array.slice(half), target)
        return pa.concat_arrays([a, b]), np.concatenate([bad_a, bad_b])


def _has_nonfinite_token(value: bytes) -> bool:
    """True if NaN/Infinity occurs outside a JSON string (the record is then not JSON).

    Only records whose bytes contain "NaN" or "Inf" get here. A quote is a string delimiter
    unless preceded by an odd run of backslashes; the parity of delimiters before a position
    says whether it is inside a string.
    """
    data = np.frombuffer(value, dtype=np.uint8)
    index = np.arange(len(data))
    backslash = data == 0x5C
    last_other = np.maximum.accumulate(np.where(backslash, -1, index))  # last non-backslash at or before i
    quotes = np.flatnonzero(data == 0x22)
    run = np.where(quotes > 0, (quotes - 1) - last_other[np.maximum(quotes - 1, 0)], 0)
    delimiters = quotes[run % 2 == 0]
    # An even number of delimiters before a match: it stands outside any string.
    return any(np.searchsorted(delimiters, match.start()) % 2 == 0 for match in _NONFINITE.finditer(value))


class _NumberText(str):
    """A JSON number's literal text (json.loads parse_float/parse_int hook)."""


def has_huge_exponent_member(value: bytes) -> bool | None:
    """Whether some object member's value is a number or a string written with an exponent
    of 10,000 or more (HUGE_EXPONENT); None if the record is not JSON Python can read."""
    found = False

    def pairs(items: list[tuple[str, object]]) -> dict:
        nonlocal found
        for _key, member in items:
            if isinstance(member, str) and HUGE_EXPONENT.fullmatch(member):
                found = True
        return {}

    try:
        json.loads(value, parse_float=_NumberText, parse_int=_NumberText, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None
    return found


def nesting_depth(value: bytes) -> int:
    """How deep the record's arrays and objects nest, brackets inside strings not counted."""
    skeleton = np.frombuffer(_JSON_STRING.sub(b"", value), dtype=np.uint8)
    steps = np.isin(skeleton, (0x5B, 0x7B)).astype(np.int64) - np.isin(skeleton, (0x5D, 0x7D))
    return int(np.cumsum(steps).max()) if len(steps) else 0


def _records_containing(text: bytes, token: bytes, offsets: np.ndarray) -> np.ndarray:
    """Indexes of the records whose bytes contain `token` (one search hop per such record)."""
    found = []
    start, end = int(offsets[0]), int(offsets[-1])
    while (at := text.find(token, start, end)) >= 0:
        record = int(np.searchsorted(offsets, at, side="right")) - 1
        found.append(record)
        start = max(int(offsets[record + 1]), at + 1)
    return np.array(found, dtype=np.int64)


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


def _not_object_reason(value: bytes) -> str:
    text = value.strip(b" \t\r\n")
    if text == b"null":
        kind = "null"
    elif text in (b"true", b"false"):
        kind = "a boolean"
    elif text[:1] == b'"':
        kind = "a string"
    elif text[:1] == b"[":
        kind = "an array"
    elif text[:1] and text[:1] in b"-0123456789":
        kind = "a number"
    else:
        return "not valid JSON: a record must be one JSON object"
    return f"not a JSON object: the record is {kind}"


class JsonDecoder:
    """Decodes JSON record values against an Iceberg schema.

    `epoch_units` maps timestamp field names to the unit of integer epochs (default ms).
    """

    def __init__(self, schema: Schema, max_record_bytes: int, epoch_units: Mapping[str, str] | None = None):
        check_supported(schema)
        units = dict(epoch_units or {})
        for name, unit in units.items():
            if unit not in EPOCH_UNITS:
                raise ValueError(f"field {name!r}: unknown epoch unit {unit!r}; use one of {', '.join(EPOCH_UNITS)}")
        self.schema = schema
        self.file_schema = schema_to_pyarrow(schema)  # with PARQUET:field_id metadata
        self.required = [f.name for f in schema.fields if f.required]
        self.max_record_bytes = max_record_bytes
        self.timestamp_fields = [f.name for f in schema.fields if _is_timestamp(f)]
        self.has_decimals = any(isinstance(f.field_type, DecimalType) for f in schema.fields)
        self.units = {name: units.get(name, DEFAULT_EPOCH_UNIT) for name in self.timestamp_fields}
        # A timestamp field holds a string or an integer, which one JSON parse cannot read
        # into one column: records are grouped by which timestamp fields carry a number
        # (a regex over the bytes) and each group is parsed with its own schema.
        self._options: dict[frozenset[str], pj.ParseOptions] = {}

    # -- parsing one block -------------------------------------------------------------
    def _parse_options(self, numbers: frozenset[str]) -> pj.ParseOptions:
        if numbers not in self._options:
            fields = []
            for f, af in zip(self.schema.fields, self.file_schema):
                t = f.field_type
                if isinstance(t, DateType):
                    parse = pa.string()
                elif _is_timestamp(f):
                    parse = pa.int64() if f.name in numbers else pa.string()
                elif isinstance(t, IntegerType):
                    parse = pa.int64()  # range-checked after the parse, row by row
                elif isinstance(t, FloatType):
                    parse = pa.float64()  # rounded to 32 bits after the parse, as the reference does
                elif isinstance(t, DecimalType):
                    parse = pa.decimal256(_DECIMAL_PARSE_PRECISION, t.scale)
                elif pa.types.is_large_string(af.type):
                    parse = pa.string()
                else:
                    parse = af.type
                fields.append(pa.field(f.name, parse))
            self._options[numbers] = pj.ParseOptions(explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore")
        return self._options[numbers]

    def _parse(self, lines: pa.BinaryArray, numbers: frozenset[str]) -> pa.Table:
        """Parse a block of newline-terminated values; raise _BadBlock if it isn't clean."""
        # A sliced BinaryArray shares its parent's buffers: find this block's byte range.
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32, count=len(lines) + 1, offset=lines.offset * 4)
        buffer = lines.buffers()[2][int(offsets[0]):int(offsets[-1])]
        try:
            # One parse block for the whole buffer, so a reported row number is absolute.
            parsed = pj.read_json(pa.BufferReader(buffer), parse_options=self._parse_options(numbers),
                                  read_options=pj.ReadOptions(use_threads=False, block_size=max(len(buffer) + 1, 1 << 20)))
        except Exception as exc:  # noqa: BLE001 - any parser error is this block's fault, never the job's
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            row = _ROW.search(message)
            raise _BadBlock(_clean_reason(_ROW.sub("", message)), int(row.group(1)) if row else None) from None
        if parsed.num_rows != len(lines):
            # Every record starts with '{' and ends with '}', so each gives at least one row
            # and none runs into the next: extra rows mean a record holding several values.
            raise _BadBlock("more than one JSON value in one record")
        return parsed

    # -- converting parsed columns to the table's types ------------------------------------
    def _convert(self, parsed: pa.Table, numbers: frozenset[str]) -> tuple[pa.Table, np.ndarray]:
        """Cast to the file schema; return (table of the good rows, per-row reason or None)."""
        n = parsed.num_rows
        reasons = np.full(n, None, dtype=object)

        def flag(mask: np.ndarray, reason: str) -> None:
            reasons[mask & (reasons == None)] = reason  # noqa: E711 - numpy elementwise

        for name in self.required:
            column = parsed.column(name)
            if column.null_count:
                flag(pc.is_null(column).to_numpy(zero_copy_only=False), f"missing required field {name!r}")
        columns = []
        for f, target in zip(self.schema.fields, self.file_schema):
            column = parsed.column(f.name).combine_chunks()
            if column.null_count == n:  # absent everywhere: nothing to check
                columns.append(pa.nulls(n, target.type))
                continue
            values, problems = self._convert_column(f, target.type, column, f.name in numbers)
            for mask, reason in problems:
                flag(mask, reason)
            columns.append(values)
        table = pa.Table.from_arrays(columns, schema=self.file_schema)
        bad = reasons != None  # noqa: E711
        if bad.any():
            table = table.filter(pa.array(~bad))
        return table, reasons

    def _convert_column(self, f: NestedField, target: pa.DataType, column: pa.Array,
                        is_number: bool) -> tuple[pa.Array, list[tuple[np.ndarray, str]]]:
        t = f.field_type
        name = f.name
        if isinstance(t, IntegerType):
            out = _mask(pc.or_(pc.less(column, -(2 ** 31)), pc.greater(column, 2 ** 31 - 1)))
            return _null_where(column, out).cast(target), [(out, f"field {name!r}: integer out of range for int")]
        if isinstance(t, (FloatType, DoubleType)):
            values = column.cast(target) if isinstance(t, FloatType) else column
            out = ~_mask(pc.is_finite(values)) & ~pc.is_null(column).to_numpy(zero_copy_only=False)
            kind = "float (32-bit)" if isinstance(t, FloatType) else "double"
            return _null_where(values, out), [(out, f"field {name!r}: not a finite {kind} (NaN, Infinity or out of range)")]
        if isinstance(t, DecimalType):
            values, out = _cast_locate(column, target)
            return values, [(out, f"field {name!r}: more digits than decimal({t.precision},{t.scale}) holds (precision)")]
        if isinstance(t, DateType):
            malformed = ~_mask(pc.match_substring_regex(column, _DATE_RE)) & column.is_valid().to_numpy(zero_copy_only=False)
            values, bad = _cast_locate(_null_where(column, malformed), target)
            out = malformed | bad | _mask(pc.less(values.cast(pa.int32()), MIN_DAY))
            return _null_where(values, out), [(out, f"field {name!r}: not a date YYYY-MM-DD in years 0001-9999")]
        if _is_timestamp(f):
            if is_number:
                micros, out = self._epoch_micros(column, self.units[name])
                reason = f"field {name!r}: epoch ({self.units[name]}) outside years 0001-9999"
            else:
                micros, out = _iso_micros(column)
                reason = f"field {name!r}: not an ISO-8601 timestamp in years 0001-9999 (or an integer epoch)"
            return _null_where(micros, out).cast(target), [(out, reason)]
        if column.type != target:
            return column.cast(target), []
        return column, []

    @staticmethod
    def _epoch_micros(column: pa.Array, unit: str) -> tuple[pa.Array, np.ndarray]:
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        raw = pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        if unit == "ns":
            micros = raw // 1000  # floor, like truncating an ISO fraction for non-negative times
        else:
            per = _US_PER_UNIT[unit]
            low, high = -(-MIN_US // per), MAX_US // per  # bounds in the unit, no overflow
            inside = (raw >= low) & (raw <= high)
            micros = np.where(inside, raw, 0) * per
        out = valid & ((micros < MIN_US) | (micros > MAX_US) if unit == "ns" else ~inside)
        return pa.array(micros, type=pa.int64(), mask=~valid), out

    # -- splitting a failing block -----------------------------------------------------
    def _bisect(self, lines: pa.BinaryArray, index: np.ndarray, numbers: frozenset[str],
                parsed: dict, rejected: list, tried: frozenset = frozenset()) -> None:
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
                table = self._parse(block, numbers)
            except _BadBlock as bad:
                row = bad.row
                if size == 1:
                    # The timestamp-field grouping guessed wrong (a key written with escapes,
                    # or a nested key of the same name): try the record with the field flipped.
                    flip = self._flip(bad, tried)
                    if flip:
                        self._bisect(block, block_index, numbers ^ {flip}, parsed, rejected, tried | {flip})
                    else:
                        rejected.append((int(block_index[0]), str(bad)))
                elif row is None or not 0 <= row < size:
                    half = size // 2
                    self._bisect(block.slice(0, half), block_index[:half], numbers, parsed, rejected, tried)
                    self._bisect(block.slice(half), block_index[half:], numbers, parsed, rejected, tried)
                else:
                    aligned = row == 0
                    if row:
                        try:
                            parsed.setdefault(numbers, []).append((self._parse(block.slice(0, row), numbers), block_index[:row]))
                            aligned = True  # one row per record before `row`: the error is in record `row`
                        except _BadBlock:
                            self._bisect(block.slice(0, row), block_index[:row], numbers, parsed, rejected, tried)
                    if aligned and not self._flip(bad, tried):
                        rejected.append((int(block_index[row]), str(bad)))
                    else:
                        self._bisect(block.slice(row, 1), block_index[row:row + 1], numbers, parsed, rejected, tried)
                    start, window = start + row + 1, max(16, 4 * (row + 1))
                    continue
                start += size
                continue
            parsed.setdefault(numbers, []).append((table, block_index))
            start, window = start + size, window * 2

    def _flip(self, bad: _BadBlock, tried: frozenset) -> str | None:
        """The timestamp field whose string/number guess the error shows wrong, if not yet retried."""
        change = _TYPE_CHANGE.search(str(bad))
        name = change.group(1) if change else None
        return name if name in self.units and name not in tried else None

    def _convert_rows(self, table: pa.Table, index: np.ndarray, numbers: frozenset[str],
                      good: list, kept: list, rejected: list) -> None:
        """Convert parsed rows; rows failing a type's rules are rejected with their reason."""
        try:
            converted, reasons = self._convert(table, numbers)
        except Exception as exc:  # noqa: BLE001 - a conversion failure must not stop the job
            if table.num_rows == 1:
                rejected.append((int(index[0]), f"decode error: {type(exc).__name__}: {_clean_reason(str(exc))}"))
                return
            half = table.num_rows // 2
            self._convert_rows(table.slice(0, half), index[:half], numbers, good, kept, rejected)
            self._convert_rows(table.slice(half), index[half:], numbers, good, kept, rejected)
            return
        bad_rows = reasons != None  # noqa: E711
        if bad_rows.any():
            rejected.extend((int(i), str(r)) for i, r in zip(index[bad_rows], reasons[bad_rows]))
            index = index[~bad_rows]
        if converted.num_rows:
            good.append(converted)
            kept.append(index)

    # -- public ---------------------------------------------------------------------
    def screen(self, raw: pa.BinaryArray) -> np.ndarray:
        """Per-record reason (or None) from the checks over the bytes, before any parse.

        The usual record starts with '{' and ends with '}' exactly: that is checked for the
        whole batch at once with numpy over Arrow's offsets and data buffers; only the
        others (leading/trailing whitespace, or bad) go through the regex checks. Besides, one
        UTF-8 validation pass and one regex pass for NUL/NaN/Inf candidates.
        """
        n = len(raw)
        reasons = np.full(n, None, dtype=object)

        def flag(mask: np.ndarray, reason: object) -> None:
            todo = np.flatnonzero(mask & (reasons == None))  # noqa: E711
            for i in todo:
                reasons[i] = reason(int(i)) if callable(reason) else reason

        if n == 0:
            return reasons
        valid = raw.is_valid().to_numpy(zero_copy_only=False)
        flag(~valid, "null value (tombstone)")
        offsets = np.frombuffer(raw.buffers()[1], dtype=np.int32, count=n + 1, offset=raw.offset * 4)
        lengths = np.diff(offsets)
        flag(lengths > self.max_record_bytes,
             lambda i: f"oversized: {int(lengths[i])} bytes > max_record_bytes {self.max_record_bytes}")
        data = np.frombuffer(raw.buffers()[2], dtype=np.uint8) if raw.buffers()[2] is not None else np.empty(0, np.uint8)
        if not len(data):  # every value empty or null
            data = np.zeros(1, np.uint8)
        nonempty = lengths > 0
        first = np.where(nonempty, data[np.minimum(offsets[:-1], len(data) - 1)], 0)
        last = np.where(nonempty, data[np.maximum(offsets[1:] - 1, 0)], 0)
        unusual = np.flatnonzero(~((first == 0x7B) & (last == 0x7D)) & (reasons == None))  # noqa: E711
        if len(unusual):
            odd = raw.take(pa.array(unusual))
            checks = [
                (f"^{_WS}*$", True, "empty or blank value"),
                ("^\ufeff", True, "starts with a UTF-8 byte order mark (not allowed in JSON records)"),
                (f"^{_WS}*\\{{", False, lambda i: _not_object_reason(raw[i].as_py())),
                (f"\\}}{_WS}*$", False, "not a single JSON object: text after its closing '}', or the object is not closed"),
            ]
            for pattern, when, reason in checks:
                hit = _mask(pc.match_substring_regex(odd, pattern))
                mask = np.zeros(n, dtype=bool)
                mask[unusual] = hit if when else ~hit
                flag(mask, reason)
        _, invalid = _cast_locate(raw, pa.string())
        flag(invalid, "value is not valid UTF-8")
        # NUL bytes, NaN and Infinity: a memchr-speed search of the whole data buffer finds
        # the records holding the bytes at all (usually none); only those are looked at.
        text = raw.buffers()[2].to_pybytes() if raw.buffers()[2] is not None else b""
        nul = _records_containing(text, b"\x00", offsets)
        flag(np.isin(np.arange(n), nul), "not valid JSON: contains a NUL byte")
        suspects = np.union1d(_records_containing(text, b"NaN", offsets), _records_containing(text, b"Inf", offsets))
        suspects = suspects[reasons[suspects] == None]  # noqa: E711
        if len(suspects):
            # A precise but slower regex over the suspects only (text like "Info" is common):
            # a token follows ':', '[' or ','; then the exact check outside strings.
            near = _mask(pc.match_substring_regex(raw.take(pa.array(suspects)), f"[:\\[,]{_WS}*-?(?:NaN|Inf)"))
            bad = [int(i) for i in suspects[near] if _has_nonfinite_token(raw[int(i)].as_py())]
            flag(np.isin(np.arange(n), bad), "not valid JSON: NaN and Infinity are not JSON numbers")
        if self.has_decimals:
            self._screen_huge_exponents(raw, reasons, flag)
        return reasons

    def _screen_huge_exponents(self, raw: pa.BinaryArray, reasons: np.ndarray,
                              flag: Callable[[np.ndarray, object], None]) -> None:
        """See HUGE_EXPONENT: one regex pass over the batch, Python only for the suspects."""
        suspects = np.flatnonzero(_mask(pc.match_substring_regex(raw, _HUGE_EXPONENT_SUSPECT)) & (reasons == None))  # noqa: E711
        huge, deep = [], []
        for i in suspects:
            value = raw[int(i)].as_py()
            if nesting_depth(value) > SUSPECT_MAX_DEPTH:
                deep.append(int(i))
            elif has_huge_exponent_member(value):
                huge.append(int(i))
        n = len(raw)
        flag(np.isin(np.arange(n), huge), "a value written with an exponent of 10,000 or more (no decimal holds it)")
        flag(np.isin(np.arange(n), deep), "nested too deeply to check for values written with huge exponents")

    def decode(self, values: list[bytes | None]) -> DecodeResult:
        raw = pa.array(values, pa.binary())
        reasons = self.screen(raw)
        screened = reasons != None  # noqa: E711
        rejected: list[tuple[int, str]] = [(int(i), str(reasons[i])) for i in np.flatnonzero(screened)]
        candidates = np.flatnonzero(~screened)
        if len(candidates) < len(raw):
            raw = raw.take(pa.array(candidates))
        # Group by which timestamp fields carry a number (bit j: field j).
        group = np.zeros(len(raw), dtype=np.int64)
        for j, name in enumerate(self.timestamp_fields):
            group |= _number_follows(raw, f'"{name}"').astype(np.int64) << j
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
        return DecodeResult(table=table, kept=kept_index, rejected=rejected)


def _null_where(values: pa.Array, mask: np.ndarray) -> pa.Array:
    if not mask.any():
        return values
    return pc.if_else(pa.array(mask), pa.scalar(None, values.type), values)


def _iso_micros(column: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """ISO-8601 strings -> int64 microseconds since the epoch (UTC), and a bad-value mask."""
    n = len(column)
    present = column.is_valid().to_numpy(zero_copy_only=False)
    malformed = present & ~_mask(pc.match_substring_regex(column, _TS_RE))
    if not malformed.any():  # fast path: one zone style for the whole column (the usual case)
        for target in (pa.timestamp("us", tz="UTC"), pa.timestamp("us")):
            try:
                micros = column.cast(target).cast(pa.int64())
            except (pa.ArrowInvalid, ValueError):
                continue
            out = _mask(pc.or_(pc.less(micros, MIN_US), pc.greater(micros, MAX_US)))
            return micros, out
    text = pc.replace_substring_regex(_null_where(column, malformed), r"(\.[0-9]{6})[0-9]+", r"\1")
    zoned = _mask(pc.match_substring_regex(text, _ZONED_RE))
    micros = np.zeros(n, dtype=np.int64)
    failed = np.zeros(n, dtype=bool)
    # Arrow's cast wants a zone for a zoned target and none for a naive one: cast each part.
    for part, target in ((zoned, pa.timestamp("us", tz="UTC")), (~zoned, pa.timestamp("us"))):
        rows = np.flatnonzero(part)
        if len(rows):
            values, bad = _cast_locate(text.take(pa.array(rows)), target)
            micros[rows] = pc.fill_null(values.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
            failed[rows] = bad
    out = present & (malformed | failed | (micros < MIN_US) | (micros > MAX_US))
    return pa.array(micros, type=pa.int64(), mask=~present), out


def _clean_reason(text: str) -> str:
    text = text.replace("JSON parse error: ", "not valid JSON for the schema: ")
    text = re.sub(r"decimal256\(76, (\d+)\)", r"decimal (scale \1)", text)
    return text.splitlines()[0][:300] if text else "unknown decode error"
