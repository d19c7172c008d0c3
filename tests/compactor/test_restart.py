"""Kill the compactor mid-stream, restart it: nothing is skipped and nothing is rewritten twice."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from streamberg.compactor.app import CompactOptions, run_compact
from streamberg.table_meta.summary_keys import SummaryKeys
from tests.compactor.helpers import (
    DAY,
    FakeIngest,
    added_by,
    compactor_snapshots,
    live_files,
    reload,
    removed_by,
    row_multiset,
    setup_table,
    summary,
)

pytestmark = pytest.mark.spark
STREAMBERG = str(Path(sys.executable).parent / "streamberg")


def test_kill_mid_batch_then_restart(spark, tmp_path) -> None:
    config, _ = setup_table(tmp_path, partition_spec=DAY, compactor={
        "strategy": "zorder", "trigger_interval_seconds": 2, "spark_master": "local[2]",
        "spark_conf": {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"},
    })
    ingest = FakeIngest(config, seed=31)
    for _ in range(3):
        ingest.append(400, days=4)  # 4 day partitions -> 4 groups -> 4 partial-progress commits
    before = reload(config)
    ingest_files = set(live_files(before))
    rows = row_multiset(before)

    proc = subprocess.Popen([STREAMBERG, "compact", "--config", config.config_path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "STREAMBERG_LOG_FORMAT": "json"})
    seen = []
    try:
        deadline = time.monotonic() + 240
        for line in proc.stderr:
            seen.append(line)
            if '"optimize committed"' in line:
                proc.send_signal(signal.SIGKILL)  # no clean-up of any kind: lease, checkpoint, Spark
                break
            assert time.monotonic() < deadline, "".join(seen[-20:])
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, "".join(seen[-20:])
    killed = reload(config)
    first_run = compactor_snapshots(killed)
    assert 1 <= len(first_run) < 4, "the kill was not mid-batch"
    assert Path(config.compactor.checkpoint_dir, "offsets", "0").exists()
    assert not Path(config.compactor.checkpoint_dir, "commits", "0").exists()  # batch 0 never completed

    with capture_logs() as logs:
        out = run_compact(config, CompactOptions(once=True), spark=spark)

    after = reload(config)
    snapshots = compactor_snapshots(after)
    removed = [p for s in snapshots for p in removed_by(after, s)]
    written = set().union(*(added_by(after, s) for s in snapshots))
    # Nothing rewritten twice: every ingest file was replaced exactly once, and no file the
    # compactor wrote was ever replaced again.
    assert collections.Counter(removed) == collections.Counter(ingest_files)
    assert written == set(live_files(after))
    # Nothing skipped: all ingest files are gone, and every row is still there once.
    assert not ingest_files & set(live_files(after))
    assert row_multiset(after) == rows
    # Spark's checkpoint made the restart re-run the interrupted batch 0, not start over.
    assert {summary(s)[SummaryKeys.COMPACTOR_BATCH_ID] for s in snapshots} == {"0"}
    assert out["batches"] == 1 and out["commits"] == len(snapshots) - len(first_run)
    takeover = [e for e in logs if e["event"] == "lease taken over"]
    assert takeover and takeover[0]["reason"] == "holder process is gone"
    json.dumps(out)  # the summary the CLI prints is plain JSON
