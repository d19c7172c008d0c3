"""A Kafka record (key and value) as a row of the table: the one decoder the writer, the range
replay and the dead-letter replay use.

The value is decoded by its format's decoder (JSON: decode/json_decode.py; Avro and Protobuf
through a registry: decode/registry_decode.py) against the table's schema without the key
column. With `kafka.key_field` set, the record's key fills that column:
- `kafka.key_format: text` (the default): as a UTF-8 string; a key that is not valid UTF-8
  dead-letters the record with the reason;
- `value`: decoded with the value's format and every rule of that format's decoder, against
  the key column's type: a JSON key is one JSON value (an object for a struct column, a
  scalar for a primitive one), an Avro or Protobuf key is Confluent-framed with its own writer
  schema (a record or message for a struct column; an Avro primitive for a primitive one).
  A key that does not decode dead-letters the record with the key's reason; fields a key
  carries and the column lacks are reported like the value's (schema evolution adds them
  inside the key column), and a key that needs a wider column widens it.
A missing key for a required column dead-letters the record; a value field of the key
column's name is ignored (the key is the truth for it). The columns come back in the table's
order, with its field ids.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import StringType

from streamberg.common.config import StreambergConfig
from streamberg.common.errors import UnsupportedSchemaError
from streamberg.decode.formats import format_of
from streamberg.decode.formats import value_format as format_named
from streamberg.decode.interface import DecodeResult, ValueDecoder
from streamberg.decode.json_decode import JsonDecoder, epoch_units
from streamberg.decode.registry import WriterSchemas
from streamberg.decode.required_fields import missing as missing_field
from streamberg.decode.types import Widening
from streamberg.decode.unknown_fields import UnknownField

KeyFormat = Literal["text", "value"]


def check_key_field(schema: Schema, key_field: str | None, key_format: KeyFormat = "text") -> None:
    """The key column is a top-level column of the table, a string one for text keys;
    UnsupportedSchemaError otherwise."""
    if key_field is None:
        return
    found = next((f for f in schema.fields if f.name == key_field), None)
    if found is None:
        raise UnsupportedSchemaError(f"kafka.key_field: {key_field!r} is not a column of the table "
                                     f"(columns: {', '.join(f.name for f in schema.fields)})")
    if key_format == "text" and not isinstance(found.field_type, StringType):
        raise UnsupportedSchemaError(f"kafka.key_field: column {key_field!r} is {found.field_type}; the key is "
                                     "written as a string (kafka.key_format: text), so the column must be a string "
                                     "(or set kafka.key_format: value to decode the key with the value's format)")


class RecordDecoder:
    """Decodes batches of (key, value) into the table's Arrow schema."""

    @classmethod
    def for_config(cls, config: StreambergConfig, schema: Schema,
                   unknown: Literal["ignore", "report"] = "report") -> RecordDecoder:
        """The ingest's decoder for `schema`: the value format, epoch units and key column the
        config sets, fields the schema lacks reported."""
        fmt, registry = format_of(config)
        return cls(schema, config.ingest.max_record_bytes, epoch_units(config.table.schema_), config.kafka.key_field,
                   unknown=unknown, registry=registry, value_format=fmt.name, key_format=config.kafka.key_format)

    def __init__(self, schema: Schema, max_record_bytes: int, epoch_units: Mapping[str, str] | None = None,
                 key_field: str | None = None, unknown: Literal["ignore", "report"] = "ignore",
                 registry: WriterSchemas | None = None, value_format: str = "json",
                 key_format: KeyFormat = "text") -> None:
        check_key_field(schema, key_field, key_format)
        self.key_field = key_field
        self.file_schema = schema_to_pyarrow(schema)
        value_schema = schema if key_field is None else Schema(
            *[f for f in schema.fields if f.name != key_field], schema_id=schema.schema_id)
        self.schema = schema
        self.max_record_bytes = max_record_bytes
        # The value format's own decoder (decode/formats.py); keys decoded by the same.
        fmt = format_named(value_format)
        if fmt.needs_registry and registry is None:
            raise ValueError(f"value format {fmt.name} needs a schema registry")
        self.values: ValueDecoder = fmt.decoder(value_schema, max_record_bytes, unknown, epoch_units=epoch_units,
                                                registry=registry)
        self.keys: ValueDecoder | None = None
        if key_field is not None and key_format == "value":
            # The key column alone, the key's value its one field: a key's paths are the table's.
            key_schema = Schema(schema.find_field(key_field), schema_id=schema.schema_id)
            self.keys = fmt.decoder(key_schema, max_record_bytes, unknown, epoch_units=epoch_units, registry=registry,
                                    wrap=key_field)
        self.key_required = key_field is not None and schema.find_field(key_field).required

    @property
    def needs_keys(self) -> bool:
        """Whether decode needs the records' Kafka keys."""
        return self.key_field is not None

    def decode(self, values: list[bytes | None], keys: Sequence[bytes | None] | None = None,
               positions: tuple[Sequence[int], Sequence[int]] | None = None) -> DecodeResult:
        """`positions`: the records' (partitions, offsets), which a change log records
        (decode/envelopes/changes.py); rows of an append do not carry them."""
        result = self.values.decode(values)
        if self.key_field is None:
            return result
        # A value field named like the key column is the key's (not a field the table lacks).
        result.unknown = [u for u in result.unknown if u.path[0] != self.key_field]
        if keys is None:
            raise ValueError("kafka.key_field is set: the records' keys are needed")
        kept_keys = [keys[int(i)] for i in result.kept]
        if self.keys is None:
            column, reasons = self._text_keys(result.kept, kept_keys)
        else:
            column, reasons = self._decoded_keys(result, kept_keys)
        bad = np.isin(result.kept, np.asarray([i for i, _ in reasons], dtype=np.int64))
        columns = {name: result.table.column(name) for name in result.table.column_names}
        columns[self.key_field] = column
        table = pa.Table.from_arrays([columns[f.name] for f in self.file_schema], schema=self.file_schema)
        if not bad.any():
            return DecodeResult(table=table, kept=result.kept, rejected=result.rejected, unknown=result.unknown)
        rejected = sorted(result.rejected + reasons)
        kept = result.kept[~bad]
        for u in result.unknown:
            u.rows = u.rows[np.isin(u.rows, kept)]
        return DecodeResult(table=table.filter(pa.array(~bad)), kept=kept, rejected=rejected,
                            unknown=[u for u in result.unknown if len(u.rows)])

    def _missing(self, index: int) -> list[tuple[int, str]]:
        if self.key_required:
            return [(index, missing_field(self.key_field, "the record has no key"))]
        return []

    def _text_keys(self, kept: np.ndarray, keys: list[bytes | None]) -> tuple[pa.Array, list[tuple[int, str]]]:
        """The keys as UTF-8 text, and the records whose key cannot be written."""
        text: list[str | None] = []
        reasons: list[tuple[int, str]] = []
        for index, key in zip(kept.tolist(), keys):
            value = None
            if key is None:
                reasons += self._missing(index)
            else:
                try:
                    value = bytes(key).decode("utf-8")
                except UnicodeDecodeError:
                    reasons.append((index, f"field {self.key_field!r}: the record's key is not valid UTF-8"))
            text.append(value)
        return pa.array(text, pa.string()), reasons

    def _decoded_keys(self, result: DecodeResult, keys: list[bytes | None]) -> tuple[pa.Array, list[tuple[int, str]]]:
        """The keys decoded with the value's format into the key column; the records whose key
        does not decode; the key's unknown fields added to `result.unknown`."""
        assert self.keys is not None and self.key_field is not None
        kept = result.kept.tolist()
        reasons: list[tuple[int, str]] = []
        batch: list[bytes | None] = []
        at: list[int] = []  # batch position -> position among the kept rows
        for j, (index, key) in enumerate(zip(kept, keys)):
            if key is None:
                reasons += self._missing(index)
                continue
            framed = bytes(key)
            if isinstance(self.keys, JsonDecoder):
                try:  # one JSON value, nothing after it: the wrapping below cannot add members
                    json.loads(framed)
                except (ValueError, RecursionError) as exc:
                    reasons.append((index, f"field {self.key_field!r}: the record's key is not one JSON value "
                                           f"({type(exc).__name__}: {str(exc)[:120]})"))
                    continue
                framed = b'{' + json.dumps(self.key_field).encode() + b':' + framed + b'}'
            batch.append(framed)
            at.append(j)
        decoded = self.keys.decode(batch)
        for position, reason in decoded.rejected:
            index = kept[at[position]]
            # A widening keeps its type: schema evolution widens the key column as any other.
            reasons.append((index, reason if isinstance(reason, Widening)
                            else f"field {self.key_field!r}: the record's key: {reason}"))
        for u in decoded.unknown:
            rows = np.asarray([kept[at[int(r)]] for r in u.rows], dtype=np.int64)
            result.unknown.append(UnknownField(u.path, u.type, rows))
        # The decoded keys in the kept rows' order; null where a key is absent or refused.
        take = np.full(len(kept), -1, dtype=np.int64)
        take[np.asarray([at[int(p)] for p in decoded.kept], dtype=np.int64)] = np.arange(len(decoded.kept))
        column = decoded.table.column(self.key_field).combine_chunks() if decoded.table.num_rows else \
            pa.array([], type=self.file_schema.field(self.key_field).type)
        indices = pa.array(take, mask=take < 0)
        return column.take(indices) if len(kept) else column, reasons
