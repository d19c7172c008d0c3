"""`streamberg govern`: one Spark session keeps a catalog of tables by their properties.

12 tables in one catalog: the config's own (db.events) and 11 in namespace `lake`, written by
plain pyiceberg appends, their policy set through Spark SQL (`ALTER TABLE ... SET
TBLPROPERTIES`, the SQL entry). One has compaction switched off, one a bad value, one is dropped
between rounds. The governor (the real TableKeeper probes and runners on the shared session)
compacts every due table: rows unchanged (pyiceberg and DuckDB count rows and distinct ids),
files fewer; the bad value is reported for its table and the others go on; a property changed
between rounds takes effect at the next; `--dry-run` through the real command changes nothing.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import duckdb
import pytest

from streamberg.common.catalog import load_catalog
from streamberg.common.spark import register_catalog
from streamberg.governor.app import Governor, Keeper
from streamberg.monitoring.collect import collect_status
from streamberg.monitoring.health import with_health
from streamberg.monitoring.metrics import status_metrics
from streamberg.monitoring.render import render_screen
from streamberg.table_meta.declared import ensure_table
from streamberg.table_meta.schedule import Scheduler
from streamberg.table_meta.summary_keys import SummaryKeys
from streamberg.table_meta.table_files import sealed_sequence_numbers
from tests.compactor.helpers import DAY, FakeIngest, compactor_snapshots, live_files, reload, row_multiset, summary
from tests.compactor.helpers import write_config as compactor_config
from tests.helpers import config_at, streamberg

pytestmark = pytest.mark.spark
LAKE = [f"lake.t{i:02d}" for i in range(11)]


def _duckdb_counts(table) -> tuple[int, int]:
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        con.execute(f"LOAD '{Path(module.__path__[0]) / 'extensions' / f'v{duckdb.__version__}' / f'{name}.duckdb_extension'}'")
    location = table.metadata_location.removeprefix("file://")
    return con.execute(f"SELECT count(*), count(DISTINCT id) FROM iceberg_scan('{location}')").fetchone()


@pytest.mark.slow
def test_one_session_keeps_a_catalog_by_its_properties(tmp_path: Path, spark) -> None:
    from streamberg.cli.govern import executors
    from streamberg.governor.keeper import SharedCatalogs, TableKeeper

    path = compactor_config(tmp_path, partition_spec=DAY, compactor={"min_files": 2})
    config = config_at(path)
    catalog = load_catalog(config.catalog)
    ensure_table(catalog, config.table)
    configs = {"db.events": config}
    for identifier in LAKE:
        configs[identifier] = config.model_copy(update={"table": config.table.model_copy(update={"identifier": identifier})})
        ensure_table(catalog, configs[identifier].table)
    ingests = {i: FakeIngest(c, seed=n) for n, (i, c) in enumerate(configs.items())}
    for ingest in ingests.values():
        for _ in range(3):
            ingest.append(120, days=2)

    # Policy from Spark SQL: the lake's tables opt in (maintenance left to its own schedule here).
    name = config.catalog.name
    register_catalog(spark, config.catalog)
    for identifier in LAKE:
        spark.sql(f"ALTER TABLE {name}.{identifier} SET TBLPROPERTIES ('streamberg.maintain.enabled'='false', "
                  "'streamberg.govern.min_interval_seconds'='0')")
    spark.sql(f"ALTER TABLE {name}.lake.t01 SET TBLPROPERTIES ('streamberg.compact.enabled'='false')")
    spark.sql(f"ALTER TABLE {name}.lake.t02 SET TBLPROPERTIES ('streamberg.cluster.strategy'='spiral')")
    spark.sql(f"ALTER TABLE {name}.lake.t03 SET TBLPROPERTIES ('streamberg.cluster.strategy'='hilbert')")
    spark.sql(f"ALTER TABLE {name}.db.events SET TBLPROPERTIES ('streamberg.maintain.enabled'='false')")
    before = {i: (row_multiset(reload(c)), set(live_files(reload(c)))) for i, c in configs.items()}

    # The real command's plan: every table but t01 due for compaction, nothing changed.
    proc = streamberg("govern", "--config", str(path), "--namespace", "lake", "--dry-run", "--json")
    plan = json.loads(proc.stdout)
    assert len(plan["planned"]) == 1 and plan["planned"][0]["action"] == "compact"  # budget 1: the most urgent
    assert plan["planned"][0]["table"] != "lake.t01"
    assert "lake.t02" in plan["problems"] and "spiral" in plan["problems"]["lake.t02"][0]
    assert all(set(live_files(reload(c))) == before[i][1] for i, c in configs.items())

    # The namespace's tables as the command finds them (policy keys set: opted in), each with
    # its own compactor checkpoint.
    from streamberg.governor.tables import opted_in as _opted_in

    live = {"db.events": config, **{c.table.identifier: c for c in _opted_in(config, ["lake"], {"db.events"})}}
    assert sorted(live) == sorted(configs)
    assert len({c.compactor.checkpoint_dir for c in live.values()}) == len(live)
    shared = SharedCatalogs()
    keepers = lambda: [Keeper(i, k.probe, k.run) for i, k in ((i, TableKeeper(c, executors(c), spark, shared)) for i, c in live.items())]  # noqa: E731
    governor = Governor(keepers, Scheduler(max_wait_seconds=600), budget=len(configs),
                        state_dir=config.ingest.state_dir)
    report = governor.round()
    assert sorted(r["table"] for r in report.ran) == sorted(set(configs) - {"lake.t01"})
    assert all(r["ok"] for r in report.ran), report.ran
    for identifier, c in configs.items():
        table = reload(c)
        rows, files = before[identifier]
        assert row_multiset(table) == rows, identifier
        assert _duckdb_counts(table) == (sum(rows.values()), sum(rows.values())), identifier
        if identifier == "lake.t01":
            assert set(live_files(table)) == files and not compactor_snapshots(table)
        else:
            assert len(live_files(table)) < len(files), identifier
    assert summary(compactor_snapshots(reload(configs["lake.t03"]))[-1])[SummaryKeys.COMPACTOR_STRATEGY] == "hilbert"
    state = json.loads((Path(config.ingest.state_dir) / "govern.json").read_text())
    assert state["problems"]["lake.t02"] and state["fleet"]["actions_last_minute"] == len(configs) - 1
    # status tells the truth about each table: the bad value (a warning), what the governor did.
    bad = with_health(collect_status(configs["lake.t02"]), configs["lake.t02"])
    assert bad.policy_problems and any("table policy: streamberg.cluster.strategy" in r for r in bad.health.reasons)
    assert [a["action"] for a in bad.governor["actions"]] == ["compact"]
    assert "governor" in render_screen(bad) and "ignored: streamberg.cluster.strategy" in render_screen(bad)
    scraped = {(m.name, tuple(s.labels.values())): s.value for m in status_metrics(bad, 0.1) for s in m.samples}
    assert scraped[("streamberg_table_policy_problems", ("lake.t02",))] == 1
    assert scraped[("streamberg_governor_failures", ("lake.t02", "compact"))] == 0
    assert ("streamberg_governor_last_run_age_seconds", ("lake.t02", "compact")) in scraped

    # Between rounds: t01 switched on, t04 dropped under the governor; new data everywhere.
    spark.sql(f"ALTER TABLE {name}.lake.t01 SET TBLPROPERTIES ('streamberg.compact.enabled'='true')")
    for identifier in ("lake.t01", "lake.t05"):
        ingests[identifier].append(120, days=2)
        ingests[identifier].append(120, days=2)
    catalog.drop_table("lake.t04")
    report = governor.round()
    assert "lake.t04" in report.problems and "cannot be read" in report.problems["lake.t04"][0]
    assert {r["table"] for r in report.ran} >= {"lake.t01", "lake.t05"} and all(r["ok"] for r in report.ran)
    assert compactor_snapshots(reload(configs["lake.t01"]))


@pytest.mark.slow
def test_an_idle_table_is_finished_by_time_alone(tmp_path: Path, spark) -> None:
    """A partition idle for seal_after_seconds is finished (sealed) by the governor with no new
    commit: its plan is made again after replan_seconds, not kept while the metadata is unchanged."""
    from streamberg.cli.govern import executors
    from streamberg.governor.keeper import SharedCatalogs, TableKeeper

    seal_after = 20.0
    path = compactor_config(tmp_path, compactor={"min_files": 2, "seal_after_seconds": seal_after})
    config = config_at(path)
    config = config.model_copy(update={"govern": config.govern.model_copy(update={"replan_seconds": 1.0})})
    with ensure_table(load_catalog(config.catalog), config.table).transaction() as tx:
        tx.set_properties({"streamberg.govern.min_interval_seconds": "0"})
    ingest = FakeIngest(config, seed=7)
    for _ in range(3):
        ingest.append(150, days=1)
    last_append = reload(config).current_snapshot().timestamp_ms / 1000
    rows = row_multiset(reload(config))
    kept_config = config.model_copy(update={"maintenance": config.maintenance.model_copy(
        update={"interval_seconds": 86400})})
    keeper = TableKeeper(kept_config, executors(kept_config), spark, SharedCatalogs())
    governor = Governor(lambda: [Keeper("db.events", keeper.probe, keeper.run)], Scheduler(max_wait_seconds=600),
                        budget=1, state_dir=config.ingest.state_dir)
    governor.round()
    table = reload(config)
    kinds = summary(compactor_snapshots(table)[-1])[SummaryKeys.COMPACTOR_GROUP_KINDS]
    if "finish" in kinds:
        pytest.skip(f"the first round started {seal_after:.0f} s after the appends: nothing left to finish by time")
    assert not sealed_sequence_numbers(table)
    probed_at = time.time()
    due, _ = keeper.probe()  # one unsealed run, nothing pending: nothing due before the seal time
    if probed_at < last_append + seal_after:
        assert [d.action for d in due if d.action == "compact"] == []
    else:  # a loaded machine: the pass ran past the seal time; what follows still must hold
        assert [d.why for d in due if d.action == "compact"] == ["1 finished partition(s) to seal"]
    time.sleep(max(0.0, last_append + seal_after + 1.5 - time.time()))
    due, _ = keeper.probe()
    assert [(d.action, d.why) for d in due if d.action == "compact"] == [("compact", "1 finished partition(s) to seal")]
    governor.round()
    table = reload(config)
    assert sealed_sequence_numbers(table) and row_multiset(table) == rows


def test_maintenance_follows_the_tables_own_policy(tmp_path: Path, spark) -> None:
    """Retention set on the table alone (`streamberg.retention.*`, as any engine would set it)
    is what the governor's maintenance applies: rows past it deleted, the others kept, counted
    by pyiceberg and DuckDB; the config itself has no retention."""
    import datetime as dt

    from streamberg.cli.govern import executors
    from streamberg.governor.keeper import SharedCatalogs, TableKeeper
    from tests.compactor.helpers import BASE_TS

    config = config_at(compactor_config(tmp_path))
    assert config.maintenance.retention.days is None
    with ensure_table(load_catalog(config.catalog), config.table).transaction() as tx:
        tx.set_properties({"streamberg.retention.column": "ts", "streamberg.retention.days": "30",
                           "streamberg.compact.enabled": "false"})
    ingest = FakeIngest(config, seed=9)
    ingest.append(200, days=2)  # March 2024: past the table's 30 days
    recent_from = ingest.next_id
    yesterday = (dt.datetime.now(dt.timezone.utc) - BASE_TS).days - 1
    ingest.append(150, days=1, day_offset=yesterday)
    keeper = TableKeeper(config, executors(config), spark, SharedCatalogs())
    due, problems = keeper.probe()
    assert [d.action for d in due] == ["maintain"] and not problems
    Governor(lambda: [Keeper("db.events", keeper.probe, keeper.run)], Scheduler(max_wait_seconds=600),
             budget=1, state_dir=config.ingest.state_dir).round()
    table = reload(config)
    ids = table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    assert sorted(ids) == list(range(recent_from, ingest.next_id))
    assert _duckdb_counts(table) == (150, 150)
