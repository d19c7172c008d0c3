"""The value formats, chosen by name in one place (`value_format`).

A format owns what differs between formats and nothing else (a template: each subclass
overrides only that):
- its decoder (a batch of Kafka values in, a DecodeResult out: decode/interface.py);
- the table's schema from the registry's latest writer schema, when the config declares none;
- the check that a table's columns are ones it can carry.

Adding a format is one module (its decoder and, if the registry describes it, its schema
conversion) plus one entry in FORMATS; tests/ingest/test_value_formats.py registers a toy
format that way. A name that is not in FORMATS is refused, by name, where the ingest starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType

from streamberg.common.config import StreambergConfig
from streamberg.common.errors import ConfigError
from streamberg.decode.interface import ValueDecoder
from streamberg.decode.registry import WriterSchemas

Unknown = Literal["ignore", "report"]


class ValueFormat:
    """A value format. `needs_registry`: its records carry a writer-schema id to look up;
    `infers_table`: its records' own fields can make a table."""

    name: ClassVar[str] = ""
    needs_registry: ClassVar[bool] = True
    # Its records' own fields can make a table (a many-table route's `schema: infer`).
    infers_table: ClassVar[bool] = False

    def decoder(self, schema: Schema, max_record_bytes: int, unknown: Unknown, *,
                epoch_units: Mapping[str, str] | None = None, registry: WriterSchemas | None = None,
                wrap: str | None = None) -> ValueDecoder:
        """A decoder of values into `schema`. `wrap`: the values are Kafka keys, each the one
        field `wrap` of a row (kafka.key_format: value)."""
        raise NotImplementedError

    def table_schema(self, registered: Any, fetch: Any) -> Schema:
        """The table's schema from a registry's writer schema (`fetch(subject, version)` gives
        the schemas it references)."""
        raise ConfigError(f"kafka.value_format {self.name}: declare table.schema (the records carry no schema)")

    def check_table(self, schema: Schema) -> None:
        """Refuse a table with columns this format's records cannot fill (UnsupportedSchemaError)."""

    def infer_fields(self, values: list[bytes], max_record_bytes: int) -> dict[str, IcebergType]:
        """The top-level fields of `values` and their types, as schema evolution types them
        (`infers_table` formats; empty when no record is an object)."""
        raise ConfigError(f"kafka.value_format {self.name}: its records make no table by themselves")


class JsonFormat(ValueFormat):
    name = "json"
    needs_registry = False
    infers_table = True

    def decoder(self, schema: Schema, max_record_bytes: int, unknown: Unknown, *,
                epoch_units: Mapping[str, str] | None = None, registry: WriterSchemas | None = None,
                wrap: str | None = None) -> ValueDecoder:
        from streamberg.decode.json_decode import JsonDecoder

        return JsonDecoder(schema, max_record_bytes, epoch_units, unknown)

    def check_table(self, schema: Schema) -> None:
        from streamberg.decode.json_values import check_supported

        check_supported(schema)

    def infer_fields(self, values: list[bytes], max_record_bytes: int) -> dict[str, IcebergType]:
        from pyiceberg.types import NestedField, StringType

        from streamberg.decode.json_decode import JsonDecoder

        # One column no record can carry (a '#' is no field name evolution takes): every field
        # of the records is then reported, typed as schema evolution types it.
        probe = Schema(NestedField(1, "#streamberg-probe", StringType(), required=False))
        found = JsonDecoder(probe, max_record_bytes, None, "report").decode(values)
        return {u.path[0]: u.type for u in found.unknown if len(u.path) == 1}


class AvroFormat(ValueFormat):
    name = "avro"

    def decoder(self, schema: Schema, max_record_bytes: int, unknown: Unknown, *,
                epoch_units: Mapping[str, str] | None = None, registry: WriterSchemas | None = None,
                wrap: str | None = None) -> ValueDecoder:
        from streamberg.decode.avro_decode import AvroDecoder

        assert registry is not None  # needs_registry: value_decoder checked it
        return AvroDecoder(schema, max_record_bytes, registry, unknown, wrap=wrap)

    def table_schema(self, registered: Any, fetch: Any) -> Schema:
        from streamberg.decode.avro_schema import iceberg_schema

        return iceberg_schema(registered.schema_str)


class ProtobufFormat(ValueFormat):
    name = "protobuf"

    def decoder(self, schema: Schema, max_record_bytes: int, unknown: Unknown, *,
                epoch_units: Mapping[str, str] | None = None, registry: WriterSchemas | None = None,
                wrap: str | None = None) -> ValueDecoder:
        from streamberg.decode.protobuf_decode import ProtobufDecoder

        assert registry is not None
        return ProtobufDecoder(schema, max_record_bytes, registry, unknown, wrap=wrap)

    def table_schema(self, registered: Any, fetch: Any) -> Schema:
        from streamberg.decode.protobuf_schema import iceberg_schema, message_descriptor

        # The file's first message: the one a record without message indexes is.
        return iceberg_schema(message_descriptor(registered.schema_str, list(registered.references or []), (), fetch))


FORMATS: dict[str, ValueFormat] = {f.name: f for f in (JsonFormat(), AvroFormat(), ProtobufFormat())}


def value_format(name: str) -> ValueFormat:
    """The format named `name`; a ConfigError naming the known ones otherwise."""
    found = FORMATS.get(name)
    if found is None:
        raise ConfigError(f"kafka.value_format: unknown format {name!r}; known: {', '.join(sorted(FORMATS))}")
    return found


def format_of(config: StreambergConfig) -> tuple[ValueFormat, WriterSchemas | None]:
    """The config's value format and, when it needs one, its registry client."""
    fmt = value_format(config.kafka.value_format)
    if not fmt.needs_registry:
        return fmt, None
    if config.kafka.schema_registry is None:
        raise ConfigError(f"kafka.value_format {fmt.name} needs kafka.schema_registry (its url)")
    return fmt, WriterSchemas(config.kafka.schema_registry)
