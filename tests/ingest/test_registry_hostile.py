"""The registry formats under hostile writer schemas and records: required fields at every
depth, Avro names resolved by the specification, decimals past Iceberg's precision, schema
bombs, unbounded field names, unknown schema ids, and the Protobuf fit cache.

Records are written by confluent-kafka's real serializers through the registry stand-in
(tests/fixtures/registry.py: no registry server is installable here) and decoded by the
ingest's decoders; the schema-evolution case runs the real writer and committer.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from streamberg.common.catalog import load_catalog
from streamberg.common.config import StreambergConfig
from streamberg.common.config.sections import SchemaRegistryConfig
from streamberg.common.errors import RegistryUnavailable, UnsupportedSchemaError
from streamberg.common.schema import schema_from_config
from streamberg.decode.avro_decode import AvroDecoder
from streamberg.decode.avro_schema import iceberg_schema
from streamberg.decode.envelopes import record_decoder
from streamberg.decode.registry import WriterSchemas
from streamberg.decode.registry_decode import MAX_FITS
from streamberg.table_meta.changelog import changelog_config
from tests.helpers import account_for_every_record, config_at, dead_letters, write_config
from tests.runbooks.inprocess import ingest_until, produce_values


def _serialize(url: str, schema: dict, records: list[dict], topic: str = "t") -> list[bytes]:
    serializer = AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(schema))
    context = SerializationContext(topic, MessageField.VALUE)
    return [serializer(r, context) for r in records]


def _registry(url: str, **settings) -> WriterSchemas:
    return WriterSchemas(SchemaRegistryConfig(url=url, retries=0, **settings))


ADDR = {"type": "record", "name": "Row", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "addr", "type": ["null", {"type": "record", "name": "Addr", "fields": [
        {"name": "zip", "type": ["null", "string"], "default": None}]}], "default": None}]}


def test_required_nested_fields_refuse_their_record(registry) -> None:
    # The table holds addr.zip required; the writer's is optional, and one record leaves it null.
    table = iceberg_schema({**ADDR, "fields": [ADDR["fields"][0], {"name": "addr", "type": ["null", {
        "type": "record", "name": "Addr", "fields": [{"name": "zip", "type": "string"}]}], "default": None}]})
    values = _serialize(registry.url, ADDR, [{"id": 1, "addr": {"zip": "1011"}}, {"id": 2, "addr": {"zip": None}},
                                             {"id": 3, "addr": None}])
    result = AvroDecoder(table, 1 << 16, _registry(registry.url)).decode(values)
    assert result.kept.tolist() == [0, 2]
    assert result.rejected == [(1, "missing required field 'addr.zip'")]
    assert result.table.to_pylist() == [{"id": 1, "addr": {"zip": "1011"}}, {"id": 3, "addr": None}]


def test_a_debezium_before_key_with_a_null_part_is_refused(registry) -> None:
    value = {"type": "record", "name": "Value", "namespace": "db.t", "fields": [
        {"name": "a", "type": "long"}, {"name": "b", "type": ["null", "long"], "default": None},
        {"name": "name", "type": ["null", "string"], "default": None}]}
    envelope = {"type": "record", "name": "Envelope", "namespace": "db.t", "fields": [
        {"name": "before", "type": ["null", value], "default": None},
        {"name": "after", "type": ["null", "db.t.Value"], "default": None},
        {"name": "source", "type": {"type": "record", "name": "Source", "fields": [
            {"name": "connector", "type": "string"}, {"name": "ts_ms", "type": "long"},
            {"name": "lsn", "type": ["null", "long"], "default": None},
            {"name": "sequence", "type": ["null", "string"], "default": None}]}},
        {"name": "op", "type": "string"}]}
    config = StreambergConfig(
        kafka={"topic": "t", "envelope": "debezium", "value_format": "avro", "schema_registry": {"url": registry.url}},
        table={"identifier": "db.t", "primary_key": ["a", "b"], "schema": [
            {"name": "a", "type": "long", "required": True}, {"name": "b", "type": "long", "required": True},
            {"name": "name", "type": "string"}]})
    view = changelog_config(config)
    decoder = record_decoder(view, schema_from_config(view.table))
    source = {"connector": "postgresql", "ts_ms": 5, "lsn": 20, "sequence": '["10", "20"]'}
    events = [
        {"before": {"a": 1, "b": None, "name": "x"}, "after": {"a": 2, "b": 5, "name": "y"}, "op": "u", "source": source},
        {"before": {"a": 1, "b": 4, "name": "x"}, "after": {"a": 2, "b": 5, "name": "y"}, "op": "u", "source": source},
    ]
    values = _serialize(registry.url, envelope, events)
    result = decoder.decode(values, None, ([0, 0], [10, 11]))
    assert result.kept.tolist() == [1], result.rejected
    assert result.rejected == [(0, "missing required field 'before.b'")]
    row = result.table.to_pylist()[0]
    assert row["_before_key"] == {"a": 1, "b": 4} and row["_source_seq"] is not None


def test_avro_names_resolve_as_the_specification_says() -> None:
    # A reference by full name to a record that inherited its namespace.
    inherited = {"type": "record", "name": "Outer", "namespace": "com.a", "fields": [
        {"name": "first", "type": {"type": "record", "name": "Inner", "fields": [{"name": "v", "type": "int"}]}},
        {"name": "second", "type": "com.a.Inner"}, {"name": "third", "type": "Inner"}]}
    schema = iceberg_schema(inherited)
    assert [f.name for f in schema.fields] == ["first", "second", "third"]
    assert all(schema.find_field(f"{n}.v") is not None for n in ("first", "second", "third"))
    # `Addr` in two namespaces: each reference finds its own.
    two = {"type": "record", "name": "R", "namespace": "x", "fields": [
        {"name": "home", "type": {"type": "record", "name": "Addr", "namespace": "p", "fields": [
            {"name": "street", "type": "string"}]}},
        {"name": "work", "type": {"type": "record", "name": "Addr", "namespace": "q", "fields": [
            {"name": "city", "type": "string"}, {"name": "zip", "type": "string"}]}},
        {"name": "again", "type": "q.Addr"}, {"name": "other", "type": "p.Addr"}]}
    schema = iceberg_schema(two)
    assert [f.name for f in schema.find_field("again").field_type.fields] == ["city", "zip"]
    assert [f.name for f in schema.find_field("other").field_type.fields] == ["street"]
    with pytest.raises(UnsupportedSchemaError, match="not a valid schema"):
        iceberg_schema({"type": "record", "name": "R", "fields": [{"name": "a", "type": "Missing"}]})


def test_a_decimal_past_38_digits_is_a_dead_letter_not_a_widening(registry) -> None:
    table = iceberg_schema({"type": "record", "name": "P", "fields": [
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}}]})
    wide = {"type": "record", "name": "P", "fields": [
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2}}]}
    from decimal import Decimal
    values = _serialize(registry.url, wide, [{"price": Decimal("1.25")}])
    result = AvroDecoder(table, 1 << 16, _registry(registry.url)).decode(values)
    assert not result.kept.size and len(result.rejected) == 1
    reason = result.rejected[0][1]
    assert isinstance(reason, str) and "decimal(40,2)" in reason and "1 to 38" in reason, reason


def _avro_bomb(levels: int = 14) -> dict:
    """Each record holds three fields of the previous one (defined once, then named): 3^14
    (4.8 million) leaves once expanded, from a schema of about two kilobytes, nested 15 deep
    (within the depth bound: the field count is what refuses it)."""
    record: dict = {"type": "record", "name": "L0", "fields": [{"name": "leaf", "type": "int"}]}
    for level in range(1, levels + 1):
        record = {"type": "record", "name": f"L{level}", "fields": [
            {"name": "a", "type": record}, {"name": "b", "type": f"L{level - 1}"}, {"name": "c", "type": f"L{level - 1}"}]}
    return record


def test_schema_bombs_are_refused_before_they_expand() -> None:
    bomb = _avro_bomb()
    assert len(json.dumps(bomb)) < 3_000
    started = time.process_time()
    with pytest.raises(UnsupportedSchemaError, match="10,000 fields"):
        iceberg_schema(bomb)
    # Not a timing assertion on the machine: a refusal after expanding would take minutes and
    # gigabytes; the bound is checked on the named types' own sizes.
    assert time.process_time() - started < 30


def test_protobuf_schema_bombs_are_refused_before_they_expand() -> None:
    from google.protobuf import descriptor_pb2
    from google.protobuf.descriptor_pool import DescriptorPool

    from streamberg.decode.protobuf_schema import iceberg_schema as protobuf_schema

    file = descriptor_pb2.FileDescriptorProto(name="bomb.proto", package="b", syntax="proto3")
    F = descriptor_pb2.FieldDescriptorProto
    previous = None
    for level in range(20):
        message = file.message_type.add(name=f"L{level}")
        if previous is None:
            message.field.add(name="leaf", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
        else:
            for number, name in enumerate(("a", "b", "c"), start=1):
                message.field.add(name=name, number=number, type=F.TYPE_MESSAGE, type_name=f".b.{previous}",
                                  label=F.LABEL_OPTIONAL)
        previous = message.name
    pool = DescriptorPool()
    pool.Add(file)
    with pytest.raises(UnsupportedSchemaError, match="fields"):
        protobuf_schema(pool.FindMessageTypeByName(f"b.{previous}"))


def test_unknown_schema_ids_fail_or_dead_letter_as_configured(registry) -> None:
    table = iceberg_schema(ADDR)
    known = _serialize(registry.url, ADDR, [{"id": 1, "addr": None}])
    unknown = b"\x00" + struct.pack(">I", 999_999) + b"\x02"
    with pytest.raises(RegistryUnavailable):
        AvroDecoder(table, 1 << 16, _registry(registry.url)).decode(known + [unknown])
    decoder = AvroDecoder(table, 1 << 16, _registry(registry.url, on_unknown_schema="dead-letter"))
    result = decoder.decode(known + [unknown, unknown])
    assert result.kept.tolist() == [0]
    assert [i for i, _ in result.rejected] == [1, 2]
    assert all("999999" in reason and "unknown to the registry" in reason for _, reason in result.rejected)
    registry.down = True  # an outage is retried and stops, whatever on_unknown_schema says
    try:
        with pytest.raises(RegistryUnavailable):
            AvroDecoder(table, 1 << 16, _registry(registry.url, on_unknown_schema="dead-letter")).decode(known)
    finally:
        registry.down = False


def test_the_protobuf_fit_cache_is_bounded(registry) -> None:
    import base64

    from streamberg.decode.protobuf_decode import ProtobufDecoder
    from streamberg.decode.protobuf_schema import file_descriptor_proto

    schema = iceberg_schema(ADDR)
    text = base64.b64encode(file_descriptor_proto(schema).SerializeToString()).decode()
    schema_id = registry.register("pb-value", text, "PROTOBUF")
    decoder = ProtobufDecoder(schema, 1 << 16, _registry(registry.url))
    seen = {"kept": 0, "rejected": 0}
    # Each record names another message-index tuple (a varint count, then the indexes).
    batch = [b"\x00" + struct.pack(">I", schema_id) + bytes([2, 2 * (i % 64), 2 * (i // 64)]) for i in range(600)]
    account_for_every_record(decoder.decode(batch), len(batch), seen)
    assert len(decoder._fits) <= MAX_FITS and seen["rejected"] == len(batch)


def test_long_field_names_never_reach_the_metadata(tmp_path: Path, broker: str) -> None:
    config = config_at(write_config(tmp_path, broker, ingest={"parallelism": 1}))
    long_name = "f" * 100_000
    ends = 0
    for _ in range(5):
        values = [json.dumps({"id": i, "ts": "2026-11-22T01:00:00+00:00", "user_id": "u", "city": "c",
                              "amount": 1.5, long_name: 1}).encode() for i in range(ends, ends + 10)]
        produce_values(config, values, 0, 1)
        ends += 10
        ingest_until(config, {0: ends})
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    metadata = Path(table.metadata_location.removeprefix("file://"))
    assert metadata.stat().st_size < 100_000, metadata.stat().st_size
    assert all(len(f.name) <= 128 for f in table.schema().fields)
    reasons = [d["reason"] for d in dead_letters(config).to_pylist()]
    assert len(reasons) == 50 and all(len(r) < 1_000 and "100,000 characters" in r for r in reasons), reasons[:1]


def test_logical_types_read_raw_equal_their_values(registry) -> None:
    """Dates, times, timestamps and uuids are read as the numbers (text) on the wire and
    given to Arrow as they are (decode/avro_decode.py RAW_LOGICAL_TYPES): the rows
    equal the values the records were written with, edges of the ranges included; a
    timestamp past a Python datetime's range (year 9999) is kept exactly, as Iceberg's
    64-bit microseconds hold it (fastavro's datetime made it a dead letter)."""
    import datetime as dt
    import uuid

    utc = dt.timezone.utc
    schema = {"type": "record", "name": "Times", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local", "type": ["null", {"type": "long", "logicalType": "local-timestamp-micros"}], "default": None},
        {"name": "ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "key", "type": {"type": "string", "logicalType": "uuid"}}]}
    instants = [dt.datetime(1970, 1, 1, tzinfo=utc), dt.datetime(1, 1, 1, tzinfo=utc),
                dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=utc), dt.datetime(2026, 11, 27, 13, 5, 7, 123456, tzinfo=utc),
                dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=utc)]
    records = [{"id": i, "day": ts.date(), "at": ts.timetz().replace(tzinfo=None), "ts": ts,
                "local": ts.replace(tzinfo=None) if i % 2 else None, "ms": ts.replace(microsecond=ts.microsecond // 1000 * 1000),
                "key": str(uuid.UUID(int=i * 7919))} for i, ts in enumerate(instants)]
    values = _serialize(registry.url, schema, records)
    result = AvroDecoder(iceberg_schema(schema), 1 << 16, _registry(registry.url)).decode(values)
    assert result.rejected == [] and result.kept.tolist() == list(range(len(records)))
    rows = result.table.to_pylist()
    for row, record in zip(rows, records):
        assert row == record, (row, record)
    outside = AvroDecoder(iceberg_schema(schema), 1 << 16, _registry(registry.url)).decode(
        _serialize(registry.url, schema, [{**records[0], "ts": 2**63 - 1}]))
    assert outside.rejected == []
    assert outside.table.column("ts").cast(pa.int64()).to_pylist() == [2**63 - 1]


def test_protobuf_timestamps_read_as_micros_equal_their_values(registry) -> None:
    import base64
    import datetime as dt

    from google.protobuf import descriptor_pb2, descriptor_pool, timestamp_pb2
    from google.protobuf.message_factory import GetMessageClass
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

    from streamberg.decode.protobuf_decode import ProtobufDecoder
    from streamberg.decode.protobuf_schema import file_descriptor_proto

    table = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "ts", TimestamptzType(), required=False),
                   NestedField(3, "name", StringType(), required=True))
    proto = file_descriptor_proto(table, "Stamp")
    schema_id = registry.register("stamp-value", base64.b64encode(proto.SerializeToString()).decode(), "PROTOBUF")
    pool = descriptor_pool.DescriptorPool()
    wellknown = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(wellknown)
    pool.Add(wellknown)
    pool.Add(proto)
    message = GetMessageClass(pool.FindMessageTypeByName("streamberg.Stamp"))
    utc = dt.timezone.utc
    instants = [dt.datetime(1970, 1, 1, tzinfo=utc), dt.datetime(1, 1, 1, tzinfo=utc),
                dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=utc), dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=utc),
                None]
    values = []
    for i, instant in enumerate(instants):
        m = message(id=i, name=f"n{i}")
        if instant is not None:
            m.ts.FromDatetime(instant)
        values.append(b"\x00" + struct.pack(">I", schema_id) + b"\x00" + m.SerializeToString())
    result = ProtobufDecoder(table, 1 << 16, _registry(registry.url)).decode(values)
    assert result.rejected == []
    assert result.table.to_pylist() == [{"id": i, "ts": t, "name": f"n{i}"} for i, t in enumerate(instants)]
