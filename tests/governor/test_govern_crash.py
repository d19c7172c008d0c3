"""`streamberg govern` over a catalog of 32 tables, killed with SIGKILL mid-rewrite and restarted.

The tables: the config's own (db.events) and 31 in namespace `lake` (`govern.namespaces`),
written by ingest-like pyiceberg appends, their policy set through Spark SQL. While the
service runs, lake.t00 is hot (an append every half second) and every other table quiet. The
real command runs two actions at once; it is killed with SIGKILL the moment a compaction has
started, a table is dropped and another's compaction switched on while it is down, and it is
restarted: every table's rows are exactly what was appended (pyiceberg's multiset, DuckDB's
count and distinct ids), every table with compaction on is compacted (the one killed
mid-rewrite too, once its lease has expired), the dropped table is a problem of its own, and
no action that could run waited past the bound (the hot table starved none).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from streamberg.common.catalog import load_catalog
from streamberg.common.spark import register_catalog
from streamberg.table_meta.declared import ensure_table
from tests.compactor.helpers import FakeIngest, compactor_snapshots, live_files, reload, row_multiset
from tests.compactor.helpers import write_config as compactor_config
from tests.governor.test_govern import _duckdb_counts
from tests.helpers import config_at, wait_for

pytestmark = pytest.mark.spark
LAKE = [f"lake.t{i:02d}" for i in range(31)]
MAX_WAIT = 90.0


def _events(log: Path, event: str) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and event in line:
            record = json.loads(line)
            if record.get("event") == event:
                out.append(record)
    return out


def _start(path: Path, log: Path) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "streamberg"
    return subprocess.Popen([str(exe), "govern", "--config", str(path)], stdout=log.open("a"), stderr=subprocess.STDOUT,
                            env={**os.environ, "STREAMBERG_LOG_FORMAT": "json"}, start_new_session=True)


def test_killed_mid_rewrite_restarted_every_table_kept(tmp_path: Path, spark) -> None:
    path = compactor_config(tmp_path, compactor={"min_files": 3, "lease_ttl_seconds": 5})
    document = yaml.safe_load(path.read_text())
    document["govern"] = {"max_concurrent": 2, "interval_seconds": 1, "max_wait_seconds": MAX_WAIT,
                          "namespaces": ["lake"]}
    path.write_text(yaml.safe_dump(document))
    config = config_at(path)
    catalog = load_catalog(config.catalog)
    configs = {"db.events": config}
    for identifier in LAKE:
        configs[identifier] = config.model_copy(update={"table": config.table.model_copy(update={"identifier": identifier})})
    ingests = {}
    for n, (identifier, c) in enumerate(configs.items()):
        ensure_table(catalog, c.table)
        ingests[identifier] = FakeIngest(c, seed=n)
        for _ in range(3):
            ingests[identifier].append(60, days=2)
    name = config.catalog.name
    register_catalog(spark, config.catalog)
    for identifier in configs:
        spark.sql(f"ALTER TABLE {name}.{identifier} SET TBLPROPERTIES ('streamberg.maintain.enabled'='false', "
                  "'streamberg.govern.min_interval_seconds'='5')")
    spark.sql(f"ALTER TABLE {name}.lake.t01 SET TBLPROPERTIES ('streamberg.compact.enabled'='false')")
    spark.sql(f"ALTER TABLE {name}.lake.t02 SET TBLPROPERTIES ('streamberg.cluster.strategy'='spiral')")
    before = {i: set(live_files(reload(c))) for i, c in configs.items()}

    hot = ingests["lake.t00"]
    stop = threading.Event()

    def appends() -> None:
        while not stop.wait(0.5):
            hot.append(40, days=2)

    appender = threading.Thread(target=appends, daemon=True)
    appender.start()
    log = tmp_path / "govern.log"
    proc = _start(path, log)
    try:
        # Killed the moment a compaction has started (and its rewrite is under way).
        wait_for(lambda: any(e["action"] == "compact" for e in _events(log, "action started")), 240,
                 "compaction started", proc=proc, log=log, every=0.5)
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        killed = [e["table"] for e in _events(log, "action started")]
        finished = {e["table"] for e in _events(log, "action finished")}
        mid_rewrite = [t for t in killed if t not in finished]
        assert mid_rewrite, "the kill came after every started rewrite had finished"

        # While it is down: one table dropped, one table's compaction switched on.
        catalog.drop_table("lake.t05")
        spark.sql(f"ALTER TABLE {name}.lake.t01 SET TBLPROPERTIES ('streamberg.compact.enabled'='true')")
        kept = {i: c for i, c in configs.items() if i != "lake.t05"}

        proc = _start(path, log)
        state_path = Path(config.ingest.state_dir) / "govern.json"

        def state() -> dict:
            try:
                return json.loads(state_path.read_text())
            except (OSError, ValueError):
                return {}

        # A table dropped under the running service: a problem of its own while it is listed.
        wait_for(lambda: any(a["table"] == "lake.t06" for a in state().get("actions", [])), 240,
                 "lake.t06 kept by the restarted service", proc=proc, log=log, every=0.5)
        catalog.drop_table("lake.t06")
        del kept["lake.t06"]
        wait_for(lambda: any("cannot be read" in p for p in state().get("problems", {}).get("lake.t06", [])), 60,
                 "the dropped lake.t06 reported", proc=proc, log=log, every=0.5)
        wait_for(lambda: all(compactor_snapshots(reload(c)) for c in kept.values()), 480, "every table compacted",
                 proc=proc, log=log, every=0.5)
        stop.set()
        appender.join()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        stop.set()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)

    for identifier, c in kept.items():
        table = reload(c)
        ingest = ingests[identifier]
        rows = row_multiset(table)
        assert sum(rows.values()) == ingest.next_id and len(rows) == ingest.next_id, identifier
        assert _duckdb_counts(table) == (ingest.next_id, ingest.next_id), identifier
        if identifier != "lake.t00":  # the hot table keeps getting new files
            assert len(live_files(table)) < len(before[identifier]), identifier
    final = json.loads((Path(config.ingest.state_dir) / "govern.json").read_text())
    assert not any(a["table"] == "lake.t05" for a in final["actions"])  # dropped while down: not kept
    assert "spiral" in final["problems"]["lake.t02"][0]
    waits = [e["waited_seconds"] for e in _events(log, "action started")]
    # The bound, plus the one action a round may still be finishing when it is passed.
    longest_action = max(e["seconds"] for e in _events(log, "action finished"))
    assert max(waits) <= MAX_WAIT + longest_action + 5, (max(waits), longest_action)
