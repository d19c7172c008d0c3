"""End to end: hostile records mixed into a stream neither crash nor restart the ingest.

A real tansu broker, `streamberg ingest` (PyFlink) in a subprocess, the table read back with
pyiceberg. The stream mixes valid events (timestamps as epoch milliseconds, as ISO strings,
and a second field in epoch seconds set by the config's `unit`) with `null`, `  null  `,
`true`, `[]`, `"x"`, `1`, invalid UTF-8, a byte order mark, NUL bytes, deep nesting, NaN, a
tombstone and two 2 MB records (one valid, one not). Before the screen, the `null` record
alone killed the ingest process with a segfault on every restart.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
import yaml
from confluent_kafka import Producer

from streamberg.common.broker import ensure_topic
from tests.helpers import EVENT_SCHEMA, config_at, dead_letters, duplicates, streamberg, write_config

pytestmark = pytest.mark.flink

PARTITIONS = 2
VALID = 3000
TS_MS = 1_763_719_200_123  # 2025-11-21T10:00:00.123Z
BIG = 2 * 1024 * 1024

# (value, substring of its dead-letter reason)
HOSTILE = [
    (b"null", "not a JSON object: the record is null"),
    (b"  null  ", "not a JSON object: the record is null"),
    (b"true", "not a JSON object: the record is a boolean"),
    (b"[]", "not a JSON object: the record is an array"),
    (b'"x"', "not a JSON object: the record is a string"),
    (b"1", "not a JSON object: the record is a number"),
    (b'{"id": 1, "ts": 5, "user_id": "\xff"}', "value is not valid UTF-8"),
    (b'\xef\xbb\xbf{"id": 1, "ts": 5, "user_id": "u"}', "byte order mark"),
    (b'{"id": 1, "ts": 5, "user_id": "u\x00"}', "NUL byte"),
    (b'{"id": 1, "ts": 5, "user_id": "u", "amount": NaN}', "NaN and Infinity"),
    (b'{"id": 1, "ts": 5, "user_id": "u"} {"id": 2}', "more than one JSON value"),
    (b'{"id": 1, "ts": 5, "user_id": "u", "n": ' + b"[" * 100_000 + b"]" * 99_999 + b"}",
     "nested more than 256 levels deep"),  # the ingest's decoder screens depth before inferring new fields
    (b'{"id": 1, "ts": 99999999999999999, "user_id": "u"}', "epoch (ms) outside years 0001-9999"),
    (b'{"id": 1, "ts": "2026-02-30T00:00:00Z", "user_id": "u"}', "not an ISO-8601 timestamp"),
    (None, "null value (tombstone)"),
]
# Once only: a 2 MB record that is not valid (the valid one is event 1234).
BIG_BAD = (b'{"id": 1, "ts": 5, "user_id": "' + b"x" * BIG + b'", "amount": "oops"}', "changed from number to string")


def valid_event(i: int) -> dict:
    event = {"id": i, "ts": TS_MS + i if i % 3 else f"2026-11-21T10:00:{i % 60:02d}Z", "user_id": f"u{i % 7}",
             "seen": 1_700_000_000 + i}
    if i == 1234:  # a 2 MB record that is valid: it must land in the table whole
        event["city"] = "c" * BIG
    if i % 5 == 0:
        event["amount"] = i / 4
    return event


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory, broker: str):
    directory = tmp_path_factory.mktemp("hostile")
    path = write_config(directory, broker, "hostile-events",
                        ingest={"max_record_bytes": 3 * 1024 * 1024, "parallelism": 2, "max_poll_records": 500})
    document = yaml.safe_load(path.read_text())
    document["table"]["schema"] = EVENT_SCHEMA + [{"name": "seen", "type": "timestamptz", "unit": "s"}]
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, PARTITIONS)

    producer = Producer({"bootstrap.servers": broker, "message.max.bytes": 8 * 1024 * 1024, "linger.ms": 5})
    delivered: dict[int, tuple[int, int]] = {}  # record number -> (partition, offset)
    records: list[bytes | None] = []
    bad_positions = {}
    for i in range(VALID):
        records.append(json.dumps(valid_event(i)).encode())
        if i % 300 == 75:  # every hostile record, spread through the stream and both partitions
            for value, reason in HOSTILE + ([BIG_BAD] if i == 75 else []):
                bad_positions[len(records)] = reason
                records.append(value)

    def on_delivery(number: int):
        def callback(err, msg) -> None:
            assert err is None, err
            delivered[number] = (msg.partition(), msg.offset())
        return callback

    for number, value in enumerate(records):
        producer.produce(config.kafka.topic, value=value, key=str(number).encode(), partition=number % PARTITIONS,
                         on_delivery=on_delivery(number))
        producer.poll(0)
    assert producer.flush(60) == 0
    run = streamberg("ingest", "--config", str(path), "--max-records", str(len(records)), "--quiet", timeout=900)
    return config, records, bad_positions, delivered, run


def test_every_valid_record_lands_once_with_its_values(hostile_run) -> None:
    from streamberg.common.catalog import load_catalog

    config, _, _, _, run = hostile_run
    assert json.loads(run.stdout.strip().splitlines()[-1])["consumed"] > VALID
    table = load_catalog(config.catalog).load_table(config.table.identifier).scan().to_arrow()
    ids = table.column("id").to_pylist()
    assert not duplicates(ids) and sorted(ids) == list(range(VALID))
    rows = {r["id"]: r for r in table.select(["id", "ts", "seen", "city"]).to_pylist()}
    for i in (1, 2, 3, 1234, VALID - 1):
        expected = valid_event(i)
        ts = rows[i]["ts"]
        if isinstance(expected["ts"], int):
            assert ts == datetime.fromtimestamp(expected["ts"] / 1000, timezone.utc)
        else:
            assert ts == datetime.fromisoformat(expected["ts"])
        assert rows[i]["seen"] == datetime.fromtimestamp(expected["seen"], timezone.utc)  # unit: s from the config
    assert len(rows[1234]["city"]) == BIG


def test_every_hostile_record_is_dead_lettered_with_its_reason(hostile_run) -> None:
    config, records, bad_positions, delivered, _ = hostile_run
    dlq = dead_letters(config).select(["partition", "offset", "value", "reason"]).to_pylist()
    by_position = {(r["partition"], r["offset"]): r for r in dlq}
    assert len(dlq) == len(by_position) == len(bad_positions)
    for number, reason in bad_positions.items():
        row = by_position[delivered[number]]
        assert reason in row["reason"], (records[number][:80] if records[number] else None, row["reason"])
        assert row["value"] == records[number]


def test_the_job_never_restarted(hostile_run) -> None:
    _, _, _, _, run = hostile_run
    events = [json.loads(line) for line in run.stderr.splitlines() if line.startswith("{")]
    opened = [e for e in events if e.get("event") == "lane opened"]
    # One open per writer subtask: a restart (Flink's restart strategy) would open them again.
    assert len(opened) == 2, [e.get("event") for e in events][:50]
    assert run.returncode == 0
