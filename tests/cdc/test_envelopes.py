"""The change-event decoder (decode/envelopes/changes.py) and the configuration of a primary-key
table: every event a change-log row, a dead letter with its reason, or a skipped tombstone,
exactly once; fuzzed in bulk with hostile envelopes, images and keys."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamberg.common.config import StreambergConfig
from streamberg.common.errors import ConfigError
from streamberg.common.schema import schema_from_config
from streamberg.decode.envelopes import record_decoder
from streamberg.decode.envelopes.changes import EnvelopeDecoder
from streamberg.decode.types import Widening
from streamberg.table_meta.changelog import changelog_config
from tests.cdc.helpers import USERS_SCHEMA


def _config(envelope: str, **kafka) -> StreambergConfig:
    return StreambergConfig(kafka={"topic": "t", "envelope": envelope, **kafka},
                            table={"identifier": "db.users", "primary_key": ["id"], "schema": USERS_SCHEMA})


def _decoder(envelope: str = "debezium", **kafka) -> EnvelopeDecoder:
    view = changelog_config(_config(envelope, **kafka))
    decoder = record_decoder(view, schema_from_config(view.table))
    assert isinstance(decoder, EnvelopeDecoder)
    return decoder


def _event(op, before=None, after=None, ts=1_764_000_000_000, wrap=False) -> bytes:
    event = {"before": before, "after": after, "op": op, "source": {"ts_ms": ts, "lsn": 7}}
    return json.dumps({"schema": {"type": "struct"}, "payload": event} if wrap else event).encode()


def _positions(n: int) -> tuple[list[int], list[int]]:
    return [i % 3 for i in range(n)], [1000 + i for i in range(n)]


def test_debezium_events_become_change_log_rows() -> None:
    values = [
        _event("c", after={"id": 1, "name": "a", "score": 3}),
        _event("u", {"id": 1, "name": "a"}, {"id": 1, "name": "b", "city": "ams"}, wrap=True),
        _event("d", before={"id": 1, "name": None}),
        None,  # the tombstone after the delete
        _event("r", after={"id": 2, "name": "snap"}),
        _event("u", {"id": 2, "name": "snap"}, {"id": 3, "name": "moved"}),
    ]
    result = _decoder().decode(values, None, _positions(len(values)))
    rows = result.table.to_pylist()
    assert result.kept.tolist() == [0, 1, 2, 4, 5] and not result.rejected and result.skipped == 1
    assert [r["_op"] for r in rows] == ["c", "u", "d", "r", "u"]
    assert [r["_kafka_offset"] for r in rows] == [1000, 1001, 1002, 1004, 1005]
    assert [r["_kafka_partition"] for r in rows] == [0, 1, 2, 1, 2]
    assert rows[1]["name"] == "b" and rows[1]["city"] == "ams" and rows[1]["score"] is None
    assert rows[2]["id"] == 1 and rows[2]["name"] is None  # a delete's image needs only the key
    assert [r["_before_key"] for r in rows] == [None, None, None, None, {"id": 2}]  # the key change
    assert rows[0]["_source_ts"].timestamp() == 1_764_000_000


def test_bad_events_are_dead_letters_with_their_reason() -> None:
    values = [
        b'{"op": "t", "before": null, "after": null}',
        _event("c", after={"name": "no key"}),
        _event("c", after={"id": 5}),  # name is required in the table (not in the change log)
        _event("u", {"id": "x"}, {"id": 6, "name": "n"}),  # a before key that is no key
        _event("d"),
        b"[1]", b"\xff", b'{"schema": {}, "payload": "text"}',
        _event("c", after={"id": 7, "name": "n", "score": 2 ** 40}),
        _event("c", after={"id": 8, "name": "n", "shoe": 42}),
        _event("c", after={"id": 9, "name": "n"}, ts="late"),
    ]
    result = _decoder().decode(values, None, _positions(len(values)))
    reasons = dict(result.rejected)
    assert "unknown op" in reasons[0] and "missing required field 'id'" in reasons[1]
    assert "missing required field 'name'" in reasons[2] and reasons[3].startswith("field 'before.id'")
    assert "op d without its before image" in reasons[4]
    assert "not a Debezium change event" in reasons[5] and "not JSON" in reasons[6]
    assert "not a Debezium change event" in reasons[7]
    assert isinstance(reasons[8], Widening)  # schema evolution widens the change log's column
    assert result.kept.tolist() == [9, 10]
    assert [u.path for u in result.unknown] == [("shoe",)] and result.unknown[0].rows.tolist() == [9]
    assert result.table.to_pylist()[1]["_source_ts"] is None  # a time that is no time


def test_upsert_rows_and_tombstones() -> None:
    decoder = _decoder("upsert", key_format="value")
    values = [b'{"id": 1, "name": "a"}', None, None, None, None, None]
    keys = [b'{"id": 1}', b'{"id": 1}', b"4", None, b'{"other": 1}', b"[1]"]
    result = decoder.decode(values, keys, _positions(len(values)))
    rows = result.table.to_pylist()
    assert [(r["id"], r["_op"]) for r in rows] == [(1, "u"), (1, "d"), (4, "d")]
    reasons = dict(result.rejected)
    assert "without a key" in reasons[3] and "lacks the key column(s) id" in reasons[4] and "JSON list" in reasons[5]
    text = _decoder_text()
    result = text.decode([None, None], [b"k1", b"\xff"], _positions(2))
    assert result.table.to_pylist()[0]["name"] == "k1" and "not valid UTF-8" in dict(result.rejected)[1]


def _decoder_text() -> EnvelopeDecoder:
    schema = [{"name": "name", "type": "string", "required": True}, {"name": "n", "type": "int"}]
    config = StreambergConfig(kafka={"topic": "t", "envelope": "upsert"},
                              table={"identifier": "db.k", "primary_key": ["name"], "schema": schema})
    view = changelog_config(config)
    decoder = record_decoder(view, schema_from_config(view.table))
    assert isinstance(decoder, EnvelopeDecoder)
    return decoder


@pytest.mark.parametrize(("table", "kafka", "needle"), [
    ({"primary_key": []}, {"envelope": "debezium"}, "needs table.primary_key"),
    ({"primary_key": ["score"]}, {"envelope": "debezium"}, "must be declared required"),
    ({"primary_key": ["nope"]}, {"envelope": "debezium"}, "not a top-level column"),
    ({"primary_key": ["id", "id"]}, {"envelope": "debezium"}, "listed twice"),
    ({"primary_key": ["id"]}, {"envelope": "none"}, "needs kafka.envelope"),
    ({"primary_key": ["id"]}, {"envelope": "upsert"}, "key is the text of one string key column"),
    ({"primary_key": ["id"]}, {"envelope": "debezium", "key_field": "name"}, "key_field does not apply"),
    ({"primary_key": ["id"], "schema": [*USERS_SCHEMA, {"name": "_op", "type": "string"}]}, {"envelope": "debezium"},
     "the change log's own columns"),
    ({"primary_key": ["id"]}, {"envelope": "debezium", "value_format": "protobuf",
                               "schema_registry": {"url": "http://127.0.0.1:1"}}, "protobuf is not supported with it"),
])
def test_primary_key_configs_refused_with_the_key_named(tmp_path: Path, table, kafka, needle) -> None:
    from streamberg.common.config import load_config

    document = {"kafka": {"topic": "t", **kafka},
                "table": {"identifier": "db.users", "schema": USERS_SCHEMA, **table}}
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=needle):
        load_config(path)


def test_float_keys_refused() -> None:
    with pytest.raises(ValueError, match="a key column is a primitive other than double, float"):
        StreambergConfig(kafka={"topic": "t", "envelope": "debezium"},
                         table={"identifier": "db.f", "primary_key": ["x"],
                                "schema": [{"name": "x", "type": "double", "required": True}]})


# -- fuzz ---------------------------------------------------------------------------------

_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False)
                     | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=12)
_IMAGE = st.fixed_dictionaries({}, optional={"id": _JSON | st.integers(-5, 5), "name": _JSON | st.text(max_size=4),
                                             "score": _JSON | st.integers(-3, 3), "city": _JSON})
_ENVELOPE = st.fixed_dictionaries({}, optional={"op": st.sampled_from(["c", "u", "d", "r", "t", "x"]) | _JSON,
                                                "before": _IMAGE | _JSON, "after": _IMAGE | _JSON,
                                                "source": st.fixed_dictionaries({}, optional={"ts_ms": _JSON})})
_VALUE = st.one_of(
    st.none(), st.binary(max_size=40),
    _ENVELOPE.map(lambda e: json.dumps(e).encode()),
    _ENVELOPE.map(lambda e: json.dumps({"schema": {}, "payload": e}).encode()),
    _IMAGE.map(lambda e: json.dumps(e).encode()),
)
_KEY = st.one_of(st.none(), st.binary(max_size=12), _JSON.map(lambda k: json.dumps(k).encode()),
                 st.integers(-5, 5).map(lambda k: json.dumps({"id": k}).encode()))


@pytest.mark.parametrize("envelope", ["debezium", "upsert"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=st.lists(st.tuples(_VALUE, _KEY), min_size=1, max_size=40), seed=st.integers(0, 2 ** 32))
def test_fuzzed_events_each_accounted_once(envelope: str, batch, seed: int) -> None:
    decoder = _decoder(envelope, key_format="value") if envelope == "upsert" else _decoder()
    values, keys = [v for v, _ in batch], [k for _, k in batch]
    partitions = [random.Random(seed + i).randrange(4) for i in range(len(batch))]
    offsets = list(range(seed % 1000, seed % 1000 + len(batch)))
    result = decoder.decode(values, keys, (partitions, offsets))
    rejected = [i for i, _ in result.rejected]
    held = result.rows_with_unknown().tolist()  # kept rows: schema evolution holds them
    assert sorted(result.kept.tolist() + rejected) == sorted(set(result.kept.tolist() + rejected))
    assert len(result.kept) + len(rejected) + result.skipped == len(batch)
    assert set(held) <= set(result.kept.tolist())
    assert all(isinstance(r, str) and r for _, r in result.rejected)
    assert result.table.num_rows == len(result.kept)
    rows = result.table.to_pylist()
    assert [r["_kafka_offset"] for r in rows] == [offsets[i] for i in result.kept]
    assert [r["_kafka_partition"] for r in rows] == [partitions[i] for i in result.kept]
    assert all(r["id"] is not None and r["_op"] in ("c", "u", "d", "r") for r in rows)
    if envelope == "upsert":
        assert result.skipped == 0  # an upsert tombstone is a delete or a dead letter, never skipped
