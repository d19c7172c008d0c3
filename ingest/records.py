"""A Kafka record (key and value) as a row of the table: the one decoder the writer, the range
replay and the dead-letter replay use.

The value is decoded by its format's decoder (JSON: ingest/decode.py; Avro and Protobuf
through a registry: ingest/registry_decode.py) against the table's
schema without the key column. With `kafka.key_field` set, the record's key fills that column,
as a UTF-8 string: a key that is not valid UTF-8, or a missing key for a required column,
dead-letters the record with the reason; a value field of the same name is ignored (the key
is the truth for it). The columns come back in the table's order, with its field ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import StringType

from streamberg.common.config import StreambergConfig
from streamberg.common.errors import UnsupportedSchemaError
from streamberg.common.registry import WriterSchemas
from streamberg.ingest.avro_decode import AvroDecoder
from streamberg.ingest.decode import DecodeResult, JsonDecoder, epoch_units
from streamberg.ingest.protobuf_decode import ProtobufDecoder
from streamberg.ingest.registry_decode import RegistryDecoder


def check_key_field(schema: Schema, key_field: str | None) -> None:
    """The key column is a top-level string column of the table; UnsupportedSchemaError otherwise."""
    if key_field is None:
        return
    found = next((f for f in schema.fields if f.name == key_field), None)
    if found is None:
        raise UnsupportedSchemaError(f"kafka.key_field: {key_field!r} is not a column of the table "
                                     f"(columns: {', '.join(f.name for f in schema.fields)})")
    if not isinstance(found.field_type, StringType):
        raise UnsupportedSchemaError(f"kafka.key_field: column {key_field!r} is {found.field_type}; the key is "
                                     "written as a string, so the column must be a string")


class RecordDecoder:
    """Decodes batches of (key, value) into the table's Arrow schema."""

    @classmethod
    def for_config(cls, config: StreambergConfig, schema: Schema,
                   unknown: Literal["ignore", "report"] = "report") -> RecordDecoder:
        """The ingest's decoder for `schema`: the value format, epoch units and key column the
        config sets, fields the schema lacks reported."""
        registry = None
        if config.kafka.value_format != "json":
            assert config.kafka.schema_registry is not None  # the config's own validator
            registry = WriterSchemas(config.kafka.schema_registry)
        return cls(schema, config.ingest.max_record_bytes, epoch_units(config.table.schema_), config.kafka.key_field,
                   unknown=unknown, registry=registry, value_format=config.kafka.value_format)

    def __init__(self, schema: Schema, max_record_bytes: int, epoch_units: Mapping[str, str] | None = None,
                 key_field: str | None = None, unknown: Literal["ignore", "report"] = "ignore",
                 registry: WriterSchemas | None = None, value_format: str = "avro") -> None:
        check_key_field(schema, key_field)
        self.key_field = key_field
        self.file_schema = schema_to_pyarrow(schema)
        value_schema = schema if key_field is None else Schema(
            *[f for f in schema.fields if f.name != key_field], schema_id=schema.schema_id)
        self.schema = schema
        # Registry-framed values when a registry is given (kafka.value_format: avro or
        # protobuf), JSON otherwise.
        self.values: JsonDecoder | RegistryDecoder
        if registry is None:
            self.values = JsonDecoder(value_schema, max_record_bytes, epoch_units, unknown)
        else:
            framed = ProtobufDecoder if value_format == "protobuf" else AvroDecoder
            self.values = framed(value_schema, max_record_bytes, registry, unknown)
        self.key_required = key_field is not None and schema.find_field(key_field).required

    def decode(self, values: list[bytes | None], keys: Sequence[bytes | None] | None = None) -> DecodeResult:
        result = self.values.decode(values)
        if self.key_field is None:
            return result
        # A value field named like the key column is the key's (not a field the table lacks).
        result.unknown = [u for u in result.unknown if u.path != (self.key_field,)]
        if keys is None:
            raise ValueError("kafka.key_field is set: the records' keys are needed")
        # One pass over the kept rows' keys: text, or the reason the record cannot be written.
        text: list[str | None] = []
        bad = np.zeros(len(result.kept), dtype=bool)
        reasons: list[tuple[int, str]] = []
        for j, index in enumerate(result.kept):
            key = keys[int(index)]
            value = None
            if key is None:
                if self.key_required:
                    reasons.append((int(index), f"missing required field {self.key_field!r} (the record has no key)"))
            else:
                try:
                    value = bytes(key).decode("utf-8")
                except UnicodeDecodeError:
                    reasons.append((int(index), f"field {self.key_field!r}: the record's key is not valid UTF-8"))
            bad[j] = len(reasons) > 0 and reasons[-1][0] == int(index)
            text.append(value)
        columns = {name: result.table.column(name) for name in result.table.column_names}
        columns[self.key_field] = pa.array(text, pa.string())
        table = pa.Table.from_arrays([columns[f.name] for f in self.file_schema], schema=self.file_schema)
        if not bad.any():
            return DecodeResult(table=table, kept=result.kept, rejected=result.rejected, unknown=result.unknown)
        rejected = sorted(result.rejected + reasons)
        kept = result.kept[~bad]
        for u in result.unknown:
            u.rows = u.rows[np.isin(u.rows, kept)]
        return DecodeResult(table=table.filter(pa.array(~bad)), kept=kept, rejected=rejected,
                            unknown=[u for u in result.unknown if len(u.rows)])
