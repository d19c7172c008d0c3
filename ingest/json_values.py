"""The decoder's rules for values: what a JSON value must be to land in a column of each
Iceberg type, and the vectorised conversions (Arrow kernels) that apply them.

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

The fuzz suite's reference decoder (tests/ingest/json_oracle.py) states the same rules with
`json.loads`; ingest/decode.py applies them to each parsed column.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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

_DATE_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_ZONE = r"(?:Z|[+-][0-9]{2}(?::?[0-9]{2})?)"
_TIME = r"[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,9})?)?"
_TS_RE = rf"^[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}(?:{_TIME}{_ZONE}?)?$"
_ZONED_RE = rf"{_TIME}{_ZONE}$"

def check_supported(schema: Schema) -> None:
    for f in schema.fields:
        if not f.field_type.is_primitive:
            # The config and the catalog take nested types (common/config/types.py); decoding
            # them from JSON comes next. Refused before any worker starts, never half-written.
            raise UnsupportedSchemaError(
                f"column {f.name!r} is {f.field_type}: the JSON decoder does not write nested columns "
                "(struct, list, map) yet; the table can hold them, the ingest cannot fill them")
        name = str(f.field_type)
        if not (name in SUPPORTED_TYPES or isinstance(f.field_type, DecimalType)):
            raise UnsupportedSchemaError(
                f"column {f.name!r} has type {name}, which JSON records cannot carry; "
                f"supported: {', '.join(SUPPORTED_TYPES)}, decimal(P,S)"
            )


def epoch_units(fields: object) -> dict[str, str]:
    """{field name: epoch unit} from the config's `table.schema` (FieldConfig objects; None when
    the config leaves the schema to the table: every epoch is then in ms)."""
    return {f.name: f.unit for f in fields or () if getattr(f, "unit", None)}  # type: ignore[attr-defined]


def is_timestamp(f: NestedField) -> bool:
    return isinstance(f.field_type, (TimestampType, TimestamptzType))


def mask_of(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean kernel result as a numpy mask, nulls as False."""
    if array.null_count:
        array = pc.fill_null(array, False)
    return array.to_numpy(zero_copy_only=False)


def cast_locate(array: pa.Array, target: pa.DataType) -> tuple[pa.Array, np.ndarray]:
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
        a, bad_a = cast_locate(array.slice(0, half), target)
        b, bad_b = cast_locate(array.slice(half), target)
        return pa.concat_arrays([a, b]), np.concatenate([bad_a, bad_b])


def null_where(values: pa.Array, mask: np.ndarray) -> pa.Array:
    if not mask.any():
        return values
    return pc.if_else(pa.array(mask), pa.scalar(None, values.type), values)


def iso_micros(column: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """ISO-8601 strings -> int64 microseconds since the epoch (UTC), and a bad-value mask."""
    n = len(column)
    present = column.is_valid().to_numpy(zero_copy_only=False)
    malformed = present & ~mask_of(pc.match_substring_regex(column, _TS_RE))
    if not malformed.any():  # fast path: one zone style for the whole column (the usual case)
        for target in (pa.timestamp("us", tz="UTC"), pa.timestamp("us")):
            try:
                micros = column.cast(target).cast(pa.int64())
            except (pa.ArrowInvalid, ValueError):
                continue
            out = mask_of(pc.or_(pc.less(micros, MIN_US), pc.greater(micros, MAX_US)))
            return micros, out
    text = pc.replace_substring_regex(null_where(column, malformed), r"(\.[0-9]{6})[0-9]+", r"\1")
    zoned = mask_of(pc.match_substring_regex(text, _ZONED_RE))
    micros = np.zeros(n, dtype=np.int64)
    failed = np.zeros(n, dtype=bool)
    # Arrow's cast wants a zone for a zoned target and none for a naive one: cast each part.
    for part, target in ((zoned, pa.timestamp("us", tz="UTC")), (~zoned, pa.timestamp("us"))):
        rows = np.flatnonzero(part)
        if len(rows):
            values, bad = cast_locate(text.take(pa.array(rows)), target)
            micros[rows] = pc.fill_null(values.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
            failed[rows] = bad
    out = present & (malformed | failed | (micros < MIN_US) | (micros > MAX_US))
    return pa.array(micros, type=pa.int64(), mask=~present), out


def convert_column(f: NestedField, target: pa.DataType, column: pa.Array, is_number: bool,
                   unit: str) -> tuple[pa.Array, list[tuple[np.ndarray, str]]]:
    """One parsed column in the column's type: the values (nulls where refused) and, per
    rule, the mask of the records it refuses with its reason. `unit`: a timestamp field's
    epoch unit."""
    t = f.field_type
    name = f.name
    if isinstance(t, IntegerType):
        out = mask_of(pc.or_(pc.less(column, -(2 ** 31)), pc.greater(column, 2 ** 31 - 1)))
        return null_where(column, out).cast(target), [(out, f"field {name!r}: integer out of range for int")]
    if isinstance(t, (FloatType, DoubleType)):
        values = column.cast(target) if isinstance(t, FloatType) else column
        out = ~mask_of(pc.is_finite(values)) & ~pc.is_null(column).to_numpy(zero_copy_only=False)
        kind = "float (32-bit)" if isinstance(t, FloatType) else "double"
        return null_where(values, out), [(out, f"field {name!r}: not a finite {kind} (NaN, Infinity or out of range)")]
    if isinstance(t, DecimalType):
        values, out = cast_locate(column, target)
        return values, [(out, f"field {name!r}: more digits than decimal({t.precision},{t.scale}) holds (precision)")]
    if isinstance(t, DateType):
        malformed = ~mask_of(pc.match_substring_regex(column, _DATE_RE)) & column.is_valid().to_numpy(zero_copy_only=False)
        values, bad = cast_locate(null_where(column, malformed), target)
        out = malformed | bad | mask_of(pc.less(values.cast(pa.int32()), MIN_DAY))
        return null_where(values, out), [(out, f"field {name!r}: not a date YYYY-MM-DD in years 0001-9999")]
    if is_timestamp(f):
        if is_number:
            micros, out = epoch_micros(column, unit)
            reason = f"field {name!r}: epoch ({unit}) outside years 0001-9999"
        else:
            micros, out = iso_micros(column)
            reason = f"field {name!r}: not an ISO-8601 timestamp in years 0001-9999 (or an integer epoch)"
        return null_where(micros, out).cast(target), [(out, reason)]
    if column.type != target:
        return column.cast(target), []
    return column, []

def epoch_micros(column: pa.Array, unit: str) -> tuple[pa.Array, np.ndarray]:
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
