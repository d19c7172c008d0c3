"""What every registry-framed value format shares: one writer schema matched with the table
once, a batch read record by record, and the rows built in the table's Arrow schema.

Confluent's wire format starts every value with magic byte 0 and the writer schema's 4-byte
id (Protobuf adds the message indexes); confluent-kafka's own `SchemaId` reads that header.
A format (decode/avro_decode.py, decode/protobuf_decode.py) says only what differs, as a
template method:
- `_writer`: the writer schema of a header, as an Iceberg schema and the format's reader;
- `_read`: one record's body as a row (a dict in the table's shape).

Against the table, each writer schema is looked at once (`_Fit`): its fields at every depth
are matched with the table's by name, and
- a field the table lacks is reported as unknown, typed from the writer schema (schema
  evolution adds it, ingest/evolution.py, or counts it);
- a writer type the table's column takes as it comes (int -> long, float -> double, an
  integer -> double, a decimal of less precision) is read as it is;
- a wider writer type Iceberg can widen the column to (long over int, double over float, a
  decimal of more precision) holds the records with a Widening reason naming every such
  column (decode/json_values.py), which the committer widens in one commit;
- any other difference dead-letters the schema's records with both types named.

Records whose bytes are not the format (another magic byte, a header cut short, a body the
reader refuses) are dead-lettered with the reason. Every record ends up in the table or in
`rejected`; only a registry that cannot answer stops the decoder (and the job, which then
re-reads the records after a restart).
"""

from __future__ import annotations

import io
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType, ListType, MapType, NestedField, PrimitiveType, StructType

from streamberg.common.errors import RegistryUnavailable, SchemaNotFound
from streamberg.common.schema_pairs import PairVisitor, walk_pair
from streamberg.decode.interface import DecodeResult
from streamberg.decode.registry import WriterSchemas
from streamberg.decode.required_fields import missing as missing_field
from streamberg.decode.required_fields import missing_required
from streamberg.decode.types import Widening, readable_as, widens
from streamberg.decode.unknown_fields import Path, UnknownField, display

FitKey = tuple[int, tuple[int, ...]]  # (schema id, Protobuf's message indexes or ())
MAX_FITS = 256  # writer schemas (with their message indexes) judged and kept per decoder


@dataclass
class _Fit:
    """How one writer schema's records fit the table."""

    reader: Any = None  # the format's reader for the writer schema
    refusal: str | None = None  # every record of the schema is refused with it
    widen: Widening | None = None  # ... or held for wider columns
    unknown: list[tuple[Path, IcebergType]] = field(default_factory=list)


class RegistryDecoder:
    """Decodes Confluent-framed values against an Iceberg schema (the JsonDecoder's API)."""

    FORMAT = ""  # "AVRO" or "PROTOBUF": confluent-kafka's schema type, read by its SchemaId
    NAME = ""  # as reasons say it

    def __init__(self, schema: Schema, max_record_bytes: int, registry: WriterSchemas,
                 unknown: Literal["ignore", "report"] = "ignore", wrap: str | None = None) -> None:
        # `wrap`: the records are Kafka keys, each the one field `wrap` of a row (the key
        # column; RecordDecoder with kafka.key_format: value), of whatever type its writer
        # schema has.
        self.wrap = wrap
        self.schema = schema
        self.file_schema = schema_to_pyarrow(schema)
        self.max_record_bytes = max_record_bytes
        self.registry = registry
        self.report_unknown = unknown == "report"
        # Writer schemas judged, least recently used first: bounded, since a hostile stream can
        # name a new Protobuf message-index tuple in every record (each a descriptor pool).
        self._fits: OrderedDict[FitKey, _Fit] = OrderedDict()
        # Headers seen (their bytes -> (fit key, length)): most records of a topic share a
        # few, so SchemaId reads each once. Confluent headers are prefix-free (a magic byte,
        # 4 or 16 bytes, then complete varints), so a known header that starts a value is
        # exactly its header.
        self._headers: dict[bytes, tuple[FitKey, int]] = {}
        self._header_lengths: list[int] = []

    # -- what a format says ----------------------------------------------------------------
    def _writer(self, key: FitKey) -> tuple[IcebergType, Any]:
        """(the writer schema as an Iceberg type: a struct, or any type when `wrap` is set;
        the format's reader for it); any exception refuses the schema's records with its
        message."""
        raise NotImplementedError

    def _read(self, body: io.BytesIO, reader: Any, length: int) -> dict:
        """One record's body as a row; any exception refuses the record with its message."""
        raise NotImplementedError

    # -- one writer schema against the table -------------------------------------------
    def _fit(self, key: FitKey) -> _Fit:
        fit = self._fits.get(key)
        if fit is None:
            fit = self._fits[key] = self._judge(key)
            while len(self._fits) > MAX_FITS:
                self._fits.popitem(last=False)
        else:
            self._fits.move_to_end(key)
        return fit

    def _judge(self, key: FitKey) -> _Fit:
        fit = _Fit()
        try:
            writer, fit.reader = self._writer(key)
        except RegistryUnavailable:
            raise  # the registry's fault, not the records': they stay in Kafka
        except SchemaNotFound as exc:  # on_unknown_schema: dead-letter
            fit.refusal = f"writer schema id {key[0]} is unknown to the registry: {exc}"[:400]
            return fit
        except Exception as exc:  # noqa: BLE001 - whatever the registry answered, its records are refused, not the job
            fit.refusal = f"writer schema id {key[0]} has no table form: {type(exc).__name__}: {exc}"[:300]
            return fit
        if self.wrap is not None:
            writer = StructType(NestedField(1, self.wrap, writer, required=False))
        walk_pair(_WriterAgainstTable(key[0], fit), writer, self.schema)
        return fit

    # -- a batch -----------------------------------------------------------------------------
    def decode(self, values: list[bytes | None]) -> DecodeResult:
        from confluent_kafka.schema_registry.common.serde import SchemaId

        rejected: list[tuple[int, str]] = []
        rows: list[dict] = []
        kept: list[int] = []
        by_schema: dict[FitKey, list[int]] = {}
        used: dict[FitKey, _Fit] = {}  # this batch's fits (the cache may drop one meanwhile)
        for i, value in enumerate(values):
            if value is None:
                rejected.append((i, "null value (tombstone)"))
                continue
            if len(value) > self.max_record_bytes:
                rejected.append((i, f"oversized: {len(value)} bytes > max_record_bytes {self.max_record_bytes}"))
                continue
            known = None
            for n in self._header_lengths:
                known = self._headers.get(value[:n])
                if known is not None:
                    break
            if known is not None:
                key, length = known
                body = io.BytesIO(value)
                body.seek(length)
            else:
                header = SchemaId(self.FORMAT)
                try:
                    body = header.from_bytes(io.BytesIO(value))
                except Exception as exc:  # noqa: BLE001 - any framing fault is the record's
                    rejected.append((i, f"not Confluent {self.NAME}: {_framing(value, exc)}"))
                    continue
                if header.id is None:
                    rejected.append((i, f"not Confluent {self.NAME} with a schema id: a GUID-framed record "
                                        "(magic byte 1)"))
                    continue
                key = (header.id, tuple(header.message_indexes or ()))
                self._remember(value[:body.tell()], key)
            fit = used[key] = self._fit(key)
            if fit.refusal is not None or fit.widen is not None:
                rejected.append((i, fit.refusal if fit.refusal is not None else fit.widen))
                continue
            try:
                record = self._read(body, fit.reader, len(value))
                if self.wrap is not None:
                    record = {self.wrap: record}
            except Exception as exc:  # noqa: BLE001 - bytes the reader cannot read for the schema
                rejected.append((i, f"not valid {self.NAME} for writer schema id {key[0]}: {type(exc).__name__}: "
                                    f"{str(exc)[:200]}"))
                continue
            rows.append(record)
            kept.append(i)
            by_schema.setdefault(key, []).append(i)
        table, kept_index, refused = self._arrow(rows, np.asarray(kept, dtype=np.int64))
        rejected.extend(refused)
        rejected.sort()
        unknown: list[UnknownField] = []
        if self.report_unknown:
            kept_set = set(kept_index.tolist())
            for key, members in by_schema.items():
                carried = np.asarray([m for m in members if m in kept_set], dtype=np.int64)
                for path, t in used[key].unknown:
                    if len(carried):
                        unknown.append(UnknownField(path, t, carried))
        return DecodeResult(table=table, kept=kept_index, rejected=rejected, unknown=unknown)

    def _remember(self, header: bytes, key: FitKey) -> None:
        if len(self._headers) < 1024:  # a bound on what hostile headers can fill
            self._headers[header] = (key, len(header))
            if len(header) not in self._header_lengths:
                self._header_lengths.append(len(header))

    def _arrow(self, rows: list[dict], kept: np.ndarray) -> tuple[pa.Table, np.ndarray, list[tuple[int, str]]]:
        """The rows in the table's Arrow schema; a row that does not convert (a value out of
        its column's range) or lacks a required field at any depth is refused alone."""
        refused: list[tuple[int, str]] = []
        try:
            table = pa.Table.from_pylist(rows, schema=self.file_schema)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            good = []
            for row, index in zip(rows, kept):
                try:
                    pa.Table.from_pylist([row], schema=self.file_schema)
                    good.append(index)
                except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
                    refused.append((int(index), f"a value does not fit the table's column: {type(exc).__name__}: "
                                                f"{str(exc)[:200]}"))
            keep = np.isin(kept, good)
            rows, kept = [r for r, k in zip(rows, keep) if k], kept[keep]
            table = pa.Table.from_pylist(rows, schema=self.file_schema)
        missing = missing_required(table, self.schema)
        if not missing:
            return table, kept, refused
        refused += [(int(kept[j]), missing_field(path)) for j, path in sorted(missing.items())]
        keep = np.ones(len(kept), dtype=bool)
        keep[list(missing)] = False
        return table.filter(pa.array(keep)), kept[keep], refused



class _WriterAgainstTable(PairVisitor):
    """A writer schema visited with the table's fields as partners (common/schema_pairs.py),
    its judgement kept in the fit: the first refusal, the widenings, the fields the table lacks."""

    def __init__(self, schema_id: int, fit: _Fit) -> None:
        super().__init__()
        self.schema_id, self.fit = schema_id, fit

    def _refuse(self, reason: str) -> None:
        if self.fit.refusal is None:
            self.fit.refusal = reason

    def _differs(self, writer: IcebergType, table: IcebergType) -> None:
        self._refuse(f"field {display(self.parts())!r}: the writer schema (id {self.schema_id}) has {writer} where "
                     f"the table has {table}")

    def struct(self, struct: StructType, struct_partner: NestedField | None, field_results: list[None]) -> None:
        if struct_partner is None:
            return
        table = struct_partner.field_type
        if not isinstance(table, StructType):
            self._differs(struct, table)
            return
        path = self.parts()
        theirs = {f.name for f in table.fields}
        self.fit.unknown += [((*path, f.name), f.field_type) for f in struct.fields if f.name not in theirs]
        mine = {f.name for f in struct.fields}
        for f in table.fields:
            if f.required and f.name not in mine:
                self._refuse(missing_field(display((*path, f.name)), f"writer schema id {self.schema_id} lacks it"))

    def list(self, list_type: ListType, list_partner: NestedField | None, element_result: None) -> None:
        if list_partner is not None and not isinstance(list_partner.field_type, ListType):
            self._differs(list_type, list_partner.field_type)

    def map(self, map_type: MapType, map_partner: NestedField | None, key_result: None, value_result: None) -> None:
        if map_partner is None:
            return
        table = map_partner.field_type
        if not isinstance(table, MapType):
            self._differs(map_type, table)
        elif not readable_as(map_type.key_type, table.key_type):
            self._refuse(f"field {display(self.parts())!r}: the writer schema (id {self.schema_id}) has map keys of "
                         f"{map_type.key_type} where the table has {table.key_type}")

    def primitive(self, primitive: PrimitiveType, primitive_partner: NestedField | None) -> None:
        if primitive_partner is None or (self.path and self.path[-1] == ("key", False)):
            return  # a field the table lacks (its struct reports it); a map's key (its map judges it)
        table = primitive_partner.field_type
        if readable_as(primitive, table):
            return
        if not widens(table, primitive):
            self._differs(primitive, table)
            return
        # Every column this writer schema needs wider goes in the one reason: the committer
        # widens them all in the same commit.
        dotted = ".".join(name for name, is_field in self.path if is_field or name != "element")
        widen = self.fit.widen
        if widen is None:
            self.fit.widen = Widening(f"field {display(self.parts())!r}: the writer schema (id {self.schema_id}) "
                                      f"has {primitive} where the table has {table}", dotted, primitive)
        else:
            self.fit.widen = Widening(str(widen), widen.path, widen.wider, (*widen.also, (dotted, primitive)))


def _framing(value: bytes, exc: Exception) -> str:
    if not value:
        return "an empty value"
    if value[0] not in (0, 1):
        return f"magic byte {value[0]} (a Confluent-framed record starts with 0)"
    return f"the header is cut short ({len(value)} bytes; {type(exc).__name__})"
