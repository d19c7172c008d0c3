"""The governor on a shared catalog: nothing deleted unasked, no table's name or record stops
the others (issue 38, items 1, 3 and 5).

- A config that declares row retention for its own table; a table opted in by only a
  clustering key in a governed namespace keeps every row (it never inherits the config's
  retention), a table that sets its own retention keys loses exactly its old rows, and the
  config's own table loses its old rows (pyiceberg and DuckDB count rows and distinct ids).
- The product's own tables are made once, safely, however many actions race on a fresh catalog.
- A table with a name no config can hold, and one whose route record is forged, are reported
  under their own names while the other tables are planned (`govern --dry-run` through the
  real command, exit 0, nothing written).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from streamberg.common.catalog import load_catalog
from streamberg.governor.app import Governor, Keeper
from streamberg.table_meta.declared import ensure_table
from streamberg.table_meta.schedule import Scheduler
from tests.compactor.helpers import BASE_TS, FakeIngest, reload
from tests.compactor.helpers import write_config as compactor_config
from tests.governor.test_govern import _duckdb_counts
from tests.helpers import config_at, streamberg


def _with_retention(tmp_path: Path) -> Path:
    path = compactor_config(tmp_path)
    document = yaml.safe_load(path.read_text())
    document["maintenance"] = {"retention": {"column": "ts", "days": 30},
                               "orphan": {"enabled": False}, "manifests": {"enabled": False}}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _old_and_new(config, seed: int) -> tuple[FakeIngest, list[int]]:
    """5 rows dated in March 2024 (far past 30 days) and 5 from yesterday; the recent ids."""
    ingest = FakeIngest(config, seed=seed)
    ingest.append(5, days=1)
    recent_from = ingest.next_id
    yesterday = (dt.datetime.now(dt.timezone.utc) - BASE_TS).days - 1
    ingest.append(5, days=1, day_offset=yesterday)
    return ingest, list(range(recent_from, ingest.next_id))


def _ids(config) -> list[int]:
    return sorted(reload(config).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())


@pytest.mark.spark
def test_an_opted_in_table_never_inherits_the_configs_retention(tmp_path: Path, spark) -> None:
    from streamberg.cli.govern import executors
    from streamberg.governor.keeper import SharedCatalogs, TableKeeper
    from streamberg.governor.tables import opted_in as _opted_in

    config = config_at(_with_retention(tmp_path))
    catalog = load_catalog(config.catalog)
    ensure_table(catalog, config.table)
    tables = {"db.events": config}
    for name in ("lake.victim", "lake.own"):
        tables[name] = config.model_copy(update={"table": config.table.model_copy(update={"identifier": name})})
        ensure_table(catalog, tables[name].table)
    recent = {name: _old_and_new(c, seed=n)[1] for n, (name, c) in enumerate(tables.items())}
    everything = {name: _ids(c) for name, c in tables.items()}
    with reload(tables["lake.victim"]).transaction() as tx:  # opted in by a clustering key alone
        tx.set_properties({"streamberg.cluster.columns": "user_id", "streamberg.compact.enabled": "false"})
    with reload(tables["lake.own"]).transaction() as tx:  # its own retention, declared on the table
        tx.set_properties({"streamberg.retention.column": "ts", "streamberg.retention.days": "30",
                           "streamberg.compact.enabled": "false"})
    with reload(config).transaction() as tx:
        tx.set_properties({"streamberg.compact.enabled": "false"})

    opted = {c.table.identifier: c for c in _opted_in(config, ["lake"], {"db.events"})}
    assert sorted(opted) == ["lake.own", "lake.victim"]
    assert all(c.maintenance.retention.days is None for c in opted.values())
    shared = SharedCatalogs()
    keepers = [TableKeeper(c, executors(c), spark, shared) for c in [config, *opted.values()]]
    report = Governor(lambda: [Keeper(k.config.table.identifier, k.probe, k.run) for k in keepers],
                      Scheduler(max_wait_seconds=600), budget=3, concurrent=3,
                      state_dir=config.ingest.state_dir).round()
    assert sorted((r["table"], r["action"], r["ok"]) for r in report.ran) == [
        ("db.events", "maintain", True), ("lake.own", "maintain", True), ("lake.victim", "maintain", True)], report.ran

    assert _ids(tables["lake.victim"]) == everything["lake.victim"]  # 10 rows, none deleted
    assert _duckdb_counts(reload(tables["lake.victim"])) == (10, 10)
    for name in ("lake.own", "db.events"):  # declared: exactly the old rows go
        assert _ids(tables[name]) == recent[name], name
        assert _duckdb_counts(reload(tables[name])) == (5, 5), name


def test_private_tables_are_made_once_whoever_races(tmp_path: Path) -> None:
    """Another creator winning between the check and the create (the governor's concurrent
    actions on a fresh catalog) is no error; every private table is made by one call."""
    import streamberg.compactor.lease as lease_module
    import streamberg.table_meta.maintenance_runs as runs_module
    from streamberg.table_meta.private_tables import ensure_private_table

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'state.db'}")
    rival = sa.create_engine(f"sqlite:///{tmp_path / 'state.db'}")

    raced: list[bool] = []

    def create_first(target, connection, **kw) -> None:  # the race, made certain: a rival creates it first
        if not raced:
            raced.append(True)
            with rival.begin() as conn:
                conn.exec_driver_sql(f"CREATE TABLE {target.name} (run_id VARCHAR(64) PRIMARY KEY)")

    table = runs_module.runs
    sa.event.listen(table, "before_create", create_first)
    try:
        ensure_private_table(engine, table)
    finally:
        sa.event.remove(table, "before_create", create_first)
    assert raced
    from streamberg.table_meta.private_tables import ensure_private_tables

    ensure_private_tables(engine)
    names = set(sa.inspect(engine).get_table_names())
    assert {runs_module.RUNS_TABLE, lease_module.LEASE_TABLE} <= names


def test_bad_names_and_forged_route_records_are_reported_under_their_own_names(tmp_path: Path) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    config = config_at(compactor_config(tmp_path))
    catalog = load_catalog(config.catalog)
    ensure_table(catalog, config.table)
    catalog.create_namespace("lake")
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    for name in ("lake.good", "lake.Bad-Name", "lake.decoy"):
        catalog.create_table(name, schema=schema, properties={"streamberg.compact.min_files": "2", "streamberg.cluster.columns": "id"})
    with catalog.load_table("lake.decoy").transaction() as tx:  # a forged route record beside a policy key
        tx.set_properties({"streamberg.route.topic": "clicks1", "streamberg.route.value": "x-y"})
    before = {name: catalog.load_table(name).metadata_location for name in ("lake.good", "lake.Bad-Name")}

    proc = streamberg("govern", "--config", config.config_path, "--namespace", "lake", "--dry-run", "--json",
                      check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads(proc.stdout)
    assert "lake.Bad-Name" in plan["problems"], plan
    assert "lake.good" not in plan["problems"] and "Traceback" not in proc.stderr
    assert {name: catalog.load_table(name).metadata_location for name in before} == before  # nothing written
    assert not (Path(config.ingest.state_dir) / "govern.json").exists()  # a dry run writes nothing


@pytest.mark.spark
def test_a_long_action_is_cancelled_and_never_holds_the_others(tmp_path: Path, spark) -> None:
    """govern.action_timeout_seconds (issue 38, item 7): a Spark job that would run for hours is
    cancelled at the timeout and its table backs off; the round's other actions finish. A real
    compaction cancelled mid-rewrite (its streaming query stopped) leaves the rows as they were,
    releases its lease, and the next round compacts the table."""
    import threading
    import time as clock

    from streamberg.cli.govern import executors
    from streamberg.common.spark import JobGroups
    from streamberg.governor.keeper import SharedCatalogs, TableKeeper
    from streamberg.table_meta.schedule import Due
    from tests.compactor.helpers import live_files, row_multiset

    def endless(action: str) -> dict:
        spark.range(0, 10**12, numPartitions=2).selectExpr("sum(id % 7) AS s").collect()
        return {}

    quick_ran = threading.Event()

    def quick(action: str) -> dict:
        quick_ran.set()
        return {"ok": True}

    def due(table: str):
        return lambda: ([Due(table, "maintain", 1.0, "test", 0.0)], [])

    governor = Governor(lambda: [Keeper("db.slow", due("db.slow"), endless), Keeper("db.quick", due("db.quick"), quick)],
                        Scheduler(max_wait_seconds=600), budget=2, concurrent=2, timeout_seconds=3.0,
                        jobs=JobGroups(spark))
    started = clock.monotonic()
    report = governor.round()
    assert clock.monotonic() - started < 60
    outcome = {r["table"]: r for r in report.ran}
    assert outcome["db.quick"]["ok"] and quick_ran.is_set()
    assert not outcome["db.slow"]["ok"] and "action_timeout_seconds" in outcome["db.slow"]["error"], outcome
    state = {t["table"]: t for t in governor.scheduler.state(governor.clock())}
    assert state["db.slow"]["failures"] == 1 and state["db.slow"]["retry_in_seconds"] > 0
    thread = governor.running["db.slow"]
    thread.join(60)
    assert not thread.is_alive(), "the cancelled Spark job went on running"

    # A real compaction past its timeout: its job group's Spark jobs are cancelled wherever the
    # pass stands (one planned pass on the action's thread, no streaming query): nothing half-done.
    config = config_at(compactor_config(tmp_path))
    ensure_table(load_catalog(config.catalog), config.table)
    ingest = FakeIngest(config, seed=31)
    for _ in range(4):
        ingest.append(200, days=2)
    rows, files = row_multiset(reload(config)), set(live_files(reload(config)))
    keeper = TableKeeper(config, executors(config), spark, SharedCatalogs())
    keeper.probe()
    compact = lambda: ([Due("db.events", "compact", 1.0, "test", 0.0)], [])  # noqa: E731
    # A timeout far shorter than any pass (a warm session compacts this in under a second).
    cut = Governor(lambda: [Keeper("db.events", compact, keeper.run, streams="streamberg-compactor-db.events")],
                   Scheduler(max_wait_seconds=600), timeout_seconds=0.05, jobs=JobGroups(spark))
    first = cut.round().ran[0]
    assert not first["ok"] and "action_timeout_seconds" in first["error"], first
    assert cut.round().ran == []  # the table gets no other action while the cancelled one lives
    cut.running["db.events"].join(120)
    assert not cut.running["db.events"].is_alive()
    assert row_multiset(reload(config)) == rows  # cancelled wherever it was: nothing half-done
    again = Governor(lambda: [Keeper("db.events", compact, keeper.run)], Scheduler(max_wait_seconds=600),
                     timeout_seconds=600, jobs=JobGroups(spark)).round().ran[0]
    assert again["ok"], again  # the lease was released
    after = reload(config)
    assert row_multiset(after) == rows and len(live_files(after)) < len(files)
