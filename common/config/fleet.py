"""Many tables from one config: `defaults` and `tables` (routes from topics to tables).

```yaml
kafka: {bootstrap_servers: ..., value_format: json}
catalog: {...}
defaults:                        # every table's settings unless a route overrides them
  table: {partition_spec: [{source: ts, transform: day}]}
  ingest: {commit_interval_seconds: 10}
tables:
  - identifier: shop.orders      # one topic, one table, declared schema
    topics: [orders]
    schema: [...]
  - identifier: "raw.{topic}"    # every topic matching the pattern: its own table
    topic_pattern: "events\\..*"
    schema: infer                # created on the first record, typed from it, then evolved
  - identifier: "cdc.{source_table}"
    topic_pattern: "dbserver1\\.inventory\\..*"
    envelope: debezium
    primary_key: [id]
    schema: [...]
```

A route names its topics (`topics`) or a regular expression every topic name must match
whole (`topic_pattern`, checked against the broker's topics at start and every
`ingest.topic_discovery_seconds`). Its identifier is a `namespace.table` template:
- `{topic}`: the topic's name made an identifier (`topic_identifier`): every character that
  is not [A-Za-z0-9_] becomes `_`, a leading digit gets a `t_` before it, lower case, at most
  128 characters (cut with an 8-hex-digit hash of the name when longer);
- `{source_table}`: Debezium's table, the topic name's last dot-separated part (Debezium's
  topic naming, `<server>.<schema>.<table>`), made an identifier the same way.

Every table is then an ordinary single-table configuration (`table_config`): the route's keys
over `defaults.table` and `defaults.ingest`, the top-level `kafka`, `catalog` and the
components' sections. Refused at load, naming the keys: two routes claiming one named topic,
a named topic another route's pattern also matches, two routes whose identifiers can be the
same (the same fixed identifier, or templates that only differ where one route's topics
would fill them), a template that is not a valid identifier once filled.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

if TYPE_CHECKING:
    from streamberg.common.config.model import StreambergConfig

from streamberg.common.config.bounds import (
    MAX_IDENTIFIER,
    Identifier,
    Properties,
    _float,
    _int,
    _Section,
    _text,
)
from streamberg.common.config.components import (
    CompactorConfig,
    GovernConfig,
    MaintenanceConfig,
    MergeConfig,
    MonitoringConfig,
    RunConfig,
)
from streamberg.common.config.sections import _TOPIC, IngestConfig, KafkaConfig
from streamberg.common.config.table import CatalogConfig, FieldConfig, PartitionFieldConfig

_PLACEHOLDER = re.compile(r"\{(topic|source_table)\}")
_ANY_PLACEHOLDER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")
_TEMPLATE = re.compile(r"[A-Za-z_{][A-Za-z0-9_{}]*\.[A-Za-z_{][A-Za-z0-9_{}]*")
TopicName = Annotated[str, _text(249, _TOPIC, "must be 1 to 249 characters of [A-Za-z0-9._-] (Kafka's rule)")]
MAX_ROUTES = 1000
# A route value (route_field): it becomes part of a table's name, so only this, lower-cased;
# it starts with a letter or digit, so no value can make the route's own `_unrouted` table.
ROUTE_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]{0,62}")
UNROUTED = "_unrouted"


# A route value ending so would name another table's side table (its dead letters, change
# log or key state: common/config/model.py, table_meta/changelog.py): refused.
SIDE_TABLE_ENDINGS = ("dead_letters", "changelog", "merge_keys")


_SIDE_KINDS = {"_dead_letters": "dead letters", "_changelog": "change log", "_merge_keys": "merge key state",
               UNROUTED: "unrouted records"}


def side_table_clash(identifier: str, anchor: bool = False) -> str | None:
    """Why a table a route makes (from a topic's name or a record's value) cannot be one: its
    name ends like a side table's (another table's dead letters, change log or key state, a
    route's unrouted table), whatever the order topics arrive in. None: it can. `anchor`: the
    identifier is a field-routed route's own unrouted table."""
    table = identifier.rsplit(".", 1)[-1].lower()
    for ending, kind in _SIDE_KINDS.items():
        if table.endswith(ending) and not (anchor and ending == UNROUTED):
            return (f"its table {identifier} would end like a side table's name ({ending}: another table's {kind}); "
                    "rename the topic or give it a route of its own")
    return None


def route_value(value: object) -> str:
    """A record's route field as a table-name part; ValueError saying why it cannot be one."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        kind = "missing" if value is None else f"a {type(value).__name__}, not a string or integer"
        raise ValueError(kind)
    text = str(value)
    if not ROUTE_VALUE.fullmatch(text):
        raise ValueError(f"{text[:60]!r}: a table name part is 1 to 63 letters, digits or _, starting with a letter "
                         "or digit")
    if text.lower().endswith(SIDE_TABLE_ENDINGS):
        raise ValueError(f"{text[:60]!r} ends like a side table's name ({', '.join(SIDE_TABLE_ENDINGS)})")
    return text.lower()


# The table property naming the topic a fleet table is fed from (written when the ingest
# first opens it): two topics that make one identifier never share a table.
ROUTE_TOPIC_PROPERTY = "streamberg.route.topic"
ROUTE_VALUE_PROPERTY = "streamberg.route.value"  # ... and the route field's value it holds
# The run folder's record of the tables the ingest paused (written by ingest/committers.py,
# read by `status`, monitoring/fleet.py).
PAUSED_TABLES_FILE = "paused-tables.json"


def topic_identifier(name: str) -> str:
    """A topic's name as an identifier part (the `{topic}` rule above)."""
    ident = re.sub(r"[^A-Za-z0-9_]", "_", name).lower()
    if ident[:1].isdigit() or not ident:
        ident = "t_" + ident
    if len(ident) > MAX_IDENTIFIER:
        ident = ident[:MAX_IDENTIFIER - 9] + "_" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return ident


def source_table(topic: str) -> str:
    """Debezium's table of a topic named `<server>.<schema>.<table>`: its last part."""
    return topic_identifier(topic.rsplit(".", 1)[-1])


class RouteConfig(_Section):
    # The table, `namespace.table`, where {topic} and {source_table} may stand for parts of it.
    identifier: Annotated[str, _text(2 * MAX_IDENTIFIER + 1)]
    # The topics of this route, named.
    topics: list[TopicName] | None = Field(default=None, max_length=10_000)
    # ... or every topic whose whole name matches this regular expression.
    topic_pattern: Annotated[str | None, _text(1024, optional=True)] = None
    # A top-level field of each record (JSON values) whose value names the record's table:
    # `{<route_field>}` stands for it in the identifier (`web.clicks_{region}`). A value is a
    # string or integer of 1 to 63 letters, digits or _ (lower-cased into the name); any other record is a
    # dead letter of the route's `<...>_unrouted` table, with the reason. At most
    # ingest.max_tables_per_route tables a route (past it: dead letters, with the reason).
    route_field: Identifier | None = None
    # The table's columns, `infer` (from the first records: JSON; later fields evolve it), or
    # null with a registry format (the writer schema makes the table).
    schema_: list[FieldConfig] | Literal["infer"] | None = Field(default=None, alias="schema")
    # What the records are (kafka.envelope) and how they are written, when not the top-level kafka's.
    envelope: Literal["none", "debezium", "upsert"] | None = None
    value_format: Annotated[str | None, _text(32, optional=True)] = None
    key_format: Literal["text", "value"] | None = None
    key_field: Identifier | None = None
    # Table settings over defaults.table.
    primary_key: list[Identifier] | None = Field(default=None, max_length=16)
    sequence_field: Identifier | None = None
    partition_spec: list[PartitionFieldConfig] | None = Field(default=None, max_length=64)
    properties: Properties | None = None
    target_file_size_bytes: Annotated[int | None, _int(1, 2**40, optional=True)] = None
    # This route's tables commit on their own interval (a hot table often, quiet ones rarely);
    # null: defaults.ingest's. A table with nothing new in an interval makes no commit.
    commit_interval_seconds: Annotated[float | None, _float(0, 86400.0, optional=True)] = None
    # This route's tables keep their uncommitted rows decoded for fresh reads
    # (ingest.keep_tail: the tables read fresh, not the whole fleet); null: defaults.ingest's.
    # Not for a field route (its tables' fresh reads pick their records from Kafka).
    keep_tail: bool | None = None

    model_config = {"extra": "forbid", "frozen": True, "populate_by_name": True}

    @field_validator("topic_pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _one_source(self) -> RouteConfig:
        if (self.topics is None) == (self.topic_pattern is None):
            raise ValueError("give exactly one of topics and topic_pattern")
        allowed = {"{topic}", "{source_table}"} | ({"{" + self.route_field + "}"} if self.route_field else set())
        if not _TEMPLATE.fullmatch(self.identifier) or \
                {m.group(0) for m in re.finditer(r"\{[^}]*\}", self.identifier)} - allowed:
            raise ValueError("identifier: must be namespace.table, each part an identifier in which {topic}, "
                             "{source_table} or {<route_field>} may stand")
        if self.route_field is not None:
            if "{" + self.route_field + "}" not in self.identifier.split(".", 1)[1]:
                raise ValueError(f"identifier: route_field {self.route_field} needs {{{self.route_field}}} in the "
                                 "table part of the identifier")
            if self.envelope not in (None, "none"):
                raise ValueError("route_field: routes rows (envelope none); a change stream is routed by topic")
            if self.keep_tail:
                raise ValueError("keep_tail: a field route's tables are read fresh from Kafka (their records share a "
                                 "topic); their tail is not kept")
        if self.topic_pattern is not None and not _PLACEHOLDER.search(self.identifier) and not self.route_field:
            raise ValueError("identifier: a topic_pattern route needs {topic} or {source_table} in its identifier "
                             "(else every matching topic would write one table)")
        if self.topics is not None and len(self.topics) > 1 and not _PLACEHOLDER.search(self.identifier) \
                and not self.route_field:
            raise ValueError("identifier: a route of several topics needs {topic} or {source_table} (one table a topic)")
        return self

    def claims(self, topic: str) -> bool:
        if self.topics is not None:
            return topic in self.topics
        assert self.topic_pattern is not None
        return re.fullmatch(self.topic_pattern, topic) is not None

    def table_identifier(self, topic: str, value: str | None = None) -> str:
        """The table of `topic` (and, with route_field, of records whose field holds `value`:
        an already checked route value, or None for the route's unrouted table)."""
        made = self.identifier.replace("{topic}", topic_identifier(topic)).replace("{source_table}",
                                                                                  source_table(topic))
        if self.route_field is not None:
            made = made.replace("{" + self.route_field + "}", value if value is not None else UNROUTED)
        return made

    def value_of(self, topic: str, identifier: str) -> str | None:
        """The route value whose table under `topic` is `identifier` (UNROUTED for the route's
        unrouted table); None when no value of this route makes it."""
        if self.route_field is None:
            return None
        marker = "\x00"
        pattern = re.escape(self.table_identifier(topic, marker).lower()).replace(re.escape(marker), "([a-z0-9_]+)")
        found = re.fullmatch(pattern, identifier.lower())
        if found is None or len(set(found.groups())) != 1:
            return None
        value = found.group(1)
        if value == UNROUTED:
            return UNROUTED
        try:
            return route_value(value)
        except ValueError:
            return None


class FleetDefaults(_Section):
    # Table settings every route starts from (partition_spec, properties, ...): checked as each
    # route's table is made (a route's own keys go over them).
    table: dict[str, Any] = Field(default_factory=dict)
    # Ingest settings of every table (commit_interval_seconds, ...): one job commits them all.
    ingest: IngestConfig = Field(default_factory=IngestConfig)

    @field_validator("table")
    @classmethod
    def _known_table_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        """A wrong key is named where it is written (defaults.table.X), not once per route."""
        from streamberg.common.config.table import TableConfig

        settable = {name for name in TableConfig.model_fields} | \
            {f.alias for f in TableConfig.model_fields.values() if f.alias}
        for key in value:
            if key in ("identifier", "schema", "schema_"):
                raise ValueError(f"{key}: each route gives its own (tables[].{key.rstrip('_')})")
            if key not in settable:
                raise ValueError(f"{key}: not a table setting (those are "
                                 f"{', '.join(sorted(settable - {'identifier', 'schema', 'schema_'}))})")
        return value


def check_routes(routes: list[RouteConfig]) -> None:
    """Refuse routes that could claim one topic or make one table (ValueError naming them)."""
    named: dict[str, int] = {}
    for i, route in enumerate(routes):
        for topic in route.topics or ():
            if topic in named:
                raise ValueError(f"tables.{i}.topics: topic {topic!r} is already routed by tables.{named[topic]}")
            named[topic] = i
    for topic, i in named.items():
        for j, route in enumerate(routes):
            if j != i and route.topic_pattern is not None and route.claims(topic):
                raise ValueError(f"tables.{j}.topic_pattern matches topic {topic!r} of tables.{i}: a topic goes to "
                                 "one route (narrow the pattern)")
    fixed: dict[str, int] = {}
    for i, route in enumerate(routes):
        if not _ANY_PLACEHOLDER.search(route.identifier) and (why := side_table_clash(route.identifier)):
            raise ValueError(f"tables.{i}.identifier: {why.replace('its table ', '', 1)}")
        if not _ANY_PLACEHOLDER.search(route.identifier):
            key = route.identifier.lower()
            if key in fixed:
                raise ValueError(f"tables.{i}.identifier: {route.identifier} is also tables.{fixed[key]}'s")
            fixed[key] = i
    templated = [(i, r) for i, r in enumerate(routes) if _ANY_PLACEHOLDER.search(r.identifier)]
    for a, (i, first) in enumerate(templated):
        for j, second in templated[a + 1:]:
            if _ANY_PLACEHOLDER.sub("*", first.identifier).lower() == _ANY_PLACEHOLDER.sub("*", second.identifier).lower():
                raise ValueError(f"tables.{j}.identifier: {second.identifier} can name the same tables as "
                                 f"tables.{i}'s {first.identifier}; give one of them another namespace or prefix")
    for i, route in enumerate(routes):
        for topic in route.topics or ():
            made = route.table_identifier(topic)
            if made.lower() in fixed and fixed[made.lower()] != i:
                raise ValueError(f"tables.{i}: topic {topic!r} would make {made}, which is tables.{fixed[made.lower()]}")


def per_table_checkpoint(checkpoint_dir: str, identifier: str) -> str:
    """The compactor checkpoint folder of one table among many: <checkpoint_dir>/<identifier>."""
    return f"{checkpoint_dir.rstrip('/')}/{identifier}"


class FleetKafkaConfig(KafkaConfig):
    """A config of many's `kafka`: the brokers and the settings every route shares; no topic
    (the routes name them)."""

    topic: str | None = None

    @field_validator("topic", mode="before")
    @classmethod
    def _no_topic(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError("a config of many tables names its topics in tables[].topics or tables[].topic_pattern")
        return value


class FleetConfig(_Section):
    """A config of many tables: the run-wide sections (typed, as a single table's), `defaults`
    and the routes."""

    kafka: FleetKafkaConfig = Field(default_factory=FleetKafkaConfig)
    catalog: CatalogConfig = Field(default_factory=CatalogConfig)
    defaults: FleetDefaults = Field(default_factory=FleetDefaults)
    tables: list[RouteConfig] = Field(min_length=1, max_length=MAX_ROUTES)
    compactor: CompactorConfig = Field(default_factory=CompactorConfig)
    maintenance: MaintenanceConfig = Field(default_factory=MaintenanceConfig)
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig)
    merge: MergeConfig = Field(default_factory=MergeConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    govern: GovernConfig = Field(default_factory=GovernConfig)
    config_path: str | None = None
    # A config of one table as a config of one route (common/config/loading.as_fleet): that
    # table's configuration, as data, which document() gives whole.
    single: dict[str, Any] | None = None
    # ... and as it loaded (what the file set, with the environment: the origins of its settings
    # that a dump, every field set, would lose). Not data: a worker rebuilds from `single`
    # (common/config/loading.one_table).
    _loaded: StreambergConfig | None = PrivateAttr(default=None)

    @property
    def many(self) -> bool:
        """Whether the file declares many tables (`tables:`), not one table as a route of one."""
        return self.single is None

    @model_validator(mode="before")
    @classmethod
    def _single_table_sections(cls, data: Any) -> Any:
        """A single-table section in a config of many: say where its settings go."""
        if isinstance(data, dict):
            moved = {"table": "each table's identifier and schema go in its tables[] entry, settings every table "
                              "shares in defaults.table",
                     "ingest": "the ingest settings of a config of many go in defaults.ingest (one job commits "
                               "every table)",
                     "dead_letter": "each table's dead letters go to <table>_dead_letters"}
            for key, where in moved.items():
                if key in data:
                    raise ValueError(f"{key}: a config of many tables (tables:) has no {key} section: {where}")
        return data

    @model_validator(mode="after")
    def _routes(self) -> FleetConfig:
        if self.single is not None:  # one table's own configuration, checked as such when it loaded
            return self
        check_routes(self.tables)
        for i, route in enumerate(self.tables):
            if route.route_field is not None and (route.value_format or self.kafka.value_format) != "json":
                raise ValueError(f"tables.{i}.route_field: routing by a field reads JSON values (value_format json)")
            if route.route_field is not None and (route.envelope or self.kafka.envelope) != "none":
                # (kafka.envelope is every route's unless it says otherwise: a change stream's
                # records hold the row under before/after, no top-level field to route by.)
                raise ValueError(f"tables.{i}.route_field: routes rows (envelope none); kafka.envelope is "
                                 f"{self.kafka.envelope}: set the route's envelope: none, or route the change "
                                 f"stream by topic")
        return self

    def document(self, route: RouteConfig, topic: str, value: str | None = None) -> dict[str, Any]:
        """The single-table configuration of `topic` under `route` (with route_field: of the
        records whose field holds `value`, None for the route's unrouted table), as data."""
        if self.single is not None:  # a config of one table: that table's own configuration
            return {**self.single, "kafka": {**self.single["kafka"], "topic": topic}}
        shared = {"kafka": self.kafka, "catalog": self.catalog, "compactor": self.compactor,
                  "maintenance": self.maintenance, "monitoring": self.monitoring, "merge": self.merge, "run": self.run,
                  "govern": self.govern}
        dumped = {name: section.model_dump(mode="json", by_alias=True, exclude_unset=True)
                  for name, section in shared.items()}
        kafka = {**dumped["kafka"], "topic": topic}
        for key in ("envelope", "value_format", "key_format", "key_field"):
            if getattr(route, key) is not None:
                kafka[key] = getattr(route, key)
        table = {**self.defaults.table, "identifier": route.table_identifier(topic, value)}
        if isinstance(route.schema_, list):
            table["schema"] = [f.model_dump(by_alias=True, exclude_none=True) for f in route.schema_]
        for key in ("primary_key", "sequence_field", "target_file_size_bytes"):
            if getattr(route, key) is not None:
                table[key] = getattr(route, key)
        if route.partition_spec is not None:
            table["partition_spec"] = [p.model_dump() for p in route.partition_spec]
        if route.properties is not None:
            table["properties"] = {**table.get("properties", {}), **route.properties}
        ingest = self.defaults.ingest.model_dump(mode="json", by_alias=True, exclude_unset=True)
        ingest.setdefault("record_group_offsets", False)  # one group consumer a table: asked for, not assumed
        if route.commit_interval_seconds is not None:
            ingest["commit_interval_seconds"] = route.commit_interval_seconds
        if route.keep_tail is not None:
            ingest["keep_tail"] = route.keep_tail
        # Each table's compactor keeps its own streaming checkpoint (a shared one would hand a
        # table another table's snapshot ids).
        compactor = dumped["compactor"]
        if compactor.get("checkpoint_dir"):
            compactor["checkpoint_dir"] = per_table_checkpoint(str(compactor["checkpoint_dir"]), table["identifier"])
        routed = {"route_field": route.route_field} if route.route_field is not None else {}
        return {**dumped, "kafka": kafka, "table": table, "ingest": ingest, "compactor": compactor,
                "config_path": self.config_path, **routed}

    def route_of(self, topic: str) -> RouteConfig | None:
        return next((r for r in self.tables if r.claims(topic)), None)

    def named_topics(self) -> list[str]:
        return [t for r in self.tables for t in (r.topics or ())]
