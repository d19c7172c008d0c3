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
- `struct`: a JSON object; its schema fields follow these rules, each at most once, a required
  one present (when the struct is). Other members are fields the schema lacks: the decoder
  names and types them (decode/unknown_fields.py) for schema evolution, or ignores them.
- `list`: a JSON array; its elements follow the element type (null only where elements are
  optional). A timestamp field inside list elements is written in one form per record (all
  epochs or all ISO strings); a timestamp that is itself a list element is an ISO string.
  Epoch units of nested timestamp fields are set by their dotted path (`customer.since`).
- `map` (string keys): a JSON object, each key once; every value follows the value type on
  its own (null only where values are optional). Not inside a list (refused at start).

The fuzz suite's reference decoder (tests/ingest/json_oracle.py) states the same rules with
`json.loads`; decode/json_decode.py applies them to each parsed column.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DateType,
    DecimalType,
    DoubleType,
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
)

from streamberg.common.errors import UnsupportedSchemaError
from streamberg.decode.required_fields import missing as missing_field
from streamberg.decode.types import Widening

# Iceberg types a JSON record can carry.
SUPPORTED_TYPES = ("boolean", "int", "long", "float", "double", "date", "timestamp", "timestamptz", "string", "decimal")
# Decimals are parsed at 76 digits, then checked against the declared precision: pyarrow's
# JSON reader checks the *written* precision (refuses 99999999.990 for decimal(10,2)) but
# not the value's (it reads 1234567890 into decimal(10,2)).
DECIMAL_PARSE_PRECISION = 76
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

def holds_map(t: IcebergType) -> bool:
    """Whether a map is anywhere inside `t`."""
    if isinstance(t, MapType):
        return True
    if isinstance(t, ListType):
        return holds_map(t.element_type)
    if isinstance(t, StructType):
        return any(holds_map(f.field_type) for f in t.fields)
    return False


def outside_parse(t: IcebergType) -> bool:
    """A column the vectorised parse leaves out and decode/json_maps.py reads: a map, or a list
    whose elements hold a map."""
    return isinstance(t, MapType) or (isinstance(t, ListType) and holds_map(t.element_type))


def check_supported(schema: Schema) -> None:
    """Every column, at every depth, is a type JSON records can carry (structs, lists and maps
    of them included); UnsupportedSchemaError names the first that is not."""
    for path, t, _in_list in _leaves(schema.as_struct(), "", False):
        if isinstance(t, MapType):
            if not isinstance(t.key_type, StringType):
                raise UnsupportedSchemaError(
                    f"column {path!r} is {t}: a map read from JSON has string keys (JSON object keys)")
            continue
        name = str(t)
        if not (name in SUPPORTED_TYPES or isinstance(t, DecimalType)):
            raise UnsupportedSchemaError(
                f"column {path!r} has type {name}, which JSON records cannot carry; "
                f"supported: {', '.join(SUPPORTED_TYPES)}, decimal(P,S), and structs, lists and maps of them"
            )


def _leaves(t: IcebergType, path: str, in_list: bool) -> Iterator[tuple[str, IcebergType, bool]]:
    """(dotted path, type, inside a list) of every primitive and map reached through structs,
    lists and map values; a list's elements and a map's values share its path, as the
    config's paths do."""
    if isinstance(t, StructType):
        for f in t.fields:
            yield from _leaves(f.field_type, f"{path}.{f.name}" if path else f.name, in_list)
    elif isinstance(t, ListType):
        yield from _leaves(t.element_type, path, True)
    elif isinstance(t, MapType):
        yield path, t, in_list
        yield from _leaves(t.value_type, path, in_list)
    else:
        yield path, t, in_list


def timestamp_paths(schema: Schema) -> list[str]:
    """Timestamp fields of structs at any depth (inside list elements too), by dotted path: the
    fields whose epoch-or-ISO form is guessed per record from the bytes. A timestamp that is
    itself a list's element has no key to look at: it is parsed as an ISO string."""
    found: list[str] = []

    def visit(t: IcebergType, path: str) -> None:
        if isinstance(t, StructType):
            for f in t.fields:
                child = f"{path}.{f.name}" if path else f.name
                if isinstance(f.field_type, (TimestampType, TimestamptzType)):
                    found.append(child)
                visit(f.field_type, child)
        elif isinstance(t, ListType):
            visit(t.element_type, path)

    visit(schema.as_struct(), "")
    return found


def has_decimals(schema: Schema) -> bool:
    return any(isinstance(t, DecimalType) for _, t, _ in _leaves(schema.as_struct(), "", False))


def parse_type(path: str, t: IcebergType, target: pa.DataType, numbers: frozenset[str]) -> pa.DataType:
    """The type pyarrow's JSON reader parses a value into before the rules convert it."""
    if isinstance(t, StructType):
        # Maps are left out, and lists holding maps: the reader has no map type
        # (decode/json_maps.py reads them).
        return pa.struct([pa.field(f.name, parse_type(f"{path}.{f.name}" if path else f.name, f.field_type,
                                                      target.field(i).type, numbers))
                          for i, f in enumerate(t.fields) if not outside_parse(f.field_type)])
    if isinstance(t, ListType):
        return pa.list_(parse_type(path, t.element_type, target.value_type, numbers))
    if isinstance(t, DateType):
        return pa.string()
    if isinstance(t, (TimestampType, TimestamptzType)):
        return pa.int64() if path in numbers else pa.string()
    if isinstance(t, IntegerType):
        return pa.int64()  # range-checked after the parse, row by row
    if isinstance(t, FloatType):
        return pa.float64()  # rounded to 32 bits after the parse, as the reference does
    if isinstance(t, DecimalType):
        return pa.decimal256(DECIMAL_PARSE_PRECISION, t.scale)
    if pa.types.is_large_string(target):
        return pa.string()
    return target


def convert_value(path: str, t: IcebergType, target: pa.DataType, column: pa.Array, numbers: frozenset[str],
                  units: Mapping[str, str], maps: Mapping[str, pa.Array] | None = None
                  ) -> tuple[pa.Array, list[tuple[np.ndarray, str]]]:
    """One parsed value column (any depth) in the table's type: the values, and per rule the
    mask of the rows it refuses with its reason. Structs and lists are converted part by part;
    a refused part refuses its whole row, and a required field missing from a present struct
    is refused as missing. `maps`: the map columns read outside the parse (json_maps.py), by
    path, one value per row."""
    n = len(column)
    if isinstance(t, StructType):
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        children, problems = [], []
        for i, f in enumerate(t.fields):
            child_path = f"{path}.{f.name}"
            if outside_parse(f.field_type):
                mapped = (maps or {})[child_path]
                if f.required:
                    missing = valid & ~mapped.is_valid().to_numpy(zero_copy_only=False)
                    problems.append((missing, missing_field(child_path)))
                children.append(mapped)
                continue
            # By name: the parsed struct has no map fields.
            values = pc.struct_field(column, [column.type.get_field_index(f.name)])  # null where the struct is null
            if f.required and values.null_count:
                missing = valid & ~values.is_valid().to_numpy(zero_copy_only=False)
                problems.append((missing, missing_field(child_path)))
            converted, child_problems = convert_value(child_path, f.field_type, target.field(i).type, values,
                                                      numbers, units, maps)
            children.append(converted)
            problems += child_problems
        out = pa.StructArray.from_arrays(children, fields=list(target), mask=pa.array(~valid))
        return out, problems
    if isinstance(t, ListType):
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        elements = pc.list_flatten(column)
        parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
        converted, element_problems = convert_value(path, t.element_type, target.value_type, elements, numbers, units)
        problems = []
        if t.element_required and elements.null_count:
            element_problems.append((~elements.is_valid().to_numpy(zero_copy_only=False),
                                     f"field {path!r}: a null element in a list whose elements are required"))
        for mask, reason in element_problems:
            rows = np.zeros(n, dtype=bool)
            rows[parents[mask]] = True
            problems.append((rows, reason))
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
        large = pa.types.is_large_list(target)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64 if large else np.int32)
        kind = pa.LargeListArray if large else pa.ListArray
        out = kind.from_arrays(pa.array(offsets), converted, type=target, mask=pa.array(~valid))
        return out, problems
    leaf = NestedField(field_id=0, name=path, field_type=t, required=False)
    return convert_column(leaf, target, column, path in numbers, units.get(path, DEFAULT_EPOCH_UNIT))


def epoch_units(fields: object) -> dict[str, str]:
    """{dotted field path: epoch unit} from the config's `table.schema` (FieldConfig objects, at
    any depth; None when the config leaves the schema to the table: every epoch is then in ms)."""
    from streamberg.common.config.types import walk

    specs = [f.field_spec for f in fields or ()]  # type: ignore[attr-defined]
    return {path: f.unit for path, f, _ in walk(specs) if f.unit}


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
        return null_where(column, out).cast(target), [
            (out, Widening(f"field {name!r}: integer out of range for int", name, LongType()))]
    if isinstance(t, (FloatType, DoubleType)):
        values = column.cast(target) if isinstance(t, FloatType) else column
        out = ~mask_of(pc.is_finite(values)) & ~pc.is_null(column).to_numpy(zero_copy_only=False)
        kind = "float (32-bit)" if isinstance(t, FloatType) else "double"
        reason = f"field {name!r}: not a finite {kind} (NaN, Infinity or out of range)"
        # The parse read a finite double (JSON has no NaN or Infinity): a double column takes it.
        return null_where(values, out), [(out, Widening(reason, name, DoubleType()) if isinstance(t, FloatType) else reason)]
    if isinstance(t, DecimalType):
        values, out = cast_locate(column, target)
        reason = f"field {name!r}: more digits than decimal({t.precision},{t.scale}) holds (precision)"
        wider = _wider_decimal(column, out, t)
        return values, [(out, Widening(reason, name, wider) if wider is not None else reason)]
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

def _wider_decimal(column: pa.Array, out: np.ndarray, t: DecimalType) -> DecimalType | None:
    """The decimal of least precision (same scale, at most 38 digits) that holds the refused
    values, or None."""
    if not out.any():
        return None
    digits = max(len(str(abs(v.as_tuple().digits and int(v.scaleb(t.scale))))) if v is not None else 0
                 for v in column.filter(pa.array(out)).to_pylist())
    return DecimalType(digits, t.scale) if t.precision < digits <= 38 else None


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
