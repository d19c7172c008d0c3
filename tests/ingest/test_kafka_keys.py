"""`kafka.key_field`: the record's key written into a string column (ingest/records.py)."""

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
from streamberg.ingest.records import RecordDecoder
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
