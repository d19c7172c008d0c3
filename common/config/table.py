"""The `catalog` and `table` sections: where the table lives and what it holds (schema, partitioning)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from streamberg.common.config.bounds import (
    BUCKET_MAX,
    DECIMAL_MAX_PRECISION,
    MAX_BYTES,
    MAX_TEXT,
    Bool,
    Identifier,
    Properties,
    TableIdentifier,
    Text,
    _int,
    _Section,
)

PRIMITIVE_TYPES = {
    "boolean", "int", "long", "float", "double", "date", "time",
    "timestamp", "timestamptz", "string", "uuid", "binary",
}
# ASCII digits only: "\d" also matches other scripts' digits, which int() accepts.
_DECIMAL = re.compile(r"^decimal\(\s*([0-9]{1,4})\s*,\s*([0-9]{1,4})\s*\)$")
_TRANSFORM = re.compile(r"^(identity|year|month|day|hour|void|bucket\[([0-9]{1,12})\]|truncate\[([0-9]{1,12})\])$")
_TIME_TRANSFORMS = {"year", "month", "day", "hour"}
_TEMPORAL_TYPES = {"date", "timestamp", "timestamptz"}

# The table's write.target-file-size-bytes unless set (not pyiceberg's 512 MiB: streaming
# commits are small, and compaction makes files this size); common/table_files.py applies it.
DEFAULT_TARGET_FILE_SIZE_BYTES = 128 * 1024 * 1024


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
    target_file_size_bytes: Annotated[int, _int(1, MAX_BYTES)] = DEFAULT_TARGET_FILE_SIZE_BYTES
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
