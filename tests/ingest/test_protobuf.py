"""Protobuf through a schema registry: records produced with confluent-kafka's real
ProtobufSerializer (the Confluent wire format, message indexes included; the schema's import
registered as a reference), the registry stand-in (tests/fixtures/registry.py), a real
broker, the ingest's writer and committer, and DuckDB and pyiceberg reading what they wrote.

The message types are built at run time from descriptors (no protoc here), exactly as a
generated module builds them.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path

import duckdb
import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.common.protobuf import _init_pool
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, json_format, text_format
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message_factory import GetMessageClass

from streamberg.common.catalog import load_catalog
from streamberg.common.errors import UnsupportedSchemaError
from streamberg.decode.protobuf_schema import file_descriptor_proto, iceberg_schema, message_descriptor
from streamberg.table_meta.field_sightings import added_fields_of
from streamberg.table_meta.offsets import committed_position, summary_properties
from tests.helpers import account_for_every_record, config_at, dead_letters, streamberg, write_config
from tests.runbooks.inprocess import ingest_until

MONEY = """
name: "shop/money.proto" package: "shop" syntax: "proto3"
message_type { name: "Money"
  field { name: "currency" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
  field { name: "units" number: 2 type: TYPE_INT64 label: LABEL_OPTIONAL } }
"""
ORDER = """
name: "shop/order.proto" package: "shop" syntax: "proto3"
dependency: "google/protobuf/timestamp.proto" dependency: "google/protobuf/wrappers.proto"
dependency: "shop/money.proto"
enum_type { name: "Status" value { name: "NEW" number: 0 } value { name: "PAID" number: 1 } }
message_type { name: "Order"
  field { name: "id" number: 1 type: TYPE_INT64 label: LABEL_OPTIONAL }
  field { name: "ts" number: 2 type: TYPE_MESSAGE type_name: ".google.protobuf.Timestamp" label: LABEL_OPTIONAL }
  field { name: "name" number: 3 type: TYPE_STRING label: LABEL_OPTIONAL }
  field { name: "amount" number: 4 type: TYPE_DOUBLE label: LABEL_OPTIONAL proto3_optional: true oneof_index: 1 }
  field { name: "status" number: 5 type: TYPE_ENUM type_name: ".shop.Status" label: LABEL_OPTIONAL }
  field { name: "customer" number: 6 type: TYPE_MESSAGE type_name: ".shop.Order.Customer" label: LABEL_OPTIONAL }
  field { name: "attrs" number: 7 type: TYPE_MESSAGE type_name: ".shop.Order.AttrsEntry" label: LABEL_REPEATED }
  field { name: "email" number: 8 type: TYPE_STRING label: LABEL_OPTIONAL oneof_index: 0 }
  field { name: "phone" number: 9 type: TYPE_STRING label: LABEL_OPTIONAL oneof_index: 0 }
  field { name: "score" number: 10 type: TYPE_MESSAGE type_name: ".google.protobuf.Int64Value" label: LABEL_OPTIONAL }
  field { name: "qty" number: 11 type: TYPE_INT32 label: LABEL_OPTIONAL }
  field { name: "price" number: 12 type: TYPE_MESSAGE type_name: ".shop.Money" label: LABEL_OPTIONAL }
  field { name: "weight" number: 14 type: TYPE_FLOAT label: LABEL_OPTIONAL }
  nested_type { name: "Customer"
    field { name: "cid" number: 1 type: TYPE_INT64 label: LABEL_OPTIONAL }
    field { name: "tags" number: 2 type: TYPE_STRING label: LABEL_REPEATED } }
  nested_type { name: "AttrsEntry" options { map_entry: true }
    field { name: "key" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
    field { name: "value" number: 2 type: TYPE_INT64 label: LABEL_OPTIONAL } }
  oneof_decl { name: "contact" } oneof_decl { name: "_amount" } }
"""


def order_file(version: int = 1) -> descriptor_pb2.FileDescriptorProto:
    """The order schema; version 2 adds customer.note and widens qty (int64) and weight (double)."""
    file = text_format.Parse(ORDER, descriptor_pb2.FileDescriptorProto())
    if version >= 2:
        order = file.message_type[0]
        F = descriptor_pb2.FieldDescriptorProto
        order.nested_type[0].field.add(name="note", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
        next(f for f in order.field if f.name == "qty").type = F.TYPE_INT64
        next(f for f in order.field if f.name == "weight").type = F.TYPE_DOUBLE
    if version >= 3:  # status as a number: contradicts the table's string column
        next(f for f in file.message_type[0].field if f.name == "status").ClearField("type_name")
        next(f for f in file.message_type[0].field if f.name == "status").type = descriptor_pb2.FieldDescriptorProto.TYPE_INT64
    return file


def message_class(version: int = 1):
    pool = DescriptorPool()
    _init_pool(pool)
    pool.Add(text_format.Parse(MONEY, descriptor_pb2.FileDescriptorProto()))
    pool.Add(order_file(version))
    return GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def order(i: int) -> dict:
    """An order in protobuf's JSON mapping."""
    record = {"id": str(i), "ts": f"2026-11-25T10:{i % 60:02d}:00.{i:06d}Z", "name": f"n{i}" if i % 4 else "",
              "status": "PAID" if i % 2 else "NEW", "qty": i % 7, "weight": 0.5,
              "customer": {"cid": str(i % 11), "tags": [f"t{i % 3}"]}, "attrs": {"a": str(i)},
              "price": {"currency": "EUR", "units": str(i * 100)}}
    if i % 3:
        record["amount"] = i / 4
    if i % 5 == 1:
        record["email"] = f"o{i}@x"
    elif i % 5 == 2:
        record["phone"] = f"+{i}"
    if i % 2:
        record["score"] = str(i * 10)
    return record


def make_config(tmp_path: Path, broker: str, registry_url: str) -> Path:
    path = write_config(tmp_path, broker, ingest={"parallelism": 1, "commit_interval_seconds": 1})
    document = yaml.safe_load(path.read_text())
    del document["table"]["schema"]  # the table comes from the registry's writer schema
    document["kafka"]["value_format"] = "protobuf"
    document["kafka"]["schema_registry"] = {"url": registry_url, "retries": 1}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def serializer(url: str, version: int = 1):
    cls = message_class(version)
    serialize = ProtobufSerializer(cls, SchemaRegistryClient({"url": url}))

    def write(record: dict, topic: str) -> bytes:
        return serialize(json_format.ParseDict(record, cls()), SerializationContext(topic, MessageField.VALUE))

    return write


def produce(config, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap_servers})
    for v in values:
        producer.produce(config.kafka.topic, value=v, partition=0)
    assert producer.flush(30) == 0


def test_the_table_schema_is_derived_from_the_message_and_back() -> None:
    pool = DescriptorPool()
    _init_pool(pool)
    pool.Add(text_format.Parse(MONEY, descriptor_pb2.FileDescriptorProto()))
    pool.Add(order_file())
    schema = iceberg_schema(pool.FindMessageTypeByName("shop.Order"))
    assert [(f.name, str(f.field_type)) for f in schema.fields] == [
        ("id", "long"), ("ts", "timestamptz"), ("name", "string"), ("amount", "double"), ("status", "string"),
        ("customer", "struct<7: cid: optional long, 8: tags: optional list<string>>"),
        ("attrs", "map<string, long>"), ("email", "string"), ("phone", "string"), ("score", "long"),
        ("qty", "int"), ("price", "struct<18: currency: optional string, 19: units: optional long>"),
        ("weight", "float")]
    assert not any(f.required for f in schema.fields)  # proto3: every column optional
    # The inverse (for `produce --format protobuf`) round-trips through the registry's form.
    back = file_descriptor_proto(schema, "Order")
    text = base64.b64encode(back.SerializeToString()).decode()
    assert iceberg_schema(message_descriptor(text, [], (), lambda s, v: None)) == schema
    # A recursive message (a tree) has no column type: refused with its path.
    tree = text_format.Parse("""name: "t.proto" package: "t" syntax: "proto3"
        message_type { name: "Node" field { name: "kids" number: 1 type: TYPE_MESSAGE type_name: ".t.Node"
        label: LABEL_REPEATED } }""", descriptor_pb2.FileDescriptorProto())
    with pytest.raises(UnsupportedSchemaError, match=r"kids\[\] is a t.Node, which contains itself"):
        iceberg_schema(message_descriptor(base64.b64encode(tree.SerializeToString()).decode(), [], (),
                                          lambda s, v: None))


def test_protobuf_records_land_the_table_evolves_with_the_schema_and_bad_bytes_are_dead_letters(
        tmp_path: Path, broker: str, registry) -> None:
    config = config_at(make_config(tmp_path, broker, registry.url))
    write = serializer(registry.url)
    good = [order(i) for i in range(30)]
    values = [write(r, config.kafka.topic) for r in good]
    assert values[0][5] == 0  # the message indexes: [0], the file's first message
    produce(config, values + [b"\x05not protobuf", b"\x00\x00\x00", values[3][:5] + b"\x00\xff\xff\xff"])
    ingest_until(config, {0: 33})

    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert [(f.name, str(f.field_type)) for f in table.schema().find_type("price").fields] == [
        ("currency", "string"), ("units", "long")]  # the imported file's message
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(30))
    for got, i in zip(rows, range(30)):
        assert got["ts"] == dt.datetime(2026, 11, 25, 10, i % 60, 0, i, tzinfo=dt.timezone.utc)
        assert got["name"] == (f"n{i}" if i % 4 else "")  # no presence: the default, as protobuf reads it
        assert got["amount"] == (i / 4 if i % 3 else None)  # proto3 optional: unset is null
        assert got["status"] == ("PAID" if i % 2 else "NEW")
        assert (got["email"], got["phone"]) == ((f"o{i}@x", None) if i % 5 == 1 else (None, f"+{i}") if i % 5 == 2
                                                else (None, None))
        assert got["score"] == (i * 10 if i % 2 else None)
        assert got["customer"] == {"cid": i % 11, "tags": [f"t{i % 3}"]} and got["attrs"] == [("a", i)]
        assert got["price"] == {"currency": "EUR", "units": i * 100}  # from the referenced file
    files = [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]
    duck = duckdb.connect().execute(
        f"SELECT count(*), sum(price.units), count(amount) FROM read_parquet({files!r})").fetchone()
    assert duck == (30, sum(i * 100 for i in range(30)), sum(1 for i in range(30) if i % 3))
    reasons = sorted(d["reason"] for d in dead_letters(config).to_pylist())
    assert reasons[0].startswith("not Confluent Protobuf: magic byte 5"), reasons
    assert reasons[1].startswith("not Confluent Protobuf: the header is cut short"), reasons
    assert reasons[2].startswith("not valid Protobuf for writer schema id 2"), reasons

    # Version 2: a new nested field and two wider columns; the table follows in one commit.
    write2 = serializer(registry.url, 2)
    newer = [{**order(i), "qty": str(2 ** 40 + i), "weight": 1e300,
              "customer": {"cid": "1", "tags": [], "note": f"n{i}"}} for i in range(100, 110)]
    produce(config, [write2(r, config.kafka.topic) for r in newer])
    ingest_until(config, {0: 43})
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert [str(table.schema().find_type(p)) for p in ("qty", "weight", "customer.note")] == ["long", "double", "string"]
    evolved = [s for s in table.snapshots() if added_fields_of(summary_properties(s))]
    assert len(evolved) == 1 and evolved[0].schema_id == table.schema().schema_id
    landed = {r["id"]: r for r in table.scan().to_arrow().to_pylist() if r["id"] >= 100}
    assert sorted(landed) == list(range(100, 110))
    assert (landed[105]["qty"], landed[105]["weight"], landed[105]["customer"]["note"]) == (2 ** 40 + 105, 1e300, "n105")

    # Version 3 contradicts a column's type: its records are dead letters naming both types.
    produce(config, [serializer(registry.url, 3)({**order(200), "status": "7"}, config.kafka.topic)])
    ingest_until(config, {0: 44})
    assert any("field 'status': the writer schema (id 4) has long where the table has string" in d["reason"]
               for d in dead_letters(config).to_pylist())
    assert committed_position(load_catalog(config.catalog).load_table(config.table.identifier),
                              config.kafka.topic).offsets[0] == 44


@pytest.mark.flink
def test_streamberg_produce_and_ingest_protobuf_end_to_end(tmp_path: Path, broker: str, registry) -> None:
    """The real commands: `streamberg produce --format protobuf` (the message made from the
    config's schema) and `streamberg ingest` (PyFlink); every record lands once."""
    path = write_config(tmp_path, broker, ingest={"parallelism": 2})
    document = yaml.safe_load(path.read_text())
    document["kafka"]["schema_registry"] = {"url": registry.url}
    document["kafka"]["value_format"] = "protobuf"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    produced = json.loads(streamberg("produce", "--config", str(path), "--count", "2000", "--bad-fraction", "0.01",
                                     "--partitions", "2", "--quiet").stdout)
    assert produced["produced"] == 2000 and sum(produced["malformed"].values()) == 20
    streamberg("ingest", "--config", str(path), "--max-records", "2000", "--quiet")
    config = config_at(path)
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    rows = table.scan(selected_fields=("id", "ts", "amount")).to_arrow()
    ids = rows.column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 1980
    assert rows.column("ts").null_count == 0
    assert dead_letters(config).num_rows == 20


def test_any_bytes_and_any_registry_answer_give_a_row_or_a_dead_letter(registry) -> None:
    """Fuzz: valid records mutated byte by byte, random bytes behind real headers (message
    indexes included), and schemas a registry might answer (not base64, not a descriptor, a
    recursive message, an Avro schema, an index past the file's messages): the decoder never
    raises, and every record is a row or a dead letter with a reason."""
    import random

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from streamberg.common.config.sections import SchemaRegistryConfig
    from streamberg.decode.protobuf_decode import ProtobufDecoder
    from streamberg.decode.registry import WriterSchemas

    write = serializer(registry.url)
    good = [write(order(i), "fuzz") for i in range(20)]
    tree = text_format.Parse("""name: "t.proto" package: "t" syntax: "proto3" message_type { name: "Node"
        field { name: "kid" number: 1 type: TYPE_MESSAGE type_name: ".t.Node" label: LABEL_OPTIONAL } }""",
                             descriptor_pb2.FileDescriptorProto())
    hostile_ids = [registry.register("hostile", text, "PROTOBUF") for text in (
        "not base64!", base64.b64encode(b"\xff\xff\xff garbage").decode(),
        base64.b64encode(tree.SerializeToString()).decode())]
    hostile_ids.append(registry.register("hostile", json.dumps({"type": "record", "name": "A", "fields": []})))
    pool = DescriptorPool()
    _init_pool(pool)
    pool.Add(text_format.Parse(MONEY, descriptor_pb2.FileDescriptorProto()))
    pool.Add(order_file())
    decoder = ProtobufDecoder(iceberg_schema(pool.FindMessageTypeByName("shop.Order")), 1 << 16,
                              WriterSchemas(SchemaRegistryConfig(url=registry.url, retries=0)), unknown="report")
    seen = {"kept": 0, "rejected": 0}

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(seed=st.integers(0, 2 ** 32), noise=st.lists(st.binary(max_size=60), max_size=20),
           indexes=st.lists(st.integers(-3, 3), max_size=4))
    def fuzz(seed: int, noise: list[bytes], indexes: list[int]) -> None:
        rng = random.Random(seed)
        batch: list[bytes | None] = []
        for value in good:
            b = bytearray(value)
            for _ in range(rng.randrange(3)):
                at = rng.randrange(len(b))
                b[at] = rng.randrange(256) if at >= 6 else b[at]  # keep the header: mutate the body
            batch.append(bytes(b) if rng.random() < 0.7 else bytes(b[: rng.randrange(1, len(b))]))
        header = b"".join(_zigzag(n) for n in [len(indexes), *indexes])
        batch += [b"\x00" + rng.choice(hostile_ids).to_bytes(4, "big") + b"\x00" + n for n in noise]
        batch += [b"\x00\x00\x00\x00\x02" + header + n for n in noise] + [None]
        account_for_every_record(decoder.decode(batch), len(batch), seen)

    fuzz()
    assert seen["kept"] > 0 and seen["rejected"] > 0


def _zigzag(n: int) -> bytes:
    value, out = (n << 1) ^ (n >> 63), bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


@pytest.mark.slow  # 9-12 s alone on 2 cores (make test-fast --durations, 2026-11-29)
def test_a_registry_outage_stops_the_protobuf_ingest_and_advances_nothing(tmp_path: Path, broker: str,
                                                                          registry) -> None:
    from streamberg.common.errors import RegistryUnavailable
    from streamberg.ingest.dead_letters import open_tables

    config = config_at(make_config(tmp_path, broker, registry.url.replace("http://", "http://reader:pw-s3cret@")))
    write = serializer(registry.url)
    produce(config, [write(order(i), config.kafka.topic) for i in range(5)])
    open_tables(config)  # the table exists (made while the registry answered) ...
    registry.down = True  # ... then the registry goes down: the reference and the file cannot be fetched
    with pytest.raises(RegistryUnavailable) as refused:
        ingest_until(config, {0: 5}, timeout=120)
    assert "failed 2 times" in str(refused.value) and "pw-s3cret" not in str(refused.value)
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert committed_position(table, config.kafka.topic).offsets.get(0, 0) == 0 and dead_letters(config).num_rows == 0
    registry.down = False  # back: the same records land, once
    ingest_until(config, {0: 5})
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert sorted(r["id"] for r in table.scan().to_arrow().to_pylist()) == list(range(5))
