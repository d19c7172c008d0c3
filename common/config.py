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
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from streamberg.common.errors import ConfigError
from streamberg.common.redact import redact, register_mapping_secrets, register_uri_secrets

ENV_PREFIX = "STREAMBERG_"

PRIMITIVE_TYPES = {
    "boolean", "int", "long", "float", "double", "date", "time",
    "timestamp", "timestamptz", "string", "uuid", "binary",
}
# ASCII digits only: "\d" also matches other scripts' digits, which int() accepts.
_DECIMAL = re.compile(r"^decimal\(\s*([0-9]{1,4})\s*,\s*([0-9]{1,4})\s*\)$")
_TRANSFORM = re.compile(r"^(identity|year|month|day|hour|void|bucket\[([0-9]{1,12})\]|truncate\[([0-9]{1,12})\])$")
_TIME_TRANSFORMS = {"year", "month", "day", "hour"}
_TEMPORAL_TYPES = {"date", "timestamp", "timestamptz"}




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


class KafkaConfig(_Section):
    bootstrap_servers: Text = "127.0.0.1:19092"
    topic: Annotated[str, _text(249, _TOPIC, "must be 1 to 249 characters of [A-Za-z0-9._-] (Kafka's rule), not '.' or '..'")]
    # The offset to start from for a partition the table has never seen.
    start_offset: Literal["earliest", "latest"] = "earliest"
    # Consumer group under which offsets are committed *after* each Iceberg commit.
    # They are for lag monitoring only: the job always resumes from the table.
    group_id: Annotated[str | None, _text(255, _PRINTABLE_ASCII, "must be 1 to 255 printable ASCII characters", optional=True)] = None
    # Extra librdkafka settings passed to every consumer (security, fetch sizes, ...).
    consumer: Annotated[dict[Key, Annotated[str | int | float | bool, PlainValidator(_check_setting)]],
                        Field(max_length=MAX_MAP_ENTRIES)] = Field(default_factory=dict)

    @field_validator("topic")
    @classmethod
    def _not_dots(cls, value: str) -> str:
        if value in (".", ".."):
            raise ValueError("'.' and '..' are not topic names")
        return value

    @field_validator("consumer")
    @classmethod
    def _no_owned_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        owned = {"bootstrap.servers", "group.id", "enable.auto.commit", "auto.offset.reset"}
        if clash := sorted(owned & set(value)):
            raise ValueError(f"{', '.join(clash)} are set by streamberg itself; use the kafka.* keys instead")
        return value


class CatalogConfig(_Section):
    # Goes into Spark SQL text (`CALL <name>.system...`) and Spark conf keys: an identifier.
    name: Identifier = "streamberg"
    # Any SQLAlchemy URI: sqlite:///catalog.db (default) or postgresql+psycopg2://user:pw@host/db.
    uri: Text = "sqlite:///.streamberg/catalog.db"
    # Table data root: a local path or an object-store URI (s3://bucket/prefix).
    warehouse: Text = ".streamberg/warehouse"
    # Extra catalog / FileIO properties (s3.endpoint, s3.access-key-id, ...).
    properties: Properties = Field(default_factory=dict)

    @field_validator("uri")
    @classmethod
    def _sqlalchemy_uri(cls, value: str) -> str:
        if "://" not in value:
            raise ValueError("must be a SQLAlchemy URI such as sqlite:///catalog.db or postgresql+psycopg2://u:p@host/db")
        return value


class FieldConfig(_Section):
    name: Identifier
    type: str
    required: Bool = False
    doc: str | None = None
    # Unit of integer epochs in a timestamp/timestamptz field (ISO-8601 strings are always
    # accepted too); unset means ms, the common choice of JSON events on Kafka.
    unit: Literal["s", "ms", "us", "ns"] | None = None

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        value = value.strip().lower()
        if value in PRIMITIVE_TYPES or _DECIMAL.match(value):
            return value
        raise ValueError(f"unknown type {value!r}; use one of {sorted(PRIMITIVE_TYPES)} or decimal(P,S)")

    @field_validator("unit")
    @classmethod
    def _unit_on_timestamps(cls, value: str | None, info: Any) -> str | None:
        kind = info.data.get("type")  # absent when the type itself was invalid
        if value is not None and kind is not None and kind not in ("timestamp", "timestamptz"):
            raise ValueError(f"an epoch unit only applies to timestamp/timestamptz fields, this one is {kind}")
        return value


class PartitionFieldConfig(_Section):
    source: Identifier
    transform: str = "identity"

    @field_validator("transform")
    @classmethod
    def _known_transform(cls, value: str) -> str:
        value = value.strip().lower()
        match = _TRANSFORM.match(value)
        if not match:
            raise ValueError(f"unknown transform {value!r}; use identity, year, month, day, hour, bucket[N] or truncate[W]")
        width = match.group(2) or match.group(3)
        if width is not None and not 0 < int(width) <= BUCKET_MAX:
            raise ValueError(f"{value!r}: the width must be between 1 and {BUCKET_MAX}")
        return value


class TableConfig(_Section):
    identifier: TableIdentifier
    schema_: list[FieldConfig] = Field(alias="schema", min_length=1, max_length=4096)
    partition_spec: list[PartitionFieldConfig] = Field(default_factory=list, max_length=64)
    target_file_size_bytes: Annotated[int, _int(1, MAX_BYTES)] = 128 * 1024 * 1024
    properties: Properties = Field(default_factory=dict)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("schema_", mode="before")
    @classmethod
    def _strict_field_flags(cls, value: Any) -> Any:
        # FieldConfig.required is a plain bool (lax: "yes" and 1 pass); checked here so the
        # field model stays as it is.
        for i, item in enumerate(value if isinstance(value, list) else []):
            if isinstance(item, dict) and "required" in item and not isinstance(item["required"], bool):
                raise ValueError(f"{i}.required: must be true or false")
            if isinstance(item, dict) and isinstance(item.get("doc"), str) and len(item["doc"]) > MAX_TEXT:
                raise ValueError(f"{i}.doc: at most {MAX_TEXT} characters")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TableConfig:
        names = [f.name for f in self.schema_]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"schema: duplicate field names {dupes}")
        for i, f in enumerate(self.schema_):
            if decimal := _DECIMAL.match(f.type):
                precision, scale = int(decimal.group(1)), int(decimal.group(2))
                if not 1 <= precision <= DECIMAL_MAX_PRECISION or not 0 <= scale <= precision:
                    raise ValueError(f"schema.{i}.type: {f.type}: precision must be 1 to {DECIMAL_MAX_PRECISION} "
                                     f"and scale 0 to the precision")
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
    commit_interval_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 10.0
    parallelism: Annotated[int, _int(1, 256)] = 2
    # Upper bound of records fetched by one poll (one decode batch).
    max_poll_records: Annotated[int, _int(1, 1_000_000)] = 5000
    poll_timeout_seconds: Annotated[float, _float(0, 3600)] = 0.2
    # A record larger than this is dead-lettered as oversized. At most what the writers'
    # consumer can be set to fetch (MAX_RECORD_BYTES: librdkafka caps max.partition.fetch.bytes,
    # which the writer sets to twice this, at 10^9).
    max_record_bytes: Annotated[int, _int(1, MAX_RECORD_BYTES)] = 1024 * 1024
    # Rows buffered per open file before a Parquet row group is written.
    row_group_rows: Annotated[int, _int(1, MAX_COUNT)] = 131072
    # Identifies this ingest job in snapshot summaries; defaults to "ingest:<table>".
    job_id: Annotated[str | None, _text(255, _PRINTABLE_ASCII, "must be 1 to 255 printable ASCII characters", optional=True)] = None
    # Local working files of the job (run markers); not part of the table.
    state_dir: Text = ".streamberg/state"
    # What happens when a position the table recorded is no longer on the broker: records
    # deleted by retention before they were ingested, or offsets that went back (a recreated
    # topic, a failover). `fail` stops with exit 1 naming the partition, the committed offset
    # and the watermarks; `skip-and-record` goes on from the low watermark and records the
    # jump in the table, where status, metrics and `streamberg table` show it
    # (docs/runbooks/lost-offsets.md).
    on_lost_offsets: Literal["fail", "skip-and-record"] = "fail"
    # Retries of an Iceberg commit that lost a race (e.g. with the compactor).
    commit_retries: Annotated[int, _int(0, 1000)] = 10
    # Local runs: fork the Python workers from one process that imported Beam, PyFlink and
    # streamberg once (ingest/fork_server.py) instead of starting a fresh interpreter for
    # each; false starts each worker anew (slower start-up and restarts, same isolation).
    fork_python_workers: Bool = True
    # Extra Flink configuration (key: value), e.g. {"taskmanager.memory.process.size": "2g"}.
    flink: Properties = Field(default_factory=dict)


class DeadLetterConfig(_Section):
    # Malformed records go to this Iceberg table (created when absent), exactly once.
    table: TableIdentifier | None = None


# The compactor's row layouts (compactor/layouts.py has one class per name).
LayoutStrategy = Literal["zorder", "hilbert", "zorder-iceberg", "sort", "binpack"]
LAYOUT_STRATEGIES: tuple[str, ...] = get_args(LayoutStrategy)


class CompactorConfig(_Section):
    """Settings of the incremental optimize loop (compactor/). Owned by the compactor.

    Planning rules decide, per table partition, whether its pending files (files added by
    ingest appends and not yet optimized) are rewritten now. A partition is rewritten when ANY
    enabled rule fires; a rule set to null is off. See docs/compactor.md.
    """

    strategy: LayoutStrategy = "zorder"
    # Columns the layout clusters on; empty means the compactor only bin-packs.
    columns: list[Identifier] = Field(default_factory=list, max_length=32)
    # Spark's checkpoint of the streaming query (progress across restarts).
    checkpoint_dir: Text = ".streamberg/compactor-checkpoint"
    spark_master: Text = "local[*]"
    spark_conf: Properties = Field(default_factory=dict)

    # -- planning rules (per partition unless said otherwise) --
    # At least this many pending files in a partition.
    min_files: Annotated[int | None, _int(1, MAX_COUNT, optional=True)] = 10
    # At least this many pending bytes in a partition (null: off; the target size is typical).
    min_bytes: Annotated[int | None, _int(1, MAX_BYTES, optional=True)] = None
    # The oldest pending file of a partition was committed at least this long ago.
    max_delay_seconds: Annotated[float | None, _float(0, YEAR_SECONDS, optional=True)] = 600.0
    # Table-wide: at least this many ingest snapshots have pending files (Tencent's "every 5").
    every_n_snapshots: Annotated[int | None, _int(1, MAX_COUNT, optional=True)] = 5

    # -- runs (docs/compactor.md, "Runs"): how the incremental layout converges --
    # A pass lays out a partition's new files as one run; when this many runs of a partition
    # share a size tier (tier k: about target size x factor^k), they are merged into one,
    # together with the new files. The main knob: higher rewrites less, reads more files;
    # 2 meets the read goals of an unpartitioned stream (docs/compactor.md, the curve).
    merge_factor: Annotated[int, _int(2, 64)] = 2
    # A partition that got no new data for this many ingest commits, or this long, is
    # finished: its runs and new files are merged into one sealed run, never rewritten again
    # (null: that rule is off; both null: partitions are never sealed).
    seal_after_commits: Annotated[int | None, _int(1, MAX_COUNT, optional=True)] = 10
    seal_after_seconds: Annotated[float | None, _float(0, YEAR_SECONDS, optional=True)] = 3600.0

    # -- rewriting --
    # Size of the files the rewrite writes; null: the table's write.target-file-size-bytes.
    target_file_size_bytes: Annotated[int | None, _int(1, MAX_BYTES, optional=True)] = None
    # A partition's pending files are split into groups of at most this many bytes; each
    # group is read, laid out and written by one Spark job.
    max_group_bytes: Annotated[int, _int(1, MAX_BYTES)] = 2 * 1024**3
    # Large plans commit in several steps so a crash loses at most one step's work; a plan
    # is committed in at most this many commits (1: one all-or-nothing commit).
    max_commits: Annotated[int, _int(1, 10_000)] = 10
    # Retries of a commit that still fails after Iceberg's own retries (CommitFailedException).
    commit_retries: Annotated[int, _int(0, 1000)] = 3
    # Rows sampled per group to find each column's rank boundaries (zorder, hilbert).
    sample_rows: Annotated[int, _int(100, MAX_COUNT)] = 20000
    # Bits of rank per column for zorder/hilbert: up to 2^bits distinct ranks per column.
    index_bits: Annotated[int, _int(1, 20)] = 10

    # -- running --
    # How often the streaming query looks for new snapshots (continuous mode).
    trigger_interval_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 30.0
    # One compactor per table: a lease row in the catalog database, renewed while running.
    lease_ttl_seconds: Annotated[float, _float(5, DAY_SECONDS, lo_open=False)] = 60.0
    # When another compactor holds the lease: 0 exits at once, >0 waits up to that long.
    lease_wait_seconds: Annotated[float, _float(0, DAY_SECONDS, lo_open=False)] = 0.0
    # Continuous mode started before the ingest's first commit: wait this long for the table
    # to appear (0 fails at once). --once/--full/--dry-run never wait.
    wait_for_table_seconds: Annotated[float, _float(0, DAY_SECONDS, lo_open=False)] = 300.0

    @field_validator("columns")
    @classmethod
    def _distinct_columns(cls, value: list[str]) -> list[str]:
        if dupes := sorted({c for c in value if value.count(c) > 1}):
            raise ValueError(f"columns listed twice: {dupes}")
        if any(not c.strip() for c in value):
            raise ValueError("column names must not be empty")
        return value

    @model_validator(mode="after")
    def _some_rule(self) -> CompactorConfig:
        rules = (self.min_files, self.min_bytes, self.max_delay_seconds, self.every_n_snapshots)
        if all(rule is None for rule in rules):
            raise ValueError("min_files, min_bytes, max_delay_seconds and every_n_snapshots are all null: "
                             "the incremental compactor would never act (use --full for one-off rewrites)")
        return self


class MonitoringConfig(_Section):
    """Thresholds of the health verdict of `streamberg status` and the metrics exporter
    (monitoring/). A threshold set to null turns its check off. See docs/monitoring.md."""

    # Seconds to wait for the broker (metadata, end offsets) before calling it unreachable.
    broker_timeout_seconds: Annotated[float, _float(0, 3600)] = 3.0
    # Find each partition's end by also reading its last record batch: the embedded tansu
    # broker's high watermark stops short of the end by the rest of that batch.
    read_last_batch: Bool = True
    # Ingest lag (records between the table's recorded offsets and the broker's end, all
    # partitions together) from which the verdict is warn / critical.
    lag_warn_records: Annotated[int | None, _int(1, MAX_INT64, optional=True)] = 10_000
    lag_critical_records: Annotated[int | None, _int(1, MAX_INT64, optional=True)] = 1_000_000
    # While records wait in Kafka, a last ingest commit older than this many
    # ingest.commit_interval_seconds means ingest is stalled (no records waiting: idle, fine).
    commit_age_warn_intervals: Annotated[float | None, _float(0, 1e6, optional=True)] = 3.0
    commit_age_critical_intervals: Annotated[float | None, _float(0, 1e6, optional=True)] = 30.0
    # The oldest file waiting for the compactor older than this many
    # compactor.max_delay_seconds means the compactor is behind (off when max_delay is null).
    pending_age_warn_factor: Annotated[float | None, _float(0, 1e6, optional=True)] = 2.0
    pending_age_critical_factor: Annotated[float | None, _float(0, 1e6, optional=True)] = 6.0
    # A data file is "small" below this fraction of the target file size (Iceberg's own
    # rewrite uses 0.75 for its min-file-size-bytes).
    small_file_fraction: Annotated[float, _float(0, 1)] = 0.75
    # Share of small data files from which the verdict is warn, checked only once the table
    # has at least small_file_min_files data files (a young table is all small files).
    small_file_ratio_warn: Annotated[float | None, _float(0, 1, optional=True)] = 0.8
    small_file_min_files: Annotated[int, _int(1, MAX_COUNT)] = 100
    # Snapshot count from which the verdict is warn / critical (maintenance expires them).
    snapshots_warn: Annotated[int | None, _int(1, MAX_COUNT, optional=True)] = 2000
    snapshots_critical: Annotated[int | None, _int(1, MAX_COUNT, optional=True)] = 20000
    # Dead letters from which the verdict is warn (null: off; bad producers are expected).
    dead_letters_warn: Annotated[int | None, _int(1, MAX_INT64, optional=True)] = None
    # Where `streamberg metrics` listens (Prometheus scrapes http://host:port/metrics).
    metrics_port: int = Field(default=9464, ge=1, le=65535)
    # Loopback unless configured: the exporter has no authentication (docs/security.md).
    metrics_address: str = "127.0.0.1"

    @model_validator(mode="after")
    def _warn_below_critical(self) -> MonitoringConfig:
        pairs = [("lag_warn_records", "lag_critical_records"),
                 ("commit_age_warn_intervals", "commit_age_critical_intervals"),
                 ("pending_age_warn_factor", "pending_age_critical_factor"),
                 ("snapshots_warn", "snapshots_critical")]
        for warn, critical in pairs:
            low, high = getattr(self, warn), getattr(self, critical)
            if low is not None and high is not None and low > high:
                raise ValueError(f"{warn} ({low}) must not exceed {critical} ({high})")
        return self

    @field_validator("metrics_port", mode="before")
    @classmethod
    def _port_not_bool(cls, value: Any) -> Any:
        # pydantic's lax int takes `true` as port 1.
        if isinstance(value, (bool, float)):
            raise ValueError("must be an integer between 1 and 65535")
        return value


class ExpireConfig(_Section):
    """maintenance.expire: drop old snapshots (and the files only they reference)."""

    enabled: Bool = True
    # Snapshots older than this may be expired (ingest/compactor needs are always kept).
    max_snapshot_age_seconds: Annotated[float, _float(0, 10 * YEAR_SECONDS)] = 7 * 86400.0
    # The newest N snapshots of the main branch are always kept, whatever their age.
    min_snapshots_to_keep: Annotated[int, _int(1, MAX_COUNT)] = 1
    # Keep every append snapshot that added a file the compactor has not rewritten yet (the
    # compactor recognises pending files by their adding snapshot). Set false only when no
    # compactor runs on the table; otherwise expiry stops at the oldest uncompacted append.
    keep_pending_for_compactor: Bool = True


# Below this, a file still being written (ingest interval, a long compaction) could be
# taken for an orphan; going lower needs an explicit, named override.
ORPHAN_SAFETY_FLOOR_SECONDS = 3600.0


class OrphanConfig(_Section):
    """maintenance.orphan: delete files under the table location that no snapshot references."""

    enabled: Bool = True
    # Only files older than this are candidates: in-flight writes must never be deleted.
    safety_age_seconds: Annotated[float, _float(0, 10 * YEAR_SECONDS)] = 3 * 86400.0
    # Allows safety_age_seconds below one hour (tests, or writers known to be idle).
    allow_short_safety_age: Bool = False

    @model_validator(mode="after")
    def _safe_age(self) -> OrphanConfig:
        if self.safety_age_seconds < ORPHAN_SAFETY_FLOOR_SECONDS and not self.allow_short_safety_age:
            raise ValueError(
                f"safety_age_seconds: {self.safety_age_seconds:g} is below {ORPHAN_SAFETY_FLOOR_SECONDS:g} s; files "
                "still being written by ingest or the compactor could be deleted. Set "
                "maintenance.orphan.allow_short_safety_age: true only if no write can take that long")
        return self


class ManifestsConfig(_Section):
    """maintenance.manifests: rewrite the manifests when there are too many or too much."""

    enabled: Bool = True
    # Rewrite when the current snapshot has at least this many manifests (null: no count rule).
    min_count: Annotated[int | None, _int(1, MAX_COUNT, optional=True)] = 100
    # ... or when its manifests total at least this many bytes (null: no size rule).
    min_total_bytes: Annotated[int | None, _int(1, MAX_BYTES, optional=True)] = 64 * 1024 * 1024

    @model_validator(mode="after")
    def _some_threshold(self) -> ManifestsConfig:
        if self.enabled and self.min_count is None and self.min_total_bytes is None:
            raise ValueError("min_count and min_total_bytes are both null, so the rewrite would never run; "
                             "set maintenance.manifests.enabled: false to turn it off")
        return self


class RetentionConfig(_Section):
    """maintenance.retention: delete rows older than `days` by a time column (off by default)."""

    # A date/timestamp/timestamptz column of table.schema (checked by `streamberg maintain`).
    column: Annotated[str | None, _text(MAX_IDENTIFIER, _IDENTIFIER, _IDENTIFIER_RULE, optional=True)] = None
    # Rows whose column is older than now - days are deleted; null: retention off.
    days: Annotated[float | None, _float(0, 36600, optional=True)] = None

    @model_validator(mode="after")
    def _column_when_on(self) -> RetentionConfig:
        if self.days is not None and not self.column:
            raise ValueError("column: required when retention.days is set (the time column rows are aged by)")
        return self


class MaintenanceConfig(_Section):
    """Settings of `streamberg maintain` (maintenance/). See docs/maintenance.md."""

    # Continuous mode runs one maintenance pass every interval.
    interval_seconds: Annotated[float, _float(0, 30 * DAY_SECONDS)] = 3600.0
    # Continuous mode started before the ingest's first commit: wait this long for the table
    # to appear (0 fails at once). --once/--dry-run never wait.
    wait_for_table_seconds: Annotated[float, _float(0, DAY_SECONDS, lo_open=False)] = 300.0
    # Retries (with backoff) of a step whose commit still lost to concurrent commits after
    # Iceberg's own retries (CommitFailedException); the step is re-planned each time.
    commit_retries: Annotated[int, _int(0, 1000)] = 3
    expire: ExpireConfig = Field(default_factory=ExpireConfig)
    orphan: OrphanConfig = Field(default_factory=OrphanConfig)
    manifests: ManifestsConfig = Field(default_factory=ManifestsConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    # Orphan removal deletes unreferenced files under the table location: it refuses a table
    # located outside catalog.warehouse unless this is true (maintenance/confine.py).
    allow_location_outside_warehouse: Bool = False


Component = Literal["ingest", "compact", "maintain"]
COMPONENTS: tuple[Component, ...] = get_args(Component)


class RunConfig(_Section):
    """Settings of `streamberg run`, the local supervisor of ingest + compactor + maintenance."""

    # Which components `streamberg run` starts (each is its own `streamberg <command>` process).
    components: list[Component] = Field(
        default_factory=lambda: list(COMPONENTS), min_length=1)
    # A component that exits unexpectedly is restarted after this delay, doubled after each
    # exit that follows a short run, up to restart_backoff_max_seconds.
    restart_backoff_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 2.0
    restart_backoff_max_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 60.0
    # A component that ran this long before exiting counts as healthy: the backoff starts over.
    healthy_after_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 60.0
    # On stop, each component gets this long to finish gracefully before SIGKILL.
    stop_timeout_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 120.0
    # How often the status (line on a terminal, log line otherwise) is refreshed: one
    # catalog read and one broker read each time.
    status_interval_seconds: Annotated[float, _float(1, DAY_SECONDS, lo_open=False)] = 10.0

    @field_validator("components")
    @classmethod
    def _distinct_components(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"components listed twice: {value}")
        return value


@dataclass(frozen=True)
class TableTarget:
    """The table a component works on: the two sections every component shares.

    Components are given their own section plus this (the compactor `compactor` + target,
    maintenance `maintenance` + target); only the commands that compose them read the whole
    configuration.
    """

    catalog: CatalogConfig
    table: TableConfig

    @property
    def identifier(self) -> str:
        return self.table.identifier

    @property
    def spark_name(self) -> str:
        """The table's name in Spark: <catalog>.<namespace>.<table>."""
        return f"{self.catalog.name}.{self.table.identifier}"


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
    run: RunConfig = Field(default_factory=RunConfig)
    # Where the file was read from (set by load_config; used to resolve relative paths).
    config_path: str | None = None

    @model_validator(mode="after")
    def _dead_letters_elsewhere(self) -> StreambergConfig:
        # Catalog identifiers compare case-insensitively in Spark: the same table either way.
        if self.dead_letter_table.lower() == self.table.identifier.lower():
            raise ValueError("dead_letter.table: must differ from table.identifier (dead letters would be "
                             "appended to the main table)")
        return self

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
    def target(self) -> TableTarget:
        return TableTarget(self.catalog, self.table)

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


# Keys whose values may hold credentials: an error about them never shows the value.
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
    """One line: every bad key and why, values shown only when harmless."""
    parts = []
    for item in error.errors():
        key = ".".join(_key_shown(p) for p in item["loc"] if not str(p).startswith("function-"))
        key = key.replace("schema_", "schema")
        msg = _PLAIN_MESSAGES.get(item["type"]) or item["msg"].removeprefix("Value error, ")
        if (nested := _KEY_PREFIX.match(msg)) and not nested.group(1).startswith(key + "."):
            key, msg = (f"{key}.{nested.group(1)}" if key else nested.group(1)), nested.group(2)
        msg = _one_line(msg)
        if len(msg) > _MAX_MESSAGE:  # a validator may quote the (huge) value it refused
            msg = msg[: _MAX_MESSAGE - 3] + "..."
        parts.append(f"{key or '(top level)'}: {msg}{_shown(key, item)}")
    if len(parts) > _MAX_ERRORS:
        parts = [*parts[:_MAX_ERRORS], f"and {len(parts) - _MAX_ERRORS} more"]
    return f"invalid configuration in {source}: " + "; ".join(parts)


def _is_path(value: Any) -> bool:
    # Leave anything odd (not a string, NUL bytes, absurd length) for validation to name.
    return isinstance(value, str) and 0 < len(value) <= MAX_TEXT and value.isprintable()


class _PathProblem(Exception):
    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")


def _absolute(path: str, base: Path, key: str) -> str:
    try:
        p = Path(path).expanduser()
        return str(p if p.is_absolute() else (base / p).resolve())
    except (RuntimeError, OSError, ValueError) as exc:  # "~nosuchuser/x", a symlink loop, ...
        raise _PathProblem(key, f"cannot resolve the path ({_one_line(exc)[:100]})") from None


def _resolve_paths(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    out = dict(raw)
    # A section given as a scalar or list is left as it is: validation names it.
    catalog = raw.get("catalog", {})
    if isinstance(catalog, dict):
        catalog = dict(catalog)
        uri = catalog.get("uri", CatalogConfig.model_fields["uri"].default)
        if _is_path(uri) and uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
            catalog["uri"] = "sqlite:///" + _absolute(uri.removeprefix("sqlite:///"), base, "catalog.uri")
        warehouse = catalog.get("warehouse", CatalogConfig.model_fields["warehouse"].default)
        if _is_path(warehouse) and "://" not in warehouse:
            catalog["warehouse"] = "file://" + _absolute(warehouse, base, "catalog.warehouse")
        out["catalog"] = catalog
    ingest = raw.get("ingest", {})
    if isinstance(ingest, dict):
        ingest = dict(ingest)
        state = ingest.get("state_dir", IngestConfig.model_fields["state_dir"].default)
        if _is_path(state):
            ingest["state_dir"] = _absolute(state, base, "ingest.state_dir")
        out["ingest"] = ingest
    compactor = raw.get("compactor", {})
    if isinstance(compactor, dict):
        compactor = dict(compactor)
        checkpoint = compactor.get("checkpoint_dir", CompactorConfig.model_fields["checkpoint_dir"].default)
        if _is_path(checkpoint) and "://" not in checkpoint:
            compactor["checkpoint_dir"] = _absolute(checkpoint, base, "compactor.checkpoint_dir")
        out["compactor"] = compactor
    return out


class _Refused(Exception):
    """The YAML document uses something a config must not (duplicate keys, deep nesting, ...)."""

    def __init__(self, message: str, mark: Any = None) -> None:
        where = f"line {mark.line + 1}: " if mark is not None else ""
        super().__init__(where + message)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, non-string keys, deep nesting and alias floods.

    PyYAML lets the last duplicate key win silently, and its composer recurses once per
    nesting level (a few thousand brackets exhaust the stack). Aliases are counted because
    each one can multiply the data a validator walks (the "billion laughs" document).
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise _Refused(f"more than {MAX_YAML_ALIASES} aliases", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _Refused(f"nested more than {MAX_YAML_DEPTH} levels deep", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *base" may be overridden, by design
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):
                shown = repr(key) if len(repr(key)) <= _MAX_SHOWN else type(key).__name__
                raise _Refused(f"key {shown} is not a string (quote it)", key_node.start_mark)
            if key in seen:
                raise _Refused(f"duplicate key '{_key_shown(key)}' (YAML would keep only the last one)",
                               key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_config_text(path: Path) -> str:
    """The file's text, if it is a regular, readable UTF-8 file of at most MAX_CONFIG_BYTES."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_CONFIG_BYTES:
        os.close(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"config file {path} is not a regular file")
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes")
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(MAX_CONFIG_BYTES + 1)  # it may have grown since fstat
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte offset {exc.start})") from None


def _parse_yaml(path: Path, text: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except _Refused as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}: {_one_line(exc.problem or exc.context or '')}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {_one_line(exc)}") from None
    except (ValueError, RecursionError) as exc:
        # PyYAML's constructors raise plain ValueError (an integer of more than 4300 digits).
        raise ConfigError(f"config file {path} holds a value YAML cannot read: {_one_line(exc)[:200]}") from None


def _env_error(exc: SettingsError) -> ConfigError:
    """pydantic-settings names only the section; find the variable whose JSON is bad."""
    match = re.search(r'field "([^"]+)"', str(exc))
    section = f"{ENV_PREFIX}{match.group(1).upper()}" if match else ENV_PREFIX
    names = []
    for name, value in sorted(os.environ.items()):
        if not name.upper().startswith(section) or not value.lstrip().startswith(("{", "[")):
            continue
        try:
            json.loads(value)
        except ValueError:
            names.append(name)
    shown = ", ".join(names) or section
    return ConfigError(f"invalid configuration in the environment: {shown}: not valid JSON "
                       f"(a section or a mapping/list key is given as JSON)")


def load_config(path: str | Path, **overrides: Any) -> StreambergConfig:
    """Read, resolve and validate a config file; raise ConfigError naming every bad key.

    The secrets the config holds (catalog URI password, secret-named catalog properties and
    consumer settings) are registered with common.redact, so no output shows them after.
    """
    path = Path(path)
    raw = _parse_yaml(path, _read_config_text(path))
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must be a mapping of sections (kafka, catalog, table, ...)")
    # An empty section ("ingest:" with every key commented out) means its defaults.
    raw = {key: value for key, value in {**raw, **overrides}.items() if value is not None or key in ("kafka", "table")}
    try:
        raw = _resolve_paths(raw, path.resolve().parent)
    except _PathProblem as exc:
        raise ConfigError(f"invalid configuration in {path}: {exc}") from None
    raw["config_path"] = str(path.resolve())
    try:
        config = StreambergConfig(**raw)
    except ValidationError as exc:
        raise ConfigError(_format_errors(str(path), exc)) from None
    except SettingsError as exc:
        raise _env_error(exc) from None
    config = _absolute_overrides(config)
    _register_secrets(config)
    return config


def _absolute_overrides(config: StreambergConfig) -> StreambergConfig:
    """Paths from the file were made absolute against its folder before validation; a path
    still relative came from an environment override: absolute against the working directory
    the operator gave it in, so every process of the run (Flink workers, the supervisor's
    children, Spark) means the same folder."""
    cwd = Path.cwd()
    updates: dict[str, Any] = {}
    catalog = config.catalog
    if catalog.uri.startswith("sqlite:///") and not catalog.uri.startswith("sqlite:////") and _is_path(catalog.uri):
        catalog = catalog.model_copy(update={"uri": "sqlite:///" + str(cwd / catalog.uri.removeprefix("sqlite:///"))})
    if "://" not in catalog.warehouse and not Path(catalog.warehouse).is_absolute():
        catalog = catalog.model_copy(update={"warehouse": "file://" + str(cwd / catalog.warehouse)})
    if catalog is not config.catalog:
        updates["catalog"] = catalog
    if not Path(config.ingest.state_dir).is_absolute():
        updates["ingest"] = config.ingest.model_copy(update={"state_dir": str(cwd / config.ingest.state_dir)})
    checkpoint = config.compactor.checkpoint_dir
    if checkpoint and "://" not in checkpoint and not Path(checkpoint).is_absolute():
        updates["compactor"] = config.compactor.model_copy(update={"checkpoint_dir": str(cwd / checkpoint)})
    return config.model_copy(update=updates) if updates else config


def dump_config(config: StreambergConfig) -> dict[str, Any]:
    """The config as plain data (for shipping to Flink/Spark workers)."""
    return config.model_dump(mode="json", by_alias=True)


def _register_secrets(config: StreambergConfig) -> None:
    register_uri_secrets(config.catalog.uri)
    register_mapping_secrets(config.catalog.properties)
    register_mapping_secrets(config.kafka.consumer)
    register_mapping_secrets(config.compactor.spark_conf)
    register_mapping_secrets(config.ingest.flink)


def config_from_dump(data: dict[str, Any]) -> StreambergConfig:
    """Rebuild a config inside a worker; the environment there must not change it."""
    config = StreambergConfig.model_construct(
        kafka=KafkaConfig(**data["kafka"]),
        catalog=CatalogConfig(**data["catalog"]),
        table=TableConfig(**data["table"]),
        ingest=IngestConfig(**data["ingest"]),
        dead_letter=DeadLetterConfig(**data["dead_letter"]),
        compactor=CompactorConfig(**data["compactor"]),
        config_path=data.get("config_path"),
    )
    _register_secrets(config)  # worker logs are redacted like the driver's
    return config
