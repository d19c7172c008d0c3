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

from pydantic import ValidationError

from streamberg.common.config import LAYOUT_STRATEGIES, StreambergConfig

PREFIX = "streamberg."
# `streamberg govern` writes every round's state here, under ingest.state_dir; status reads it.
GOVERN_STATE_FILE = "govern.json"
GOVERN_HEARTBEAT_FILE = "govern.heartbeat"  # ... and its heartbeat (`govern --health`)


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


def _engines(text: str) -> list[str]:
    engines = [e.strip() for e in text.split(",") if e.strip()]
    if not engines or len(engines) > 16 or any(len(e) > 60 for e in engines):
        raise ValueError("1 to 16 engine names, comma-separated")
    return engines


def _strategy(text: str) -> str:
    value = text.strip().lower()
    if value not in LAYOUT_STRATEGIES:
        raise ValueError(f"one of {', '.join(LAYOUT_STRATEGIES)}")
    return value


def _int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError("an integer") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("a finite number")
    return value


def _name(text: str) -> str:
    value = text.strip()
    if not value or len(value) > 200:
        raise ValueError("a column name")
    return value


def _days_or_none(text: str) -> float | None:
    """Retention days, or `none` (retention off for this table, whatever the config says)."""
    if text.strip().lower() in ("none", "off", "null"):
        return None
    return _float(text)


def _positive_days(text: str) -> float:
    value = _float(text)
    if not 0 < value <= 3650:
        raise ValueError("days between 0 and 3650")
    return value


def _seconds(text: str) -> float:
    value = _float(text)
    if not 0 <= value <= 30 * 86400:
        raise ValueError("seconds between 0 and 2592000")
    return value


@dataclass(frozen=True)
class PolicyKey:
    name: str  # the property, streamberg.*
    # A TablePolicy field (the governor's own switches), or, dotted, the config setting this
    # table's value stands in for (`compactor.columns`), bounded by that setting's own rules.
    target: str
    parse: Callable[[str], Any]
    doc: str


# Every key the product reads from a table's properties, with what it means (docs/governor.md
# prints this table). Defaults are the config's settings.
POLICY_KEYS: tuple[PolicyKey, ...] = (
    PolicyKey("streamberg.compact.enabled", "compact_enabled", _bool,
              "cluster and compact this table (true unless set false)"),
    PolicyKey("streamberg.cluster.columns", "compactor.columns", _columns,
              "clustering columns, comma-separated (default: compactor.columns); `auto`: up to 4 columns "
              "chosen from what queries filter (scan reports in catalog.scan_reports_dir)"),
    PolicyKey("streamberg.cluster.strategy", "compactor.strategy", _strategy,
              "the layout, a compactor.strategy value (default: compactor.strategy)"),
    PolicyKey("streamberg.compact.min_files", "compactor.min_files", _int,
              "a partition's files waiting before it is compacted (default: compactor.min_files)"),
    PolicyKey("streamberg.compact.target_file_size_bytes", "compactor.target_file_size_bytes", _int,
              "size of the files a rewrite writes (default: compactor.target_file_size_bytes)"),
    PolicyKey("streamberg.compact.merge_factor", "compactor.merge_factor", _int,
              "runs of a size tier merged at once (default: compactor.merge_factor)"),
    PolicyKey("streamberg.compact.seal_after_seconds", "compactor.seal_after_seconds", _float,
              "a partition idle this long is finished (default: compactor.seal_after_seconds)"),
    PolicyKey("streamberg.merge.enabled", "merge_enabled", _bool,
              "apply a primary-key table's change log (true unless set false)"),
    PolicyKey("streamberg.maintain.enabled", "maintain_enabled", _bool,
              "expiry, orphans, manifests, retention (true unless set false)"),
    PolicyKey("streamberg.maintain.interval_seconds", "maintenance.interval_seconds", _float,
              "maintenance is due this long after the last run (default: maintenance.interval_seconds)"),
    PolicyKey("streamberg.snapshots.max_age_seconds", "maintenance.expire.max_snapshot_age_seconds", _float,
              "snapshots older than this may be expired (default: maintenance.expire.max_snapshot_age_seconds)"),
    PolicyKey("streamberg.snapshots.keep", "maintenance.expire.min_snapshots_to_keep", _int,
              "the newest N snapshots are kept whatever their age, for restores "
              "(default: maintenance.expire.min_snapshots_to_keep)"),
    PolicyKey("streamberg.snapshots.max", "maintenance.expire.max_snapshots", _int,
              "at most this many snapshots kept (default: maintenance.expire.max_snapshots)"),
    PolicyKey("streamberg.retention.column", "maintenance.retention.column", _name,
              "the time column rows are aged by (default: maintenance.retention.column)"),
    PolicyKey("streamberg.retention.days", "maintenance.retention.days", _days_or_none,
              "rows older than this many days are deleted; needs a column; `none` turns retention off "
              "(default: maintenance.retention.days of the config that declares the table; none for an "
              "opted-in table)"),
    PolicyKey("streamberg.govern.min_interval_seconds", "min_interval_seconds", _seconds,
              "at least this long between two actions of one kind on this table (default 60)"),
    PolicyKey("streamberg.columns.unused_after_days", "unused_after_days", _positive_days,
              "a column no reported scan filtered or projected for this long is listed as unused by "
              "`status` (default 30; needs catalog.scan_reports_dir)"),
    PolicyKey("streamberg.columns.drop_unused", "drop_unused", _bool,
              "the governor drops the unused columns (never a key, partition, clustering, sequence, retention, "
              "route or key column) and the ingest then ignores those fields, counted (false unless set true). "
              "Safe only if every engine reading the table reports its scans: nothing is dropped until "
              "streamberg.columns.reporting_engines says which engines read it"),
    PolicyKey("streamberg.columns.reporting_engines", "reporting_engines", _engines,
              "the engines that read this table, comma-separated (e.g. `spark,streamberg`), every one of which "
              "sends its scan reports to catalog.scan_reports_dir: the acknowledgement drop_unused needs (a "
              "reader that reports nothing makes every column it reads look unused)"),
)
_FAMILIES = ("compact", "cluster", "merge", "maintain", "govern", "snapshots", "retention", "columns")


@dataclass
class TablePolicy:
    compact_enabled: bool = True
    merge_enabled: bool = True
    maintain_enabled: bool = True
    min_interval_seconds: float = 60.0
    unused_after_days: float = 30.0
    drop_unused: bool = False
    reporting_engines: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # config setting (dotted) -> this table's value
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


def carries_policy(properties: Mapping[str, str]) -> bool:
    """Whether the properties set any policy key (what a table of an opt-in namespace needs to
    be kept); their values are the table's runtime's to parse (table_meta/table_runtime.py)."""
    names = {k.name for k in POLICY_KEYS}
    return any(name in names for name in properties)


def policy_of(properties: Mapping[str, str]) -> TablePolicy:
    """The policy the table's properties state; bad values named in `problems`, never raised."""
    policy = TablePolicy()
    known = {k.name: k for k in POLICY_KEYS}
    for name, text in sorted(properties.items()):
        if not name.startswith(PREFIX):
            continue
        key = known.get(name)
        if key is None:
            if name.split(".")[1] in _FAMILIES:
                policy.problems.append(f"{name}: not a key streamberg reads (docs/governor.md lists them)")
            continue  # the product's own bookkeeping keys (streamberg.route.topic, ...) are not policy
        policy.governed = True
        try:
            value = key.parse(str(text))
        except (ValueError, TypeError) as exc:
            policy.problems.append(f"{name}: {str(text)[:60]!r} is not {exc}")
            continue
        if "." in key.target:
            policy.settings[key.target] = value
        else:
            setattr(policy, key.target, value)
    if policy.drop_unused and not policy.reporting_engines:
        policy.problems.append(DROP_NEEDS_ENGINES)
    return policy


DROP_NEEDS_ENGINES = (
    "streamberg.columns.drop_unused: true, but no column is dropped until streamberg.columns.reporting_engines "
    "lists the engines that read this table, each of which reports its scans (catalog.scan_reports_dir): a "
    "reader that reports nothing makes the columns it reads look unused")


def undeclared(config: StreambergConfig) -> StreambergConfig:
    """The config a table is kept with when the config does not declare it (a table opted in
    by its `streamberg.*` keys in a governed namespace): the config's settings, except the
    destructive ones, which reach a table only from the config that declares it or from the
    table's own keys. No row retention; snapshot expiry, orphan removal and the change log's
    trim never more eager than the product's defaults."""
    from streamberg.common.config import MaintenanceConfig

    given, default = config.maintenance, MaintenanceConfig()
    expire = given.expire.model_copy(update={
        "max_snapshot_age_seconds": max(given.expire.max_snapshot_age_seconds, default.expire.max_snapshot_age_seconds),
        "min_snapshots_to_keep": max(given.expire.min_snapshots_to_keep, default.expire.min_snapshots_to_keep),
        "max_snapshots": max(given.expire.max_snapshots, default.expire.max_snapshots),
        "keep_pending_for_compactor": True})
    orphan = given.orphan.model_copy(update={
        "safety_age_seconds": max(given.orphan.safety_age_seconds, default.orphan.safety_age_seconds)})
    changelog = given.changelog.model_copy(update={
        "keep_applied_seconds": max(given.changelog.keep_applied_seconds, default.changelog.keep_applied_seconds)})
    maintenance = given.model_copy(update={"retention": default.retention, "expire": expire, "orphan": orphan,
                                           "changelog": changelog,
                                           "allow_location_outside_warehouse": False})
    return config.model_copy(update={"maintenance": maintenance})


def policy_for(config: StreambergConfig, properties: Mapping[str, str]) -> tuple[TablePolicy, StreambergConfig]:
    """A table's policy (every ignored value in its `problems`) and the config it is kept with:
    its settings over the config's, each checked by its section's own model (the setting's
    bounds, the rules between keys). A value the model refuses keeps the configured one."""
    policy = policy_of(properties)
    return policy, _configured(config, policy)


def _configured(config: StreambergConfig, policy: TablePolicy) -> StreambergConfig:
    if not policy.settings:
        return config
    names = {k.target: k.name for k in POLICY_KEYS}
    sections: dict[str, Any] = {}
    for setting, value in sorted(policy.settings.items()):
        section, *path = setting.split(".")
        current = sections.get(section, getattr(config, section))
        data = current.model_dump(by_alias=True)
        node = data
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
        try:
            sections[section] = type(current).model_validate(data)
        except ValidationError as exc:
            why = "; ".join(str(e.get("msg", "")) for e in exc.errors()[:2])[:200]
            policy.problems.append(f"{names[setting]}: {str(value)[:60]!r} is refused as {setting}: {why}")
    return config.model_copy(update=sections) if sections else config


def effective(config: StreambergConfig, table: Any) -> tuple[StreambergConfig, list[str]]:
    """A table's settings as every component keeps it (compact, merge, maintain, status, the
    governor): the config's, with the table's own `streamberg.*` keys over them, and what is
    wrong with them: values refused (table_meta/policy.policy_for) and clustering columns the
    table does not have. The one function; its problems are the table's, never raised."""
    _, configured, problems = table_settings(config, table)
    return configured, problems


def table_settings(config: StreambergConfig, table: Any) -> tuple[TablePolicy, StreambergConfig, list[str]]:
    """`effective`, with the policy's own switches (enabled actions, intervals, the column
    lifecycle's): what the governor keeps a table by. `auto` clustering is resolved to its
    choice (or the config's columns until one is made) before anything reads the columns."""
    names = {name for name in _column_paths(table.schema())}
    properties, problems = _auto_columns(config, dict(table.properties), names)
    policy, configured = policy_for(config, properties)
    problems += list(policy.problems)
    problems += _missing_clustering(configured, policy, names, "the table")
    return policy, configured, problems


def _missing_clustering(configured: StreambergConfig, policy: TablePolicy, names: set[str], where: str) -> list[str]:
    """The clustering columns (the table's key or the config's) that are not among `names`."""
    missing = [c for c in configured.compactor.columns if c not in names]
    if not missing:
        return []
    source = "streamberg.cluster.columns" if "compactor.columns" in policy.settings else "compactor.columns"
    return [f"{source}: {', '.join(missing)} not a column of {where} (columns: "
            f"{', '.join(sorted(n for n in names if '.' not in n)[:20])})"]


def declared_problems(config: StreambergConfig) -> list[str]:
    """What the components would refuse of a table from its config alone, before any table
    exists (`streamberg check`): its `table.properties` policy values, and the clustering and
    retention columns against the declared schema. The same rules `table_settings` and the
    compactor apply to the table later; [] when no schema is declared (the table's own then)."""
    from streamberg.common.schema import schema_from_config

    properties = dict(config.table.properties)
    problems: list[str] = []
    if str(properties.get("streamberg.cluster.columns", "")).strip().lower() == AUTO:
        del properties["streamberg.cluster.columns"]
        if not config.catalog.scan_reports_dir:
            problems.append("streamberg.cluster.columns=auto needs catalog.scan_reports_dir (where scan reports are "
                            "collected)")
    policy, configured = policy_for(config, properties)
    problems += [f"table.properties: {p}" for p in policy.problems]
    if config.table.schema_ is None:
        return problems
    names = set(_column_paths(schema_from_config(config.table)))
    problems += _missing_clustering(configured, policy, names, "table.schema")
    retention = configured.maintenance.retention.column
    if retention and retention not in names:
        problems.append(f"maintenance.retention.column: {retention} not a column of table.schema")
    return problems


AUTO = "auto"


def _auto_columns(config: StreambergConfig, properties: dict[str, str],
                  names: set[str]) -> tuple[dict[str, str], list[str]]:
    """`streamberg.cluster.columns=auto`: the columns the table's queries filter
    (table_meta/query_stats.py); the config's columns until a query filtered one."""
    key = "streamberg.cluster.columns"
    if str(properties.get(key, "")).strip().lower() != AUTO:
        return properties, []
    del properties[key]
    folder = config.catalog.scan_reports_dir
    if not folder:
        return properties, [f"{key}=auto needs catalog.scan_reports_dir (where scan reports are collected); "
                            f"clustering by compactor.columns"]
    from streamberg.table_meta.query_stats import auto_columns

    try:
        chosen, _ = auto_columns(folder, config.catalog.name, config.table.identifier, names)
    except OSError as exc:
        return properties, [f"{key}=auto: scan reports in {folder} cannot be read ({exc.strerror or exc}); "
                            f"clustering by compactor.columns"]
    if chosen:
        properties[key] = ",".join(chosen)
    return properties, []


def _column_paths(schema: Any) -> list[str]:
    """Every column's dotted path (nested struct fields too), as clustering names them."""
    out: list[str] = []

    def walk(fields: Any, prefix: str) -> None:
        for f in fields:
            path = f"{prefix}{f.name}"
            out.append(path)
            if hasattr(f.field_type, "fields"):
                walk(f.field_type.fields, path + ".")

    walk(schema.fields, "")
    return out
