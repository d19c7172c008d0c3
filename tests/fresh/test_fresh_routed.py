"""Fresh reads of the tables of a field-routed topic (`route_field`): each table is one route
value's records of a shared topic, so its tail is that value's records alone, picked by the
writers' own rule (fresh/tail.routed_here); the route's unrouted table holds none.

The real broker and the real ingest code (Writer -> Committers in process, as in
tests/ingest/test_fleet_hostile.py): a first batch is committed, a second one (every region,
plus records no table takes: not JSON, no region, a region that is no table name) waits in
Kafka. A fresh read of each region's table is the test's own expectation of that region, each
id once; DuckDB (`streamberg query --fresh`) counts the same.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml
from confluent_kafka import Producer

from streamberg.common.broker import ensure_topic
from streamberg.common.config import load_fleet
from streamberg.fresh import read
from streamberg.ingest.committers import Committers
from streamberg.ingest.writer import Writer
from tests.runbooks.inprocess import cli

REGIONS = ("eu", "us", "apac")


def _record(i: int) -> bytes:
    kind = i % 11
    if kind == 9:
        return b"{not json"
    if kind == 10:
        return json.dumps({"id": i, "region": "no such region!"}).encode()  # no table name: a dead letter
    return json.dumps({"id": i, "region": REGIONS[i % 3], "amount": i / 2}).encode()


def _region_of(i: int) -> str | None:
    return REGIONS[i % 3] if i % 11 < 9 else None


def test_each_route_value_table_reads_its_own_records_fresh(tmp_path: Path, broker: str) -> None:
    p = f"r{int(time.time() * 1000) % 100000}"
    topic = f"{p}-orders"
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": broker, "value_format": "json"},
        "catalog": {"name": f"c{p}", "uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "defaults": {"ingest": {"commit_interval_seconds": 0.5, "state_dir": "state", "parallelism": 1,
                                "topic_discovery_seconds": 0.5}},
        "tables": [{"identifier": f"{p}.orders_{{region}}", "topics": [topic], "route_field": "region",
                    "schema": [{"name": "id", "type": "long", "required": True},
                               {"name": "region", "type": "string"}, {"name": "amount", "type": "double"}]}],
    }, sort_keys=False))
    fleet = load_fleet(path)
    ensure_topic(broker, topic, 2)
    producer = Producer({"bootstrap.servers": broker, "linger.ms": 2})

    def produce(ids: range) -> None:
        for i in ids:
            producer.produce(topic, value=_record(i), partition=i % 2)
        assert producer.flush(30) == 0

    produce(range(0, 200))
    writer, committer = Writer(fleet, 0, 1, f"{p}-1"), Committers(fleet, 1, f"{p}-1")
    writer.open()
    committer.open()
    first = {r: sorted(i for i in range(200) if _region_of(i) == r) for r in REGIONS}
    try:
        deadline = time.monotonic() + 120
        while not all(_count(path, f"{p}.orders_{r}") == len(first[r]) for r in REGIONS):
            assert time.monotonic() < deadline, "the first batch was never committed"
            for unit in writer.poll():
                committer.offer(unit)
    finally:
        writer.close()
        committer.close()
    produce(range(200, 530))  # waits in Kafka: only a fresh read sees it

    for region in REGIONS:
        result = read(path, f"{p}.orders_{region}")
        expected = sorted(i for i in range(530) if _region_of(i) == region)
        ids = result.rows.column("id").to_pylist()
        assert sorted(ids) == expected and len(set(ids)) == len(ids), region
        assert result.snapshot_rows == len(first[region])
        assert result.tail is not None and result.tail.records == 330
        assert result.tail.rows.num_rows == len(expected) - len(first[region])
        # The tail's other records: the other regions' and those no table takes.
        assert result.tail.elsewhere == 330 - result.tail.rows.num_rows - result.tail.rejected
        assert result.bounds.watermarks == {0: 265, 1: 265}
        answer = cli("query", "--config", str(path), "--fresh", "--json",
                     f"SELECT count(*) AS n, count(DISTINCT id) AS d FROM {p}.orders_{region}")
        assert json.loads(answer.stdout.strip().splitlines()[-1]) == {"n": len(expected), "d": len(expected)}
    # The route's unrouted table holds no rows: nothing of the tail is its.
    unrouted = read(path, f"{p}.orders__unrouted")
    assert unrouted.rows.num_rows == 0 and unrouted.tail is not None and unrouted.tail.elsewhere == 330


def _count(path: Path, identifier: str) -> int:
    try:
        return read(path, identifier, fresh=False).rows.num_rows
    except Exception:  # noqa: BLE001 - not made yet
        return -1
