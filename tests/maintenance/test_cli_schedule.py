"""`streamberg maintain` as an operator runs it: a subprocess on a schedule, stopped by SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from streamberg.table_meta.maintenance_runs import last_maintenance_run
from tests.compactor.helpers import FakeIngest
from tests.helpers import JvmSentinel, wait_for
from tests.maintenance.helpers import setup_maintained

pytestmark = pytest.mark.spark

STREAMBERG = str(Path(sys.executable).parent / "streamberg")
CONTRACT_KEYS = {"table", "dry_run", "expire_snapshots", "orphan_files", "rewrite_manifests", "retention",
                 "bytes_freed", "duration_seconds"}


@pytest.mark.slow
def test_scheduled_runs_are_recorded_and_sigterm_stops_gracefully(tmp_path) -> None:
    config, _ = setup_maintained(tmp_path, {
        "interval_seconds": 1,
        # No compactor runs here, so its pending appends need no protection.
        "expire": {"max_snapshot_age_seconds": 0.001, "keep_pending_for_compactor": False},
        "manifests": {"min_count": 3},
    })
    ingest = FakeIngest(config, seed=11)
    for _ in range(3):
        ingest.append(50)
    # The JVM sentinel's positive control: this run does start Spark, and the sentinel must see
    # it (the "before Spark starts" tests rely on it seeing nothing).
    jvm = JvmSentinel(tmp_path)
    proc = subprocess.Popen([STREAMBERG, "maintain", "--config", config.config_path, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**jvm.env, "STREAMBERG_LOG_FORMAT": "json"})
    try:
        first = wait_for(lambda: last_maintenance_run(config), 180, "a maintenance run recorded", every=0.5,
                         proc=proc)
        # A second run, proving the schedule repeats.
        wait_for(lambda: last_maintenance_run(config)["run_id"] != first["run_id"], 180, "a second maintenance run",
                 every=0.5, proc=proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert any("org.apache.spark" in line for line in jvm.launched()), jvm.launched()
    runs = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(runs) >= 2
    assert set(runs[0]) >= CONTRACT_KEYS
    assert runs[0]["rewrite_manifests"]["ran"] and runs[0]["rewrite_manifests"]["manifests_after"] == 1
    assert runs[0]["expire_snapshots"]["ran"]
    assert not runs[1]["rewrite_manifests"]["ran"]  # already compact
    assert first["result"]["run_id"] == runs[0]["run_id"]
    logs = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    done = [entry for entry in logs if entry.get("event") == "maintenance run done"]
    assert done and all(entry["table"] == "db.events" and "snapshot_id" in entry for entry in done)
