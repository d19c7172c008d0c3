"""The whole configuration (`StreambergConfig`) and the targets that components are given."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import (
    Field,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from streamberg.common.config.components import (
    CompactorConfig,
    GovernConfig,
    MaintenanceConfig,
    MergeConfig,
    MonitoringConfig,
    RunConfig,
)
from streamberg.common.config.sections import (
    CHANGELOG_COLUMNS,
    CHANGELOG_TARGET_PROPERTY,
    DeadLetterConfig,
    IngestConfig,
    KafkaConfig,
)
from streamberg.common.config.table import (
    CatalogConfig,
    TableConfig,
)

ENV_PREFIX = "STREAMBERG_"

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


@dataclass(frozen=True)
class IngestTarget:
    """The names the ingest gives its work on a table: its job, consumer group, dead-letter
    table and state folder, each defaulted from the table's identifier. Monitoring reads
    the same names (the dead-letter table, the consumer group's lag)."""

    table_identifier: str
    kafka: KafkaConfig
    ingest: IngestConfig
    dead_letter: DeadLetterConfig

    @property
    def job_id(self) -> str:
        return self.ingest.job_id or f"ingest:{self.table_identifier}"

    @property
    def dead_letter_table(self) -> str:
        return self.dead_letter.table or f"{self.table_identifier}_dead_letters"

    @property
    def consumer_group(self) -> str:
        return self.kafka.group_id or f"streamberg-{self.table_identifier}"

    @property
    def state_dir(self) -> Path:
        return Path(self.ingest.state_dir)


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
    merge: MergeConfig = Field(default_factory=MergeConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    govern: GovernConfig = Field(default_factory=GovernConfig)
    # Where the file was read from (set by load_config; used to resolve relative paths).
    config_path: str | None = None
    # Set by a config of many for the tables of a field-routed topic, not a setting: the
    # route's field, whose value (the table's `streamberg.route.value`) picks the topic's
    # records a table holds (a fresh read's tail keeps those alone, as the writers do; the
    # route's unrouted table holds none).
    route_field: str | None = None

    @property
    def side_tables(self) -> tuple[str, ...]:
        """The tables the product writes beside this one: its dead letters and, for a
        primary-key table, its change log and the merge's key state."""
        out = [self.ingest_target.dead_letter_table]
        if self.kafka.envelope != "none":
            out += [self.merge.changelog_table or f"{self.table.identifier}_changelog",
                    self.merge.key_state_table or f"{self.table.identifier}_merge_keys"]
        return tuple(out)

    @model_validator(mode="after")
    def _dead_letters_elsewhere(self) -> StreambergConfig:
        # Catalog identifiers compare case-insensitively in Spark: the same table either way.
        if self.ingest_target.dead_letter_table.lower() == self.table.identifier.lower():
            raise ValueError("dead_letter.table: must differ from table.identifier (dead letters would be "
                             "appended to the main table)")
        key = self.kafka.key_field
        if key is not None and self.table.schema_ is not None:  # otherwise checked against the table at start
            declared = next((f for f in self.table.schema_ if f.name == key), None)
            if declared is None:
                raise ValueError(f"kafka.key_field: {key!r} is not a column of table.schema")
            if declared.type != "string" and self.kafka.key_format == "text":
                raise ValueError(f"kafka.key_field: column {key!r} is {declared.type}; the key is written as a "
                                 "string (kafka.key_format: text), so the column must be a string")
        if key is None and self.kafka.key_format != "text" and self.kafka.envelope != "upsert":
            raise ValueError("kafka.key_format: value needs kafka.key_field, the column the key is decoded into")
        self._check_envelope()
        return self

    def _check_envelope(self) -> None:
        """A change-data-capture table (docs/cdc.md): a key, a declared schema, JSON records."""
        envelope, keys = self.kafka.envelope, self.table.primary_key
        if CHANGELOG_TARGET_PROPERTY in self.table.properties:
            return  # the ingest's view: its table is the change log, built from a checked config
        if envelope == "none":
            if keys:
                raise ValueError("table.primary_key: needs kafka.envelope debezium or upsert (a primary-key table is "
                                 "kept by the merge stage from a change stream; an append table has no key)")
            return
        if not keys:
            raise ValueError(f"kafka.envelope {envelope}: needs table.primary_key, the columns that identify a row")
        if self.table.schema_ is None:
            raise ValueError(f"kafka.envelope {envelope}: needs table.schema declared (the change log is built from it)")
        if self.kafka.value_format == "protobuf":
            raise ValueError(f"kafka.envelope {envelope}: value_format protobuf is not supported with it yet; use "
                             "json or avro")
        if self.kafka.key_field is not None:
            raise ValueError(f"kafka.envelope {envelope}: kafka.key_field does not apply (the key columns come from "
                             "the records; an upsert tombstone's from its Kafka key)")
        if clash := sorted({f.name for f in self.table.schema_} & set(CHANGELOG_COLUMNS)):
            raise ValueError(f"table.schema: {', '.join(clash)} are the change log's own columns; rename them")
        if envelope == "upsert" and self.kafka.key_format == "text":
            declared = {f.name: f for f in self.table.schema_}
            if len(keys) != 1 or declared[keys[0]].type != "string":
                raise ValueError("kafka.envelope upsert with kafka.key_format text: the key is the text of one string "
                                 "key column; use kafka.key_format value for JSON keys (an object of the key "
                                 "columns, or one JSON value for a one-column key)")
        identifier = self.merge.changelog_table or f"{self.table.identifier}_changelog"
        taken = {self.table.identifier.lower(), self.ingest_target.dead_letter_table.lower()}
        if identifier.lower() in taken:
            raise ValueError(f"merge.changelog_table: {identifier} must differ from the table and its dead letters")

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
    def ingest_target(self) -> IngestTarget:
        return IngestTarget(self.table.identifier, self.kafka, self.ingest, self.dead_letter)


# Keys whose values may hold credentials: an error about them never shows the value.
