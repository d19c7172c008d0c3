"""The product against a real Iceberg REST catalog and S3 object store: SeaweedFS (`weed
mini`, tests/fixtures/seaweed.py), started by the suite, storing on local disk. The ingest
commits through the REST protocol and writes Parquet into S3; reads, `status`, `check
--connect`, the fleet's routes and a lost commit race go through the same server; an
independent reader (DuckDB, through the S3 API) agrees with the expected state the test
computes. Spark cannot open s3:// files on these machines (no AWS SDK for Java is
installable: docs/catalogs.md), so Spark's side keeps the REST stand-in (tests/test_rest_catalog.py)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.fresh import read
from streamberg.ingest.dead_letters import open_tables
from tests.helpers import EVENT_SCHEMA
from tests.runbooks.inprocess import cli, event, ingest_until, produce_values


def _config(tmp_path: Path, broker: str, seaweed: Any, topic: str, **extra: Any) -> Path:
    bucket = seaweed.bucket()
    path = tmp_path / "lake.yaml"
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": broker, "topic": topic},
        "catalog": {"name": "lake", **seaweed.catalog_settings(bucket), "state_uri": "sqlite:///state.db"},
        "table": {"identifier": "web.events", "schema": EVENT_SCHEMA},
        "ingest": {"parallelism": 2, "state_dir": "state", "commit_interval_seconds": 2},
        **extra}))
    return path


def test_ingest_reads_and_status_through_a_real_rest_catalog_and_s3(tmp_path: Path, broker: str, seaweed) -> None:
    path = _config(tmp_path, broker, seaweed, topic=f"sw-{tmp_path.name[-8:]}")
    config = load_config(path)
    ensure_topic(broker, config.kafka.topic, 2)
    assert cli("check", "--config", str(path), "--connect").returncode == 0
    open_tables(config)
    produce_values(config, [event(i) for i in range(0, 300)], 0, 2)
    produce_values(config, [event(i) for i in range(300, 500)], 1, 2)
    ingest_until(config, {0: 300, 1: 200})
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert table.location().startswith("s3://"), table.location()
    ids = sorted(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())
    assert ids == list(range(500)) and len(set(ids)) == 500
    # The fresh read: the table plus the Kafka tail, exact.
    produce_values(config, [event(i) for i in range(500, 540)], 0, 2)
    fresh = sorted(read(config, fresh=True).rows.column("id").to_pylist())
    assert fresh == list(range(540))
    status = cli("status", "--config", str(path), "--json", check=False)
    assert status.returncode in (0, 1), status.stderr
    document = json.loads(status.stdout)
    assert document["table_exists"] is True and document["files"]["records"] == 500, document["files"]
    # Another reader: DuckDB's own Iceberg reader over the S3 API, from the metadata file.
    duck = _duckdb_rows(table, seaweed)
    assert duck == list(range(500))
    # Maintenance runs in Spark, which cannot open s3:// here (no AWS SDK for Java installable):
    # refused in one line that says what to give, nothing touched.
    planned = cli("maintain", "--config", str(path), "--once", "--dry-run", "--json", check=False)
    assert planned.returncode == 1 and "STREAMBERG_SPARK_S3_JARS" in planned.stderr, planned.stderr[-2000:]
    assert "Traceback" not in planned.stderr
    governed = cli("govern", "--config", str(path), "--dry-run", check=False)
    assert governed.returncode == 0 and "Traceback" not in governed.stderr, governed.stderr[-2000:]
    assert load_catalog(config.catalog).load_table(config.table.identifier).metadata_location == \
        table.metadata_location  # nothing committed by either


def _duckdb_rows(table: Any, seaweed: Any) -> list[int]:
    from tests.fixtures.seaweed import duckdb_over_s3

    connection = duckdb_over_s3(seaweed)
    rows = connection.execute(f"SELECT id FROM iceberg_scan('{table.metadata_location}') ORDER BY id").fetchall()
    return [r[0] for r in rows]


def test_a_lost_commit_race_on_the_rest_catalog_loses_nothing(tmp_path: Path, broker: str, seaweed) -> None:
    """Two committers of one table at once (a stale run and the live one): the REST server's
    compare-and-swap lets one win; the loser retries or is fenced; every record once."""
    path = _config(tmp_path, broker, seaweed, topic=f"race-{tmp_path.name[-8:]}")
    config = load_config(path)
    ensure_topic(broker, config.kafka.topic, 2)
    open_tables(config)
    catalog = load_catalog(config.catalog)
    produce_values(config, [event(i) for i in range(200)], 0, 2)
    produce_values(config, [event(i) for i in range(200, 400)], 1, 2)
    errors: list[BaseException] = []

    def other_writer() -> None:  # a concurrent commit of an unrelated property, through the same server
        try:
            for n in range(10):
                table = catalog.load_table(config.table.identifier)
                with table.transaction() as tx:
                    tx.set_properties({"race.other": str(n)})
        except BaseException as exc:  # noqa: BLE001 - a lost race is expected to be retried, not raised
            errors.append(exc)

    thread = threading.Thread(target=other_writer)
    thread.start()
    ingest_until(config, {0: 200, 1: 200})
    thread.join(60)
    table = catalog.load_table(config.table.identifier)
    ids = sorted(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())
    assert ids == list(range(400))


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["processes", "flink"])
def test_a_killed_ingest_restarts_on_the_rest_catalog_and_loses_nothing(tmp_path: Path, broker: str, seaweed,
                                                                       engine: str) -> None:
    """kill -9 of the whole ingest (driver and tasks) after its first commits through the REST
    server, then a bounded run on the same engine: every valid record once, the malformed ones
    dead letters, DuckDB over S3 agreeing."""
    import os
    import signal
    import subprocess
    import sys

    from tests.helpers import BackgroundProducer, committed_records, dead_letters, duplicates, table_ids, wait_for

    path = _config(tmp_path, broker, seaweed, topic=f"kill-{engine}-{tmp_path.name[-6:]}")
    document = yaml.safe_load(path.read_text())
    document["ingest"].update({"commit_interval_seconds": 1, "max_poll_records": 500})
    path.write_text(yaml.safe_dump(document))
    config = load_config(path)
    ensure_topic(broker, config.kafka.topic, 2)
    producer = BackgroundProducer(config, 3000, rate=20_000, bad_fraction=0.01, max_batches=1).start()
    producer.join()
    exe = Path(sys.executable).parent / "streamberg"
    log = tmp_path / "ingest.log"
    proc = subprocess.Popen([str(exe), "ingest", "--config", str(path), "--quiet", "--engine", engine],
                            stdout=subprocess.DEVNULL, stderr=log.open("wb"), start_new_session=True, cwd=tmp_path)
    try:
        wait_for(lambda: committed_records(config) > 0, 180, "the run's first commit", proc=proc, log=log)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole run, mid-interval
        proc.wait(30)
    later = BackgroundProducer(config, 2000, rate=20_000, bad_fraction=0.01, max_batches=1, first_id=3000).start()
    later.join()
    done = subprocess.run([str(exe), "ingest", "--config", str(path), "--quiet", "--engine", engine,
                           "--max-records", str(producer.produced + later.produced - committed_records(config))],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    ids = table_ids(config)
    assert not duplicates(ids) and sorted(ids) == sorted(producer.ids + later.ids)
    assert dead_letters(config).num_rows == producer.produced + later.produced - len(ids)
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert sorted(_duckdb_rows(table, seaweed)) == sorted(ids)


@pytest.mark.slow
def test_the_readmes_local_lake_works_as_written(tmp_path: Path, broker: str) -> None:
    """The README's local-lake lines, run as written (`scripts/local-lake.sh start`, then
    produce, check --connect, ingest, a fresh query on examples/lake.yaml), the broker being
    the test's (STREAMBERG_KAFKA__BOOTSTRAP_SERVERS, as any key can be overridden)."""
    import os
    import shutil
    import subprocess
    import sys

    root = Path(__file__).parents[1]
    lake = tmp_path / "lake"
    env = {**os.environ, "WEED": str(Path(sys.executable).parent / "weed"),
           "STREAMBERG_KAFKA__BOOTSTRAP_SERVERS": broker}
    config = tmp_path / "examples" / "lake.yaml"  # its relative state paths under tmp_path, not the checkout
    config.parent.mkdir()
    shutil.copy(root / "examples" / "lake.yaml", config)
    exe = str(Path(sys.executable).parent / "streamberg")
    started = subprocess.run(["bash", str(root / "scripts" / "local-lake.sh"), "start", str(lake)], env=env,
                             capture_output=True, text=True, timeout=180, cwd=root)
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        assert yaml.safe_load(started.stdout)["catalog"]["uri"] == yaml.safe_load(config.read_text())["catalog"]["uri"]
        for argv in (["produce", "--config", str(config), "--count", "2000"],
                     ["check", "--config", str(config), "--connect"],
                     ["ingest", "--config", str(config), "--max-records", "2000", "--engine", "processes"]):
            done = subprocess.run([exe, *argv], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
            assert done.returncode == 0, (argv, done.stdout[-1000:], done.stderr[-2000:])
        queried = subprocess.run([exe, "query", "--config", str(config), "--fresh", "--json",
                                  "SELECT count(*) AS n, count(DISTINCT id) AS ids FROM lake.events"], env=env,
                                 capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert queried.returncode == 0, queried.stderr[-2000:]
        row = json.loads(queried.stdout.strip().splitlines()[-1])
        assert row["n"] == row["ids"] > 0, row
    finally:
        subprocess.run(["bash", str(root / "scripts" / "local-lake.sh"), "stop", str(lake)], env=env, timeout=60)


def test_two_committers_race_on_the_rest_catalog_and_one_is_fenced(tmp_path: Path, broker: str, seaweed) -> None:
    """Two ingest committers of one table, both opened on the same (empty) table: the REST
    server takes the first commit; the second is fenced, nothing duplicated; a restarted one
    continues the chain."""
    from streamberg.common.errors import FencedError
    from streamberg.ingest.committer import Committer
    from tests.helpers import duplicates, table_ids
    from tests.ingest.test_committer import make_unit

    path = _config(tmp_path, broker, seaweed, topic=f"fence-{tmp_path.name[-6:]}")
    config = load_config(path)
    open_tables(config)
    first = Committer(config, parallelism=1, run_id="first")
    second = Committer(config, parallelism=1, run_id="second")
    first.open()
    second.open()
    try:
        first.offer(make_unit(config, 0, partition=0, start=0, end=100))
        with pytest.raises(FencedError, match="another ingest instance"):
            second.offer(make_unit(config, 0, partition=0, start=0, end=100))
        assert table_ids(config) == list(range(100)) and not duplicates(table_ids(config))
        restarted = Committer(config, parallelism=1, run_id="restarted")
        restarted.open()
        restarted.offer(make_unit(config, 0, partition=0, start=100, end=150))
        restarted.close()
        assert table_ids(config) == list(range(150))
    finally:
        first.close()
        second.close()


def test_a_fleet_makes_its_tables_on_the_rest_catalog(tmp_path: Path, broker: str, seaweed) -> None:
    """A config of many: a topic pattern's tables made on their first records through the REST
    server (their topic recorded), each exactly once, by the real ingest command."""
    import subprocess
    import sys

    bucket = seaweed.bucket()
    suffix = tmp_path.name[-6:].replace("_", "")
    topics = [f"fl{n}-{suffix}" for n in range(3)]
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": broker},
        "catalog": {"name": "lake", **seaweed.catalog_settings(bucket), "state_uri": "sqlite:///state.db"},
        "defaults": {"ingest": {"parallelism": 1, "state_dir": "state", "commit_interval_seconds": 1}},
        "tables": [{"topic_pattern": f"fl[0-9]-{suffix}", "identifier": "web.{topic}", "schema": EVENT_SCHEMA}]}))
    from tests.helpers import config_at

    counts = {topic: 10 * (n + 1) for n, topic in enumerate(topics)}
    for topic, count in counts.items():
        ensure_topic(broker, topic, 1)
        produce_values(config_at(_one_table(tmp_path, broker, topic)), [event(i) for i in range(count)], 0, 1)
    checked = cli("check", "--config", str(path), "--connect", check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    exe = str(Path(sys.executable).parent / "streamberg")
    done = subprocess.run([exe, "ingest", "--config", str(path), "--quiet", "--engine", "processes",
                           "--max-records", str(sum(counts.values()))], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    catalog = load_catalog(load_config_of(path, topics[0]).catalog)
    for topic, count in counts.items():
        table = catalog.load_table(f"web.{topic.replace('-', '_')}")
        ids = sorted(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())
        assert ids == list(range(count)), (topic, ids)
        assert table.properties.get("streamberg.route.topic") == topic


def _one_table(tmp_path: Path, broker: str, topic: str) -> Path:
    """A one-table config of `topic`, to produce to it with the tests' helper."""
    path = tmp_path / f"produce-{topic}.yaml"
    path.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": broker, "topic": topic},
                                    "table": {"identifier": "x.y", "schema": EVENT_SCHEMA}}))
    return path


def load_config_of(path: Path, topic: str):
    from streamberg.common.config import load_fleet
    from streamberg.common.tables import run_settings

    return run_settings(load_fleet(path))
