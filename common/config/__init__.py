"""The one configuration file: a YAML document validated by pydantic.

Values come from the YAML file and may be overridden by environment variables named
``STREAMBERG_<SECTION>__<KEY>`` (for example ``STREAMBERG_KAFKA__BOOTSTRAP_SERVERS``).
An invalid file fails before anything starts, with every bad key named.

Relative paths (catalog database, warehouse, state directory) are resolved against the
directory of the config file, so a config works the same from any working directory.

The file is hostile input until proven otherwise: it must be a regular UTF-8 file of at most
1 MiB; duplicate keys, non-string keys, deep nesting and alias floods are refused before
validation; every number is bounded (no inf/nan, no booleans for integers), identifiers are
ASCII with a length cap (they end up in paths, Spark SQL text and snapshot summaries). Every
failure is one line naming the key, without echoing values that may be secrets.

The package, by concern: `bounds` (bounded value types), `table` (catalog and table
sections), `sections` (kafka, ingest, dead letters), `components` (compactor, monitoring,
maintenance, run), `model` (the whole configuration and the targets components are given),
`messages` (one line per invalid key), `loading` (the hostile file, paths, environment,
dump and rebuild). Import from the package, not its modules.
"""

from streamberg.common.config.bounds import MAX_CONFIG_BYTES, MAX_RECORD_BYTES
from streamberg.common.config.components import (
    LAYOUT_STRATEGIES,
    ORPHAN_SAFETY_FLOOR_SECONDS,
    CompactorConfig,
    ExpireConfig,
    GovernConfig,
    MaintenanceConfig,
    ManifestsConfig,
    MergeConfig,
    MonitoringConfig,
    OrphanConfig,
    RetentionConfig,
    RunConfig,
)
from streamberg.common.config.fleet import FleetConfig, RouteConfig, topic_identifier
from streamberg.common.config.loading import (
    config_from_dump,
    dump_config,
    load_config,
    load_fleet,
    load_tables,
    one_table,
)
from streamberg.common.config.model import ENV_PREFIX, IngestTarget, StreambergConfig, TableTarget
from streamberg.common.config.resolve import fleet_table
from streamberg.common.config.sections import (
    CHANGELOG_COLUMNS,
    CHANGELOG_TARGET_PROPERTY,
    DeadLetterConfig,
    IngestConfig,
    KafkaConfig,
)
from streamberg.common.config.table import (
    CatalogConfig,
    FieldConfig,
    PartitionFieldConfig,
    TableConfig,
    TypeConfig,
)
from streamberg.common.config.types import PRIMITIVE_TYPES

__all__ = [
    "CHANGELOG_COLUMNS", "CHANGELOG_TARGET_PROPERTY", "ENV_PREFIX", "LAYOUT_STRATEGIES", "MAX_CONFIG_BYTES", "MAX_RECORD_BYTES", "ORPHAN_SAFETY_FLOOR_SECONDS",
    "PRIMITIVE_TYPES", "CatalogConfig", "CompactorConfig", "DeadLetterConfig", "ExpireConfig", "FieldConfig",
    "IngestConfig", "IngestTarget", "KafkaConfig", "MaintenanceConfig", "ManifestsConfig", "MergeConfig", "MonitoringConfig", "OrphanConfig",
    "PartitionFieldConfig", "RetentionConfig", "TypeConfig", "RunConfig", "GovernConfig", "StreambergConfig", "TableConfig", "TableTarget",
    "FleetConfig", "RouteConfig", "topic_identifier", "fleet_table", "load_fleet", "load_tables", "one_table",
    "config_from_dump", "dump_config", "load_config",
]
