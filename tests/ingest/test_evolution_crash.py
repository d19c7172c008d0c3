"""kill -9 the ingest during the evolution commit, restart: nothing lost, nothing duplicated,
the column added once.

`streamberg ingest` (PyFlink) runs in its own process group on a topic whose records start
carrying a nested field the table lacks. The committer is held at the moment the schema
update and the held records' files are staged in its transaction but not committed
(common/faults.py: the process waits there, nothing else changes), and the whole group is
killed with SIGKILL at that moment. The restarted run must add the field and land every
record once: the new column filled for the new records and null for the old ones, the
conflicting records dead-lettered with the reason, the recorded offsets the topic's ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from streamberg.common.catalog import load_catalog
from streamberg.table_meta.field_sightings import added_fields_of
from streamberg.table_meta.offsets import committed_position, summary_properties
from tests.helpers import config_at, dead_letters, end_offsets_by_reading, streamberg, write_config
from tests.runbooks.inprocess import produce_values

pytestmark = pytest.mark.flink

PARTITIONS = 2


def record(i: int, **extra) -> bytes:
    return json.dumps({"id": i, "ts": "2026-11-25T10:00:00Z", "user_id": f"u{i % 5}", "city": "c",
                       "amount": 1.5, **extra}).encode()


def test_kill_9_during_the_evolution_commit_then_restart(tmp_path: Path, broker: str) -> None:
    path = write_config(tmp_path, broker, ingest={"commit_interval_seconds": 1, "parallelism": 2})
    config = config_at(path)
    old = [record(i) for i in range(400)]
    new = [record(i, device={"os": "ios" if i % 2 else "android", "build": i}) for i in range(400, 700)]
    conflicting = [record(i, amount="lots") for i in range(700, 705)]  # a string where the table has double
    for p in range(PARTITIONS):
        produce_values(config, old[p::PARTITIONS], p, PARTITIONS)

    marker = tmp_path / "paused"
    exe = Path(sys.executable).parent / "streamberg"
    log = tmp_path / "ingest.log"
    proc = subprocess.Popen(
        [str(exe), "ingest", "--config", str(path), "--quiet"], stdout=log.open("ab"), stderr=subprocess.STDOUT,
        start_new_session=True, env={**os.environ, "STREAMBERG_LOG_FORMAT": "json", "STREAMBERG_FAULT_PAUSE":
                                     "evolution-commit", "STREAMBERG_FAULT_MARKER": str(marker)})
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # the old records committed (no evolution yet)
            if proc.poll() is not None:
                pytest.fail(f"ingest exited early ({proc.returncode}):\n{log.read_text()[-3000:]}")
            catalog = load_catalog(config.catalog)
            if catalog.table_exists(config.table.identifier) and sum(committed_position(
                    catalog.load_table(config.table.identifier), config.kafka.topic).offsets.values()) >= len(old):
                break
            time.sleep(0.3)
        else:
            pytest.fail(f"the old records were not committed within 180 s:\n{log.read_text()[-3000:]}")
        for p in range(PARTITIONS):
            produce_values(config, new[p::PARTITIONS] + conflicting[p::PARTITIONS], p, PARTITIONS)
        deadline = time.monotonic() + 120
        while not marker.exists():  # the committer holds the staged evolution commit
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the evolution commit was never reached:\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)

    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert "device" not in [f.name for f in table.schema().fields]  # the kill came before the commit
    committed = sum(committed_position(table, config.kafka.topic).offsets.values())
    total = len(old) + len(new) + len(conflicting)
    assert committed < total

    streamberg("ingest", "--config", str(path), "--max-records", str(total - committed), "--quiet", timeout=600)
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert str(table.schema().find_type("device")).startswith("struct<")
    added = [s for s in table.snapshots() if added_fields_of(summary_properties(s))]
    assert len(added) == 1 and added[0].schema_id == table.schema().schema_id  # added once, with its rows
    rows = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert sorted(rows) == list(range(700))  # every valid record once
    assert all(rows[i]["device"] is None for i in range(400))
    assert all(rows[i]["device"] == {"os": "ios" if i % 2 else "android", "build": i} for i in range(400, 700))
    dead = dead_letters(config).to_pylist()
    assert sorted(json.loads(d["value"])["id"] for d in dead) == list(range(700, 705))
    assert all("field 'amount'" in d["reason"] for d in dead)
    offsets = {str(p): o for p, o in committed_position(table, config.kafka.topic).offsets.items()}
    assert offsets == end_offsets_by_reading(broker, config.kafka.topic, PARTITIONS)
    # DuckDB reads the files of both schemas alike.
    files = [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]
    assert duckdb.connect().execute(f"SELECT count(*), count(device), sum(device.build) FROM "
                                    f"read_parquet({files!r}, union_by_name=true)").fetchone() == (
        700, 300, sum(range(400, 700)))
