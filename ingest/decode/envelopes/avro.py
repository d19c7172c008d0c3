"""Debezium change events in Confluent-framed Avro (kafka.envelope debezium with
kafka.value_format avro), read into the change log's rows.

The events are decoded by the registry-format decoder (ingest/decode/avro_decode.py: the header by
confluent-kafka's SchemaId, the writer schema from the registry, the body by fastavro)
against the envelope as a table: `before` and `after` of the change log's row type, `op`,
and `source.ts_ms`. So every rule of the Avro ingest holds for the row images: a writer
schema's Value record is matched with the change log once, fields it adds are reported for
schema evolution (under `after.`/`before.`, reported here by their column's path), wider
types widen the column, contradicting ones dead-letter the schema's records with both types.
Fields of the envelope itself that the change log does not keep (`source.*` but `ts_ms`,
`transaction`, `ts_ms`) are not data and are not reported.

Then per event, vectorised over the batch: c, u and r take the after image, d the before
image; an unknown op, a missing image, or a null where the table requires a value is a dead
letter with the reason; an update whose before and after keys differ records the before key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import LongType, NestedField, StringType, StructType

from streamberg.common.changelog import DELETE, OPS
from streamberg.ingest.decode.avro_decode import AvroDecoder
from streamberg.ingest.decode.envelopes.source_position import source_sequence
from streamberg.ingest.decode.registry import WriterSchemas
from streamberg.ingest.decode.required_fields import missing as missing_field
from streamberg.ingest.decode.types import Widening
from streamberg.ingest.decode.unknown_fields import UnknownField

IMAGES = ("after", "before")
POSITION = "streamberg.position"


@dataclass
class Changes:
    """A batch's change events read: the row images (in the change log's row columns) and,
    aligned with them, the op, the before key and the source time; the rest accounted."""

    rows: pa.Table
    kept: np.ndarray  # batch indexes of the rows, ascending
    ops: pa.Array
    before_key: pa.Array
    source_ms: pa.Array  # int64 ms, null where unknown
    source_seq: pa.Array  # the source position as ordered text (ingest/decode/envelopes/source_position.py), null where unknown
    rejected: list[tuple[int, Any]]
    unknown: list[UnknownField]
    skipped: int


def envelope_schema(rows: Sequence[NestedField]) -> Schema:
    """The Debezium envelope as a table: what of it the change log keeps."""
    row = StructType(*rows)
    return assign_fresh_schema_ids(Schema(
        NestedField(1, "before", row, required=False), NestedField(2, "after", row, required=False),
        NestedField(3, "op", StringType(), required=False),
        NestedField(4, "source", StructType(NestedField(5, "ts_ms", LongType(), required=False),
                                            NestedField(6, POSITION, StringType(), required=False)),
                    required=False)))


class _EnvelopeReader(AvroDecoder):
    """The Avro decoder of envelopes: each event's source position is read from its whole
    `source` record (whatever fields and types its connector's schema has) into the one
    synthetic field POSITION, which no writer schema can have (an Avro name has no dot)."""

    def _read(self, body: Any, reader: Any, length: int) -> dict:
        record = super()._read(body, reader, length)
        source = record.get("source") if isinstance(record, dict) else None
        if isinstance(source, dict):
            source[POSITION] = source_sequence(source)
        return record


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


class AvroChanges:
    """Reads a batch of Confluent-framed Debezium events into row images and their facts."""

    def __init__(self, rows: Sequence[NestedField], keys: Sequence[str], required: Sequence[str],
                 row_schema: pa.Schema, key_type: pa.StructType, max_record_bytes: int, registry: WriterSchemas,
                 unknown: str = "report") -> None:
        self.envelopes = _EnvelopeReader(envelope_schema(rows), max_record_bytes, registry,
                                     "report" if unknown == "report" else "ignore")
        self.keys, self.required, self.row_schema, self.key_type = list(keys), list(required), row_schema, key_type

    def read(self, values: list[bytes | None]) -> Changes:
        present = np.asarray([i for i, v in enumerate(values) if v is not None], dtype=np.int64)
        skipped = len(values) - len(present)  # the tombstones after deletes
        result = self.envelopes.decode([values[int(i)] for i in present])
        rejected: list[tuple[int, Any]] = [(int(present[j]), _row_reason(r)) for j, r in result.rejected]
        env = result.table
        at = present[result.kept]
        n = env.num_rows
        ops = env.column("op").to_pylist()
        after = env.column("after").combine_chunks() if n else pa.nulls(0, env.schema.field("after").type)
        before = env.column("before").combine_chunks() if n else pa.nulls(0, env.schema.field("before").type)
        after_valid = after.is_valid().to_numpy(zero_copy_only=False)
        before_valid = before.is_valid().to_numpy(zero_copy_only=False)
        take: list[int] = []
        chosen: list[int] = []
        for j, op in enumerate(ops):
            if op not in OPS:
                rejected.append((int(at[j]), f"unknown op {op!r}: a Debezium change event's op is c, u, d or r"))
            elif op == DELETE and not before_valid[j]:
                rejected.append((int(at[j]), "op d without its before image (an object of the row's columns)"))
            elif op != DELETE and not after_valid[j]:
                rejected.append((int(at[j]), f"op {op} without its after image (an object of the row's columns)"))
            else:
                take.append(n + j if op == DELETE else j)
                chosen.append(j)
        images = pa.concat_arrays([after, before]).take(pa.array(take, pa.int64()))
        is_delete = np.asarray([ops[j] == DELETE for j in chosen], dtype=bool)
        good = np.ones(len(chosen), dtype=bool)
        for name in self.keys + self.required:
            missing = ~images.field(name).is_valid().to_numpy(zero_copy_only=False)
            if name not in self.keys:
                missing &= ~is_delete  # a delete's image needs only the key
            for k in np.flatnonzero(missing & good):
                rejected.append((int(at[chosen[k]]), missing_field(name)))
            good &= ~missing
        chosen_arr = np.asarray(chosen, dtype=np.int64)[good]
        images = images.filter(pa.array(good))
        kept = at[chosen_arr]
        rows = pa.Table.from_arrays([images.field(f.name) for f in self.row_schema], schema=self.row_schema)
        ops_out = pa.array([ops[int(j)] for j in chosen_arr], pa.string())
        source = env.column("source").combine_chunks() if n else None
        source_ms = (source.field("ts_ms").take(pa.array(chosen_arr)) if source is not None
                     else pa.array([], pa.int64()))
        source_seq = (source.field(POSITION).take(pa.array(chosen_arr)) if source is not None
                      else pa.array([], pa.string()))
        moved = self._moved(before, after, chosen_arr, ops_out)
        kept_set = set(kept.tolist())
        unknown: dict[tuple[str, ...], UnknownField] = {}
        for u in result.unknown:
            if u.path[0] not in IMAGES or len(u.path) < 2:
                continue  # the envelope's own fields: not data
            rows_of = np.asarray([r for r in present[u.rows].tolist() if r in kept_set], dtype=np.int64)
            if not len(rows_of):
                continue
            path = u.path[1:]
            seen = unknown.get(path)
            unknown[path] = UnknownField(path, u.type, rows_of if seen is None else np.union1d(seen.rows, rows_of))
        return Changes(rows, kept, ops_out, moved, source_ms, source_seq, rejected, list(unknown.values()), skipped)

    def _moved(self, before: pa.StructArray, after: pa.StructArray, chosen: np.ndarray, ops: pa.Array) -> pa.Array:
        """The before key of each update that changed the key, null elsewhere."""
        index = pa.array(chosen, pa.int64())
        old = [before.field(k).take(index) for k in self.keys]
        new = [after.field(k).take(index) for k in self.keys]
        changed = np.zeros(len(chosen), dtype=bool)
        for o, w in zip(old, new):
            differs = pc.fill_null(pc.not_equal(o, w), False).to_numpy(zero_copy_only=False)
            changed |= differs & o.is_valid().to_numpy(zero_copy_only=False)
        changed &= np.asarray([op == "u" for op in ops.to_pylist()], dtype=bool)
        # Built in the change log's exact type: a struct with null entries over required
        # children cannot be cast to it (its children hold nulls only under null entries).
        return pa.StructArray.from_arrays(old, fields=list(self.key_type), mask=pa.array(~changed))
