"""Debezium events in Confluent-framed Avro through the registry stand-in
(tests/fixtures/registry.py: no registry server is installable here), written by
confluent-kafka's real AvroSerializer with Debezium's envelope schema (Envelope, Value,
Source). A second writer-schema version adds a column, which evolves the change log and then
the table; a third contradicts a column's type and is dead-lettered. The real writer and
committer (in process) append the change log; the merge stage runs on the shared Spark
session; pyiceberg and DuckDB read the table and equal the state the test computes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from streamberg.common.broker import ensure_topic
from streamberg.merge.app import MergeOptions, run_merge
from streamberg.table_meta.changelog import ingest_config
from tests.cdc.helpers import cdc_config, rows_by_duckdb, rows_by_pyiceberg
from tests.helpers import dead_letters
from tests.runbooks.inprocess import ingest_until

NS = "dbserver1.inventory.users"


def _value(tier: bool = False, score: str = "int") -> dict:
    fields = [{"name": "id", "type": "long"}, {"name": "name", "type": "string"},
              {"name": "score", "type": ["null", score], "default": None},
              {"name": "city", "type": ["null", "string"], "default": None}]
    if tier:
        fields.append({"name": "tier", "type": ["null", "string"], "default": None})
    return {"type": "record", "name": "Value", "namespace": NS, "fields": fields}


def _envelope(value: dict) -> dict:
    source = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql", "fields": [
        {"name": "version", "type": "string"}, {"name": "connector", "type": "string"},
        {"name": "ts_ms", "type": "long"}, {"name": "db", "type": "string"},
        {"name": "lsn", "type": ["null", "long"], "default": None}]}
    return {"type": "record", "name": "Envelope", "namespace": NS, "fields": [
        {"name": "before", "type": ["null", value], "default": None},
        {"name": "after", "type": ["null", f"{NS}.Value"], "default": None},
        {"name": "source", "type": source}, {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None}]}


class Source:
    def __init__(self) -> None:
        self.rng = random.Random(5)
        self.rows: dict[int, dict] = {}
        self.lsn = 0

    def event(self, op: str, before: dict | None, after: dict | None) -> dict:
        self.lsn += 1
        return {"before": before, "after": after, "op": op, "ts_ms": 1_764_000_000_000 + self.lsn,
                "source": {"version": "2.7.0", "connector": "postgresql", "ts_ms": 1_764_000_000_000 + self.lsn,
                           "db": "inventory", "lsn": self.lsn}}

    def changes(self, count: int, tier: bool = False) -> list[dict | None]:
        out: list[dict | None] = []
        for _ in range(count):
            key = self.rng.randrange(60)
            row = {"id": key, "name": f"u{key}-{self.lsn}", "score": self.rng.randrange(100),
                   "city": self.rng.choice(["ams", None])}
            if tier:
                row["tier"] = self.rng.choice(["gold", None])
            if key in self.rows and self.rng.random() < 0.2:
                out += [self.event("d", self.rows.pop(key), None), None]  # and the tombstone
            elif key in self.rows:
                out.append(self.event("u", self.rows[key], row))
                self.rows[key] = row
            else:
                out.append(self.event("r" if self.rng.random() < 0.1 else "c", None, row))
                self.rows[key] = row
        return out


def _produce(config, schema: dict, events: list[dict | None], extra: list[bytes] = ()) -> int:
    assert config.kafka.schema_registry is not None
    serializer = AvroSerializer(SchemaRegistryClient({"url": config.kafka.schema_registry.url}), json.dumps(schema))
    context = SerializationContext(config.kafka.topic, MessageField.VALUE)
    ensure_topic(config.kafka.bootstrap_servers, config.kafka.topic, 1)
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap_servers})
    values = [None if e is None else serializer(e, context) for e in events] + list(extra)
    for value in values:
        producer.produce(config.kafka.topic, value=value, partition=0)
    assert producer.flush(30) == 0
    return len(values)


def test_debezium_avro_through_the_registry_with_schema_evolution(tmp_path: Path, broker: str, registry, spark) -> None:
    config = cdc_config(tmp_path, broker, "debezium", value_format="avro",
                        schema_registry={"url": registry.url, "retries": 1})
    source = Source()
    end = _produce(config, _envelope(_value()), source.changes(300))
    ingest_until(ingest_config(config), {0: end})
    run_merge(config, MergeOptions(once=True), spark=spark)
    assert rows_by_pyiceberg(config) == source.rows

    # Version 2 adds `tier`; a key change; version 3 has a string score; two hostile values.
    moved = source.rows.pop(next(iter(source.rows)))
    new = {**moved, "id": 1000, "tier": "new"}
    source.rows[1000] = new
    events = [source.event("u", moved, new)] + source.changes(200, tier=True)
    end += _produce(config, _envelope(_value(tier=True)), events)
    end += _produce(config, _envelope(_value(score="string")),
                    [source.event("c", None, {"id": 2000, "name": "x", "score": "high", "city": None})],
                    extra=[b"\x05not-framed", b"\x00\x00\x00\x00\x01"])
    ingest_until(ingest_config(config), {0: end})
    run_merge(config, MergeOptions(once=True), spark=spark)

    expected = {k: {"city": None, "tier": None, **v} for k, v in source.rows.items()}
    assert rows_by_pyiceberg(config) == expected
    assert rows_by_duckdb(config) == expected
    reasons = sorted(d["reason"] for d in dead_letters(config).to_pylist())
    assert len(reasons) == 3, reasons
    assert any(".score': the writer schema (id 3) has string where the table has int" in r for r in reasons)
    assert any("magic byte 5" in r for r in reasons) and any("not valid Avro for writer schema id 1" in r for r in reasons)


def test_upsert_with_avro_rows_and_json_key_tombstones(tmp_path: Path, broker: str, registry, spark) -> None:
    """An upsert topic whose rows are Confluent-framed Avro (a second version adds a column)
    and whose keys are JSON: each row replaces its key's, a tombstone deletes it."""
    config = cdc_config(tmp_path, broker, "upsert", key_format="value", value_format="avro",
                        schema_registry={"url": registry.url, "retries": 1})
    assert config.kafka.schema_registry is not None
    client = SchemaRegistryClient({"url": config.kafka.schema_registry.url})
    context = SerializationContext(config.kafka.topic, MessageField.VALUE)
    v1, v2 = (AvroSerializer(client, json.dumps(_value(tier=t))) for t in (False, True))
    rng = random.Random(9)
    state: dict[int, dict] = {}
    records: list[tuple[bytes, bytes | None]] = []
    for n in range(400):
        key = rng.randrange(40)
        if key in state and rng.random() < 0.2:
            state.pop(key)
            records.append((json.dumps({"id": key}).encode(), None))
            continue
        row = {"id": key, "name": f"n{n}", "score": rng.randrange(9), "city": None}
        if n >= 200:
            row["tier"] = rng.choice(["gold", None])
        state[key] = row
        records.append((json.dumps({"id": key}).encode(), (v2 if n >= 200 else v1)(row, context)))
    ensure_topic(config.kafka.bootstrap_servers, config.kafka.topic, 1)
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap_servers})
    for key, value in records:
        producer.produce(config.kafka.topic, key=key, value=value, partition=0)
    assert producer.flush(30) == 0
    ingest_until(ingest_config(config), {0: len(records)})
    assert run_merge(config, MergeOptions(once=True), spark=spark)["changes"] == len(records)
    expected = {k: {"tier": None, **v} for k, v in state.items()}
    assert rows_by_pyiceberg(config) == expected
    assert rows_by_duckdb(config) == expected
