"""Decode a batch of Kafka record values written in Confluent's Avro wire format into an Arrow table.

The wire format: magic byte 0, the writer schema's 4-byte id (big-endian), the Avro binary
body. The header is read by confluent-kafka's own `SchemaId`, the writer schema fetched from
the registry by id (ingest/decode/registry.py: cached, retried, then a clear RegistryUnavailable:
the records stay in Kafka), and the body read by fastavro's `schemaless_reader`: no wire
decoder is written here. How a writer schema is matched with the table, and what happens to
records that do not fit, is the same for every registry format (ingest/decode/registry_decode.py).

Avro's promotions (int -> long, float -> double, an integer -> double, a decimal of less
precision) are read as they come. Bytes left after the record refuse it.
"""

from __future__ import annotations

import io
import json
from typing import Any

from pyiceberg.types import IcebergType

from streamberg.ingest.decode.avro_schema import iceberg_schema, iceberg_type
from streamberg.ingest.decode.registry_decode import FitKey, RegistryDecoder


def _without_uuid(schema: Any) -> Any:
    """The schema with `uuid` logical types left out: fastavro then reads them as the strings
    they are on the wire (the table keeps uuids as strings, ingest/decode/avro_schema.py)."""
    if isinstance(schema, dict):
        return {k: _without_uuid(v) for k, v in schema.items()
                if not (k == "logicalType" and v == "uuid")}
    if isinstance(schema, list):
        return [_without_uuid(s) for s in schema]
    return schema


class AvroDecoder(RegistryDecoder):
    """Decodes Confluent-framed Avro values against an Iceberg schema."""

    FORMAT = "AVRO"
    NAME = "Avro"

    def _writer(self, key: FitKey) -> tuple[IcebergType, Any]:
        from fastavro import parse_schema, schemaless_reader

        parsed_json = json.loads(self.registry.by_id(key[0]))
        # A value is a record; a key (wrap) may be any Avro type, a primitive often.
        table_form = iceberg_type(parsed_json) if self.wrap is not None else iceberg_schema(parsed_json).as_struct()
        return table_form, (parse_schema(_without_uuid(parsed_json)), schemaless_reader)

    def _read(self, body: io.BytesIO, reader: Any, length: int) -> dict:
        parsed, schemaless_reader = reader
        record = schemaless_reader(body, parsed, None)
        if body.tell() != length:
            raise ValueError(f"{length - body.tell()} bytes after the record")
        return record
