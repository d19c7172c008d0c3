"""Drills of the fleet's and the governor's runbooks: each page's marked blocks run as written.

- fleet-table-paused + fleet-topic-refused, drilled together (one situation leads to the
  other): a config of many whose pattern route meets a topic named like a side table
  (`ev.a_dead_letters`, refused) and a table whose dead-letter name a data table of an earlier
  release took (`ev.b`, paused). Made for real with the in-process fleet writer and committer,
  then the pages' commands: status, the hand fixes (done here in Python, as the pages say),
  `check --connect` and the real `streamberg ingest` (PyFlink), status again.
- governor-action-failing: a table whose own retention names a column rows cannot be aged by;
  the real governor's maintenance of it fails round after round while it backs off; the page's
  status, `govern --dry-run`, `table --unset` and `govern --once`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from streamberg.common.catalog import load_catalog
from streamberg.common.config import CatalogConfig, load_fleet
from streamberg.ingest.committers import Committers
from streamberg.ingest.writer import Writer
from streamberg.table_meta.declared import ensure_table
from tests.ingest.test_fleet import _event, _produce, _rows


def _fleet(path: Path, broker: str, p: str, pattern: str, extra: list | None = None) -> Path:
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": broker, "value_format": "json"},
        "catalog": {"name": f"c{p.replace('-', '_')}", "uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "defaults": {"ingest": {"commit_interval_seconds": 1, "state_dir": "state", "parallelism": 1,
                                "topic_discovery_seconds": 1, "table_failures_to_pause": 2}},
        "tables": [*(extra or []), {"identifier": "raw.{topic}", "topic_pattern": pattern, "schema": "infer"}],
    }, sort_keys=False))
    return path


@pytest.mark.flink
def test_fleet_table_paused_and_topic_refused(tmp_path: Path, broker: str, drills) -> None:
    p = f"d{int(time.time() * 1000) % 100000}-"
    n = p.replace("-", "_")
    path = _fleet(tmp_path / "fleet.yaml", broker, p, f"{p}ev\\..*")
    fleet = load_fleet(path)
    catalog = load_catalog(CatalogConfig.model_validate(fleet.document(fleet.tables[0], f"{p}ev.a")["catalog"]))
    catalog.create_namespace("raw")
    squatter = f"raw.{n}ev_b_dead_letters"  # what an earlier release let topic ev.b_dead_letters make
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    catalog.create_table(squatter, schema=Schema(NestedField(1, "id", LongType(), required=False)),
                         properties={"streamberg.route.topic": f"{p}ev.b_dead_letters"})
    _produce(broker, f"{p}ev.a", [_event(i) for i in range(20)])
    _produce(broker, f"{p}ev.a_dead_letters", [_event(i) for i in range(9)])
    _produce(broker, f"{p}ev.b", [_event(i) for i in range(13)])
    writer, committer = Writer(fleet, 0, 1, "drill-0"), Committers(fleet, 1, "drill-0")
    writer.open()
    committer.open()
    try:
        deadline = time.monotonic() + 120
        while f"raw.{n}ev_b" not in committer.paused or not catalog.table_exists(f"raw.{n}ev_a") \
                or len(_rows(catalog, f"raw.{n}ev_a")) < 20:
            assert time.monotonic() < deadline, (committer.paused, writer.tables.refused)
            for unit in writer.poll():
                committer.offer(unit)
    finally:
        writer.close()
        committer.close()

    paused = drills("fleet-table-paused.md", CONFIG=str(path), TABLE=f"raw.{n}ev_b")
    refused = drills("fleet-topic-refused.md", CONFIG=str(path), TOPIC=f"{p}ev.a_dead_letters")
    status = paused.run("confirm").expect(1).json()
    assert "not a dead-letter table" in status["paused"][f"raw.{n}ev_b"], status["paused"]
    status = refused.run("confirm").expect(1).json()
    assert "side table" in status["refused"][f"{p}ev.a_dead_letters"], status["refused"]

    # The hand fixes the pages describe: the table that took the name goes; the refused topic
    # gets a route of its own, the pattern narrowed so it does not claim it too.
    catalog.drop_table(squatter)
    _fleet(path, broker, p, f"{p}ev\\.(?!a_dead_letters$).*",
           extra=[{"identifier": "raw.ev_a_deadletter_topic", "topics": [f"{p}ev.a_dead_letters"], "schema": "infer"}])
    out = refused.run("fix", timeout=600).expect(0).stdout
    assert "valid" in out and "broker   ok" in out, out
    paused.run("fix", timeout=600).expect(0)

    status = paused.run("check").expect(0, 1).json()
    assert status["ingest"]["last_commit"] is not None and not any("pause" in r for r in status["health"]["reasons"])
    assert sorted(_rows(catalog, f"raw.{n}ev_b")) == list(range(13))
    status = refused.run("check").expect(0, 1).json()
    assert f"{p}ev.a_dead_letters" not in status["refused"] and not status["paused"], status
    assert sorted(_rows(catalog, "raw.ev_a_deadletter_topic")) == list(range(9))
    assert sorted(_rows(catalog, f"raw.{n}ev_a")) == list(range(20))


@pytest.mark.slow
@pytest.mark.spark
def test_governor_action_failing(tmp_path: Path, spark, drills) -> None:
    from streamberg.cli.govern import executors
    from streamberg.governor.app import Governor, Keeper
    from streamberg.governor.keeper import SharedCatalogs, TableKeeper
    from streamberg.table_meta.schedule import Scheduler
    from tests.compactor.helpers import FakeIngest, reload
    from tests.compactor.helpers import write_config as compactor_config
    from tests.helpers import config_at

    path = compactor_config(tmp_path, compactor={"min_files": 2})
    config = config_at(path)
    with ensure_table(load_catalog(config.catalog), config.table).transaction() as tx:
        # Rows aged by `city`, a string: maintenance refuses it when it runs, not when it is planned.
        tx.set_properties({"streamberg.retention.column": "city", "streamberg.retention.days": "30",
                           "streamberg.compact.enabled": "false", "streamberg.govern.min_interval_seconds": "0"})
    ingest = FakeIngest(config, seed=3)
    for _ in range(3):
        ingest.append(100, days=1)
    rows = sorted(reload(config).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())
    keeper = TableKeeper(config, executors(config), spark, SharedCatalogs())
    governor = Governor(lambda: [Keeper("db.events", keeper.probe, keeper.run)], Scheduler(max_wait_seconds=600),
                        state_dir=config.ingest.state_dir)
    ran = governor.round().ran
    assert ran and not ran[0]["ok"], ran  # the governor's maintenance of the table failed; it backs off

    drill = drills("governor-action-failing.md", CONFIG=str(path), TABLE="db.events")
    out = drill.run("confirm", timeout=600).expect(0, 1).stdout
    status, _ = json.JSONDecoder().raw_decode(out[out.index("{"):])  # after the plan's lines
    action = next(a for a in status["governor"]["actions"] if a["action"] == "maintain")
    assert action["failures"] == 1 and "retention" in action["last_error"], action
    drill.run("fix", timeout=900).expect(0)
    status = drill.run("check").expect(0, 1).json()
    action = next(a for a in status["governor"]["actions"] if a["action"] == "maintain")
    assert action["failures"] == 0 and action["last_run_age_seconds"] is not None, action
    assert sorted(reload(config).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()) == rows
