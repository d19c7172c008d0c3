"""Debezium change events read into the change log's rows: the rules written once, over an
Arrow table of envelopes that each value format fills.

Each format reads its events into one table of the envelope (`envelope_schema`): `before`
and `after` of the change log's row type, `op`, and `source` with `ts_ms` and the source
position (decode/envelopes/source_position.py, computed from the event's whole
`source` record by the same function for every format):

- JSON (`JsonEnvelopes`): each event parsed once (orjson; bare or inside the JsonConverter's
  `{"schema", "payload"}` wrapper), cut to what the change log keeps (an update's before image
  to its key columns: only the key is read from it); the images decoded in one batch by the
  JSON decoder (decode/json_decode.py), the op and the source's time and position
  joining its table as Arrow columns (they are read from the parsed event, not from JSON);
- Avro (`AvroEnvelopes`): Confluent-framed events decoded by the Avro ingest's decoder
  (decode/avro_decode.py) against the envelope as a table.

So every rule of the format's append ingest holds for the row images (types, widening,
fields the table lacks reported for schema evolution under `after.`/`before.` and told here by
their column's path, dead letters with reasons). Fields of the envelope itself that the change
log does not keep (`source.*` but the time and position, `transaction`, `ts_ms`) are not data
and are not reported.

Then `DebeziumRules`, vectorised over the batch, for every format: c, u and r take the after
image, d the before image; an unknown op, a missing image, or a null where the table requires
a value is a dead letter with the reason; an update whose before and after keys differ records
the before key (the merge deletes it); a source time that is no time is left null.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import LongType, NestedField, StringType, StructType

from streamberg.decode.avro_decode import AvroDecoder
from streamberg.decode.envelopes.source_position import source_identity, source_sequence
from streamberg.decode.interface import DecodeResult, ValueDecoder
from streamberg.decode.json_decode import JsonDecoder
from streamberg.decode.json_values import mask_of
from streamberg.decode.registry import WriterSchemas
from streamberg.decode.required_fields import missing as missing_field
from streamberg.decode.types import Widening
from streamberg.decode.unknown_fields import UnknownField
from streamberg.table_meta.changelog import DELETE, OPS

IMAGES = ("after", "before")
POSITION = "streamberg.position"  # no writer schema has it: an Avro name holds no dot
IDENTITY = "streamberg.identity"  # ... the source it belongs to (source_position.source_identity)
_INT64 = (-(2**63), 2**63)
_OPS = pa.array(sorted(OPS), pa.string())
# source.ts_ms beyond this many ms from the epoch (year ~33,600) is not a time: left null.
_MAX_TS_MS = 10**15


@dataclass
class Changes:
    """A batch's change events read: the row images (in the change log's row columns) and,
    aligned with them, the op, the before key and the source time; the rest accounted."""

    rows: pa.Table
    kept: np.ndarray  # batch indexes of the rows, ascending
    ops: pa.Array
    before_key: pa.Array
    source_ms: pa.Array  # int64 ms, null where unknown
    source_seq: pa.Array  # the source position as ordered text (source_position.py), null where unknown
    source_id: pa.Array  # the source that position belongs to, null where a connector cannot say
    rejected: list[tuple[int, Any]]
    unknown: list[UnknownField]
    skipped: int


def envelope_schema(rows: Sequence[NestedField]) -> Schema:
    """The Debezium envelope as a table: what of it the change log keeps. The images' columns
    are optional here: which an image must hold depends on its op (DebeziumRules)."""
    row = StructType(*(NestedField(f.field_id, f.name, f.field_type, required=False, doc=f.doc) for f in rows))
    return assign_fresh_schema_ids(Schema(
        NestedField(1, "before", row, required=False), NestedField(2, "after", row, required=False),
        NestedField(3, "op", StringType(), required=False),
        NestedField(4, "source", StructType(NestedField(5, "ts_ms", LongType(), required=False),
                                            NestedField(6, POSITION, StringType(), required=False),
                                            NestedField(7, IDENTITY, StringType(), required=False)),
                    required=False)))


# -- each format's envelopes -----------------------------------------------------------------
class AvroEnvelopes(AvroDecoder):
    """Confluent-framed Avro events: the Avro decoder of the envelope, each event's source
    position read from its whole `source` record (whatever fields its connector's schema has)."""

    def _read(self, body: Any, reader: Any, length: int) -> dict:
        record = super()._read(body, reader, length)
        source = record.get("source") if isinstance(record, dict) else None
        if isinstance(source, dict):
            source[POSITION] = source_sequence(source)
            source[IDENTITY] = source_identity(source)
        return record


class JsonEnvelopes:
    """JSON events (bare or in the JsonConverter's wrapper): parsed once, cut to the envelope,
    decoded in one batch by the JSON decoder. Events that are no envelope at all (not JSON, not
    an object) are refused here; every other rule is DebeziumRules'."""

    def __init__(self, schema: Schema, keys: Sequence[str], max_record_bytes: int,
                 epoch_units: Mapping[str, str] | None, unknown: Literal["ignore", "report"]) -> None:
        self.schema, self.keys, self.max_record_bytes = schema, list(keys), max_record_bytes
        units = {f"{image}.{path}": unit for path, unit in (epoch_units or {}).items() for image in IMAGES}
        # Only the images go through the JSON decoder (its rules are for data); the op and the
        # source's time and position are read here, where the cut holds them as Python values
        # the decoder could only accept, and join its table as Arrow columns.
        # The cut event is never longer than the record, but for numbers orjson writes longer.
        self.json = JsonDecoder(schema.select(*IMAGES), 2 * max_record_bytes, units, unknown)
        arrow = schema_to_pyarrow(schema)
        self._op_field, self._source_field = arrow.field("op"), arrow.field("source")

    def _cut(self, value: bytes) -> tuple[bytes, str | None, int | None, Any]:
        """The images as JSON for the decoder; the op, the source time and the source block."""
        if len(value) > self.max_record_bytes:
            raise ValueError(f"oversized: {len(value)} bytes > max_record_bytes {self.max_record_bytes} (record)")
        try:
            event = orjson.loads(value)  # strict JSON at a fifth of the stdlib's time
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"the change event is not JSON ({str(exc)[:120]})") from None
        if isinstance(event, dict) and "payload" in event and "schema" in event:
            event = event["payload"]  # the JsonConverter's schemas.enable wrapper
        if not isinstance(event, dict):
            raise ValueError(f"not a Debezium change event: a JSON {type(event).__name__}, not an object with "
                             "before, after and op")
        op = event.get("op")
        if op is not None and type(op) is not str:
            op = json.dumps(op)[:40]
        before, after = event.get("before"), event.get("after")
        if type(before) is not dict:
            before = None
        elif op != DELETE:
            before = {k: before[k] for k in self.keys if k in before}  # only its key is read
        if type(after) is not dict or op == DELETE:
            after = None
        source = event.get("source")
        ts = source.get("ts_ms") if isinstance(source, dict) else None
        ts = ts if type(ts) is int and _INT64[0] <= ts < _INT64[1] else None
        try:
            return orjson.dumps({"before": before, "after": after}), op, ts, source
        except TypeError as exc:  # an integer past 64 bits: the row's column cannot hold it either
            raise ValueError("the row image holds a value JSON for the table cannot carry "
                             f"({str(exc)[:120]})") from None

    def decode(self, values: list[bytes | None]) -> DecodeResult:
        at: list[int] = []
        cut: list[bytes | None] = []
        ops: list[str | None] = []
        times: list[int | None] = []
        positions: list[str | None] = []
        identities: list[str | None] = []
        rejected: list[tuple[int, Any]] = []
        for i, value in enumerate(values):
            try:
                images, op, ts, source = self._cut(value or b"")
            except ValueError as exc:
                rejected.append((i, str(exc)))
                continue
            cut.append(images)
            ops.append(op)
            times.append(ts)
            positions.append(source_sequence(source))
            identities.append(source_identity(source))
            at.append(i)
        result = self.json.decode(cut)
        index = np.asarray(at, dtype=np.int64)
        for u in result.unknown:
            u.rows = index[u.rows]
        kept = pa.array(result.kept, pa.int64())
        source_type = self._source_field.type
        source = pa.StructArray.from_arrays(
            [pa.array(column, field.type).take(kept) for column, field in
             zip((times, positions, identities), source_type)], fields=list(source_type))
        table = result.table.append_column(self._op_field, pa.array(ops, self._op_field.type).take(kept)) \
            .append_column(self._source_field, source)
        return DecodeResult(table=table, kept=index[result.kept],
                            rejected=sorted(rejected + [(int(index[j]), r) for j, r in result.rejected],
                                            key=lambda r: r[0]), unknown=result.unknown)


# -- the rules, once -------------------------------------------------------------------------
def _row_reason(reason: Any) -> Any:
    """A reason about the envelope, told about the change log: a widening of `after.score`
    widens the column `score`; one elsewhere in the envelope is only a reason."""
    if not isinstance(reason, Widening):
        return reason
    parts = reason.path.split(".", 1)
    if parts[0] not in IMAGES or len(parts) < 2:
        return str(reason)
    also = tuple((p.split(".", 1)[1], t) for p, t in reason.also if p.split(".", 1)[0] in IMAGES and "." in p)
    return Widening(str(reason), parts[1], reason.wider, also)


class DebeziumRules:
    """Reads a batch of Debezium events, through its format's envelope decoder, into row
    images and their facts."""

    def __init__(self, envelopes: ValueDecoder, keys: Sequence[str], required: Sequence[str],
                 row_schema: pa.Schema, key_type: pa.StructType) -> None:
        self.envelopes = envelopes
        self.keys, self.required, self.row_schema, self.key_type = list(keys), list(required), row_schema, key_type

    def read(self, values: list[bytes | None]) -> Changes:
        present = np.asarray([i for i, v in enumerate(values) if v is not None], dtype=np.int64)
        skipped = len(values) - len(present)  # the tombstones after deletes: log compaction's, not changes
        result = self.envelopes.decode([values[int(i)] for i in present])
        rejected: list[tuple[int, Any]] = [(int(present[j]), _row_reason(r)) for j, r in result.rejected]
        env = result.table
        at = present[result.kept]
        n = env.num_rows
        ops = env.column("op").combine_chunks() if n else pa.array([], pa.string())
        after = env.column("after").combine_chunks() if n else pa.nulls(0, env.schema.field("after").type)
        before = env.column("before").combine_chunks() if n else pa.nulls(0, env.schema.field("before").type)
        after_valid = after.is_valid().to_numpy(zero_copy_only=False)
        before_valid = before.is_valid().to_numpy(zero_copy_only=False)
        known = mask_of(pc.is_in(ops, value_set=_OPS))
        deleting = mask_of(pc.equal(ops, DELETE))
        no_image = known & np.where(deleting, ~before_valid, ~after_valid)
        for j in np.flatnonzero(~known).tolist():  # the rare ones, one at a time, for their reasons
            op = ops[j].as_py()
            shown = json.dumps(op)[:40] if op is not None else "none"
            rejected.append((int(at[j]), f"unknown op {shown}: a Debezium change event's op is c, u, d or r"))
        for j in np.flatnonzero(no_image).tolist():
            op = ops[j].as_py()
            which = "before" if op == DELETE else "after"
            rejected.append((int(at[j]), f"op {op} without its {which} image (an object of the row's columns)"))
        chosen = np.flatnonzero(known & ~no_image)
        images = pa.concat_arrays([after, before]).take(pa.array(np.where(deleting[chosen], n + chosen, chosen)))
        is_delete = deleting[chosen]
        good = np.ones(len(chosen), dtype=bool)
        for name in self.keys + [r for r in self.required if r not in self.keys]:
            missing = ~images.field(name).is_valid().to_numpy(zero_copy_only=False)
            if name not in self.keys:
                missing &= ~is_delete  # a delete's image needs only the key
            for k in np.flatnonzero(missing & good):
                rejected.append((int(at[chosen[k]]), missing_field(name)))
            good &= ~missing
        # An update's before image, when it has one, names the key it had: all of it.
        updating = mask_of(pc.equal(ops, "u"))
        has_before = before_valid[chosen] & updating[chosen]
        for name in self.keys:
            missing = has_before & ~before.field(name).is_valid().to_numpy(zero_copy_only=False)[chosen]
            for k in np.flatnonzero(missing & good):
                rejected.append((int(at[chosen[k]]), missing_field(f"before.{name}")))
            good &= ~missing
        chosen_arr = chosen[good]
        images = images.filter(pa.array(good))
        kept = at[chosen_arr]
        rows = pa.Table.from_arrays([images.field(f.name) for f in self.row_schema], schema=self.row_schema)
        index = pa.array(chosen_arr, pa.int64())
        ops_out = ops.take(index)
        if n:
            source = env.column("source").combine_chunks()
            ts = source.field("ts_ms").take(index)
            in_range = pc.less_equal(pc.abs(pc.fill_null(ts, 0)), _MAX_TS_MS)
            source_ms, source_seq = pc.if_else(in_range, ts, None), source.field(POSITION).take(index)
            source_id = source.field(IDENTITY).take(index)
        else:
            source_ms, source_seq = pa.array([], pa.int64()), pa.array([], pa.string())
            source_id = pa.array([], pa.string())
        moved = self._moved(before, after, chosen_arr, updating[chosen_arr])
        return Changes(rows, kept, ops_out, moved, source_ms, source_seq, source_id, rejected,
                       self._unknown(result.unknown, present, kept), skipped)

    @staticmethod
    def _unknown(found: list[UnknownField], present: np.ndarray, kept: np.ndarray) -> list[UnknownField]:
        """Fields the images carry and the row lacks, by their column's path, for kept rows."""
        unknown: dict[tuple[str, ...], UnknownField] = {}
        for u in found:
            if u.path[0] not in IMAGES or len(u.path) < 2:
                continue  # the envelope's own fields: not data
            rows_of = np.intersect1d(present[u.rows], kept)
            if not len(rows_of):
                continue
            path = u.path[1:]
            seen = unknown.get(path)
            unknown[path] = UnknownField(path, u.type, rows_of if seen is None else np.union1d(seen.rows, rows_of))
        return list(unknown.values())

    def _moved(self, before: pa.StructArray, after: pa.StructArray, chosen: np.ndarray,
               updates: np.ndarray) -> pa.Array:
        """The before key of each update that changed the key, null elsewhere."""
        index = pa.array(chosen, pa.int64())
        old = [before.field(k).take(index) for k in self.keys]
        new = [after.field(k).take(index) for k in self.keys]
        changed = np.zeros(len(chosen), dtype=bool)
        for o, w in zip(old, new):
            changed |= mask_of(pc.not_equal(o, w))
        changed &= updates
        # Built in the change log's exact type: a struct with null entries over required
        # children cannot be cast to it (its children hold nulls only under null entries).
        return pa.StructArray.from_arrays(old, fields=list(self.key_type), mask=pa.array(~changed))


def _avro(schema: Schema, keys: Sequence[str], max_record_bytes: int, epoch_units: Mapping[str, str] | None,
          unknown: Literal["ignore", "report"], registry: WriterSchemas | None) -> ValueDecoder:
    assert registry is not None  # formats.format_of gives one with a registry format
    return AvroEnvelopes(schema, max_record_bytes, registry, unknown)


def _json(schema: Schema, keys: Sequence[str], max_record_bytes: int, epoch_units: Mapping[str, str] | None,
          unknown: Literal["ignore", "report"], registry: WriterSchemas | None) -> ValueDecoder:
    return JsonEnvelopes(schema, keys, max_record_bytes, epoch_units, unknown)


# value format -> its envelope decoder: reading Debezium in another format is one entry here.
ENVELOPE_READERS: dict[str, Callable[..., ValueDecoder]] = {"json": _json, "avro": _avro}


def debezium_rules(fmt_name: str, rows: Sequence[NestedField], keys: Sequence[str], required: Sequence[str],
                   row_schema: pa.Schema, key_type: pa.StructType, max_record_bytes: int,
                   epoch_units: Mapping[str, str] | None, unknown: Literal["ignore", "report"],
                   registry: WriterSchemas | None) -> DebeziumRules:
    """The rules over the envelope decoder of the value format `fmt_name`."""
    envelopes = ENVELOPE_READERS[fmt_name](envelope_schema(rows), keys, max_record_bytes, epoch_units, unknown,
                                           registry)
    return DebeziumRules(envelopes, keys, required, row_schema, key_type)
