"""Change events (kafka.envelope debezium or upsert) as rows of the change log.

The change log (table_meta/changelog.py) holds each change's row image in the table's columns
plus its own: the operation, the key before a key change, the Kafka position and the
source's time. One assembly (EnvelopeDecoder) over one class per kind:

- `debezium` (DebeziumDecoder): `{"before", "after", "op", "source"}` in JSON (bare or in the
  JsonConverter's wrapper) or Confluent-framed Avro; read by the rules of
  decode/envelopes/debezium.py, written once over an Arrow table of envelopes that each
  format fills. The tombstone Kafka sends after a delete (a null value) is skipped and
  counted: it carries nothing the delete did not.
- `upsert` (UpsertDecoder): the value is the whole row (`u`), read by its format's decoder; a
  null value (tombstone) deletes the row whose key the Kafka key carries (`d`): with
  `kafka.key_format: text` the key's text is the one string key column, with `value` it is
  JSON (an object of the key columns, or one value for a one-column key).

A change whose image is not a row of the table is a dead letter with the reason. A delete's
image needs only the key columns; every other image is held to the table's required columns
(the change log relaxes them, the table does not).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField, StructType

from streamberg.common.config import CHANGELOG_COLUMNS
from streamberg.decode.envelopes.debezium import Changes, debezium_rules
from streamberg.decode.formats import ValueFormat
from streamberg.decode.interface import DecodeResult, ValueDecoder
from streamberg.decode.json_decode import JsonDecoder
from streamberg.decode.registry import WriterSchemas
from streamberg.decode.unknown_fields import UnknownField
from streamberg.table_meta.changelog import (
    BEFORE_KEY,
    DELETE,
    OFFSET,
    OP,
    PARTITION,
    SOURCE_ID,
    SOURCE_SEQ,
    SOURCE_TS,
)


class _Refused(Exception):
    """A change that is no row: its reason goes to the dead-letter table."""


def _dumps(row: Mapping[str, Any]) -> bytes:
    try:
        return orjson.dumps(row)
    except TypeError as exc:  # an integer past 64 bits: the row's column cannot hold it either
        raise _Refused(f"the row image holds a value JSON for the table cannot carry ({str(exc)[:120]})") from None


def _with_required(fields: Sequence[NestedField], names: set[str]) -> list[NestedField]:
    return [NestedField(field_id=f.field_id, name=f.name, field_type=f.field_type,
                        required=f.required or f.name in names, doc=f.doc) for f in fields]


class EnvelopeDecoder:
    """Decodes batches of change events into the change log's Arrow schema. A template: each
    kind of envelope sets up its readers (`_readers`) and reads a batch's changes (`_changes`);
    the change log's own columns and the reserved names are this class's."""

    kind: str = ""
    needs_keys: bool = False  # whether decode needs the records' Kafka keys

    def __init__(self, schema: Schema, max_record_bytes: int, fmt: ValueFormat, *,
                 epoch_units: Mapping[str, str] | None = None, key_format: Literal["text", "value"] = "text",
                 required: Sequence[str] = (), unknown: Literal["ignore", "report"] = "ignore",
                 registry: WriterSchemas | None = None) -> None:
        self.schema = schema
        self.file_schema = schema_to_pyarrow(schema)
        self.max_record_bytes = max_record_bytes
        self.key_format = key_format
        before = schema.find_field(BEFORE_KEY).field_type
        assert isinstance(before, StructType)
        self.key_columns = [f.name for f in before.fields]
        self.rows = [f for f in schema.fields if f.name not in CHANGELOG_COLUMNS]
        self.row_schema = pa.schema([self.file_schema.field(f.name) for f in self.rows])
        self._readers(fmt, required, epoch_units, unknown, registry)

    def _readers(self, fmt: ValueFormat, required: Sequence[str], epoch_units: Mapping[str, str] | None,
                 unknown: Literal["ignore", "report"], registry: WriterSchemas | None) -> None:
        """Set up what reads this kind's records in the value format `fmt`."""
        raise NotImplementedError

    def _changes(self, values: list[bytes | None], keys: Sequence[bytes | None] | None) -> Changes:
        """A batch's changes: each record a row image, a dead letter, or skipped."""
        raise NotImplementedError

    def decode(self, values: list[bytes | None], keys: Sequence[bytes | None] | None = None,
               positions: tuple[Sequence[int], Sequence[int]] | None = None) -> DecodeResult:
        if positions is None:
            raise ValueError("the change log records each change's Kafka position: positions are needed")
        return self._assemble(self._changes(values, keys), *positions)

    def _assemble(self, changes: Changes, partitions: Sequence[int], offsets: Sequence[int]) -> DecodeResult:
        """The change-log rows: the images' columns, then the change log's own."""
        kept = changes.kept
        columns = {name: changes.rows.column(name) for name in changes.rows.column_names}
        columns[OP] = changes.ops
        columns[BEFORE_KEY] = changes.before_key
        columns[PARTITION] = pa.array(np.asarray(partitions, dtype=np.int32)[kept], pa.int32())
        columns[OFFSET] = pa.array(np.asarray(offsets, dtype=np.int64)[kept], pa.int64())
        columns[SOURCE_TS] = pc.multiply(changes.source_ms, 1000).cast(pa.timestamp("us", tz="UTC"))
        columns[SOURCE_SEQ] = changes.source_seq
        columns[SOURCE_ID] = changes.source_id
        # Cast only what differs: a struct with null entries over required children (the
        # before key) cannot be cast, and is built in its exact type already.
        out = pa.Table.from_arrays([columns[f.name] if columns[f.name].type == f.type else columns[f.name].cast(f.type)
                                    for f in self.file_schema], schema=self.file_schema)
        rejected, unknown = list(changes.rejected), list(changes.unknown)
        if reserved := [u for u in unknown if u.path[0] in CHANGELOG_COLUMNS]:
            # A source column named like one of the change log's own could never be kept (the
            # change log has that name already): refused by name, the first time it is seen.
            at: dict[int, str] = {}
            for u in reserved:
                for row in u.rows.tolist():
                    at.setdefault(int(row), f"field {u.path[0]!r} has a name the change log reserves for its own "
                                            f"columns ({', '.join(CHANGELOG_COLUMNS)}): a source column of that "
                                            "name cannot be kept; rename it in the source (docs/cdc.md, reserved names)")
            keep = ~np.isin(kept, np.asarray(list(at), dtype=np.int64))
            out, kept = out.filter(pa.array(keep)), kept[keep]
            rejected += list(at.items())
            unknown = [u for u in unknown if u.path[0] not in CHANGELOG_COLUMNS]
            for u in unknown:
                u.rows = u.rows[np.isin(u.rows, kept)]
            unknown = [u for u in unknown if len(u.rows)]
        return DecodeResult(table=out, kept=kept, rejected=sorted(rejected, key=lambda r: r[0]),
                            unknown=unknown, skipped=changes.skipped)


class DebeziumDecoder(EnvelopeDecoder):
    """`debezium`: the rules of decode/envelopes/debezium.py over the value format's
    envelope decoder."""

    kind = "debezium"

    def _readers(self, fmt: ValueFormat, required: Sequence[str], epoch_units: Mapping[str, str] | None,
                 unknown: Literal["ignore", "report"], registry: WriterSchemas | None) -> None:
        self.rules = debezium_rules(fmt.name, self.rows, self.key_columns, required, self.row_schema,
                                    self.file_schema.field(BEFORE_KEY).type, self.max_record_bytes, epoch_units,
                                    unknown, registry)

    def _changes(self, values: list[bytes | None], keys: Sequence[bytes | None] | None) -> Changes:
        return self.rules.read(values)


class UpsertDecoder(EnvelopeDecoder):
    """`upsert`: the value is the whole row, read by its format's decoder; a null value deletes
    the row of the record's Kafka key (text or JSON)."""

    kind = "upsert"
    needs_keys = True

    def _readers(self, fmt: ValueFormat, required: Sequence[str], epoch_units: Mapping[str, str] | None,
                 unknown: Literal["ignore", "report"], registry: WriterSchemas | None) -> None:
        # Rows: the table's own required columns, in the value's format; deletes: the key alone.
        schema_id = self.schema.schema_id
        rows = Schema(*_with_required(self.rows, set(required)), schema_id=schema_id)
        self.images: ValueDecoder = fmt.decoder(rows, self.max_record_bytes, unknown, epoch_units=epoch_units,
                                                registry=registry)
        self.deletes = JsonDecoder(Schema(*self.rows, schema_id=schema_id), self.max_record_bytes, epoch_units,
                                   unknown)

    def _changes(self, values: list[bytes | None], keys: Sequence[bytes | None] | None) -> Changes:
        if keys is None:
            raise ValueError("an upsert's tombstones delete by their Kafka key: keys are needed")
        ops: dict[int, str] = {}
        images: list[tuple[int, bytes]] = []
        deletes: list[tuple[int, bytes]] = []
        rejected: list[tuple[int, Any]] = []
        for i, value in enumerate(values):
            if value is not None:
                ops[i] = "u"
                images.append((i, value))  # the row, JSON or Avro: its decoder reads it
                continue
            try:
                deletes.append((i, self._key_image(keys[i])))
                ops[i] = DELETE
            except _Refused as exc:
                rejected.append((i, str(exc)))
        parts: list[pa.Table] = []
        kept_parts: list[np.ndarray] = []
        unknown: list[UnknownField] = []
        for decoder, batch in ((self.images, images), (self.deletes, deletes)):
            if not batch:
                continue
            at = np.asarray([i for i, _ in batch], dtype=np.int64)
            result = decoder.decode([v for _, v in batch])
            # A Widening keeps its type: schema evolution widens the change log's column.
            rejected += [(int(at[j]), reason) for j, reason in result.rejected]
            unknown += [UnknownField(u.path, u.type, at[u.rows]) for u in result.unknown]
            kept_parts.append(at[result.kept])
            parts.append(result.table.cast(self.row_schema))
        kept = np.concatenate(kept_parts) if kept_parts else np.empty(0, dtype=np.int64)
        order = np.argsort(kept, kind="stable")
        kept = kept[order]
        table = pa.concat_tables(parts).take(pa.array(order)) if parts else self.row_schema.empty_table()
        nothing = pa.nulls(len(kept))
        return Changes(table, kept, pa.array([ops[int(i)] for i in kept], pa.string()),
                       pa.nulls(len(kept), self.file_schema.field(BEFORE_KEY).type), nothing.cast(pa.int64()),
                       nothing.cast(pa.string()), nothing.cast(pa.string()), rejected, unknown, 0)

    def _key_image(self, key: bytes | None) -> bytes:
        """The delete image of a tombstone: the key columns from its Kafka key."""
        if key is None:
            raise _Refused("a tombstone (null value) without a key: no row to delete")
        key = bytes(key)
        if len(key) > self.max_record_bytes:
            raise _Refused(f"oversized: {len(key)} bytes > max_record_bytes {self.max_record_bytes} (key)")
        if self.key_format == "text":
            try:
                return _dumps({self.key_columns[0]: key.decode("utf-8")})
            except UnicodeDecodeError:
                raise _Refused("the tombstone's key is not valid UTF-8") from None
        try:
            parsed = orjson.loads(key)
        except orjson.JSONDecodeError as exc:
            raise _Refused(f"the tombstone's key is not JSON ({str(exc)[:120]})") from None
        if isinstance(parsed, dict):
            if missing := [k for k in self.key_columns if k not in parsed]:
                raise _Refused(f"the tombstone's key lacks the key column(s) {', '.join(missing)}")
            return _dumps({k: parsed[k] for k in self.key_columns})
        if len(self.key_columns) == 1 and not isinstance(parsed, list):
            return _dumps({self.key_columns[0]: parsed})
        raise _Refused(f"the tombstone's key is a JSON {type(parsed).__name__}; it must be an object of the key "
                       f"columns ({', '.join(self.key_columns)})")
