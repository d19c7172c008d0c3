"""Avro through a schema registry: records produced with confluent-kafka's real AvroSerializer
(the Confluent wire format), a registry stand-in that speaks the REST API the client uses
(tests/fixtures/registry.py: no registry server is installable here), a real broker, the
ingest's writer and committer, and DuckDB and pyiceberg reading what they wrote.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from streamberg.common.catalog import load_catalog
from streamberg.common.errors import RegistryUnavailable, UnsupportedSchemaError
from streamberg.decode.avro_schema import avro_schema, iceberg_schema
from streamberg.table_meta.field_sightings import added_fields_of
from streamberg.table_meta.offsets import committed_position, summary_properties
from tests.helpers import account_for_every_record, config_at, dead_letters, streamberg, write_config
from tests.runbooks.inprocess import ingest_until

ORDER_V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}], "default": None},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
    {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    {"name": "qty", "type": "int"},
    {"name": "customer", "type": ["null", {"type": "record", "name": "Customer", "fields": [
        {"name": "cid", "type": "long"}, {"name": "tags", "type": {"type": "array", "items": "string"}}]}],
     "default": None},
    {"name": "attrs", "type": {"type": "map", "values": ["null", "long"]}},
]}


def order(i: int) -> dict:
    return {"id": i, "ts": dt.datetime(2026, 11, 25, 10, i % 60, tzinfo=dt.timezone.utc),
            "day": dt.date(2026, 11, 25) if i % 3 else None, "price": Decimal(f"{i}.{i % 100:02d}"),
            "ref": f"00000000-0000-4000-8000-{i:012d}", "status": "PAID" if i % 2 else "NEW", "qty": i % 7,
            "customer": None if i % 5 == 4 else {"cid": i % 11, "tags": [f"t{i % 3}"]},
            "attrs": {"a": i, "b": None}}


def v2(schema: dict) -> dict:
    """The producers' next version: a new optional field inside the customer record, and two
    wider columns (qty as long, price with more digits)."""
    nxt = json.loads(json.dumps(schema))
    customer = next(f for f in nxt["fields"] if f["name"] == "customer")
    customer["type"][1]["fields"].append({"name": "email", "type": ["null", "string"], "default": None})
    next(f for f in nxt["fields"] if f["name"] == "qty")["type"] = "long"
    next(f for f in nxt["fields"] if f["name"] == "price")["type"]["precision"] = 14
    return nxt


def make_config(tmp_path: Path, broker: str, registry_url: str, **ingest) -> Path:
    path = write_config(tmp_path, broker, ingest={"parallelism": 1, "commit_interval_seconds": 1, **ingest})
    document = yaml.safe_load(path.read_text())
    del document["table"]["schema"]  # the table comes from the registry's writer schema
    document["kafka"]["value_format"] = "avro"
    document["kafka"]["schema_registry"] = {"url": registry_url, "retries": 1}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def produce(config, schema: dict, records: list[dict], extra: list[bytes] = ()) -> list[bytes]:
    assert config.kafka.schema_registry is not None
    client = SchemaRegistryClient({"url": config.kafka.schema_registry.url})
    serializer = AvroSerializer(client, json.dumps(schema))
    context = SerializationContext(config.kafka.topic, MessageField.VALUE)
    values = [serializer(r, context) for r in records] + list(extra)
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap_servers})
    for v in values:
        producer.produce(config.kafka.topic, value=v, partition=0)
    assert producer.flush(30) == 0
    return values


def test_the_table_schema_is_derived_from_the_writer_schema() -> None:
    schema = iceberg_schema(ORDER_V1)
    assert [(f.name, str(f.field_type), f.required) for f in schema.fields] == [
        ("id", "long", True), ("ts", "timestamptz", True), ("day", "date", False), ("price", "decimal(10, 2)", True),
        ("ref", "string", True), ("status", "string", True), ("qty", "int", True),
        ("customer", "struct<9: cid: required long, 10: tags: required list<string>>", False),
        ("attrs", "map<string, long>", True)]
    assert str(iceberg_schema({"type": "record", "name": "R", "fields": [
        {"name": "t", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "h", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "f", "type": {"type": "fixed", "name": "F", "size": 4}}]}).as_struct()) == \
        "struct<1: t: required timestamp, 2: h: required time, 3: f: required fixed[4]>"
    assert iceberg_schema(avro_schema(schema)) == schema  # the inverse, for `produce --format avro`
    with pytest.raises(UnsupportedSchemaError, match=r"Avro schema: u is a union of 3 types"):
        iceberg_schema({"type": "record", "name": "R", "fields": [{"name": "u", "type": ["null", "int", "string"]}]})
    with pytest.raises(UnsupportedSchemaError, match="made from a record schema"):
        iceberg_schema({"type": "array", "items": "int"})


def test_avro_records_land_the_table_evolves_with_the_writer_schema_and_bad_bytes_are_dead_letters(
        tmp_path: Path, broker: str, registry) -> None:
    path = make_config(tmp_path, broker, registry.url)
    config = config_at(path)
    good = [order(i) for i in range(40)]
    values = produce(config, ORDER_V1, good, extra=[b"\x05not avro", b"\x00\x00\x00"])
    truncated = values[3][:-4]
    produce(config, ORDER_V1, [], extra=[truncated])
    ingest_until(config, {0: 43})

    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert str(table.schema().find_type("customer.tags")) == "list<string>"  # made from the writer schema
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(40))
    for got, want in zip(rows, good):
        assert (got["ts"], got["day"], got["price"], got["ref"], got["status"], got["qty"]) == (
            want["ts"], want["day"], want["price"], want["ref"], want["status"], want["qty"])
        assert got["customer"] == want["customer"] and got["attrs"] == list(want["attrs"].items())
    # DuckDB, reading the same table's data files, agrees.
    files = [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]
    duck = duckdb.connect().execute(
        f"SELECT count(*), sum(price), count(customer) FROM read_parquet({files!r})").fetchone()
    assert duck == (40, sum(o["price"] for o in good), sum(1 for o in good if o["customer"] is not None))
    reasons = sorted(d["reason"] for d in dead_letters(config).to_pylist())
    assert reasons[0].startswith("not Confluent Avro: magic byte 5")
    assert reasons[1].startswith("not Confluent Avro: the header is cut short")
    assert reasons[2].startswith("not valid Avro for writer schema id 1")

    # The producers move to v2: a new nested field, and two wider columns. The table follows
    # in the commit that first carries them, and the values land.
    newer = [{**order(i), "customer": {"cid": 1, "tags": [], "email": f"c{i}@x"}, "qty": 2 ** 40 + i,
              "price": Decimal(f"123456789{i:03d}.25")} for i in range(100, 110)]
    produce(config, v2(ORDER_V1), newer)
    ingest_until(config, {0: 53})
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert str(table.schema().find_type("qty")) == "long"
    assert str(table.schema().find_type("price")) == "decimal(14, 2)"
    assert str(table.schema().find_type("customer.email")) == "string"
    evolved = [s for s in table.snapshots() if added_fields_of(summary_properties(s))]
    assert len(evolved) == 1 and evolved[0].schema_id == table.schema().schema_id
    landed = {r["id"]: r for r in table.scan().to_arrow().to_pylist() if r["id"] >= 100}
    assert sorted(landed) == list(range(100, 110))
    assert landed[105]["customer"]["email"] == "c105@x" and landed[105]["qty"] == 2 ** 40 + 105
    assert landed[105]["price"] == Decimal("123456789105.25")

    # A version whose type contradicts the table's: its records are dead letters naming both types.
    v3 = json.loads(json.dumps(ORDER_V1))
    next(f for f in v3["fields"] if f["name"] == "status")["type"] = "long"
    produce(config, v3, [{**order(200), "status": 7}])
    ingest_until(config, {0: 54})
    last = dead_letters(config).to_pylist()
    assert any("field 'status': the writer schema (id 3) has long where the table has string" in d["reason"]
               for d in last)
    assert committed_position(load_catalog(config.catalog).load_table(config.table.identifier),
                              config.kafka.topic).offsets[0] == 54


@pytest.mark.slow  # 9-12 s alone on 2 cores (make test-fast --durations, 2026-11-29)
def test_a_registry_that_cannot_answer_stops_the_ingest_and_advances_nothing(tmp_path: Path, broker: str,
                                                                             registry) -> None:
    url = registry.url.replace("http://", "http://reader:s3cr3t-pass@")
    path = make_config(tmp_path, broker, url)
    config = config_at(path)
    produce(config.model_copy(update={"kafka": config.kafka.model_copy(update={
        "schema_registry": config.kafka.schema_registry.model_copy(update={"url": registry.url})})}),
        ORDER_V1, [order(i) for i in range(5)])
    # The table exists (made while the registry answered); then the registry goes down.
    from streamberg.ingest.dead_letters import open_tables

    open_tables(config)
    registry.down = True
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable) as refused:
        ingest_until(config, {0: 5}, timeout=120)
    message = str(refused.value)
    assert "schema id 1 failed 2 times" in message and "s3cr3t-pass" not in message
    assert time.monotonic() - started < 110
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert committed_position(table, config.kafka.topic).offsets.get(0, 0) == 0  # nothing advanced
    assert dead_letters(config).num_rows == 0

    registry.down = False  # back: the same records are read and land, once
    ingest_until(config, {0: 5})
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert sorted(r["id"] for r in table.scan().to_arrow().to_pylist()) == list(range(5))


@pytest.mark.flink
def test_streamberg_produce_and_ingest_avro_end_to_end(tmp_path: Path, broker: str, registry) -> None:
    """The real commands: `streamberg produce --format avro` (the writer schema made from the
    config's schema) and `streamberg ingest` (PyFlink) into a table; every record lands once."""
    path = write_config(tmp_path, broker, ingest={"parallelism": 2})
    document = yaml.safe_load(path.read_text())
    document["kafka"]["schema_registry"] = {"url": registry.url}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    produced = json.loads(streamberg("produce", "--config", str(path), "--count", "3000", "--format", "avro",
                                     "--bad-fraction", "0.01", "--partitions", "2", "--quiet").stdout)
    assert produced["produced"] == 3000 and sum(produced["malformed"].values()) == 30
    document["kafka"]["value_format"] = "avro"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    streamberg("ingest", "--config", str(path), "--max-records", "3000", "--quiet")
    config = config_at(path)
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    ids = table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 2970
    assert dead_letters(config).num_rows == 30


def test_any_bytes_and_any_registry_answer_give_a_row_or_a_dead_letter(registry) -> None:
    """Fuzz: valid records mutated byte by byte, random bytes behind a real header, and writer
    schemas a registry might answer (not JSON, not a record, recursive, a union of three):
    the decoder never raises, and every record is a row or a dead letter with a reason."""
    import random

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from streamberg.common.config.sections import SchemaRegistryConfig
    from streamberg.decode.avro_decode import AvroDecoder
    from streamberg.decode.registry import WriterSchemas

    client = SchemaRegistryClient({"url": registry.url})
    context = SerializationContext("fuzz", MessageField.VALUE)
    good = [AvroSerializer(client, json.dumps(ORDER_V1))(order(i), context) for i in range(20)]
    hostile = ["not json", json.dumps({"type": "array", "items": "int"}),
               json.dumps({"type": "record", "name": "L", "fields": [{"name": "next", "type": ["null", "L"]}]}),
               json.dumps({"type": "record", "name": "U", "fields": [{"name": "u", "type": ["null", "int", "string"]}]})]
    hostile_ids = [registry.register("hostile", text) for text in hostile]
    decoder = AvroDecoder(iceberg_schema(ORDER_V1), 1 << 16,
                          WriterSchemas(SchemaRegistryConfig(url=registry.url, retries=0)), unknown="report")
    seen = {"kept": 0, "rejected": 0}

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(seed=st.integers(0, 2 ** 32), noise=st.lists(st.binary(max_size=60), max_size=20))
    def fuzz(seed: int, noise: list[bytes]) -> None:
        rng = random.Random(seed)
        batch: list[bytes | None] = []
        for value in good:
            b = bytearray(value)
            for _ in range(rng.randrange(3)):
                at = rng.randrange(len(b))
                b[at] = rng.randrange(256) if at >= 5 else b[at]  # keep the header: mutate the body
            batch.append(bytes(b) if rng.random() < 0.7 else bytes(b[: rng.randrange(1, len(b))]))
        batch += [b"\x00" + rng.choice(hostile_ids).to_bytes(4, "big") + n for n in noise]
        batch += [b"\x00\x00\x00\x00\x01" + n for n in noise] + [None]
        account_for_every_record(decoder.decode(batch), len(batch), seen)

    fuzz()
    assert seen["kept"] > 0 and seen["rejected"] > 0
