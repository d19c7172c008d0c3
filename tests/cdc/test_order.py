"""No older change ever overwrites a newer one (docs/cdc.md#order, merge/order.py).

Each case is a reproduction that produced a wrong table before the sequence rule: a replayed
range, a rewound topic under `skip-and-record`, keys moving to other partitions, a key
change tied in time with the key's insert, a newer change on a lower partition number, an
older insert replayed after a delete, an upsert ordered by its sequence_field. Records go
through the real writer and committer (tests/runbooks/inprocess.py) and the real merge on the
shared Spark session; the table is read by Spark, DuckDB and pyiceberg and compared with the
state this test computes by applying the events in their source order: row counts, distinct
keys and values.

tansu cannot add partitions to a topic (CreatePartitions is unsupported), so "partitions added
mid-stream" is a topic whose last two partitions stay empty until the keys move to them:
the merge sees exactly what it would see after Kafka added them.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.ingest.replay import replay_range
from streamberg.merge.app import MergeOptions, run_merge
from streamberg.table_meta.changelog import ingest_config, key_state_identifier
from streamberg.table_meta.offsets import summary_properties
from streamberg.table_meta.summary_keys import SummaryKeys, kafka_skips_key
from tests.cdc.helpers import USERS_SCHEMA, assert_table_holds, cdc_config
from tests.helpers import dead_letters
from tests.runbooks.inprocess import ingest_until

COLUMNS = ["id", "name", "score", "city"]


def _produce(config, partitions: int, events: list[tuple[int, bytes | None, bytes | None]],
             ends: dict[int, int] | None = None) -> dict[int, int]:
    """Produce (partition, key, value) in order; returns the next offset of each partition,
    counted from `ends` (the offsets before; tansu's high watermark can lag by a batch)."""
    ensure_topic(config.kafka.bootstrap_servers, config.kafka.topic, partitions)
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap_servers, "linger.ms": 5})
    out = dict(ends or {p: 0 for p in range(partitions)})
    for partition, key, value in events:
        producer.produce(config.kafka.topic, key=key, value=value, partition=partition)
        out[partition] += 1
    assert producer.flush(30) == 0
    return out


def _merge(config, spark) -> dict:
    summary = run_merge(config, MergeOptions(once=True), spark=spark)
    assert summary["merges"] == 1, summary
    return summary["last"]


class Source:
    """A Postgres table's change stream as Debezium writes it: each event its own
    transaction, its position `sequence: [last commit LSN, LSN]`, the truth applied in
    source order."""

    def __init__(self) -> None:
        self.lsn = 1000
        self.state: dict[int, dict] = {}
        self.events: list[tuple[int, bytes]] = []  # (key, value) in source order

    def change(self, op: str, key: int, row: dict | None = None, ts: int | None = None) -> bytes:
        self.lsn += 10
        before = {**self.state[key]} if key in self.state else None
        after = None if op == "d" else {"id": key, **(row or {})}
        if op == "d":
            self.state.pop(key, None)
        else:
            self.state[key] = after
        source = {"connector": "postgresql", "ts_ms": ts if ts is not None else 1_764_000_000_000 + self.lsn,
                  "lsn": self.lsn, "sequence": json.dumps([str(self.lsn - 5), str(self.lsn)])}
        value = json.dumps({"before": before if op != "c" else None, "after": after, "op": op,
                            "source": source}).encode()
        self.events.append((key, value))
        return value

    def random_changes(self, rng: random.Random, keys: range, count: int) -> list[tuple[int, bytes]]:
        out = []
        for n in range(count):
            key = rng.choice(keys)
            if key in self.state and rng.random() < 0.15:
                out.append((key, self.change("d", key)))
            else:
                op = "u" if key in self.state else "c"
                out.append((key, self.change(op, key, {"name": f"n{key}-{n}", "score": rng.randrange(1000),
                                                       "city": rng.choice(["ams", None])})))
        return out


@pytest.mark.slow  # 9-12 s alone on 2 cores (make test-fast --durations, 2026-11-29)
def test_debezium_positions_keep_replays_rewinds_and_moved_keys_from_overwriting(tmp_path: Path, broker: str,
                                                                                  spark) -> None:
    config = cdc_config(tmp_path, broker, "debezium", {"ingest": {
        "commit_interval_seconds": 1, "parallelism": 2, "state_dir": "state", "on_lost_offsets": "skip-and-record"}})
    view = ingest_config(config)
    rng = random.Random(28)
    source = Source()

    # Round 1: 120 keys on partitions 0 and 1 (partitions 2 and 3 stay empty).
    first = source.random_changes(rng, range(120), 1500)
    ends = _produce(config, 4, [(k % 2, json.dumps({"id": k}).encode(), v) for k, v in first])
    ingest_until(view, ends)
    outcome = _merge(config, spark)
    assert outcome["stale"] == 0
    assert_table_holds(spark, config, source.state, columns=COLUMNS)
    merged_once = {**source.state}

    # A replay of partition 0's whole committed range: the change log gets every change again,
    # each older than what the table holds (or equal to it); nothing changes.
    replay_range(view, 0, 0, ends[0])
    catalog = load_catalog(config.catalog)
    before = catalog.load_table(config.table.identifier).current_snapshot().snapshot_id
    outcome = _merge(config, spark)
    on_p0 = {k for k, _ in first if k % 2 == 0}
    assert outcome["stale"] == len(on_p0), outcome  # every key of the partition, its newest change again
    assert outcome["keys"] == 0 and outcome["deletes"] == 0
    assert_table_holds(spark, config, merged_once, columns=COLUMNS)
    resurrectable = {k for k, v in first if k % 2 == 0 and k not in source.state}
    assert resurrectable, "the replayed range holds inserts of keys deleted later"
    table = catalog.load_table(config.table.identifier)
    assert table.current_snapshot().snapshot_id != before  # the merge committed its position ...
    assert summary_properties(table.current_snapshot())[SummaryKeys.MERGE_STALE] == str(len(on_p0))
    # ... and the key state knows every key, the deleted ones as tombstones.
    state = catalog.load_table(key_state_identifier(config)).scan().to_arrow().to_pylist()
    assert {s["key"]["id"] for s in state} == {k for k, _ in first}
    assert {s["key"]["id"] for s in state if s["deleted"]} == {k for k, _ in first} - set(source.state)

    # Partitions "added": keys now live on partition key % 4; the moved keys' changes sit at
    # offsets far below their old partition's, and are newer.
    second = source.random_changes(rng, range(120), 1200)
    ends = _produce(config, 4, [(k % 4, json.dumps({"id": k}).encode(), v) for k, v in second], ends)
    ingest_until(view, ends)
    outcome = _merge(config, spark)
    assert outcome["stale"] == 0
    assert_table_holds(spark, config, source.state, columns=COLUMNS)

    # A rewound topic under skip-and-record: recreated, it holds old changes again (a failover
    # to a lagging copy) and then new ones. The old ones are skipped, the new ones applied.
    admin = AdminClient({"bootstrap.servers": broker})
    for future in admin.delete_topics([config.kafka.topic]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while config.kafka.topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    old = [(k, v) for k, v in second[:300]]
    fresh = source.random_changes(rng, range(120, 140), 40)
    ends = _produce(config, 4, [(k % 4, json.dumps({"id": k}).encode(), v) for k, v in old + fresh])
    ingest_until(view, ends)
    outcome = _merge(config, spark)
    assert outcome["stale"] == len({k for k, _ in old}), outcome
    assert_table_holds(spark, config, source.state, columns=COLUMNS)
    skips = [summary_properties(s).get(kafka_skips_key(config.kafka.topic)) for s in catalog.load_table(
        f"{config.table.identifier}_changelog").snapshots()]
    assert any(skips), "the rewind is recorded in the change log"


def _event(op: str, before: dict | None, after: dict | None, ts: int) -> bytes:
    # No connector named: the sequence is source.ts_ms alone (decode/envelopes/source_position.py).
    return json.dumps({"before": before, "after": after, "op": op, "source": {"ts_ms": ts}}).encode()


def test_time_ordered_changes_key_changes_and_reserved_names(tmp_path: Path, broker: str, spark) -> None:
    config = cdc_config(tmp_path, broker, "debezium")
    view = ingest_config(config)
    row = {"score": 1, "city": "x"}
    filler = [(1, b"f", _event("c", None, {"id": 10_000 + i, "name": "filler"}, 500)) for i in range(900)]
    batch = [
        # A key change tied in time with the key's insert, on one partition: the offset says
        # the change came second, so key 1 is gone and key 2 holds the row.
        (0, b"1", _event("c", None, {"id": 1, "name": "first", **row}, 1000)),
        (0, b"2", _event("u", {"id": 1, "name": "first"}, {"id": 2, "name": "moved", **row}, 1000)),
        # The newer change of key 5 on partition 0 at offset 2; the older on partition 1 at
        # offset 900: the source time decides, not the partition number nor the offset.
        (0, b"5", _event("u", {"id": 5}, {"id": 5, "name": "newer", **row}, 2000)),
        *filler,
        (1, b"5", _event("c", None, {"id": 5, "name": "older", **row}, 1000)),
        # Source columns named like the merge's working columns arrive by schema evolution.
        (0, b"7", _event("c", None, {"id": 7, "name": "seven", "_streamberg_moved": 1, "_streamberg_rank": 2,
                                     "_streamberg_seq": "s", "_streamberg_apply": False}, 3000)),
        # A source column named like one of the change log's own: a dead letter that says so.
        (0, b"8", _event("c", None, {"id": 8, "name": "eight", "_op": "x"}, 3000)),
    ]
    ends = _produce(config, 2, batch)
    ingest_until(view, ends)
    _merge(config, spark)
    expected = {2: {"id": 2, "name": "moved"}, 5: {"id": 5, "name": "newer"}, 7: {"id": 7, "name": "seven"},
                **{10_000 + i: {"id": 10_000 + i, "name": "filler"} for i in range(900)}}
    assert_table_holds(spark, config, expected, columns=["id", "name"])
    columns = [f.name for f in load_catalog(config.catalog).load_table(config.table.identifier).schema().fields]
    assert {"_streamberg_moved", "_streamberg_rank", "_streamberg_seq", "_streamberg_apply"} <= set(columns)
    reasons = [d["reason"] for d in dead_letters(config).to_pylist()]
    assert len(reasons) == 1 and "field '_op' has a name the change log reserves" in reasons[0], reasons

    # Across merges: the key change of key 3 (tied in time) after its insert was merged, and
    # an older change of key 5 arriving on partition 1 after the newer one was merged.
    ends = _produce(config, 2, [(0, b"3", _event("c", None, {"id": 3, "name": "three"}, 4000))], ends)
    ingest_until(view, ends)
    _merge(config, spark)
    ends = _produce(config, 2, [
        (0, b"4", _event("u", {"id": 3, "name": "three"}, {"id": 4, "name": "four"}, 4000)),
        (1, b"5", _event("u", {"id": 5}, {"id": 5, "name": "stale", **row}, 1500)),
    ], ends)
    ingest_until(view, ends)
    outcome = _merge(config, spark)
    assert outcome["stale"] == 1, outcome
    expected[4] = {"id": 4, "name": "four"}
    assert_table_holds(spark, config, expected, columns=["id", "name"])


def test_upsert_ordered_by_sequence_field(tmp_path: Path, broker: str, spark) -> None:
    schema = [*USERS_SCHEMA, {"name": "updated_at", "type": "long", "required": True}]
    config = cdc_config(tmp_path, broker, "upsert", {"table": {
        "identifier": "db.users", "schema": schema, "primary_key": ["id"], "sequence_field": "updated_at"}},
        key_format="value")
    view = ingest_config(config)

    def upsert(key: int, name: str, at: int) -> tuple[bytes, bytes]:
        return json.dumps({"id": key}).encode(), json.dumps({"id": key, "name": name, "updated_at": at}).encode()

    batch = [
        (0, *upsert(1, "newer", 200)), (1, *upsert(1, "older", 100)),  # across partitions, one batch
        (0, *upsert(2, "two", 100)), (0, b'{"id": 2}', None),  # a tombstone takes the sequence before it
        (0, *upsert(2, "older than the delete", 50)),
        (1, *upsert(3, "three", 300)),
        (0, *upsert(-4, "negative", -5)), (0, *upsert(-4, "less negative", -1)),
    ]
    ends = _produce(config, 2, [(p, k, v) for p, k, v in batch])
    ingest_until(view, ends)
    _merge(config, spark)
    expected = {1: {"id": 1, "name": "newer", "updated_at": 200}, 3: {"id": 3, "name": "three", "updated_at": 300},
                -4: {"id": -4, "name": "less negative", "updated_at": -1}}
    assert_table_holds(spark, config, expected)
    ends = _produce(config, 2, [(0, *upsert(3, "stale", 250)), (1, *upsert(1, "newest", 201))], ends)
    ingest_until(view, ends)
    outcome = _merge(config, spark)
    assert outcome["stale"] == 1 and outcome["keys"] == 1, outcome
    expected[1] = {"id": 1, "name": "newest", "updated_at": 201}
    assert_table_holds(spark, config, expected)


def test_a_resync_refuses_while_its_records_are_dead_letters(tmp_path: Path, broker: str, spark) -> None:
    from datetime import datetime, timezone

    from streamberg.common.errors import MergeError

    config = cdc_config(tmp_path, broker, "debezium")
    view = ingest_config(config)
    rows = [(k % 2, str(k).encode(), _event("c", None, {"id": k, "name": f"n{k}"}, 1000 + k)) for k in range(20)]
    ends = _produce(config, 2, rows)
    ingest_until(view, ends)
    _merge(config, spark)
    time.sleep(0.05)
    since = int(datetime.now(timezone.utc).timestamp() * 1000)
    time.sleep(0.05)
    # The resync sends keys 0-9 again; key 10's snapshot record does not decode.
    resync = [(k % 2, str(k).encode(), _event("r", None, {"id": k, "name": f"r{k}"}, 5000 + k)) for k in range(10)]
    resync.append((0, b"10", _event("r", None, {"id": "ten", "name": "r10"}, 5010)))
    ends = _produce(config, 2, resync, ends)
    ingest_until(view, ends)
    try:
        run_merge(config, MergeOptions(once=True, resynced_since_ms=since), spark=spark)
        raise AssertionError("the resync was not refused")
    except MergeError as exc:
        assert "1 record(s) of the table went to the dead letters" in str(exc), exc
    expected = {k: {"id": k, "name": f"r{k}" if k < 10 else f"n{k}"} for k in range(20)}
    assert_table_holds(spark, config, expected, columns=["id", "name"])  # merged, nothing deleted
    summary = run_merge(config, MergeOptions(once=True, resynced_since_ms=since, ignore_dead_letters=True),
                        spark=spark)
    assert summary["resync"]["rows_deleted"] == 10, summary
    assert_table_holds(spark, config, {k: v for k, v in expected.items() if k < 10}, columns=["id", "name"])


@pytest.mark.slow
def test_the_governor_merges_a_primary_key_table(tmp_path: Path, broker: str, spark) -> None:
    """`streamberg govern --once` (the real command, one Spark session of its own) finds the
    change log's unapplied changes due before the table exists (its first merge makes it),
    merges them with the merge's own code (ordered by source position), and plans no merge
    after; every reader sees exactly the source's state."""
    from tests.helpers import streamberg

    config = cdc_config(tmp_path, broker, "debezium")
    rng = random.Random(31)
    source = Source()
    changes = source.random_changes(rng, range(60), 600)
    ends = _produce(config, 2, [(k % 2, json.dumps({"id": k}).encode(), v) for k, v in changes])
    ingest_until(ingest_config(config), ends)
    path = str(tmp_path / "streamberg.yaml")
    plan = json.loads(streamberg("govern", "--config", path, "--dry-run", "--json").stdout)
    # The table does not exist before its first merge: the merge alone is due, nothing refused.
    assert [p["action"] for p in plan["planned"]] == ["merge"] and not plan["problems"], plan
    ran = json.loads(streamberg("govern", "--config", path, "--once", "--json").stdout)["ran"]
    assert [(r["action"], r["ok"]) for r in ran] == [("merge", True)], ran
    assert_table_holds(spark, config, source.state, columns=COLUMNS)
    after = json.loads(streamberg("govern", "--config", path, "--dry-run", "--json").stdout)
    assert not any(p["action"] == "merge" for p in after["planned"]), after
