"""The `kafka`, `ingest` and `dead_letter` sections: what the ingest reads and how."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PlainValidator,
    field_validator,
    model_validator,
)

from streamberg.common.config.bounds import (
    _PRINTABLE_ASCII,
    _TOPIC,
    DAY_SECONDS,
    MAX_BYTES,
    MAX_COUNT,
    MAX_MAP_ENTRIES,
    MAX_RECORD_BYTES,
    Bool,
    Identifier,
    Key,
    Properties,
    TableIdentifier,
    Text,
    _check_setting,
    _float,
    _int,
    _Section,
    _text,
)
from streamberg.common.config.types import MAX_SCHEMA_FIELDS

_HTTP_URL = re.compile(r"https?://[!-~]+")

# The columns the change log (<table>_changelog) adds to the table's own (table_meta/changelog.py
# builds them); a table column may not take one of these names.
CHANGELOG_COLUMNS = ("_op", "_before_key", "_kafka_partition", "_kafka_offset", "_source_ts", "_source_seq",
                     "_source_id")
# The change log's table property naming the table it feeds: a configuration whose table
# carries it is the ingest's view of a primary-key table (table_meta/changelog.py derives it).
CHANGELOG_TARGET_PROPERTY = "streamberg.changelog.target"


class SchemaRegistryConfig(_Section):
    # The registry's base URL (Confluent's REST API: Confluent, Karapace, Redpanda, Apicurio's
    # compatibility endpoint). Credentials in it are redacted wherever printed.
    url: Annotated[str, _text(2048, _HTTP_URL, "must be an http:// or https:// URL")]
    # confluent-kafka SchemaRegistryClient settings besides the URL: `basic.auth.user.info`,
    # `basic.auth.credentials.source`, `ssl.ca.location`, `ssl.certificate.location`,
    # `ssl.key.location`, `bearer.auth.*`, ... Secret values are redacted everywhere.
    properties: Properties = Field(default_factory=dict)
    # A lookup the registry does not answer (down, an error, an unknown schema id) is asked
    # again this many times with exponential backoff (capped at 30 s), then the ingest stops
    # with the reason; the records wait in Kafka.
    retries: Annotated[int, _int(0, 100)] = 8
    # A schema id the registry answers it does not have (HTTP 404, after the retries): `fail`
    # stops the ingest (the records wait in Kafka until the schema is registered again);
    # `dead-letter` dead-letters every record naming it, the id in the reason, and goes on.
    # Outages (timeouts, 5xx) are retried either way.
    on_unknown_schema: Literal["fail", "dead-letter"] = "fail"

    @field_validator("properties")
    @classmethod
    def _not_the_url(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "url" in value:
            raise ValueError("set the registry's URL as kafka.schema_registry.url")
        return value


class KafkaConfig(_Section):
    # The brokers (host:port, comma-separated); the embedded broker's address by default.
    bootstrap_servers: Text = "127.0.0.1:19092"
    # The topic to ingest.
    topic: Annotated[str, _text(249, _TOPIC, "must be 1 to 249 characters of [A-Za-z0-9._-] (Kafka's rule), not '.' or '..'")]
    # The offset to start from for a partition the table has never seen.
    start_offset: Literal["earliest", "latest"] = "earliest"
    # Consumer group under which offsets are committed *after* each Iceberg commit.
    # They are for lag monitoring only: the job always resumes from the table.
    group_id: Annotated[str | None, _text(255, _PRINTABLE_ASCII, "must be 1 to 255 printable ASCII characters", optional=True)] = None
    # Extra librdkafka settings passed to every consumer (security, fetch sizes, ...).
    consumer: Annotated[dict[Key, Annotated[str | int | float | bool, PlainValidator(_check_setting)]],
                        Field(max_length=MAX_MAP_ENTRIES)] = Field(default_factory=dict)
    # A top-level column the record's key is written into; null: keys are not kept.
    key_field: Identifier | None = None
    # How the key is read into key_field: `text` (UTF-8, a string column) or `value` (decoded
    # with value_format: a JSON value, or a Confluent-framed Avro/Protobuf key with its own
    # writer schema, into a column of any type, a struct for a record key).
    key_format: Literal["text", "value"] = "text"
    # How record values are written: `json` (UTF-8 JSON objects), `avro` or `protobuf`
    # (Confluent's wire format: magic byte 0, a 4-byte schema id, for Protobuf the message
    # indexes, then the binary body; the writer schema comes from kafka.schema_registry).
    value_format: Literal["json", "avro", "protobuf"] = "json"
    schema_registry: SchemaRegistryConfig | None = None
    # What a record is (docs/cdc.md): `none`, a row to append (the default); `debezium`, a
    # Debezium change event (before, after, op, source), with or without the JsonConverter
    # schema/payload wrapper; `upsert`, the whole row, and a null value (tombstone) deletes
    # the row of the record's key. With an envelope the ingest appends the change log to
    # <table>_changelog and `streamberg merge` applies it to the table (table.primary_key).
    # JSON or Avro values (value_format avro; an upsert tombstone's key is text or JSON).
    envelope: Literal["none", "debezium", "upsert"] = "none"

    @model_validator(mode="after")
    def _registry_for_avro(self) -> KafkaConfig:
        if self.value_format != "json" and self.schema_registry is None:
            raise ValueError(f"kafka.value_format {self.value_format} needs kafka.schema_registry (its url) for the "
                             "writer schemas")
        return self

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

class IngestConfig(_Section):
    # Each commit interval, writers close their files and the committer makes one snapshot.
    commit_interval_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 10.0
    # A table commits at an interval's end once its new data files hold this many bytes (0:
    # every interval with data), or once its oldest uncommitted interval waited
    # commit_max_wait_seconds: the quiet tables of a many-table job then commit rarely, the hot
    # ones every interval. What is not committed yet is read again after a crash, as always.
    commit_min_bytes: Annotated[int, _int(0, MAX_BYTES)] = 0
    commit_max_wait_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 60.0
    # Writer subtasks: partition p is read by writer p % parallelism.
    parallelism: Annotated[int, _int(1, 256)] = 2
    # Upper bound of records fetched by one poll (one decode batch).
    max_poll_records: Annotated[int, _int(1, 1_000_000)] = 5000
    # How long one poll waits for records when the partitions are idle.
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
    # Fields the records carry and the table lacks, at any depth. `add`: the committer adds
    # them as optional columns, typed from the JSON values, in the same commit as the first
    # files that carry them (ingest/evolution.py). `off`: they are not written, and counted
    # per field path in every ingest commit, `streamberg status` and `metrics`. Never dropped
    # in silence either way.
    schema_evolution: Literal["add", "off"] = "add"
    # At most this many fields are added by one commit; a record that would add more is
    # dead-lettered with the reason. A JSON object whose keys are ids belongs in a `map`.
    max_new_fields_per_commit: Annotated[int, _int(1, MAX_SCHEMA_FIELDS)] = 100
    # Retries of an Iceberg commit that lost a race (e.g. with the compactor).
    commit_retries: Annotated[int, _int(0, 1000)] = 10
    # Keep the table's uncommitted records decoded for fresh reads (docs/fresh-read.md): the
    # writers write the rows they decode into <state_dir>/tail-cache/<table>/ as well, a
    # fraction of a second after reading them, and the committer deletes what a commit
    # covers. A fresh read on this machine then reads Kafka only past them: its cost no longer
    # grows with the commit interval. Costs the disk of one interval's rows (Arrow, not
    # compressed). Off: fresh reads decode their whole tail from Kafka (or `streamberg tail`'s).
    # Not for tables of a field-routed topic (their fresh reads pick their records from Kafka).
    keep_tail: Bool = False
    # What runs the writers and the committer of a local `streamberg ingest`: `flink` (PyFlink
    # on a MiniCluster, as on a cluster) or `processes` (the same tasks in processes of their
    # own, no JVM: starts in ~1 s, not ~4, and holds no JVM; ingest/processes.py). A cluster
    # run (`flink run`, `deploy`) is always Flink.
    engine: Literal["flink", "processes"] = "flink"
    # Local runs: fork the Python workers from one process that imported Beam, PyFlink and
    # streamberg once (ingest/local/fork_server.py) instead of starting a fresh interpreter for
    # each; false starts each worker anew (slower start-up and restarts, same isolation).
    fork_python_workers: Bool = True
    # Extra Flink configuration (key: value), e.g. {"taskmanager.memory.process.size": "2g"}.
    flink: Properties = Field(default_factory=dict)
    # A config of many tables (`tables:`, common/config/fleet.py): how often the broker's topics
    # are matched against the routes while the job runs (new topics get their table).
    topic_discovery_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 60.0
    # ... and how many commits in a row a table may fail (with backoff) before it is paused
    # while the others go on; a paused table resumes at the next start of the ingest.
    table_failures_to_pause: Annotated[int, _int(1, 1000)] = 5
    # ... and a writer's memory, whatever the number of tables: at most this many Parquet files
    # open and this many bytes of rows buffered for row groups; past either, the least recently
    # written file is closed (a smaller file, which the compactor merges). 256: with fewer open
    # files than a job's active tables every file is closed after a batch or two (make
    # bench-fleet at 64 over 100 tables: 10-22 files a table a commit, 0.54 of one table's
    # speed; at 256: 0.71, peak memory 1.15x one table's instead of 1.09x).
    max_open_files: Annotated[int, _int(1, 100_000)] = 256
    max_buffered_bytes: Annotated[int, _int(1, MAX_BYTES)] = 256 * 1024 * 1024
    # How many tables one route may make: a route field's values (past it, a record naming yet
    # another table is a dead letter saying so: a hostile stream of values must not create
    # tables without end), or a pattern route's topics (past it, the topic is refused and
    # status says so). Counted once for all writers (table_meta/table_slots.py).
    max_tables_per_route: Annotated[int, _int(1, 100_000)] = 1000
    # ... and how many tables one ingest job may write in all, over every route.
    max_tables: Annotated[int, _int(1, 100_000)] = 10_000
    # After each commit, also record the table's offsets in its Kafka consumer group
    # (kafka.group_id, default streamberg-<table>) for lag dashboards; never used to resume.
    # A config of many leaves it off unless set (one group consumer a table).
    record_group_offsets: Bool = True


class DeadLetterConfig(_Section):
    # Malformed records go to this Iceberg table (created when absent), exactly once.
    table: TableIdentifier | None = None

