"""Change events (kafka.envelope debezium or upsert) as rows of the change log.

The change log (common/changelog.py) holds each change's row image in the table's columns
plus its own: the operation, the key before a key change, the Kafka position and the
source's time. This decoder reads the envelope of each record in Python (one `json.loads`),
then hands the row images to the JSON decoder (ingest/decode/json_decode.py) in one batch, so the
table's types, schema evolution and every dead-letter reason of an append apply unchanged:

- `debezium`: `{"before", "after", "op", "source": {"ts_ms"}}`, or the same inside the
  JsonConverter's `{"schema", "payload"}` wrapper. c, u and r take the after image, d the
  before image. An update whose before and after keys differ records the before key (the
  merge deletes it). The tombstone Kafka sends after a delete (a null value) is skipped and
  counted: it carries nothing the delete did not.
- `upsert`: the value is the whole row (`u`); a null value (tombstone) deletes the row whose
  key the Kafka key carries (`d`): with `kafka.key_format: text` the key's text is the one
  string key column, with `value` it is JSON (an object of the key columns, or one value for
  a one-column key).

A change whose image is not a row of the table is a dead letter with the reason: no
envelope, an unknown op, no image for its op, a missing key column, a value that does not fit
its column. A delete's image needs only the key columns; every other image is held to the
table's required columns (the change log relaxes them, the table does not).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField, StructType

from streamberg.common.changelog import (
    BEFORE_KEY,
    DELETE,
    OFFSET,
    OP,
    OPS,
    PARTITION,
    SOURCE_SEQ,
    SOURCE_TS,
)
from streamberg.common.config import CHANGELOG_COLUMNS
from streamberg.ingest.decode.envelopes.avro import AvroChanges, Changes
from streamberg.ingest.decode.envelopes.source_position import source_sequence
from streamberg.ingest.decode.formats import ValueFormat
from streamberg.ingest.decode.interface import DecodeResult, ValueDecoder
from streamberg.ingest.decode.json_decode import JsonDecoder
from streamberg.ingest.decode.registry import WriterSchemas
from streamberg.ingest.decode.unknown_fields import UnknownField

# source.ts_ms beyond this many ms from the epoch (year ~33,600) is not a time: left null.
_MAX_TS_MS = 10**15


class _Refused(Exception):
    """A change that is no row: its reason goes to the dead-letter table."""


def _loads(data: bytes, what: str) -> Any:
    # orjson: strict JSON (no NaN or Infinity; UTF-8 only; 1024 levels deep at most) at a
    # fifth of the stdlib's time, which is most of this decoder's cost.
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise _Refused(f"{what} is not JSON ({str(exc)[:120]})") from None


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
    kind of envelope (DebeziumDecoder, UpsertDecoder) reads one record's change (`_change`)
    and its framed form (`_framed`); the images, the before keys, the reserved names and the
    change log's own columns are this class's."""

    kind: str = ""
    needs_keys: bool = False  # whether decode needs the records' Kafka keys

    def __init__(self, schema: Schema, max_record_bytes: int, *,
                 epoch_units: Mapping[str, str] | None = None, key_format: Literal["text", "value"] = "text",
                 required: Sequence[str] = (), unknown: Literal["ignore", "report"] = "ignore",
                 fmt: ValueFormat | None = None, registry: WriterSchemas | None = None) -> None:
        self.schema = schema
        self.file_schema = schema_to_pyarrow(schema)
        self.max_record_bytes = max_record_bytes
        self.key_format = key_format
        before = schema.find_field(BEFORE_KEY).field_type
        assert isinstance(before, StructType)
        self.key_columns = [f.name for f in before.fields]
        rows = [f for f in schema.fields if f.name not in CHANGELOG_COLUMNS]
        self.row_schema = pa.schema([self.file_schema.field(f.name) for f in rows])
        # Inserts and updates: the table's own required columns; deletes: the key alone.
        self.images: ValueDecoder = JsonDecoder(
            Schema(*_with_required(rows, set(required)), schema_id=schema.schema_id), max_record_bytes, epoch_units,
            unknown)
        self.deletes = JsonDecoder(Schema(*rows, schema_id=schema.schema_id), max_record_bytes, epoch_units, unknown)
        self.before_keys = JsonDecoder(Schema(*before.fields), max_record_bytes, epoch_units, "ignore")
        self.avro: AvroChanges | None = None
        if fmt is not None and fmt.needs_registry:
            assert registry is not None  # formats.format_of gives one with a registry format
            self._framed(fmt, registry, rows, required, unknown)

    def _framed(self, fmt: ValueFormat, registry: WriterSchemas, rows: list[NestedField], required: Sequence[str],
                unknown: Literal["ignore", "report"]) -> None:
        """Set up reading Confluent-framed records (kafka.value_format avro)."""
        raise NotImplementedError

    def _change(self, value: bytes | None, key: bytes | None) -> tuple[str, bytes, bytes | None, int | None,
                                                                          str | None] | None:
        """One record's change: (op, row image JSON, before key JSON, source ms, sequence), or
        None for a record that is no change (counted as skipped); _Refused for a dead letter."""
        raise NotImplementedError

    def decode(self, values: list[bytes | None], keys: Sequence[bytes | None] | None = None,
               positions: tuple[Sequence[int], Sequence[int]] | None = None) -> DecodeResult:
        if positions is None:
            raise ValueError("the change log records each change's Kafka position: positions are needed")
        partitions, offsets = positions
        if self.avro is not None:
            return self._assemble(self.avro.read(values), partitions, offsets)
        ops: dict[int, str] = {}
        times: dict[int, int] = {}
        sequences: dict[int, str] = {}
        images: list[tuple[int, bytes]] = []
        deletes: list[tuple[int, bytes]] = []
        moved: list[tuple[int, bytes]] = []
        rejected: list[tuple[int, Any]] = []
        skipped = 0
        for i, value in enumerate(values):
            try:
                change = self._change(value, None if keys is None else keys[i])
            except _Refused as exc:
                rejected.append((i, str(exc)))
                continue
            if change is None:
                skipped += 1
                continue
            op, image, before_key, ts, seq = change
            ops[i] = op
            if ts is not None:
                times[i] = ts
            if seq is not None:
                sequences[i] = seq
            (deletes if op == DELETE else images).append((i, image))
            if before_key is not None:
                moved.append((i, before_key))
        before = self._before_keys(moved, rejected)
        if before.rejected:
            gone = {i for i, _ in before.rejected}
            images = [(i, v) for i, v in images if i not in gone]
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
        return self._assemble(Changes(table, kept, pa.array([ops[int(i)] for i in kept], pa.string()),
                                      self._before_column(before, kept),
                                      pa.array([times.get(int(i)) for i in kept], pa.int64()),
                                      pa.array([sequences.get(int(i)) for i in kept], pa.string()),
                                      rejected, unknown, skipped), partitions, offsets)

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

    def _size(self, data: bytes, what: str) -> None:
        if len(data) > self.max_record_bytes:
            raise _Refused(f"oversized: {len(data)} bytes > max_record_bytes {self.max_record_bytes} ({what})")

    # -- the key before a key change ---------------------------------------------------
    def _before_keys(self, moved: list[tuple[int, bytes]], rejected: list[tuple[int, Any]]) -> DecodeResult:
        """The before keys of key-changing updates, decoded to the key columns' types; an
        update whose before key does not fit them is refused (its reason added)."""
        at = np.asarray([i for i, _ in moved], dtype=np.int64)
        result = self.before_keys.decode([v for _, v in moved])
        result.kept = at[result.kept] if len(moved) else result.kept
        result.rejected = [(int(at[j]), f"before: {reason}") for j, reason in result.rejected]
        rejected += result.rejected
        return result

    def _before_column(self, before: DecodeResult, kept: np.ndarray) -> pa.Array:
        struct = self.file_schema.field(BEFORE_KEY).type
        if not len(before.kept):
            return pa.nulls(len(kept), struct)
        where = {int(i): j for j, i in enumerate(before.kept)}
        take = np.asarray([where.get(int(i), -1) for i in kept], dtype=np.int64)
        rows = pa.array(np.where(take < 0, 0, take))
        return pa.StructArray.from_arrays([before.table.column(f.name).combine_chunks().take(rows) for f in struct],
                                          fields=list(struct), mask=pa.array(take < 0))


class DebeziumDecoder(EnvelopeDecoder):
    """`debezium`: `{"before", "after", "op", "source"}`, bare or in the JsonConverter's
    schema/payload wrapper; or Confluent-framed Avro through the registry, its envelope read by
    the Avro ingest's own decoder (ingest/decode/envelopes/avro.py)."""

    kind = "debezium"

    def _framed(self, fmt: ValueFormat, registry: WriterSchemas, rows: list[NestedField], required: Sequence[str],
                unknown: Literal["ignore", "report"]) -> None:
        self.avro = AvroChanges(rows, self.key_columns, required, self.row_schema,
                                self.file_schema.field(BEFORE_KEY).type, self.max_record_bytes, registry, unknown)

    def _change(self, value: bytes | None, key: bytes | None) -> tuple[str, bytes, bytes | None, int | None,
                                                                          str | None] | None:
        if value is None:
            return None  # the tombstone after a delete: log compaction's, not a change
        self._size(value, "record")
        event = _loads(value, "the change event")
        if isinstance(event, dict) and "payload" in event and "schema" in event:
            event = event["payload"]  # the JsonConverter's schemas.enable wrapper
        if not isinstance(event, dict):
            raise _Refused(f"not a Debezium change event: a JSON {type(event).__name__}, not an object with "
                           "before, after and op")
        op = event.get("op")
        if op not in OPS:
            shown = json.dumps(op)[:40] if op is not None else "none"
            raise _Refused(f"unknown op {shown}: a Debezium change event's op is c, u, d or r")
        image = event.get("before" if op == DELETE else "after")
        if not isinstance(image, dict):
            which = "before" if op == DELETE else "after"
            raise _Refused(f"op {op} without its {which} image (an object of the row's columns)")
        before_key = None
        before = event.get("before")
        if op == "u" and isinstance(before, dict) and all(k in before for k in self.key_columns) \
                and any(before[k] != image.get(k) for k in self.key_columns):
            before_key = _dumps({k: before[k] for k in self.key_columns})
        source = event.get("source")
        ts = source.get("ts_ms") if isinstance(source, dict) else None
        if not isinstance(ts, int) or isinstance(ts, bool) or abs(ts) > _MAX_TS_MS:
            ts = None
        return op, _dumps(image), before_key, ts, source_sequence(source)


class UpsertDecoder(EnvelopeDecoder):
    """`upsert`: the value is the whole row (JSON, or one Avro record read as the Avro ingest
    reads rows); a null value deletes the row of the record's Kafka key (text or JSON)."""

    kind = "upsert"
    needs_keys = True

    def _framed(self, fmt: ValueFormat, registry: WriterSchemas, rows: list[NestedField], required: Sequence[str],
                unknown: Literal["ignore", "report"]) -> None:
        self.images = fmt.decoder(Schema(*_with_required(rows, set(required)), schema_id=self.schema.schema_id),
                                  self.max_record_bytes, unknown, registry=registry)

    def _change(self, value: bytes | None, key: bytes | None) -> tuple[str, bytes, None, None, None]:
        if value is not None:
            return "u", value, None, None, None  # the row, JSON or Avro: its decoder reads it
        if key is None:
            raise _Refused("a tombstone (null value) without a key: no row to delete")
        key = bytes(key)
        self._size(key, "key")
        if self.key_format == "text":
            try:
                return DELETE, _dumps({self.key_columns[0]: key.decode("utf-8")}), None, None, None
            except UnicodeDecodeError:
                raise _Refused("the tombstone's key is not valid UTF-8") from None
        parsed = _loads(key, "the tombstone's key")
        if isinstance(parsed, dict):
            if missing := [k for k in self.key_columns if k not in parsed]:
                raise _Refused(f"the tombstone's key lacks the key column(s) {', '.join(missing)}")
            return DELETE, _dumps({k: parsed[k] for k in self.key_columns}), None, None, None
        if len(self.key_columns) == 1 and not isinstance(parsed, list):
            return DELETE, _dumps({self.key_columns[0]: parsed}), None, None, None
        raise _Refused(f"the tombstone's key is a JSON {type(parsed).__name__}; it must be an object of the key "
                       f"columns ({', '.join(self.key_columns)})")
