"""Decode a batch of Kafka record values written in Confluent's Avro wire format into an Arrow table.

The wire format: magic byte 0, the writer schema's 4-byte id (big-endian), the Avro binary
body. The header is read by confluent-kafka's own `SchemaId`, the writer schema fetched from
the registry by id (decode/registry.py: cached, retried, then a clear RegistryUnavailable:
the records stay in Kafka), and the body read by fastavro's `schemaless_reader`: no wire
decoder is written here. How a writer schema is matched with the table, and what happens to
records that do not fit, is the same for every registry format (decode/registry_decode.py).

Avro's promotions (int -> long, float -> double, an integer -> double, a decimal of less
precision) are read as they come. Bytes left after the record refuse it.
"""

from __future__ import annotations

import io
import json
from typing import Any

from pyiceberg.types import IcebergType

from streamberg.decode.avro_schema import iceberg_schema, iceberg_type
from streamberg.decode.registry_decode import FitKey, RegistryDecoder

# Logical types read as the numbers (or strings) they are on the wire: the table's Arrow
# column takes them as they come (a date's days, a time's or a timestamp's micro- or
# nanoseconds since midnight or the epoch; a uuid's text, which the table keeps as a string,
# decode/avro_schema.py). fastavro would make a Python date, time or datetime of each
# for Arrow to take apart again: that was a third of an Avro record's decode. The
# millisecond ones keep fastavro's reading (the table counts micros).
RAW_LOGICAL_TYPES = frozenset({"uuid", "date", "time-micros", "timestamp-micros", "local-timestamp-micros",
                               "timestamp-nanos", "local-timestamp-nanos"})


def _reader_schema(schema: Any) -> Any:
    """The writer schema with RAW_LOGICAL_TYPES left out (the same bytes, read as raw values)."""
    if isinstance(schema, dict):
        return {k: _reader_schema(v) for k, v in schema.items()
                if not (k == "logicalType" and v in RAW_LOGICAL_TYPES)}
    if isinstance(schema, list):
        return [_reader_schema(s) for s in schema]
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
        return table_form, (parse_schema(_reader_schema(parsed_json)), schemaless_reader)

    def _read(self, body: io.BytesIO, reader: Any, length: int) -> dict:
        parsed, schemaless_reader = reader
        record = schemaless_reader(body, parsed, None)
        if body.tell() != length:
            raise ValueError(f"{length - body.tell()} bytes after the record")
        return record
