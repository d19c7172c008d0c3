"""Bounded value types of the configuration: every number, name and map has a limit.

A config is hostile input: no inf/nan, no booleans for integers, ASCII identifiers with a
length cap (they end up in paths, Spark SQL text and snapshot summaries).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
)

# -- limits of what a config may say ----------------------------------------------------------
MAX_CONFIG_BYTES = 1024 * 1024
# Sections nest at most 4 deep (maintenance.expire.x, table.schema.N.name); 32 leaves room
# for JSON-ish values in free-form maps while keeping the YAML composer's recursion shallow.
MAX_YAML_DEPTH = 32
MAX_YAML_ALIASES = 100
DAY_SECONDS = 86400.0
YEAR_SECONDS = 366 * DAY_SECONDS
MAX_BYTES = 2**40  # 1 TiB: no file, group or threshold of this system is larger
MAX_COUNT = 10**9
MAX_INT64 = 2**63 - 1  # Kafka offsets and lags are int64
MAX_IDENTIFIER = 128
MAX_TEXT = 4096
MAX_MAP_ENTRIES = 256
DECIMAL_MAX_PRECISION = 38  # Iceberg's decimal limit
BUCKET_MAX = 2**31 - 1  # Iceberg bucket/truncate widths are int32

_IDENTIFIER = re.compile(rf"[A-Za-z_][A-Za-z0-9_]{{0,{MAX_IDENTIFIER - 1}}}")
_TABLE_ID = re.compile(rf"{_IDENTIFIER.pattern}(\.{_IDENTIFIER.pattern})+")
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")  # Kafka's own rule (kafka.common.internals.Topic)
_PRINTABLE_ASCII = re.compile(r"[ -~]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,19}")  # an environment override of an integer
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]{1,20}(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")


MAX_RECORD_BYTES = 500_000_000


def _int(lo: int, hi: int, optional: bool = False) -> PlainValidator:
    """An integer in [lo, hi]. Booleans and fractional numbers are refused (pydantic's lax
    mode takes `true` as 1); a string of digits is taken, as environment overrides are strings."""
    hint = f"must be an integer between {lo} and {hi}" + (" (or null)" if optional else "")

    def check(value: Any) -> int | None:
        if value is None and optional:
            return None
        if isinstance(value, str) and _INT_TEXT.fullmatch(value.strip()):
            value = int(value.strip())
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(hint)
        return value

    return PlainValidator(check)


def _float(lo: float, hi: float, *, lo_open: bool = True, optional: bool = False) -> PlainValidator:
    """A finite number in (lo, hi] (or [lo, hi]); no inf, nan or booleans."""
    hint = f"must be a number {'>' if lo_open else '>='} {lo:.12g} and <= {hi:.12g}" + (" (or null)" if optional else "")

    def check(value: Any) -> float | None:
        if value is None and optional:
            return None
        if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            value = float(value.strip())
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(hint)
        # Compare before float(): an int beyond float's range would overflow.
        if (value <= lo if lo_open else value < lo) or value > hi or not math.isfinite(value):
            raise ValueError(hint)
        return float(value)

    return PlainValidator(check)


def _check_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):  # environment overrides
        return value.strip().lower() == "true"
    raise ValueError("must be true or false")


Bool = Annotated[bool, PlainValidator(_check_bool)]


def _text(max_len: int = MAX_TEXT, pattern: re.Pattern[str] | None = None, rule: str = "",
          optional: bool = False) -> PlainValidator:
    """A string of 1..max_len characters without control characters, matching `pattern` when given."""
    hint = rule or f"must be a string of 1 to {max_len} printable characters"

    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        # isprintable(): no control, format (zero-width) or undecodable (surrogate) characters.
        if (not isinstance(value, str) or not 0 < len(value) <= max_len or not value.isprintable()
                or (pattern is not None and not pattern.fullmatch(value))):
            raise ValueError(hint)
        return value

    return PlainValidator(check)


_IDENTIFIER_RULE = f"must be an ASCII identifier ([A-Za-z_][A-Za-z0-9_]*) of at most {MAX_IDENTIFIER} characters"
Identifier = Annotated[str, _text(MAX_IDENTIFIER, _IDENTIFIER, _IDENTIFIER_RULE)]
MAX_PATH_DEPTH = 16
_FIELD_PATH = re.compile(rf"{_IDENTIFIER.pattern}(?:\.{_IDENTIFIER.pattern}){{0,{MAX_PATH_DEPTH - 1}}}")
_FIELD_PATH_RULE = (f"must be a column name or a dotted path to a nested field (customer.geo.city), each part an "
                    f"ASCII identifier ([A-Za-z_][A-Za-z0-9_]*) of at most {MAX_IDENTIFIER} characters, at most "
                    f"{MAX_PATH_DEPTH} parts")
# A column, or a nested field by its dotted path (customer.geo.city).
FieldPath = Annotated[str, _text(MAX_PATH_DEPTH * (MAX_IDENTIFIER + 1), _FIELD_PATH, _FIELD_PATH_RULE)]
OptionalFieldPath = Annotated[str | None, _text(MAX_PATH_DEPTH * (MAX_IDENTIFIER + 1), _FIELD_PATH, _FIELD_PATH_RULE,
                                                optional=True)]
TableIdentifier = Annotated[str, _text(2 * MAX_IDENTIFIER + 1, _TABLE_ID,
                                       f"must be namespace.table, each part an ASCII identifier "
                                       f"([A-Za-z_][A-Za-z0-9_]*) of at most {MAX_IDENTIFIER} characters")]
Text = Annotated[str, _text()]
Key = Annotated[str, _text(256)]
# Free-form string maps (catalog/table properties, Flink and Spark settings).
Properties = Annotated[dict[Key, Text], Field(max_length=MAX_MAP_ENTRIES)]


def _check_setting(value: Any) -> str | int | float | bool:
    """A librdkafka setting's value: a string, a bool, an int64 or a finite number."""
    if isinstance(value, bool) or (isinstance(value, int) and -MAX_INT64 <= value <= MAX_INT64):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, str) and len(value) <= MAX_TEXT and value.isprintable():
        return value
    raise ValueError("must be a string, a boolean or a finite number")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
