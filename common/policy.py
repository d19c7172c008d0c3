"""Per-table policy in the table's own properties: the `streamberg.*` keys, one registry.

The table's properties are the source of truth for what keeps it: set from any engine
(`ALTER TABLE t SET TBLPROPERTIES ('streamberg.cluster.columns'='user_id,city')` in Spark
SQL) and read by `streamberg govern` at every round, so a change takes effect without a
restart. A key left unset means the config's setting (compactor.*, maintenance.*). A bad
value is reported for that table (status, the governor's plan) and that key is ignored;
it never stops the other tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streamberg.common.config import LAYOUT_STRATEGIES

PREFIX = "streamberg."
# `streamberg govern` writes every round's state here, under ingest.state_dir; status reads it.
GOVERN_STATE_FILE = "govern.json"


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError("true or false")
    return lowered == "true"


def _columns(text: str) -> list[str]:
    columns = [c.strip() for c in text.split(",") if c.strip()]
    if not columns or len(columns) > 8:
        raise ValueError("1 to 8 column names, comma-separated")
    return columns


def _strategy(text: str) -> str:
    value = text.strip().lower()
    if value not in LAYOUT_STRATEGIES:
        raise ValueError(f"one of {', '.join(LAYOUT_STRATEGIES)}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 30 * 86400:
        raise ValueError("seconds between 0 and 2592000")
    return value


@dataclass(frozen=True)
class PolicyKey:
    name: str  # the property, streamberg.*
    attribute: str  # TablePolicy's field
    parse: Callable[[str], Any]
    doc: str


# Every key the product reads from a table's properties, with what it means (docs/governor.md
# prints this table). Defaults are the config's settings.
POLICY_KEYS: tuple[PolicyKey, ...] = (
    PolicyKey("streamberg.compact.enabled", "compact_enabled", _bool,
              "cluster and compact this table (true unless set false)"),
    PolicyKey("streamberg.cluster.columns", "cluster_columns", _columns,
              "clustering columns, comma-separated (default: compactor.columns)"),
    PolicyKey("streamberg.cluster.strategy", "cluster_strategy", _strategy,
              "the layout, a compactor.strategy value (default: compactor.strategy)"),
    PolicyKey("streamberg.merge.enabled", "merge_enabled", _bool,
              "apply a primary-key table's change log (true unless set false)"),
    PolicyKey("streamberg.maintain.enabled", "maintain_enabled", _bool,
              "expiry, orphans, manifests, retention (true unless set false)"),
    PolicyKey("streamberg.govern.min_interval_seconds", "min_interval_seconds", _seconds,
              "at least this long between two actions of one kind on this table (default 60)"),
)


@dataclass
class TablePolicy:
    compact_enabled: bool = True
    cluster_columns: list[str] | None = None
    cluster_strategy: str | None = None
    merge_enabled: bool = True
    maintain_enabled: bool = True
    min_interval_seconds: float = 60.0
    problems: list[str] = field(default_factory=list)  # "key: why", one per bad value or unknown key
    governed: bool = False  # any policy key set (what an opt-in namespace's tables need)


def refusal(name: str, text: str) -> str | None:
    """Why `name=text` is not a policy setting (None: it is), as `streamberg table --set` checks
    before writing: only the registry's keys, each value as its parser takes it."""
    key = {k.name: k for k in POLICY_KEYS}.get(name)
    if key is None:
        return f"{name}: not a policy key; the keys are {', '.join(k.name for k in POLICY_KEYS)}"
    try:
        key.parse(text)
    except (ValueError, TypeError) as exc:
        return f"{name}: {text[:60]!r} is not {exc}"
    return None


def policy_of(properties: Mapping[str, str]) -> TablePolicy:
    """The policy the table's properties state; bad values named in `problems`, never raised."""
    policy = TablePolicy()
    known = {k.name: k for k in POLICY_KEYS}
    for name, text in sorted(properties.items()):
        if not name.startswith(PREFIX):
            continue
        key = known.get(name)
        if key is None:
            if name.split(".")[1] in ("compact", "cluster", "merge", "maintain", "govern"):
                policy.problems.append(f"{name}: not a key streamberg reads (docs/governor.md lists them)")
            continue  # the product's own bookkeeping keys (streamberg.route.topic, ...) are not policy
        policy.governed = True
        try:
            setattr(policy, key.attribute, key.parse(str(text)))
        except (ValueError, TypeError) as exc:
            policy.problems.append(f"{name}: {str(text)[:60]!r} is not {exc}")
    return policy
