"""The one configuration file: a YAML document validated by pydantic.

Values come from the YAML file and may be overridden by environment variables named
``STREAMBERG_<SECTION>__<KEY>`` (for example ``STREAMBERG_KAFKA__BOOTSTRAP_SERVERS``).
An invalid file fails before anything starts, with every bad key named.

Relative paths (catalog database, warehouse, state directory) are resolved against the
directory of the config file, so a config works the same from any working directory.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

ENV_PREFIX = "STREAMBERG_"

PRIMITIVE_TYPES = {
    "boolean", "int", "long", "float", "double", "date", "time",
    "timestamp", "timestamptz", "string", "uuid", "binary",
}
_DECIMAL = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
_TRANSFORM = re.compile(r"^(identity|year|month|day|hour|void|bucket\[(\d+)\]|truncate\[(\d+)\])$")
_TIME_TRANSFORMS = {"year", "month", "day", "hour"}
_TEMPORAL_TYPES = {"date", "timestamp", "timestamptz"}


class ConfigError(ValueError):
    """The configuration cannot be used; the message names every offending key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaConfig(_Section):
    bootstrap_servers: str = "127.0.0.1:19092"
    topic: str = Field(min_length=1)
    # The offset to start from for a partition the table has never seen.
    start_offset: Literal["earliest", "latest"] = "earliest"
    # Consumer group under which offsets are committed *after* each Iceberg commit.
    # They are for lag monitoring only: the job always resumes from the table.
    group_id: str | None = None
    # Extra librdkafka settings passed to every consumer (security, fetch sizes, ...).
    consumer: dict[str, str | int | float | bool] = Field(default_factory=dict)

    @field_validator("consumer")
    @classmethod
    def _no_owned_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        owned = {"bootstrap.servers", "group.id", "enable.auto.commit", "auto.offset.reset"}
        if clash := sorted(owned & set(value)):
            raise ValueError(f"{', '.join(clash)} are set by streamberg itself; use the kafka.* keys instead")
        return value


class CatalogConfig(_Section):
    name: str = "streamberg"
    # Any SQLAlchemy URI: sqlite:///catalog.db (default) or postgresql+psycopg2://user:pw@host/db.
    uri: str = "sqlite:///.streamberg/catalog.db"
    # Table data root: a local path or an object-store URI (s3://bucket/prefix).
    warehouse: str = ".streamberg/warehouse"
    # Extra catalog / FileIO properties (s3.endpoint, s3.access-key-id, ...).
    properties: dict[str, str] = Field(default_factory=dict)

    @field_validator("uri")
    @classmethod
    def _sqlalchemy_uri(cls, value: str) -> str:
        if "://" not in value:
            raise ValueError("must be a SQLAlchemy URI such as sqlite:///catalog.db or postgresql+psycopg2://u:p@host/db")
        return value


class FieldConfig(_Section):
    name: str = Field(min_length=1)
    type: str
    required: bool = False
    doc: str | None = None

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        value = value.strip().lower()
        if value in PRIMITIVE_TYPES or _DECIMAL.match(value):
            return value
        raise ValueError(f"unknown type {value!r}; use one of {sorted(PRIMITIVE_TYPES)} or decimal(P,S)")


class PartitionFieldConfig(_Section):
    source: str
    transform: str = "identity"

    @field_validator("transform")
    @classmethod
    def _known_transform(cls, value: str) -> str:
        value = value.strip().lower()
        match = _TRANSFORM.match(value)
        if not match:
            raise ValueError(f"unknown transform {value!r}; use identity, year, month, day, hour, bucket[N] or truncate[W]")
        width = match.group(2) or match.group(3)
        if width is not None and int(width) <= 0:
            raise ValueError(f"{value!r}: the width must be positive")
        return value


class TableConfig(_Section):
    identifier: str = Field(pattern=r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$")
    schema_: list[FieldConfig] = Field(alias="schema", min_length=1)
    partition_spec: list[PartitionFieldConfig] = Field(default_factory=list)
    target_file_size_bytes: int = Field(default=128 * 1024 * 1024, gt=0)
    properties: dict[str, str] = Field(default_factory=dict)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _consistent(self) -> "TableConfig":
        names = [f.name for f in self.schema_]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"schema: duplicate field names {dupes}")
        types = {f.name: f.type for f in self.schema_}
        for i, part in enumerate(self.partition_spec):
            if part.source not in types:
                raise ValueError(f"partition_spec.{i}.source: {part.source!r} is not a schema field")
            base = part.transform.split("[")[0]
            if base in _TIME_TRANSFORMS and types[part.source] not in _TEMPORAL_TYPES:
                raise ValueError(f"partition_spec.{i}.transform: {base} needs a date/timestamp field, {part.source!r} is {types[part.source]}")
            if base == "hour" and types[part.source] == "date":
                raise ValueError(f"partition_spec.{i}.transform: hour needs a timestamp field, {part.source!r} is a date")
        return self

    @property
    def namespace(self) -> str:
        return self.identifier.rsplit(".", 1)[0]


class IngestConfig(_Section):
    # Each commit interval, writers close their files and the committer makes one snapshot.
    commit_interval_seconds: float = Field(default=10.0, gt=0)
    parallelism: int = Field(default=2, ge=1)
    # Upper bound of records fetched by one poll (one decode batch).
    max_poll_records: int = Field(default=5000, ge=1)
    poll_timeout_seconds: float = Field(default=0.2, gt=0)
    # A record larger than this is dead-lettered as oversized.
    max_record_bytes: int = Field(default=1024 * 1024, gt=0)
    # Rows buffered per open file before a Parquet row group is written.
    row_group_rows: int = Field(default=131072, ge=1)
    # Identifies this ingest job in snapshot summaries; defaults to "ingest:<table>".
    job_id: str | None = None
    # Local working files of the job (run markers); not part of the table.
    state_dir: str = ".streamberg/state"
    # Retries of an Iceberg commit that lost a race (e.g. with the compactor).
    commit_retries: int = Field(default=10, ge=0)
    # Extra Flink configuration (key: value), e.g. {"taskmanager.memory.process.size": "2g"}.
    flink: dict[str, str] = Field(default_factory=dict)


class DeadLetterConfig(_Section):
    # Malformed records go to this Iceberg table (created when absent), exactly once.
    table: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$")


class CompactorConfig(_Section):
    """Settings of the incremental optimize loop (compactor/). Owned by the compactor.

    Planning rules decide, per table partition, whether its pending files (files added by
    ingest appends and not yet optimized) are rewritten now. A partition is rewritten when ANY
    enabled rule fires; a rule set to null is off. See docs/compactor.md.
    """

    strategy: Literal["zorder", "hilbert", "zorder-iceberg", "sort", "binpack"] = "zorder"
    # Columns the layout clusters on; empty means the compactor only bin-packs.
    columns: list[str] = Field(default_factory=list)
    # Spark's checkpoint of the streaming query (progress across restarts).
    checkpoint_dir: str = ".streamberg/compactor-checkpoint"
    spark_master: str = "local[*]"
    spark_conf: dict[str, str] = Field(default_factory=dict)

    # -- planning rules (per partition unless said otherwise) --
    # At least this many pending files in a partition.
    min_files: int | None = Field(default=10, ge=1)
    # At least this many pending bytes in a partition (null: off; the target size is typical).
    min_bytes: int | None = Field(default=None, gt=0)
    # The oldest pending file of a partition was committed at least this long ago.
    max_delay_seconds: float | None = Field(default=600.0, gt=0)
    # Table-wide: at least this many ingest snapshots have pending files (Tencent's "every 5").
    every_n_snapshots: int | None = Field(default=5, ge=1)

    # -- rewriting --
    # Size of the files the rewrite writes; null: the table's write.target-file-size-bytes.
    target_file_size_bytes: int | None = Field(default=None, gt=0)
    # A partition's pending files are split into groups of at most this many bytes; each
    # group is read, laid out and written by one Spark job.
    max_group_bytes: int = Field(default=2 * 1024**3, gt=0)
    # Large plans commit in several steps so a crash loses at most one step's work; a plan
    # is committed in at most this many commits (1: one all-or-nothing commit).
    max_commits: int = Field(default=10, ge=1)
    # Retries of a commit that still fails after Iceberg's own retries (CommitFailedException).
    commit_retries: int = Field(default=3, ge=0)
    # Rows sampled per group to find each column's rank boundaries (zorder, hilbert).
    sample_rows: int = Field(default=20000, ge=100)
    # Bits of rank per column for zorder/hilbert: up to 2^bits distinct ranks per column.
    index_bits: int = Field(default=10, ge=1, le=20)

    # -- running --
    # How often the streaming query looks for new snapshots (continuous mode).
    trigger_interval_seconds: float = Field(default=30.0, gt=0)
    # One compactor per table: a lease row in the catalog database, renewed while running.
    lease_ttl_seconds: float = Field(default=60.0, ge=5)
    # When another compactor holds the lease: 0 exits at once, >0 waits up to that long.
    lease_wait_seconds: float = Field(default=0.0, ge=0)

    @field_validator("columns")
    @classmethod
    def _distinct_columns(cls, value: list[str]) -> list[str]:
        if dupes := sorted({c for c in value if value.count(c) > 1}):
            raise ValueError(f"columns listed twice: {dupes}")
        if any(not c.strip() for c in value):
            raise ValueError("column names must not be empty")
        return value

    @model_validator(mode="after")
    def _some_rule(self) -> "CompactorConfig":
        rules = (self.min_files, self.min_bytes, self.max_delay_seconds, self.every_n_snapshots)
        if all(rule is None for rule in rules):
            raise ValueError("min_files, min_bytes, max_delay_seconds and every_n_snapshots are all null: "
                             "the incremental compactor would never act (use --full for one-off rewrites)")
        return self

    @property
    def effective_strategy(self) -> str:
        """Without clustering columns every strategy degenerates to bin-packing."""
        return self.strategy if self.columns else "binpack"


class MonitoringConfig(_Section):
    """Thresholds of the health verdict of `streamberg status` and the metrics exporter
    (monitoring/). A threshold set to null turns its check off. See docs/monitoring.md."""

    # Seconds to wait for the broker (metadata, end offsets) before calling it unreachable.
    broker_timeout_seconds: float = Field(default=3.0, gt=0)
    # Find each partition's end by also reading its last record batch: the embedded tansu
    # broker's high watermark stops short of the end by the rest of that batch.
    read_last_batch: bool = True
    # Ingest lag (records between the table's recorded offsets and the broker's end, all
    # partitions together) from which the verdict is warn / critical.
    lag_warn_records: int | None = Field(default=10_000, ge=1)
    lag_critical_records: int | None = Field(default=1_000_000, ge=1)
    # While records wait in Kafka, a last ingest commit older than this many
    # ingest.commit_interval_seconds means ingest is stalled (no records waiting: idle, fine).
    commit_age_warn_intervals: float | None = Field(default=3.0, gt=0)
    commit_age_critical_intervals: float | None = Field(default=30.0, gt=0)
    # The oldest file waiting for the compactor older than this many
    # compactor.max_delay_seconds means the compactor is behind (off when max_delay is null).
    pending_age_warn_factor: float | None = Field(default=2.0, gt=0)
    pending_age_critical_factor: float | None = Field(default=6.0, gt=0)
    # A data file is "small" below this fraction of the target file size (Iceberg's own
    # rewrite uses 0.75 for its min-file-size-bytes).
    small_file_fraction: float = Field(default=0.75, gt=0, le=1)
    # Share of small data files from which the verdict is warn, checked only once the table
    # has at least small_file_min_files data files (a young table is all small files).
    small_file_ratio_warn: float | None = Field(default=0.8, gt=0, le=1)
    small_file_min_files: int = Field(default=100, ge=1)
    # Snapshot count from which the verdict is warn / critical (maintenance expires them).
    snapshots_warn: int | None = Field(default=2000, ge=1)
    snapshots_critical: int | None = Field(default=20000, ge=1)
    # Dead letters from which the verdict is warn (null: off; bad producers are expected).
    dead_letters_warn: int | None = Field(default=None, ge=1)
    # Where `streamberg metrics` listens (Prometheus scrapes http://host:port/metrics).
    metrics_port: int = Field(default=9464, ge=1, le=65535)
    metrics_address: str = "0.0.0.0"

    @model_validator(mode="after")
    def _warn_below_critical(self) -> "MonitoringConfig":
        pairs = [("lag_warn_records", "lag_critical_records"),
                 ("commit_age_warn_intervals", "commit_age_critical_intervals"),
                 ("pending_age_warn_factor", "pending_age_critical_factor"),
                 ("snapshots_warn", "snapshots_critical")]
        for warn, critical in pairs:
            low, high = getattr(self, warn), getattr(self, critical)
            if low is not None and high is not None and low > high:
                raise ValueError(f"{warn} ({low}) must not exceed {critical} ({high})")
        return self


class ExpireConfig(_Section):
    """maintenance.expire: drop old snapshots (and the files only they reference)."""

    enabled: bool = True
    # Snapshots older than this may be expired (ingest/compactor needs are always kept).
    max_snapshot_age_seconds: float = Field(default=7 * 86400.0, gt=0)
    # The newest N snapshots of the main branch are always kept, whatever their age.
    min_snapshots_to_keep: int = Field(default=1, ge=1)
    # Keep every append snapshot that added a file the compactor has not rewritten yet (the
    # compactor recognises pending files by their adding snapshot). Set false only when no
    # compactor runs on the table; otherwise expiry stops at the oldest uncompacted append.
    keep_pending_for_compactor: bool = True


# Below this, a file still being written (ingest interval, a long compaction) could be
# taken for an orphan; going lower needs an explicit, named override.
ORPHAN_SAFETY_FLOOR_SECONDS = 3600.0


class OrphanConfig(_Section):
    """maintenance.orphan: delete files under the table location that no snapshot references."""

    enabled: bool = True
    # Only files older than this are candidates: in-flight writes must never be deleted.
    safety_age_seconds: float = Field(default=3 * 86400.0, gt=0)
    # Allows safety_age_seconds below one hour (tests, or writers known to be idle).
    allow_short_safety_age: bool = False

    @model_validator(mode="after")
    def _safe_age(self) -> "OrphanConfig":
        if self.safety_age_seconds < ORPHAN_SAFETY_FLOOR_SECONDS and not self.allow_short_safety_age:
            raise ValueError(
                f"safety_age_seconds: {self.safety_age_seconds:g} is below {ORPHAN_SAFETY_FLOOR_SECONDS:g} s; files "
                "still being written by ingest or the compactor could be deleted. Set "
                "maintenance.orphan.allow_short_safety_age: true only if no write can take that long")
        return self


class ManifestsConfig(_Section):
    """maintenance.manifests: rewrite the manifests when there are too many or too much."""

    enabled: bool = True
    # Rewrite when the current snapshot has at least this many manifests (null: no count rule).
    min_count: int | None = Field(default=100, ge=1)
    # ... or when its manifests total at least this many bytes (null: no size rule).
    min_total_bytes: int | None = Field(default=64 * 1024 * 1024, gt=0)

    @model_validator(mode="after")
    def _some_threshold(self) -> "ManifestsConfig":
        if self.enabled and self.min_count is None and self.min_total_bytes is None:
            raise ValueError("min_count and min_total_bytes are both null, so the rewrite would never run; "
                             "set maintenance.manifests.enabled: false to turn it off")
        return self


class RetentionConfig(_Section):
    """maintenance.retention: delete rows older than `days` by a time column (off by default)."""

    # A date/timestamp/timestamptz column of table.schema (checked by `streamberg maintain`).
    column: str | None = None
    # Rows whose column is older than now - days are deleted; null: retention off.
    days: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _column_when_on(self) -> "RetentionConfig":
        if self.days is not None and not self.column:
            raise ValueError("column: required when retention.days is set (the time column rows are aged by)")
        return self


class MaintenanceConfig(_Section):
    """Settings of `streamberg maintain` (maintenance/). See docs/maintenance.md."""

    # Continuous mode runs one maintenance pass every interval.
    interval_seconds: float = Field(default=3600.0, gt=0)
    # Retries (with backoff) of a step whose commit still lost to concurrent commits after
    # Iceberg's own retries (CommitFailedException); the step is re-planned each time.
    commit_retries: int = Field(default=3, ge=0)
    expire: ExpireConfig = Field(default_factory=ExpireConfig)
    orphan: OrphanConfig = Field(default_factory=OrphanConfig)
    manifests: ManifestsConfig = Field(default_factory=ManifestsConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)


class StreambergConfig(BaseSettings):
    """The whole configuration. Build it with :func:`load_config`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True, populate_by_name=True
    )

    kafka: KafkaConfig
    catalog: CatalogConfig = Field(default_factory=CatalogConfig)
    table: TableConfig
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    dead_letter: DeadLetterConfig = Field(default_factory=DeadLetterConfig)
    compactor: CompactorConfig = Field(default_factory=CompactorConfig)
    maintenance: MaintenanceConfig = Field(default_factory=MaintenanceConfig)
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig)
    # Where the file was read from (set by load_config; used to resolve relative paths).
    config_path: str | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The YAML document arrives as init kwargs; the environment overrides it.
        return (env_settings, init_settings)

    @property
    def job_id(self) -> str:
        return self.ingest.job_id or f"ingest:{self.table.identifier}"

    @property
    def dead_letter_table(self) -> str:
        return self.dead_letter.table or f"{self.table.identifier}_dead_letters"

    @property
    def consumer_group(self) -> str:
        return self.kafka.group_id or f"streamberg-{self.table.identifier}"

    @property
    def state_dir(self) -> Path:
        return Path(self.ingest.state_dir)


def _format_errors(source: str, error: ValidationError) -> str:
    lines = [f"invalid configuration in {source}:"]
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"]) or "(top level)"
        key = key.replace("schema_", "schema")
        msg = item["msg"].removeprefix("Value error, ")
        got = item.get("input")
        shown = "" if isinstance(got, (dict, list)) or got is None or item["type"] == "missing" else f" (got {got!r})"
        lines.append(f"  {key}: {msg}{shown}")
    return "\n".join(lines)


def _absolute(path: str, base: Path) -> str:
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def _resolve_paths(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    catalog = dict(raw.get("catalog") or {})
    uri = catalog.get("uri", CatalogConfig.model_fields["uri"].default)
    if isinstance(uri, str) and uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        catalog["uri"] = "sqlite:///" + _absolute(uri.removeprefix("sqlite:///"), base)
    warehouse = catalog.get("warehouse", CatalogConfig.model_fields["warehouse"].default)
    if isinstance(warehouse, str) and "://" not in warehouse:
        catalog["warehouse"] = "file://" + _absolute(warehouse, base)
    ingest = dict(raw.get("ingest") or {})
    state = ingest.get("state_dir", IngestConfig.model_fields["state_dir"].default)
    if isinstance(state, str):
        ingest["state_dir"] = _absolute(state, base)
    compactor = dict(raw.get("compactor") or {})
    checkpoint = compactor.get("checkpoint_dir", CompactorConfig.model_fields["checkpoint_dir"].default)
    if isinstance(checkpoint, str) and "://" not in checkpoint:
        compactor["checkpoint_dir"] = _absolute(checkpoint, base)
    return {**raw, "catalog": catalog, "ingest": ingest, "compactor": compactor}


def load_config(path: str | Path, **overrides: Any) -> StreambergConfig:
    """Read, resolve and validate a config file; raise ConfigError naming every bad key."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must be a mapping of sections (kafka, catalog, table, ...)")
    raw = _resolve_paths({**raw, **overrides}, path.resolve().parent)
    raw["config_path"] = str(path.resolve())
    try:
        return StreambergConfig(**raw)
    except ValidationError as exc:
        raise ConfigError(_format_errors(str(path), exc)) from None


def dump_config(config: StreambergConfig) -> dict[str, Any]:
    """The config as plain data (for shipping to Flink/Spark workers)."""
    return config.model_dump(mode="json", by_alias=True)


def config_from_dump(data: dict[str, Any]) -> StreambergConfig:
    """Rebuild a config inside a worker; the environment there must not change it."""
    return StreambergConfig.model_construct(**{
        "kafka": KafkaConfig(**data["kafka"]),
        "catalog": CatalogConfig(**data["catalog"]),
        "table": TableConfig(**data["table"]),
        "ingest": IngestConfig(**data["ingest"]),
        "dead_letter": DeadLetterConfig(**data["dead_letter"]),
        "compactor": CompactorConfig(**data["compactor"]),
        "config_path": data.get("config_path"),
    })
