"""One line per invalid key, without echoing values that may be secrets."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import (
    ValidationError,
)

from streamberg.common.config.bounds import (
    _CONTROL,
)
from streamberg.common.errors import ConfigError
from streamberg.common.redact import redact

_SECRET_BEARING = ("catalog.uri", "catalog.properties", "kafka.consumer", "kafka.bootstrap_servers",
                   "ingest.flink", "compactor.spark_conf", "table.properties")
# A model validator's message may start with the key it is about ("schema.3.type: ...").
_KEY_PREFIX = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_.]*): (.*)$", re.DOTALL)
_MAX_SHOWN = 60
# pydantic's wording names its model classes ("instance of CatalogConfig"): say it plainly.
_PLAIN_MESSAGES = {"model_type": "must be a mapping of keys", "model_attributes_type": "must be a mapping of keys",
                   "dict_type": "must be a mapping of keys", "list_type": "must be a list",
                   "string_type": "must be a string"}
_MAX_ERRORS = 10
_MAX_MESSAGE = 300


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _key_shown(part: Any) -> str:
    """A key path element as printed: control characters escaped, absurd lengths cut."""
    text = str(part)
    if _CONTROL.search(text) or not text.isprintable():
        text = repr(text)[1:-1]
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _shown(key: str, item: Mapping[str, Any]) -> str:
    """' (got X)' for a harmless scalar input; nothing for containers, secrets and long text."""
    got = item.get("input")
    if item["type"] == "missing" or got is None or isinstance(got, (dict, list, tuple, set, bytes)):
        return ""
    if any(key == k or key.startswith(k + ".") for k in _SECRET_BEARING):
        return ""
    shown = repr(got)
    if isinstance(got, int) and not isinstance(got, bool) and len(shown) > 20:
        shown = f"an integer of {len(shown)} digits"
    elif len(shown) > _MAX_SHOWN:
        shown = shown[: _MAX_SHOWN - 3] + "..."
    return f" (got {redact(shown)})"


def _format_errors(source: str, error: ValidationError) -> str:
    """One line: every bad key and why (the first ten), values shown only when harmless."""
    parts = problems_of(error)
    if len(parts) > _MAX_ERRORS:
        parts = [*parts[:_MAX_ERRORS], f"and {len(parts) - _MAX_ERRORS} more"]
    return f"invalid configuration in {source}: " + "; ".join(parts)


def config_error(source: str, error: ValidationError) -> ConfigError:
    """The ConfigError of a failed validation: one line, and every problem one by one."""
    return ConfigError(_format_errors(source, error), problems=problems_of(error))


def problems_of(error: ValidationError) -> list[str]:
    """Every bad key and why, one item each, values shown only when harmless."""
    parts = []
    items = error.errors()
    # A union's members are named in the location (`list[...]`, `literal['infer']`): they are
    # pydantic's bookkeeping, not keys of the file. Where one member went deeper, the others'
    # "expected a literal" adds nothing.
    keys = [".".join(_key_shown(p) for p in item["loc"] if "[" not in str(p) and not str(p).startswith("function-"))
            .replace("schema_", "schema") for item in items]
    for item, key in zip(items, keys):
        if item["type"] == "literal_error" and any(k.startswith(key + ".") for k in keys):
            continue
        msg = _PLAIN_MESSAGES.get(item["type"]) or item["msg"].removeprefix("Value error, ")
        if (nested := _KEY_PREFIX.match(msg)) and not nested.group(1).startswith(key + "."):
            key, msg = (f"{key}.{nested.group(1)}" if key else nested.group(1)), nested.group(2)
        msg = _one_line(msg)
        if len(msg) > _MAX_MESSAGE:  # a validator may quote the (huge) value it refused
            msg = msg[: _MAX_MESSAGE - 3] + "..."
        parts.append(f"{key or '(top level)'}: {msg}{_shown(key, item)}")
    return parts
