"""The screen: checks over a batch's raw bytes before any JSON parse.

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

In a schema with decimal fields, records holding a value written with a huge exponent are
refused here too (HUGE_EXPONENT below).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamberg.decode.json_values import cast_locate, mask_of

_WS = "[ \t\r\n]"

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


def _screen_depth(raw: pa.BinaryArray, max_depth: int, flag: Callable[[np.ndarray, object], None]) -> None:
    """Records nested deeper than `max_depth`: only records longer than twice that can be
    (each level takes an opening and a closing bracket), and of those only the ones with more
    brackets than that; one Arrow count per bracket kind over the long ones picks the few to
    measure, and a batch of short records costs one comparison of lengths."""
    offsets = np.frombuffer(raw.buffers()[1], dtype=np.int32, count=len(raw) + 1, offset=raw.offset * 4)
    long = np.flatnonzero(np.diff(offsets) > 2 * max_depth)
    if not len(long):
        return
    candidates = raw.take(pa.array(long))
    brackets = (pc.count_substring(candidates, "[").to_numpy(zero_copy_only=False)
                + pc.count_substring(candidates, "{").to_numpy(zero_copy_only=False))
    many = long[brackets > max_depth]
    deep = [int(i) for i in many if nesting_depth(raw[int(i)].as_py()) > max_depth]
    if deep:
        flag(np.isin(np.arange(len(raw)), deep),
             f"nested more than {max_depth} levels deep (no table column nests that deep; its fields cannot be added)")


def screen(raw: pa.BinaryArray, max_record_bytes: int, huge_exponents: bool,
           max_depth: int | None = None) -> np.ndarray:
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
    flag(lengths > max_record_bytes,
         lambda i: f"oversized: {int(lengths[i])} bytes > max_record_bytes {max_record_bytes}")
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
            hit = mask_of(pc.match_substring_regex(odd, pattern))
            mask = np.zeros(n, dtype=bool)
            mask[unusual] = hit if when else ~hit
            flag(mask, reason)
    _, invalid = cast_locate(raw, pa.string())
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
        near = mask_of(pc.match_substring_regex(raw.take(pa.array(suspects)), f"[:\\[,]{_WS}*-?(?:NaN|Inf)"))
        bad = [int(i) for i in suspects[near] if _has_nonfinite_token(raw[int(i)].as_py())]
        flag(np.isin(np.arange(n), bad), "not valid JSON: NaN and Infinity are not JSON numbers")
    if huge_exponents:  # only decimal columns crash on them
        _screen_huge_exponents(raw, reasons, flag)
    if max_depth is not None:
        _screen_depth(raw, max_depth, flag)
    return reasons

def _screen_huge_exponents(raw: pa.BinaryArray, reasons: np.ndarray,
                           flag: Callable[[np.ndarray, object], None]) -> None:
    """See HUGE_EXPONENT: one regex pass over the batch, Python only for the suspects."""
    suspects = np.flatnonzero(mask_of(pc.match_substring_regex(raw, _HUGE_EXPONENT_SUSPECT)) & (reasons == None))  # noqa: E711
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
