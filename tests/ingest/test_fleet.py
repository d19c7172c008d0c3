"""Many tables from one ingest (ingest/writer.py), driven in process: the real Writer
(one consumer, a lane per table) and Committers (a Committer per table) on a real broker,
a SQLite catalog and Parquet files; read back by pyiceberg and DuckDB.

22 topics: one named topic with a declared schema, twenty by a pattern whose tables are
created from their first records (`schema: infer`), and a Debezium topic whose change log a
pattern route makes; malformed records in each; a topic whose name collides with another's
table once made an identifier; a topic created while the job runs; a table dropped while it
runs, which the others outlive. Every table: its rows once (count and distinct ids), its dead
letters with their reasons.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer

from streamberg.common.broker import ensure_topic
from streamberg.common.config import load_fleet
from streamberg.ingest.committers import Committers
from streamberg.ingest.writer import Writer

EVENTS = 20


def _fleet(tmp_path: Path, broker: str, prefix: str) -> Path:
    document = {
        "kafka": {"bootstrap_servers": broker, "value_format": "json"},
        "catalog": {"name": f"c{prefix.replace('-', '_')}", "uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "defaults": {"table": {"partition_spec": [{"source": "ts", "transform": "day"}]},
                     "ingest": {"commit_interval_seconds": 0.5, "state_dir": "state", "parallelism": 1,
                                "topic_discovery_seconds": 0.5, "table_failures_to_pause": 3,
                                "max_open_files": 5}},
        "tables": [
            {"identifier": "shop.orders", "topics": [f"{prefix}orders"],
             "schema": [{"name": "id", "type": "long", "required": True},
                        {"name": "ts", "type": "timestamptz", "required": True},
                        {"name": "amount", "type": "double"}]},
            {"identifier": "raw.{topic}", "topic_pattern": f"{prefix}events\\..*", "schema": "infer"},
            {"identifier": "cdc.{source_table}", "topic_pattern": f"{prefix}dbserver1\\.inventory\\..*",
             "envelope": "debezium", "primary_key": ["id"], "partition_spec": [],
             "schema": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"}]},
        ],
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _produce(broker: str, topic: str, values: list[bytes]) -> None:
    ensure_topic(broker, topic, 2)
    producer = Producer({"bootstrap.servers": broker, "linger.ms": 5})
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % 2)
    assert producer.flush(30) == 0


def _event(i: int, **extra) -> bytes:
    return json.dumps({"id": i, "ts": "2026-11-26T01:00:00+00:00", "amount": i / 2, **extra}).encode()


def _drive(writer: Writer, committer: Committers, until, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, ("the fleet did not get there in time", sorted(writer.lanes),
                                             committer.paused, {t: f[0] for t, f in committer.failing.items()})
        for unit in writer.poll():
            committer.offer(unit)
        # Memory bounded whatever the number of tables: ingest.max_open_files over them all.
        assert sum(lane.files.open_files for lane in writer.lanes.values()) <= 5


def _rows(catalog, identifier: str) -> list[int]:
    return catalog.load_table(identifier).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()


@pytest.mark.slow
def test_one_ingest_writes_many_tables_each_exactly_once(tmp_path: Path, broker: str) -> None:
    prefix = f"f{int(time.time() * 1000) % 100000}-"
    fleet = load_fleet(_fleet(tmp_path, broker, prefix))
    catalog_config = fleet.document(fleet.tables[0], f"{prefix}orders")["catalog"]
    expected: dict[str, int] = {}
    dead: dict[str, int] = {}
    _produce(broker, f"{prefix}orders", [_event(i) for i in range(300)] + [b"not json", b'{"id": "x"}'])
    expected["shop.orders"], dead["shop.orders"] = 300, 2
    for t in range(EVENTS):
        topic = f"{prefix}events.t{t:02d}"
        extra = {"kind": f"k{t}"} if t % 2 else {}
        _produce(broker, topic, [_event(i, **extra) for i in range(50 + t)] + [b"[1, 2]"])
        expected[f"raw.{prefix.replace('-', '_')}events_t{t:02d}"] = 50 + t
        dead[f"raw.{prefix.replace('-', '_')}events_t{t:02d}"] = 1
    cdc_topic = f"{prefix}dbserver1.inventory.customers"
    _produce(broker, cdc_topic, [json.dumps({"op": "c", "after": {"id": i, "name": f"n{i}"},
                                             "source": {"ts_ms": 1000 + i}}).encode() for i in range(40)])

    writer = Writer(fleet, 0, 1, "fleet-test")
    committer = Committers(fleet, 1, "fleet-test")
    writer.open()
    committer.open()
    from streamberg.common.catalog import load_catalog as open_catalog
    from streamberg.common.config import CatalogConfig

    catalog = open_catalog(CatalogConfig.model_validate({**catalog_config, "name": fleet.catalog.name}))

    def all_there() -> bool:
        try:
            return all(len(_rows(catalog, t)) >= n for t, n in expected.items()) and \
                catalog.load_table("cdc.customers_changelog").scan().to_arrow().num_rows >= 40
        except Exception:  # noqa: BLE001 - a table not created yet
            return False

    try:
        _drive(writer, committer, all_there)
        # A route's table records its topic in the commit that made it (not in a second one).
        from pyiceberg.serializers import FromInputFile

        orders = catalog.load_table("shop.orders")
        log = orders.metadata.metadata_log
        made = FromInputFile.table_metadata(orders.io.new_input(log[0].metadata_file if log else
                                                                 orders.metadata_location))
        assert made.properties.get("streamberg.route.topic") == f"{prefix}orders", made.properties
        # A name that makes the same identifier as events.t00's, made later: not read, reported.
        _produce(broker, f"{prefix}events.T00", [_event(0)])
        _drive(writer, committer, lambda: f"{prefix}events.T00" in writer.tables.refused)
        assert "already topic" in writer.tables.refused[f"{prefix}events.T00"]

        # A topic created while the job runs gets its table without a restart.
        late = f"{prefix}events.late"
        _produce(broker, late, [_event(i, late=True) for i in range(25)])
        expected[f"raw.{prefix.replace('-', '_')}events_late"] = 25
        _drive(writer, committer, all_there)

        # A table dropped while the job runs: its commits fail, it is paused, the others go on.
        dropped = f"raw.{prefix.replace('-', '_')}events_t05"
        catalog.drop_table(dropped)
        expected.pop(dropped)
        _produce(broker, f"{prefix}events.t05", [_event(1000 + i) for i in range(10)])
        _produce(broker, f"{prefix}orders", [_event(300 + i) for i in range(30)])
        expected["shop.orders"] = 330
        _drive(writer, committer, lambda: dropped in committer.paused and all_there())
        for unit in writer.finish():
            committer.offer(unit)
    finally:
        writer.close()
        committer.close()

    assert committer.paused == {dropped: committer.paused[dropped]} and "NoSuchTable" in committer.paused[dropped]
    assert writer.closed_early > 0  # 22 tables, 5 open files: the least recently written were closed
    assert json.loads((Path(fleet.defaults.ingest.state_dir) / "runs" / "fleet-test" / "paused-tables.json")
                      .read_text()).keys() == {dropped}
    for table, count in expected.items():
        ids = _rows(catalog, table)
        assert len(ids) == count and len(set(ids)) == count, (table, len(ids), len(set(ids)))
        letters = catalog.load_table(f"{table}_dead_letters").scan().to_arrow().num_rows
        assert letters == dead.get(table, 0), (table, letters)
    # Inferred tables: typed from their first records, partitioned by the route's spec.
    odd = catalog.load_table(f"raw.{prefix.replace('-', '_')}events_t01")
    assert {f.name for f in odd.schema().fields} == {"id", "ts", "amount", "kind"}
    changelog = catalog.load_table("cdc.customers_changelog").scan().to_arrow()
    assert changelog.num_rows == 40 and sorted(changelog.column("id").to_pylist()) == list(range(40))

    # `streamberg status` of the whole config: one line a table, worst first, the paused one
    # named with its reason, the refused topic listed; --table X is that table's screen.
    from tests.runbooks.inprocess import cli

    with_run = Path(fleet.defaults.ingest.state_dir) / "runs" / "fleet-test"
    assert with_run.is_dir()
    out = cli("status", "--config", str(tmp_path / "fleet.yaml"), check=False)
    lines = out.stdout.splitlines()
    # The tables expected, the dropped one and the CDC table (critical until a merge makes it).
    assert out.returncode == 1 and lines[0].startswith(f"{len(expected) + 2} tables, verdict CRITICAL"), out.stdout
    assert lines[2].startswith("PAUSED") and dropped in lines[2] and "NoSuchTable" in lines[2], lines[2]
    assert any(line.startswith("REFUSED") and f"{prefix}events.T00" in line for line in lines)
    assert sum(1 for line in lines if "shop.orders" in line) == 1
    one = cli("status", "--config", str(tmp_path / "fleet.yaml"), "--table", "shop.orders", "--json", check=False)
    assert json.loads(one.stdout)["table"] == "shop.orders", one.stdout


@pytest.mark.slow
def test_a_route_field_splits_a_topic_into_tables_exactly_once(tmp_path: Path, broker: str) -> None:
    """`route_field`: one topic, a table per value of a record field. Hostile values (missing,
    null, nested, too long, a path, a side table's name, not JSON) are dead letters of the
    route's `_unrouted` table with their reason; a value past ingest.max_tables_per_route too.
    The lanes share the topic's partitions but each table keeps its own offsets: a restart
    after records were read and not committed puts every record in its table once."""
    prefix = f"r{int(time.time() * 1000) % 100000}-"
    topic = f"{prefix}clicks"
    document = {
        "kafka": {"bootstrap_servers": broker, "value_format": "json"},
        "catalog": {"name": f"c{prefix.replace('-', '_')}", "uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "defaults": {"ingest": {"commit_interval_seconds": 0.5, "state_dir": "state", "parallelism": 1,
                                "topic_discovery_seconds": 0.5, "max_tables_per_route": 3,
                                # Any data commits at once; a value table that only moved past the
                                # others' records commits its position at most every 3 s.
                                "commit_min_bytes": 1, "commit_max_wait_seconds": 3}},
        "tables": [{"identifier": "web.clicks_{region}", "topics": [topic], "route_field": "region",
                    "schema": "infer"},
                   {"identifier": "web.plain", "topics": [f"{prefix}plain"], "schema": "infer"}],
    }
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    fleet = load_fleet(tmp_path / "fleet.yaml")
    from streamberg.common.catalog import load_catalog as open_catalog
    from streamberg.common.config import CatalogConfig, fleet_table

    catalog = open_catalog(CatalogConfig.model_validate(fleet.document(fleet.tables[0], topic)["catalog"]))
    expected: dict[str, set[int]] = {"web.clicks_eu": set(), "web.clicks_us": set(), "web.clicks_7": set(),
                                     "web.plain": set()}
    next_id = iter(range(1_000_000))

    def clicks(region: object, n: int, table: str | None) -> list[bytes]:
        out = []
        for _ in range(n):
            i = next(next_id)
            out.append(json.dumps({"id": i, "region": region, "ts": "2026-11-26T01:00:00+00:00"}).encode())
            if table is not None:
                expected[table].add(i)
        return out

    hostile = [json.dumps({"id": -1}).encode(), json.dumps({"id": -2, "region": None}).encode(),
               json.dumps({"id": -3, "region": {"x": 1}}).encode(), json.dumps({"id": -4, "region": "../etc"}).encode(),
               json.dumps({"id": -5, "region": "a" * 70}).encode(), json.dumps({"id": -6, "region": "x_dead_letters"}).encode(),
               json.dumps({"id": -7, "region": True}).encode(), b"not json", b"[1, 2]"]
    _produce(broker, topic, clicks("eu", 30, "web.clicks_eu") + clicks("US", 30, "web.clicks_us")
             + clicks(7, 30, "web.clicks_7") + hostile)
    # Another topic's records in the same batches as the first of each value: a table made
    # mid-batch must not make the consumer fetch them again (they would be written twice).
    _produce(broker, f"{prefix}plain", clicks("any", 200, "web.plain"))
    anchor = "web.clicks__unrouted"

    def holds(extra_dead: int) -> bool:
        try:
            return all(set(_rows(catalog, t)) >= ids for t, ids in expected.items()) and \
                catalog.load_table(f"{anchor}_dead_letters").scan().to_arrow().num_rows >= len(hostile) + extra_dead
        except Exception:  # noqa: BLE001 - a table not created yet
            return False

    writer, committer = Writer(fleet, 0, 1, "route-1"), Committers(fleet, 1, "route-1")
    writer.open()
    committer.open()
    try:
        _drive(writer, committer, lambda: holds(0))
        # A fourth value: past max_tables_per_route (3), its records are dead letters saying so.
        _produce(broker, topic, clicks("apac", 10, None) + clicks("eu", 10, "web.clicks_eu"))
        _drive(writer, committer, lambda: holds(10))
        # Read and written; one table (eu) commits them, the others do not: then the job is gone.
        _produce(broker, topic, clicks("us", 10, "web.clicks_us") + clicks(7, 5, "web.clicks_7")
                 + clicks("eu", 5, "web.clicks_eu") + [b"junk"])
        deadline = time.monotonic() + 10
        while sum(lane.messages for lane in writer.lanes.values()) < 21 and time.monotonic() < deadline:
            writer._split(topic, [m for m in writer.source.read(500, 0.5) if m.topic() == topic])
        assert sum(lane.messages for lane in writer.lanes.values()) >= 21, "the records were not read"
        committer.offer(writer.lanes["web.clicks_eu"].flush(final=False))
        assert set(_rows(catalog, "web.clicks_eu")) == expected["web.clicks_eu"]
    finally:
        writer.close()
        committer.close()
    assert not set(_rows(catalog, "web.clicks_us")) & {i for i in expected["web.clicks_us"] if i >= 100}

    # The next run: every lane from its own table's offsets; the limit still holds.
    _produce(broker, topic, clicks("eu", 5, "web.clicks_eu") + clicks("apac", 1, None))
    writer, committer = Writer(fleet, 0, 1, "route-2"), Committers(fleet, 1, "route-2")
    writer.open()
    committer.open()
    try:
        assert sorted(writer.known[topic]) == ["7", "eu", "us"]
        _drive(writer, committer, lambda: holds(12))
        # A trickle of eu records for 6 s: the other value tables only move past them. Their
        # position-only commits wait (commit_min_bytes, up to commit_max_wait_seconds 3 s)
        # where every 0.5 s interval would make one.
        trickle_ms = time.time() * 1000
        while time.time() * 1000 < trickle_ms + 6000:
            _produce(broker, topic, clicks("eu", 1, "web.clicks_eu"))
            end = time.monotonic() + 0.3
            _drive(writer, committer, lambda: time.monotonic() > end)  # noqa: B023 - this iteration's end
        trickle_end_ms = time.time() * 1000
        _drive(writer, committer, lambda: holds(12))
        for unit in writer.finish():
            committer.offer(unit)
    finally:
        writer.close()
        committer.close()

    for table in ("web.clicks_7", "web.clicks_us"):
        idle = [s for s in catalog.load_table(table).metadata.snapshots
                if trickle_ms <= s.timestamp_ms <= trickle_end_ms and s.summary.get("added-records") is None]
        assert len(idle) <= 3, (table, len(idle))  # 6 s / 3 s, and one the trickle's start may cut
    assert len(catalog.load_table("web.clicks_eu").metadata.snapshots) >= 5  # its data did not wait
    for table, ids in expected.items():
        got = _rows(catalog, table)
        assert len(got) == len(ids) and set(got) == ids, (table, len(got), len(set(got)), len(ids))
        if table != "web.plain":
            assert catalog.load_table(table).properties["streamberg.route.value"] == table.rsplit("_", 1)[1]
    assert catalog.load_table(anchor).scan().to_arrow().num_rows == 0
    letters = catalog.load_table(f"{anchor}_dead_letters").scan().to_arrow()
    assert letters.num_rows == len(hostile) + 12, letters.num_rows  # each once
    reasons = letters.column("reason").to_pylist()
    assert sum("max_tables_per_route" in r for r in reasons) == 11
    for needle in ("is missing", "is a dict", "'../etc'", "side table", "is a bool", "not JSON", "not a JSON object"):
        assert any(needle in r for r in reasons), (needle, reasons)
    assert not any(t[1].startswith("clicks_apac") or "etc" in t[1] for t in catalog.list_tables("web"))
    # DuckDB, an independent reader, agrees on one table.
    from tests.cdc.helpers import rows_by_duckdb

    assert set(rows_by_duckdb(fleet_table(fleet, "web.clicks_eu"))) == expected["web.clicks_eu"]

    # `streamberg status` lists the value tables; --table resolves one of them.
    from tests.runbooks.inprocess import cli

    lines = cli("status", "--config", str(tmp_path / "fleet.yaml"), check=False).stdout.splitlines()
    assert lines[0].startswith("5 tables"), lines
    # `streamberg metrics` of the whole config: each family once, a sample per table.
    scrape = cli("metrics", "--config", str(tmp_path / "fleet.yaml"), "--once").stdout
    helps = [line for line in scrape.splitlines() if line.startswith("# HELP")]
    assert len(helps) == len(set(helps)), "a metric family written twice"
    for table in (*expected, anchor):
        assert f'streamberg_table_paused{{table="{table}"}} 0.0' in scrape, table
    assert "streamberg_fleet_tables 5.0" in scrape
    assert f'streamberg_dead_letters_total{{table="{anchor}"}} {len(hostile) + 12}.0' in scrape
    assert fleet_table(fleet, "web.clicks_eu").kafka.topic == topic
    assert fleet_table(fleet, "web.clicks__unrouted").table.identifier == anchor


def test_a_commit_whose_answer_was_lost_is_not_made_twice(tmp_path: Path, broker: str, monkeypatch) -> None:
    """A catalog that commits but whose answer is lost (a 5xx, a timeout: pyiceberg's
    CommitStateUnknownException): the table's retry finds the interval in the table and does
    not commit it again; the others are not held up."""
    from pyiceberg.exceptions import CommitStateUnknownException

    from streamberg.ingest.committer import Committer

    prefix = f"u{int(time.time() * 1000) % 100000}-"
    document = {
        "kafka": {"bootstrap_servers": broker, "value_format": "json"},
        "catalog": {"name": f"c{prefix.replace('-', '_')}", "uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "defaults": {"ingest": {"commit_interval_seconds": 0.5, "state_dir": "state", "parallelism": 1}},
        "tables": [{"identifier": "raw.{topic}", "topic_pattern": f"{prefix}.*", "schema": "infer"}],
    }
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(document))
    fleet = load_fleet(tmp_path / "fleet.yaml")
    _produce(broker, f"{prefix}a", [_event(i) for i in range(50)])
    _produce(broker, f"{prefix}b", [_event(i) for i in range(50)])
    real, lost = Committer.commit, []

    def commit_then_lose_the_answer(self, units):
        result = real(self, units)
        if not lost and self.config.table.identifier.endswith("_a") and result.records:
            lost.append(result.snapshot_id)
            raise CommitStateUnknownException("the catalog's answer was lost (test)")
        return result

    monkeypatch.setattr(Committer, "commit", commit_then_lose_the_answer)
    from streamberg.common.catalog import load_catalog as open_catalog
    from streamberg.common.config import CatalogConfig

    catalog = open_catalog(CatalogConfig.model_validate(fleet.document(fleet.tables[0], f"{prefix}a")["catalog"]))
    table_a, table_b = f"raw.{prefix.replace('-', '_')}a", f"raw.{prefix.replace('-', '_')}b"
    writer, committer = Writer(fleet, 0, 1, "lost-1"), Committers(fleet, 1, "lost-1")
    writer.open()
    committer.open()

    def rows(identifier: str) -> int:
        try:
            return len(_rows(catalog, identifier))
        except Exception:  # noqa: BLE001 - not there yet
            return 0

    try:
        _drive(writer, committer, lambda: lost and rows(table_b) >= 50)
        _produce(broker, f"{prefix}a", [_event(i) for i in range(50, 70)])
        _drive(writer, committer, lambda: rows(table_a) >= 70 and not committer.failing)
    finally:
        writer.close()
        committer.close()
    ids = _rows(catalog, table_a)
    assert len(ids) == len(set(ids)) == 70 and not committer.paused, (len(ids), len(set(ids)), committer.paused)
    assert rows(table_b) == 50
