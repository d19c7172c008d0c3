"""The reference decoder for the fuzz suite: `json.loads` plus the schema's rules, record by record.

Plain Python, written from the rules in the docstring of streamberg.decode.json_decode, with no code
shared with the decoder: where the two disagree, one of them is wrong. Returns, per record,
either ("ok", row) with the row normalised as `normalise_table` normalises the decoder's
output, or ("bad", reason), or ("either", row) for a record the rules accept but that holds
a number beyond a double's range in a field the schema lacks: the parser may refuse it
(RFC 8259 section 6 lets a parser limit the range of numbers; pyarrow's does so depending on
how the number is written), so keeping it with that row or dead-lettering it as
`Number too big` are both right.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from datetime import date, datetime, timedelta, timezone
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, InvalidOperation
from typing import Any

import numpy as np
import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

EPOCH = datetime(1970, 1, 1)
MIN_US = (datetime(1, 1, 1) - EPOCH) // timedelta(microseconds=1)
MAX_US = (datetime(9999, 12, 31, 23, 59, 59, 999999) - EPOCH) // timedelta(microseconds=1)
US_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}
TS = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?"
                r"(Z|[+-]\d{2}(?::?\d{2})?)?)?", re.ASCII)
DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})", re.ASCII)
DECIMAL_STRING = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)
# Any exponent a JSON number can carry (the default context overflows past 1e999999).
WIDE = Context(prec=200, Emax=MAX_EMAX, Emin=MIN_EMIN)


def _int(text: str) -> int | None:
    """An integer literal's value, or None past 64 bits (int() refuses over 4300 digits)."""
    return int(text) if len(text.lstrip("-")) <= 20 else None


class Num:
    """A JSON number with its literal text (so decimals and ints are judged exactly)."""

    __slots__ = ("kind", "text")

    def __init__(self, kind: str, text: str):
        self.kind, self.text = kind, text


class Obj(dict):
    dups: set
    members: list
    huge: bool  # some member (duplicates included) is written with an exponent of 10,000 or more


# The decoder's rule for schemas with decimal fields (decode/json_screen.py, HUGE_EXPONENT): a
# record is refused when some object member's value, at any depth, is a number or a string
# written with an exponent of 10,000 or more; records that could hold one (SUSPECT: such a
# token standing as a whole member value, or an escaped e/E or digit) and nest deeper than
# 500 levels are refused unchecked.
HUGE_EXPONENT = re.compile(r"[+-]?[0-9.]*[eE][+-]?0*[1-9][0-9]{4,}", re.ASCII)
SUSPECT = re.compile(rb'(?:"|[:\[,][ \t\r\n]*)[+-]?[0-9.]*[eE][+-]?0*[1-9][0-9]{4,}(?:"|[ \t\r\n]*[,\]}])'
                     rb"|\\u00[46]5|\\u003[0-9]")


def _depth(value: Any) -> int:
    """Levels of arrays and objects, counted on the parsed value (iteratively: no recursion)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict):
            deepest = max(deepest, level)
            todo.extend((v, level + 1) for v in getattr(item, "members", item.values()))
        elif isinstance(item, list):
            deepest = max(deepest, level)
            todo.extend((v, level + 1) for v in item)
    return deepest


def _written_huge(v: Any) -> bool:
    text = v.text if isinstance(v, Num) else v if isinstance(v, str) else None
    return text is not None and HUGE_EXPONENT.fullmatch(text) is not None


def _pairs(pairs: list[tuple[str, Any]]) -> Obj:
    obj = Obj()
    obj.dups = set()
    obj.members = [v for _, v in pairs]  # duplicates' values too (they nest like the rest)
    obj.huge = any(_written_huge(v) for _, v in pairs)
    for k, v in pairs:
        if k in obj:
            obj.dups.add(k)
        obj[k] = v
    return obj


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(text: str) -> Any:
    return json.loads(text, parse_int=lambda s: Num("int", s), parse_float=lambda s: Num("float", s),
                      parse_constant=_constant, object_pairs_hook=_pairs)


def _loads_deep(text: str) -> Any:
    """json.loads recurses per nesting level: deep records get a thread with a big stack."""
    out: dict[str, Any] = {}

    def run() -> None:
        old = sys.getrecursionlimit()
        try:
            sys.setrecursionlimit(max(old, 3 * len(text) + 1000))
            out["value"] = _loads(text)
        except Exception as exc:  # noqa: BLE001
            out["error"] = exc
        finally:
            sys.setrecursionlimit(old)

    size = threading.stack_size(1 << 30)
    try:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
    finally:
        threading.stack_size(size)
    if "error" in out:
        raise out["error"]
    return out["value"]


def _holds_huge_member(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, Obj):
            if v.huge:
                return True
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _overflows_double(value: Any) -> bool:
    """Whether some number literal in the value is beyond a double's range."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, Num):
            try:
                if abs(float(v.text)) == float("inf"):
                    return True
            except OverflowError:
                return True
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _has_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _micros_from_iso(text: str) -> int | None:
    m = TS.fullmatch(text)
    if not m:
        return None
    y, mo, d, hh, mi, ss, frac, zone = m.groups()
    try:
        naive = datetime(int(y), int(mo), int(d), int(hh or 0), int(mi or 0), int(ss or 0),
                         int((frac or "0")[:6].ljust(6, "0")))
    except ValueError:
        return None
    micros = (naive - EPOCH) // timedelta(microseconds=1)
    if zone and zone != "Z":
        digits = zone[1:].replace(":", "")
        hours, minutes = int(digits[:2]), int(digits[2:] or 0)
        if hours > 23 or minutes > 59:
            return None
        offset = (hours * 60 + minutes) * 60_000_000
        micros -= offset if zone[0] == "+" else -offset
    return micros if MIN_US <= micros <= MAX_US else None


def _field(ftype: Any, value: Any, unit: str) -> tuple[bool, Any]:
    """(ok, normalised value) for one non-null value of one field."""
    if isinstance(ftype, BooleanType):
        return (True, value) if isinstance(value, bool) else (False, None)
    if isinstance(ftype, (IntegerType, LongType)):
        if not (isinstance(value, Num) and value.kind == "int"):
            return False, None
        v = _int(value.text)
        if v is None:
            return False, None
        bits = 31 if isinstance(ftype, IntegerType) else 63
        return (-(2 ** bits) <= v < 2 ** bits), v
    if isinstance(ftype, (FloatType, DoubleType)):
        if not isinstance(value, Num):
            return False, None
        v = float(value.text)  # correctly rounded from the literal, as a double
        if isinstance(ftype, FloatType):
            with np.errstate(over="ignore"):
                v = float(np.float32(v))
        return (v == v and abs(v) != float("inf")), v
    if isinstance(ftype, DecimalType):
        if isinstance(value, Num):
            text = value.text
        elif isinstance(value, str) and DECIMAL_STRING.fullmatch(value):
            text = value
        else:
            return False, None
        if sum(c.isdigit() for c in text.split("e")[0].split("E")[0]) > 76:
            return False, None
        d = WIDE.create_decimal(text)
        try:
            q = d.quantize(Decimal(1).scaleb(-ftype.scale), context=WIDE)
        except InvalidOperation:
            return False, None
        if q != d or abs(q) >= Decimal(10) ** (ftype.precision - ftype.scale):
            return False, None
        return True, q
    if isinstance(ftype, DateType):
        if not (isinstance(value, str) and DATE.fullmatch(value)):
            return False, None
        try:
            return True, (date.fromisoformat(value) - date(1970, 1, 1)).days
        except ValueError:
            return False, None
    if isinstance(ftype, (TimestampType, TimestamptzType)):
        if isinstance(value, Num) and value.kind == "int":
            v = _int(value.text)
            if v is None or not -(2 ** 63) <= v < 2 ** 63:
                return False, None
            micros = v // 1000 if unit == "ns" else v * US_PER_UNIT[unit]
            return (MIN_US <= micros <= MAX_US), micros
        if isinstance(value, str):
            micros = _micros_from_iso(value)
            return micros is not None, micros
        return False, None
    if isinstance(ftype, StringType):
        return (True, value) if isinstance(value, str) else (False, None)
    raise AssertionError(f"type {ftype} not covered by the oracle")


def _decimal_anywhere(t: Any) -> bool:
    if isinstance(t, StructType):
        return any(_decimal_anywhere(f.field_type) for f in t.fields)
    if isinstance(t, ListType):
        return _decimal_anywhere(t.element_type)
    if isinstance(t, MapType):
        return _decimal_anywhere(t.value_type)
    return isinstance(t, DecimalType)


class _Bad(Exception):
    pass


def _nested(ftype: Any, value: Any, path: str, units: dict[str, str], forms: dict[str, set]) -> Any:
    """The normalised value of one non-null value at `path`, or _Bad. Structs: an object whose
    schema fields appear once each, required ones present; lists: an array whose elements
    follow the element type (a null element only where elements are optional). A timestamp
    field inside list elements is written in one form (all epochs or all strings) per record;
    a timestamp that is itself a list element is an ISO string."""
    if isinstance(ftype, StructType):
        if not isinstance(value, dict):
            raise _Bad(f"{path}: not an object")
        if value.dups & {f.name for f in ftype.fields}:
            raise _Bad(f"{path}: duplicate {sorted(value.dups)}")
        out = {}
        for f in ftype.fields:
            child = f"{path}.{f.name}"
            v = value.get(f.name)
            if v is None:
                if f.required:
                    raise _Bad(f"missing {child}")
                out[f.name] = None
                continue
            if isinstance(f.field_type, (TimestampType, TimestamptzType)):
                forms.setdefault(child, set()).add("epoch" if isinstance(v, Num) else "text")
            out[f.name] = _nested(f.field_type, v, child, units, forms)
        return out
    if isinstance(ftype, MapType):
        # A JSON object with string keys, each once; every value judged on its own (its own
        # timestamp forms too), null only where values are optional.
        if not isinstance(value, dict):
            raise _Bad(f"{path}: not an object")
        if value.dups:
            raise _Bad(f"{path}: key twice")
        entries = []
        for key, item in value.items():
            if item is None:
                if ftype.value_required:
                    raise _Bad(f"{path}: null value")
                entries.append((key, None))
                continue
            own: dict[str, set] = {}
            entries.append((key, _nested(ftype.value_type, item, path, units, own)))
            if any(len(seen) > 1 for seen in own.values()):
                raise _Bad(f"{path}: timestamps in two forms in one value")
        return entries
    if isinstance(ftype, ListType):
        if not isinstance(value, list):
            raise _Bad(f"{path}: not an array")
        out_list = []
        for element in value:
            if element is None:
                if ftype.element_required:
                    raise _Bad(f"{path}: null element")
                out_list.append(None)
            elif isinstance(ftype.element_type, (TimestampType, TimestamptzType)) and not isinstance(element, str):
                raise _Bad(f"{path}: a timestamp element that is not a string")
            else:
                out_list.append(_nested(ftype.element_type, element, path, units, forms))
        return out_list
    ok, normalised = _field(ftype, value, units.get(path, "ms"))
    if not ok:
        raise _Bad(f"field {path}")
    return normalised


def reference_decode(schema: Schema, units: dict[str, str], max_record_bytes: int,
                     value: bytes | None) -> tuple[str, Any]:
    if value is None:
        return "bad", "tombstone"
    if len(value) > max_record_bytes:
        return "bad", "oversized"
    try:
        text = value.decode("utf-8")  # strict: no surrogates, no overlong forms
    except UnicodeDecodeError:
        return "bad", "utf-8"
    if text.startswith("\ufeff"):
        return "bad", "bom"
    try:
        bracketed = value.count(b"[") + value.count(b"{") > 500
        obj = _loads_deep(text) if bracketed else _loads(text)
    except (ValueError, RecursionError) as exc:
        return "bad", f"json: {exc}"
    if not isinstance(obj, dict):
        return "bad", "not an object"
    if _has_lone_surrogate(obj):
        return "bad", "lone surrogate"
    if any(_decimal_anywhere(f.field_type) for f in schema.fields) and SUSPECT.search(value) and (
            _depth(obj) > 500 or _holds_huge_member(obj)):
        return "bad", "huge exponent"
    names = {f.name for f in schema.fields}
    if obj.dups & names:
        return "bad", f"duplicate {sorted(obj.dups & names)}"
    row = {}
    forms: dict[str, set] = {}
    for f in schema.fields:
        v = obj.get(f.name)
        if v is None:
            if f.required:
                return "bad", f"missing {f.name}"
            row[f.name] = None
            continue
        try:
            row[f.name] = _nested(f.field_type, v, f.name, units, forms)
        except _Bad as bad:
            return "bad", str(bad)
    if mixed := sorted(path for path, seen in forms.items() if len(seen) > 1):
        return "bad", f"timestamps in two forms in one record: {mixed}"
    return ("either" if _overflows_double(obj) else "ok"), row


def _normalise_value(value: Any) -> Any:
    """Timestamps as epoch micros and dates as epoch days, inside structs and lists too."""
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(timezone.utc).replace(tzinfo=None)
        return (value - EPOCH) // timedelta(microseconds=1)
    if isinstance(value, date):
        return (value - date(1970, 1, 1)).days
    if isinstance(value, dict):
        return {k: _normalise_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalise_value(v) for v in value]
    if isinstance(value, tuple):  # a map entry
        return tuple(_normalise_value(v) for v in value)
    return value


def normalise_table(table: pa.Table) -> list[dict[str, Any]]:
    """Decoder output in the oracle's terms: timestamps as epoch micros, dates as epoch days."""
    columns = {}
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_timestamp(column.type):
            columns[name] = column.cast(pa.int64()).to_pylist()
        elif pa.types.is_date32(column.type):
            columns[name] = column.cast(pa.int32()).to_pylist()
        elif pa.types.is_nested(column.type):
            columns[name] = [_normalise_value(v) for v in column.to_pylist()]
        else:
            columns[name] = column.to_pylist()
    return [dict(zip(columns, values)) for values in zip(*columns.values())] if columns else []
