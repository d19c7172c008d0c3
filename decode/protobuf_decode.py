"""Decode a batch of Kafka record values written in Confluent's Protobuf wire format into an Arrow table.

The wire format: magic byte 0, the writer schema's 4-byte id, the message indexes (which
message of the schema's file the record is; zig-zag varints, `0` for the first), the
Protobuf binary body. The header is read by confluent-kafka's own `SchemaId`, the writer
schema (a file, with its imports by reference) fetched from the registry in the serialized
form its own deserializer asks for (decode/registry.py: cached, retried, then a clear
RegistryUnavailable), built into a descriptor pool and the body parsed by protobuf's dynamic
messages (decode/protobuf_schema.py): no wire decoder is written here. How a writer schema
is matched with the table, and what happens to records that do not fit, is the same for
every registry format (decode/registry_decode.py).
"""

from __future__ import annotations

import io
from typing import Any

from pyiceberg.types import IcebergType

from streamberg.decode.protobuf_schema import iceberg_schema, message_descriptor, reader
from streamberg.decode.registry_decode import FitKey, RegistryDecoder


class ProtobufDecoder(RegistryDecoder):
    """Decodes Confluent-framed Protobuf values against an Iceberg schema."""

    FORMAT = "PROTOBUF"
    NAME = "Protobuf"

    def _writer(self, key: FitKey) -> tuple[IcebergType, Any]:
        from google.protobuf.message_factory import GetMessageClass

        schema_id, indexes = key
        registered = self.registry.schema(schema_id, "PROTOBUF")
        message = message_descriptor(registered.schema_str, list(registered.references or []), indexes,
                                     lambda subject, version: self.registry.version(subject, version, "PROTOBUF"))
        table_form = iceberg_schema(message)  # refuses recursive and too-deep messages first
        return table_form.as_struct(), (GetMessageClass(message), reader(message))

    def _read(self, body: io.BytesIO, reader: Any, length: int) -> dict:
        message_class, row = reader
        return row(message_class.FromString(body.read()))
