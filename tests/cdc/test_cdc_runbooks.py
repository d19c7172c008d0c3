"""Drills of the change-data-capture runbooks: each page's marked blocks run as written.

The situations are made for real: change-log commits the merge stage has not applied (the
ingest in process, tests/runbooks/inprocess.py, the merge not running), and a source that was
resynced after rows were deleted in it with no change read. What the page tells the operator
to run is the real command (a `streamberg merge` process each fix).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from streamberg.merge.app import MergeOptions, run_merge
from streamberg.table_meta.changelog import ingest_config
from tests.cdc.helpers import cdc_config, rows_by_pyiceberg
from tests.runbooks.drill import Drill
from tests.runbooks.inprocess import ingest_until, produce_values

pytestmark = pytest.mark.spark


def _event(op: str, key: int, name: str | None = None) -> bytes:
    row = {"id": key, "name": name or f"n{key}"}
    before, after = (row, None) if op == "d" else (None, row)
    return json.dumps({"before": before, "after": after, "op": op, "source": {"ts_ms": int(time.time() * 1000)}}).encode()


@pytest.mark.slow
def test_upsert_table_behind(tmp_path: Path, broker: str, spark, drills) -> None:
    config = cdc_config(tmp_path, broker, "debezium")
    produce_values(config, [_event("c", k) for k in range(50)], 0, 1)
    ingest_until(ingest_config(config), {0: 50})
    run_merge(config, MergeOptions(once=True), spark=spark)
    # The merge stage stops; the ingest goes on committing changes.
    produce_values(config, [_event("u", k, "again") for k in range(30)] + [_event("d", k) for k in range(40, 50)], 0, 1)
    ingest_until(ingest_config(config), {0: 90})
    time.sleep(5)  # more than monitoring.merge_lag_warn_intervals (4) merge intervals of 1 s
    drill = drills("upsert-table-behind.md", CONFIG=config.config_path or "")

    status = drill.run("confirm").expect(0, 1).json()
    assert status["merge"]["pending_records"] == 40 and status["merge"]["pending_snapshots"] == 1
    assert any("wait for the merge" in r for r in status["health"]["reasons"]), status["health"]
    fixed = json.loads(drill.run("fix", timeout=600).expect(0).stdout.strip().splitlines()[-1])
    assert fixed["merges"] == 1 and fixed["changes"] == 40
    status = drill.run("check").expect(0, 1).json()
    assert status["merge"]["pending_records"] == 0
    assert not any("merge" in r for r in status["health"]["reasons"]), status["health"]
    rows = rows_by_pyiceberg(config)
    assert sorted(rows) == list(range(40)) and all(rows[k]["name"] == "again" for k in range(30))


@pytest.mark.slow
def test_source_table_resynced(tmp_path: Path, broker: str, spark, drills) -> None:
    config = cdc_config(tmp_path, broker, "debezium")
    produce_values(config, [_event("c", k) for k in range(100)], 0, 1)
    ingest_until(ingest_config(config), {0: 100})
    run_merge(config, MergeOptions(once=True), spark=spark)
    # The connector lost its position; meanwhile rows 0-19 were deleted in the source and
    # row 20-29 changed. It resyncs: every row the source has, op r, then a new change.
    time.sleep(1.1)
    since = datetime.now(timezone.utc).isoformat(timespec="seconds")
    time.sleep(1.1)
    resync = [_event("r", k, "changed" if k < 30 else None) for k in range(20, 100)] + [_event("c", 100)]
    produce_values(config, resync, 0, 1)
    ingest_until(ingest_config(config), {0: 181})
    drill = drills("source-table-resynced.md", CONFIG=config.config_path or "", SINCE=since)

    status = drill.run("confirm").expect(0, 1).json()
    assert status["merge"]["pending_records"] == 81
    fixed = json.loads(drill.run("fix", timeout=600).expect(0).stdout.strip().splitlines()[-1])
    assert fixed["changes"] == 81 and fixed["resync"]["keys_seen"] == 81 and fixed["resync"]["rows_deleted"] == 20
    status = drill.run("check").expect(0, 1).json()
    assert status["merge"]["pending_records"] == 0 and status["health"]["verdict"] == "ok", status["health"]
    rows = rows_by_pyiceberg(config)
    assert sorted(rows) == list(range(20, 101)) and rows[25]["name"] == "changed" and rows[50]["name"] == "n50"
    # A time with no change since refuses, changing nothing.
    later = Drill("source-table-resynced.md", tmp_path, CONFIG=config.config_path or "",
                  SINCE=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    time.sleep(1.1)
    refused = later.run("fix", timeout=600).expect(1)
    assert "no commit since then" in refused.stderr
    assert sorted(rows_by_pyiceberg(config)) == list(range(20, 101))


@pytest.mark.slow
def test_cdc_source_regressed(tmp_path: Path, broker: str, spark, drills) -> None:
    """MySQL RESET MASTER: the same server and binlog name, files from 000001 again."""
    config = cdc_config(tmp_path, broker, "debezium")

    def mysql(op: str, key: int, name: str, file: int, pos: int) -> bytes:
        row = {"id": key, "name": name}
        before, after = (row, None) if op == "d" else (None if op == "c" else {"id": key}, row)
        return json.dumps({"before": before, "after": after, "op": op, "source": {
            "connector": "mysql", "server_id": 7, "file": f"mysql-bin.{file:06d}", "pos": pos, "row": 0,
            "ts_ms": int(time.time() * 1000)}}).encode()

    produce_values(config, [mysql("c", k, f"n{k}", 412, 100 + k) for k in range(40)], 0, 1)
    ingest_until(ingest_config(config), {0: 40})
    run_merge(config, MergeOptions(once=True), spark=spark)
    # RESET MASTER; then updates of keys 0-9, deletes of 10-14, a new key 40.
    produce_values(config, [mysql("u", k, "after-reset", 1, 4 + k) for k in range(10)]
                   + [mysql("d", k, f"n{k}", 1, 200 + k) for k in range(10, 15)]
                   + [mysql("c", 40, "n40", 1, 300)], 0, 1)
    ingest_until(ingest_config(config), {0: 56})
    run_merge(config, MergeOptions(once=True), spark=spark)
    drill = drills("cdc-source-regressed.md", CONFIG=config.config_path or "", WHY="RESET MASTER on db1 (drill)")

    status = drill.run("confirm").expect(1).json()
    regression = status["merge"]["source_regression"]
    assert regression["changes"] == 15 and regression["since"] == {"0": 40}, regression
    assert status["health"]["verdict"] == "critical"
    fixed = drill.run("fix", timeout=600).expect(0).stdout.strip().splitlines()
    assert json.loads(fixed[0])["epoch"] == 1 and json.loads(fixed[-1])["merges"] == 1
    status = drill.run("check").expect(0, 1).json()
    assert status["merge"]["source_regression"] is None and status["merge"]["source_epoch"] == 1
    assert not any("backwards" in r for r in status["health"]["reasons"]), status["health"]
    rows = rows_by_pyiceberg(config)
    assert sorted(rows) == [k for k in range(41) if not 10 <= k < 15]
    assert all(rows[k]["name"] == "after-reset" for k in range(10)) and rows[20]["name"] == "n20"
