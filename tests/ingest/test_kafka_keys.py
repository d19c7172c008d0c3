"""`kafka.key_field`: the record's key written into a string column (decode/records.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer
from pydantic import ValidationError
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.common.errors import UnsupportedSchemaError
from streamberg.decode.records import RecordDecoder
from tests.helpers import EVENT_SCHEMA, config_at, dead_letters, write_config
from tests.runbooks.inprocess import cli, ingest_until

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "order_key", StringType(), required=True),
                NestedField(3, "city", StringType()))


def _value(i: int, **extra) -> bytes:
    return json.dumps({"id": i, "city": "c", **extra}).encode()


def test_keys_fill_their_column_and_bad_keys_are_dead_lettered_with_the_reason() -> None:
    decoder = RecordDecoder(SCHEMA, 4096, key_field="order_key")
    values = [_value(0), _value(1, order_key="from-the-value"), b"not json", _value(3), _value(4), _value(5)]
    keys = [b"k0", b"k1", b"k2", b"\xff\xfe", None, "ключ".encode()]
    result = decoder.decode(values, keys)
    assert result.table.schema.names == ["id", "order_key", "city"]
    assert [f.metadata[b"PARQUET:field_id"] for f in result.table.schema] == [b"1", b"2", b"3"]
    assert result.table.to_pylist() == [{"id": 0, "order_key": "k0", "city": "c"},
                                        {"id": 1, "order_key": "k1", "city": "c"},  # the key wins over the value
                                        {"id": 5, "order_key": "ключ", "city": "c"}]
    assert list(result.kept) == [0, 1, 5]
    reasons = dict(result.rejected)
    assert set(reasons) == {2, 3, 4}
    assert reasons[3] == "field 'order_key': the record's key is not valid UTF-8"
    assert reasons[4] == "missing required field 'order_key' (the record has no key)"
    assert "JSON" in reasons[2]  # the value's own reason stands


def test_an_optional_key_column_takes_records_without_keys() -> None:
    optional = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "k", StringType()))
    result = RecordDecoder(optional, 4096, key_field="k").decode([_value(0), _value(1)], [None, b"x"])
    assert result.table.to_pylist() == [{"id": 0, "k": None}, {"id": 1, "k": "x"}] and not result.rejected


def test_the_key_column_must_be_a_string_column_of_the_table(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedSchemaError, match="'nope' is not a column of the table"):
        RecordDecoder(SCHEMA, 4096, key_field="nope")
    with pytest.raises(UnsupportedSchemaError, match="column 'id' is long; the key is written as a string"):
        RecordDecoder(SCHEMA, 4096, key_field="id")
    document = {"kafka": {"topic": "t", "key_field": "amount"}, "table": {"identifier": "db.e", "schema": EVENT_SCHEMA}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(document))
    with pytest.raises(Exception, match="kafka.key_field: column 'amount' is double"):
        load_config(tmp_path / "s.yaml")
    with pytest.raises(ValidationError):
        from streamberg.common.config import KafkaConfig

        KafkaConfig(topic="t", key_field="a.b")  # a top-level column


def test_the_ingest_writes_keys_and_the_dead_letter_replay_keeps_them(tmp_path: Path, broker: str) -> None:
    schema = [*EVENT_SCHEMA, {"name": "order_key", "type": "string", "required": True}]
    path = write_config(tmp_path, broker, extra={})
    document = yaml.safe_load(path.read_text())
    document["table"]["schema"] = schema
    document["kafka"]["key_field"] = "order_key"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 1)
    producer = Producer({"bootstrap.servers": broker})
    for i in range(20):
        value = {"id": i, "ts": "2026-11-25T10:00:00Z", "user_id": f"u{i}", "city": "c", "amount": 1.0}
        producer.produce(config.kafka.topic, value=json.dumps(value).encode(), partition=0,
                         key=None if i == 7 else f"order-{i}".encode())
    assert producer.flush(30) == 0
    ingest_until(config, {0: 20})
    rows = load_catalog(config.catalog).load_table(config.table.identifier).scan().to_arrow().to_pylist()
    assert sorted((r["id"], r["order_key"]) for r in rows) == [(i, f"order-{i}") for i in range(20) if i != 7]
    dead = dead_letters(config).to_pylist()
    assert [(d["offset"], d["key"], d["reason"]) for d in dead] == [
        (7, None, "missing required field 'order_key' (the record has no key)")]
    # The dead-letter replay decodes with the stored key too: still without one, still refused.
    out = json.loads(cli("replay", "--config", str(path), "--dead-letters").stdout)
    assert out["read"] == 1 and out["records_added"] == 0 and out["still_bad"] == 1


# -- kafka.key_format: value -----------------------------------------------------------------
def test_json_keys_are_decoded_with_every_rule_of_the_value_format() -> None:
    from pyiceberg.types import StructType

    schema = Schema(NestedField(1, "id", LongType(), required=True),
                    NestedField(2, "k", StructType(NestedField(4, "tenant", StringType(), required=True),
                                                   NestedField(5, "seq", LongType())), required=True),
                    NestedField(3, "city", StringType()))
    decoder = RecordDecoder(schema, 4096, key_field="k", key_format="value", unknown="report")
    keys = [b'{"tenant": "a", "seq": 1}', b'{"tenant": "b"}', b'not json', b'{"tenant": "c"}, "x": 1',
            b'{"tenant": 5}', None, b'{"seq": 2}', b'{"tenant": "d", "region": "eu"}', b'{"tenant": "e", "seq": 9e99}']
    result = decoder.decode([_value(i) for i in range(len(keys))], keys)
    assert result.table.column("k").to_pylist() == [{"tenant": "a", "seq": 1}, {"tenant": "b", "seq": None},
                                                    {"tenant": "d", "seq": None}]
    assert result.table.column("id").to_pylist() == [0, 1, 7]
    reasons = dict(result.rejected)
    assert reasons[2].startswith("field 'k': the record's key is not one JSON value")
    assert reasons[3].startswith("field 'k': the record's key is not one JSON value")  # no member smuggled in
    assert "field 'k.tenant'" in reasons[4] and "string" in reasons[4]
    assert reasons[5] == "missing required field 'k' (the record has no key)"
    assert "missing required field 'k.tenant'" in reasons[6]
    assert reasons[8].startswith("field 'k': the record's key: ") and "9e99" in reasons[8]
    # A field the key carries and the column lacks is named by its table path, for evolution.
    assert [(u.path, str(u.type), u.rows.tolist()) for u in result.unknown] == [(("k", "region"), "string", [7])]
    # A primitive key column takes a JSON scalar, by the same rules.
    scalar = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "k", LongType()))
    out = RecordDecoder(scalar, 4096, key_field="k", key_format="value").decode(
        [_value(0), _value(1), _value(2)], [b"42", b'"42"', b"1.5"])
    assert out.table.to_pylist() == [{"id": 0, "k": 42}] and sorted(dict(out.rejected)) == [1, 2]


def test_avro_and_protobuf_keys_are_decoded_with_their_writer_schemas(registry) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from pyiceberg.types import StructType

    from streamberg.common.config.sections import SchemaRegistryConfig
    from streamberg.decode.avro_schema import avro_schema
    from streamberg.decode.registry import WriterSchemas

    client = SchemaRegistryClient({"url": registry.url})
    writer_schemas = WriterSchemas(SchemaRegistryConfig(url=registry.url, retries=0))
    value_schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(3, "city", StringType()))
    values = AvroSerializer(client, json.dumps(avro_schema(value_schema)))
    key_context = SerializationContext("keys", MessageField.KEY)
    value_context = SerializationContext("keys", MessageField.VALUE)
    rows = [values({"id": i, "city": "c"}, value_context) for i in range(3)]

    # A primitive Avro key (the usual "long") into a long column.
    long_keys = AvroSerializer(client, json.dumps("long"))
    schema = Schema(*value_schema.fields, NestedField(2, "k", LongType(), required=True))
    decoder = RecordDecoder(schema, 4096, key_field="k", key_format="value", registry=writer_schemas,
                            value_format="avro")
    out = decoder.decode(rows, [long_keys(7, key_context), long_keys(8, key_context), b"\x05bad"])
    assert out.table.select(["id", "k"]).to_pylist() == [{"id": 0, "k": 7}, {"id": 1, "k": 8}]
    assert dict(out.rejected)[2].startswith("field 'k': the record's key: not Confluent Avro: magic byte 5")

    # A record key into a struct column; a key version with a field more is reported under it.
    key_struct = StructType(NestedField(4, "tenant", StringType(), required=True), NestedField(5, "seq", LongType()))
    schema = Schema(*value_schema.fields, NestedField(2, "k", key_struct, required=True))
    record_keys = AvroSerializer(client, json.dumps({"type": "record", "name": "K", "fields": [
        {"name": "tenant", "type": "string"}, {"name": "seq", "type": ["null", "long"], "default": None},
        {"name": "shard", "type": "int"}]}))
    decoder = RecordDecoder(schema, 4096, key_field="k", key_format="value", registry=writer_schemas,
                            value_format="avro", unknown="report")
    out = decoder.decode(rows[:2], [record_keys({"tenant": "a", "seq": 1, "shard": 3}, key_context), None])
    assert out.table.column("k").to_pylist() == [{"tenant": "a", "seq": 1}]
    assert [(u.path, str(u.type), u.rows.tolist()) for u in out.unknown] == [(("k", "shard"), "int", [0])]
    assert dict(out.rejected) == {1: "missing required field 'k' (the record has no key)"}

    # A Protobuf message key into a struct column (the value Protobuf too).
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from google.protobuf import json_format
    from google.protobuf.descriptor_pool import DescriptorPool
    from google.protobuf.message_factory import GetMessageClass

    from streamberg.decode.protobuf_schema import file_descriptor_proto

    def message(schema: Schema, name: str):
        pool = DescriptorPool()
        pool.Add(file_descriptor_proto(schema, name, f"keys.{name.lower()}"))
        return GetMessageClass(pool.FindMessageTypeByName(f"keys.{name.lower()}.{name}"))

    value_class, key_class = message(value_schema, "Row"), message(Schema(*key_struct.fields), "Key")
    proto_values, proto_keys = ProtobufSerializer(value_class, client), ProtobufSerializer(key_class, client)
    decoder = RecordDecoder(schema, 4096, key_field="k", key_format="value", registry=writer_schemas,
                            value_format="protobuf")
    out = decoder.decode(
        [proto_values(json_format.ParseDict({"id": i, "city": "c"}, value_class()), value_context) for i in range(2)],
        [proto_keys(json_format.ParseDict({"tenant": f"t{i}", "seq": i}, key_class()), key_context) for i in range(2)])
    assert out.table.select(["id", "k"]).to_pylist() == [{"id": 0, "k": {"tenant": "t0", "seq": 0}},
                                                         {"id": 1, "k": {"tenant": "t1", "seq": 1}}]


def test_decoded_keys_land_and_a_new_key_field_evolves_the_key_column(tmp_path: Path, broker: str) -> None:
    schema = [*EVENT_SCHEMA, {"name": "k", "type": "struct<tenant:string,seq:long>", "required": True}]
    path = write_config(tmp_path, broker, ingest={"parallelism": 1, "commit_interval_seconds": 1})
    document = yaml.safe_load(path.read_text())
    document["table"]["schema"] = schema
    document["kafka"].update({"key_field": "k", "key_format": "value"})
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 1)
    producer = Producer({"bootstrap.servers": broker})
    for i in range(10):
        value = {"id": i, "ts": "2026-11-25T10:00:00Z", "user_id": f"u{i}", "city": "c", "amount": 1.0}
        key = {"tenant": f"t{i % 2}", "seq": i, **({"region": "eu"} if i >= 5 else {})}
        producer.produce(config.kafka.topic, value=json.dumps(value).encode(), partition=0,
                         key=b"[oops" if i == 3 else json.dumps(key).encode())
    assert producer.flush(30) == 0
    ingest_until(config, {0: 10})
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert str(table.schema().find_type("k.region")) == "string"  # added inside the key column
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["k"]) for r in rows] == [
        (i, {"tenant": f"t{i % 2}", "seq": i, "region": "eu" if i >= 5 else None}) for i in range(10) if i != 3]
    dead = dead_letters(config).to_pylist()
    assert [(d["offset"], d["key"]) for d in dead] == [(3, b"[oops")]
    assert dead[0]["reason"].startswith("field 'k': the record's key is not one JSON value")
