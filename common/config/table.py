"""The `catalog` and `table` sections: where the table lives and what it holds (schema, partitioning)."""

from __future__ import annotations

import re
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from streamberg.common.config.bounds import (
    BUCKET_MAX,
    MAX_BYTES,
    MAX_TEXT,
    Bool,
    FieldPath,
    Identifier,
    Properties,
    TableIdentifier,
    Text,
    _int,
    _Section,
)
from streamberg.common.config.types import (
    MAX_SCHEMA_FIELDS,
    MAX_TYPE_DEPTH,
    NESTED_KINDS,
    FieldSpec,
    ListOf,
    MapOf,
    Primitive,
    StructOf,
    TypeSpec,
    count_fields,
    depth,
    find,
    parse_type,
)

_TRANSFORM = re.compile(r"^(identity|year|month|day|hour|void|bucket\[([0-9]{1,12})\]|truncate\[([0-9]{1,12})\])$")
_TIME_TRANSFORMS = {"year", "month", "day", "hour"}
_TEMPORAL_TYPES = {"date", "timestamp", "timestamptz"}
# Key columns compare by equality in the merge: floating point does not (NaN, -0.0).
_UNKEYABLE = {"float", "double"}
# The types a sequence column may have (table_meta/changelog.py encodes each as ordered text).
SEQUENCE_TYPES = {"int", "long", "date", "timestamp", "timestamptz", "string"}

# The table's write.target-file-size-bytes unless set (not pyiceberg's 512 MiB: streaming
# commits are small, and compaction makes files this size); table_meta/table_files.py applies it.
DEFAULT_TARGET_FILE_SIZE_BYTES = 128 * 1024 * 1024


DEFAULT_CATALOG_URI = "sqlite:///.streamberg/catalog.db"


class CatalogConfig(_Section):
    # Goes into Spark SQL text (`CALL <name>.system...`) and Spark conf keys: an identifier.
    name: Identifier = "streamberg"
    # sql: a SQL database (SQLite, PostgreSQL) that pyiceberg's SqlCatalog and Spark's
    # JdbcCatalog share. rest: an Iceberg REST catalog (Apache Polaris, Nessie, Lakekeeper,
    # Gravitino, Unity Catalog, AWS Glue's and S3 Tables' Iceberg REST endpoints), reached by
    # pyiceberg's RestCatalog and Spark's RESTCatalog with the same keys. glue: AWS Glue's
    # Data Catalog (properties glue.region, glue.id, glue.endpoint; AWS credentials from the
    # environment). hive: a Hive metastore (uri thrift://host:9083). Glue and Hive are tested
    # as far as these machines allow (docs/catalogs.md), not against the real services.
    type: Literal["sql", "rest", "glue", "hive"] = "sql"
    # sql: any SQLAlchemy URI, sqlite:///catalog.db (default) or postgresql+psycopg2://user:pw@host/db.
    # rest: the catalog's base URL, the one its clients are given (https://polaris.example/api/catalog).
    # hive: the metastore's thrift://host:port. glue: not used (leave it unset).
    uri: Text = DEFAULT_CATALOG_URI
    # sql: the table data root, a local path or an object-store URI (s3://bucket/prefix).
    # rest: the warehouse the server serves (a name or a location, as the server expects it).
    # glue, hive: where new tables go, an object-store or HDFS location (s3://lake/warehouse).
    warehouse: Text = ".streamberg/warehouse"
    # rest: OAuth2 client credentials, `client_id:client_secret`, exchanged for a token at
    # oauth2_server_uri; or a bearer `token` given as is. Secrets: set them in the environment
    # (STREAMBERG_CATALOG__CREDENTIAL) or in a file (credential_file, token_file: a mounted
    # secret), not in the config file. Redacted wherever printed.
    credential: Text | None = None
    credential_file: Text | None = None
    token: Text | None = None
    token_file: Text | None = None
    # rest: the token endpoint (default: <uri>/v1/oauth/tokens) and the scope asked for.
    oauth2_server_uri: Text | None = None
    scope: Text | None = None
    # rest: a credential or token is never sent over plain http:// (uri, oauth2_server_uri)
    # unless this is true (a stand-in on loopback, a mesh that encrypts underneath).
    allow_insecure: Bool = False
    # streamberg's own small tables (the compactor's leases, the maintenance runs): in the
    # catalog's database for sql; otherwise in this SQLAlchemy database (default: a SQLite file
    # .streamberg/state.db beside the config; PostgreSQL when compactors run on several hosts).
    state_uri: Text | None = None
    # Extra catalog / FileIO properties (s3.endpoint, s3.access-key-id, header.X-Tenant, ...),
    # passed to pyiceberg and to Spark's Iceberg catalog alike.
    properties: Properties = Field(default_factory=dict)
    # A local folder for Iceberg's scan reports (what engines filter and project: the evidence
    # of `streamberg.cluster.columns=auto`, table_meta/query_stats.py). When set, the product's
    # Spark sessions report every scan there, and any Spark given the catalog properties
    # `metrics-reporter-impl` and `streamberg.reports-dir` (docs/governor.md) does too.
    scan_reports_dir: Text | None = None

    @model_validator(mode="after")
    def _uri_of_its_type(self) -> CatalogConfig:
        if self.type == "sql":
            if "://" not in self.uri:
                raise ValueError("uri: must be a SQLAlchemy URI such as sqlite:///catalog.db or "
                                 "postgresql+psycopg2://u:p@host/db")
            rest_only = [k for k in ("credential", "credential_file", "token", "token_file", "oauth2_server_uri",
                                     "scope", "state_uri") if getattr(self, k) is not None] \
                + (["allow_insecure"] if self.allow_insecure else [])
            if rest_only:
                raise ValueError(f"{', '.join(rest_only)}: keys of a REST catalog (catalog.type: rest); a SQL "
                                 "catalog's credentials go in its uri")
            return self
        if self.type in ("glue", "hive"):
            return self._metastore_keys()
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", self.uri):
            raise ValueError("uri: a REST catalog's URL, http(s)://host[:port][/path] (catalog.type: rest)")
        for key in ("oauth2_server_uri",):
            value = getattr(self, key)
            if value is not None and not re.fullmatch(r"https?://\S+", value):
                raise ValueError(f"{key}: an http(s) URL")
        if self.credential is not None and ":" not in self.credential:
            raise ValueError("credential: must be client_id:client_secret, an OAuth2 client's id and secret joined by "
                             "':' (the value given has no ':'; for a bearer token use catalog.token)")
        given = [k for k in ("credential", "credential_file", "token", "token_file") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"{', '.join(given)}: give one way to authenticate")
        plain = [k for k in ("uri", "oauth2_server_uri") if str(getattr(self, k) or "").lower().startswith("http://")]
        if given and plain and not self.allow_insecure:
            raise ValueError(f"{plain[0]}: {given[0]} would be sent over plain http://; use https://, or set "
                             "catalog.allow_insecure: true where the link is private (loopback, an encrypting mesh)")
        if "warehouse" not in self.model_fields_set:
            raise ValueError("warehouse: a REST catalog serves named warehouses: give the one to use (its name, or the "
                             "location its server expects); the default, a local folder, means nothing to a server")
        return self

    def _metastore_keys(self) -> CatalogConfig:
        rest_only = [k for k in ("credential", "credential_file", "token", "token_file", "oauth2_server_uri", "scope")
                     if getattr(self, k) is not None]
        if rest_only:
            raise ValueError(f"{', '.join(rest_only)}: keys of a REST catalog (catalog.type: rest)")
        if self.type == "glue" and self.uri != DEFAULT_CATALOG_URI:
            raise ValueError("uri: not used by a Glue catalog (its endpoint is properties glue.endpoint, its region "
                             "glue.region)")
        if self.type == "hive" and not re.fullmatch(r"thrift://[^\s/:]+:\d{1,5}(,thrift://[^\s/:]+:\d{1,5})*", self.uri):
            raise ValueError("uri: a Hive metastore's thrift://host:port (catalog.type: hive)")
        if not re.fullmatch(r"[a-z][a-z0-9+.-]*://\S+", self.warehouse):
            raise ValueError(f"warehouse: a {self.type} catalog's tables need a location every engine reaches "
                             "(s3://bucket/prefix, hdfs://..., file:///...)")
        return self


class TypeConfig(_Section):
    """A type in the tree form: a list's element, a map's key or value (common/config/types.py)."""

    type: str
    fields: list[FieldConfig] | None = Field(default=None, min_length=1, max_length=4096)
    element: TypeConfig | str | None = None
    element_required: Bool = False
    key: TypeConfig | str | None = None
    value: TypeConfig | str | None = None
    value_required: Bool = False
    # Unit of integer epochs in a timestamp/timestamptz field (ISO-8601 strings are always
    # accepted too); unset means ms, the common choice of JSON events on Kafka.
    unit: Literal["s", "ms", "us", "ns"] | None = None

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if not isinstance(value, str):
            raise ValueError("must be a type name")
        value = value.strip().lower()
        if value not in NESTED_KINDS:
            parse_type(value)  # a primitive, decimal(P,S) or a short form; ValueError names the choices
        return value

    @model_validator(mode="after")
    def _shape(self) -> TypeConfig:
        """The parts a kind takes, and only those; decimal bounds; units on timestamps only."""
        self.spec  # noqa: B018 - builds the tree, raising ValueError where a part is missing
        parts = {"fields": self.fields, "element": self.element, "key": self.key, "value": self.value}
        wanted = {"struct": {"fields"}, "list": {"element"}, "map": {"key", "value"}}.get(self.type, set())
        if extra := sorted(k for k, v in parts.items() if v is not None and k not in wanted):
            raise ValueError(f"{', '.join(extra)}: not a part of a {self.type} type"
                             + ("" if self.type in NESTED_KINDS else " (only struct, list and map have parts)"))
        if self.element_required and self.type != "list":
            raise ValueError("element_required: only a list has elements")
        if self.value_required and self.type != "map":
            raise ValueError("value_required: only a map has values")
        return self

    @field_validator("unit")
    @classmethod
    def _unit_on_timestamps(cls, value: str | None, info: Any) -> str | None:
        kind = info.data.get("type")  # absent when the type itself was invalid
        if value is not None and kind is not None and kind not in ("timestamp", "timestamptz"):
            raise ValueError(f"an epoch unit only applies to timestamp/timestamptz fields, this one is {kind}")
        return value

    @cached_property
    def spec(self) -> TypeSpec:
        """This type as one tree (common/config/types.py)."""
        if self.type == "struct":
            if not self.fields:
                raise ValueError("fields: a struct needs its fields")
            names = [f.name for f in self.fields]
            if dupes := sorted({n for n in names if names.count(n) > 1}):
                raise ValueError(f"fields: duplicate field names {dupes}")
            return StructOf(tuple(f.field_spec for f in self.fields))
        if self.type == "list":
            if self.element is None:
                raise ValueError("element: a list needs its element type")
            return ListOf(_spec_of(self.element), self.element_required)
        if self.type == "map":
            if self.key is None or self.value is None:
                raise ValueError("key, value: a map needs both")
            key = _spec_of(self.key)
            if not isinstance(key, Primitive):
                raise ValueError(f"key: a map's key must be a primitive type, not {key}")
            return MapOf(key, _spec_of(self.value), self.value_required)
        return parse_type(self.type)


def _spec_of(part: TypeConfig | str) -> TypeSpec:
    return parse_type(part) if isinstance(part, str) else part.spec


class FieldConfig(TypeConfig):
    """One column of `table.schema`, or one field of a struct, at any depth."""

    name: Identifier
    required: Bool = False
    doc: str | None = Field(default=None, max_length=MAX_TEXT)

    @cached_property
    def field_spec(self) -> FieldSpec:
        return FieldSpec(self.name, self.spec, self.required, self.doc, self.unit)


TypeConfig.model_rebuild()


class PartitionFieldConfig(_Section):
    # A column, or a nested field by its dotted path (customer.geo.city).
    source: FieldPath
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
    # The table, `namespace.table`.
    identifier: TableIdentifier
    # None: the table exists and its schema is the truth (common/schema.py reads it from there).
    schema_: list[FieldConfig] | None = Field(default=None, alias="schema", min_length=1, max_length=4096)
    # Partition fields, `{source, transform}`: identity, year, month, day, hour, bucket[N], truncate[W].
    partition_spec: list[PartitionFieldConfig] = Field(default_factory=list, max_length=64)
    # Data files roll at this size (the table's write.target-file-size-bytes).
    target_file_size_bytes: Annotated[int, _int(1, MAX_BYTES)] = DEFAULT_TARGET_FILE_SIZE_BYTES
    # Iceberg table properties of a table streamberg creates.
    properties: Properties = Field(default_factory=dict)
    # The primary key of a change-data-capture table (kafka.envelope debezium or upsert):
    # top-level required primitive columns, the table's Iceberg identifier fields. The table
    # then holds the last state of each key (docs/cdc.md).
    primary_key: list[Identifier] = Field(default_factory=list, max_length=16)
    # A primary-key table's sequence column (Paimon's `sequence.field`), e.g. updated_at: of two
    # changes of one key, the one with the greater value is the newer, whatever Kafka's order.
    # Without it the source position of a Debezium event decides, else the Kafka offset
    # (docs/cdc.md#order). A top-level required int, long, date, timestamp or string column.
    sequence_field: Identifier | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("schema_", mode="before")
    @classmethod
    def _strict_field_flags(cls, value: Any) -> Any:
        # The columns' flags as the YAML wrote them: `required` a real boolean (the Bool type
        # below also takes "true" from environment overrides, which a schema never comes
        # from), `doc` bounded; nested fields are held to the same by their own models.
        for i, item in enumerate(value if isinstance(value, list) else []):
            if isinstance(item, dict) and "required" in item and not isinstance(item["required"], bool):
                raise ValueError(f"{i}.required: must be true or false")
            if isinstance(item, dict) and isinstance(item.get("doc"), str) and len(item["doc"]) > MAX_TEXT:
                raise ValueError(f"{i}.doc: at most {MAX_TEXT} characters")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TableConfig:
        if self.schema_ is None:
            return self  # partition sources are the table's business then (ensure_table compares)
        names = [f.name for f in self.schema_]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"schema: duplicate field names {dupes}")
        fields = self.field_specs
        self._check_primary_key(fields)
        self._check_sequence_field(fields)
        total = sum(1 + count_fields(f.type) for f in fields)
        if total > MAX_SCHEMA_FIELDS:
            raise ValueError(f"schema: {total} fields at all depths; at most {MAX_SCHEMA_FIELDS} (declare a JSON "
                             "object whose keys are ids as a map, not as a struct)")
        if deepest := max((depth(f.type) for f in fields), default=0) > MAX_TYPE_DEPTH:
            raise ValueError(f"schema: types nested {deepest} levels deep; at most {MAX_TYPE_DEPTH}")
        for i, part in enumerate(self.partition_spec):
            found = find(fields, part.source)
            if found is None:
                raise ValueError(f"partition_spec.{i}.source: {part.source!r} is not a schema field")
            source, repeated = found
            if repeated or not isinstance(source.type, Primitive):
                where = "inside a list or map" if repeated else f"a {source.type.__class__.__name__[:-2].lower()}"
                raise ValueError(f"partition_spec.{i}.source: {part.source!r} is {where}; a partition source must be "
                                 "a primitive field outside lists and maps")
            kind = source.type.name
            base = part.transform.split("[")[0]
            if base in _TIME_TRANSFORMS and kind not in _TEMPORAL_TYPES:
                raise ValueError(f"partition_spec.{i}.transform: {base} needs a date/timestamp field, {part.source!r} is {kind}")
            if base == "hour" and kind == "date":
                raise ValueError(f"partition_spec.{i}.transform: hour needs a timestamp field, {part.source!r} is a date")
        return self

    def _check_sequence_field(self, fields: tuple[FieldSpec, ...]) -> None:
        if self.sequence_field is None:
            return
        if not self.primary_key:
            raise ValueError("sequence_field: orders the changes of a primary-key table; set table.primary_key "
                             "(and kafka.envelope debezium or upsert)")
        column = next((f for f in fields if f.name == self.sequence_field), None)
        if column is None:
            raise ValueError(f"sequence_field: {self.sequence_field!r} is not a top-level column of table.schema")
        if not isinstance(column.type, Primitive) or column.type.name not in SEQUENCE_TYPES:
            raise ValueError(f"sequence_field: column {self.sequence_field!r} is {column.type}; a sequence is one of "
                             f"{', '.join(sorted(SEQUENCE_TYPES))}")
        if not column.required:
            raise ValueError(f"sequence_field: column {self.sequence_field!r} must be declared required: true (a "
                             "change without its sequence could not be ordered)")
        if self.sequence_field in self.primary_key:
            raise ValueError(f"sequence_field: {self.sequence_field!r} is a key column; a key's changes all share it")

    def _check_primary_key(self, fields: tuple[FieldSpec, ...]) -> None:
        if dupes := sorted({k for k in self.primary_key if self.primary_key.count(k) > 1}):
            raise ValueError(f"primary_key: columns listed twice {dupes}")
        by_name = {f.name: f for f in fields}
        for key in self.primary_key:
            column = by_name.get(key)
            if column is None:
                raise ValueError(f"primary_key: {key!r} is not a top-level column of table.schema")
            if not isinstance(column.type, Primitive) or column.type.name in _UNKEYABLE:
                raise ValueError(f"primary_key: column {key!r} is {column.type}; a key column is a primitive other "
                                 f"than {', '.join(sorted(_UNKEYABLE))}")
            if not column.required:
                raise ValueError(f"primary_key: column {key!r} must be declared required: true (Iceberg's "
                                 "identifier fields are required)")

    @property
    def field_specs(self) -> tuple[FieldSpec, ...]:
        """The declared schema as one tree of field specs (common/config/types.py); empty when
        the config leaves the schema to the table."""
        return tuple(f.field_spec for f in self.schema_ or ())

    def column_type(self, path: str) -> TypeSpec | None:
        """The type of the field a dotted path names, or None."""
        found = find(self.field_specs, path)
        return found[0].type if found is not None else None

    @property
    def namespace(self) -> str:
        return self.identifier.rsplit(".", 1)[0]
