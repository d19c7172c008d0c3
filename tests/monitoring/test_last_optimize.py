"""The compactor's side of status and metrics, after one real optimize pass (Spark + Iceberg)."""

from __future__ import annotations

import pytest

from streamberg.common.config import load_config
from streamberg.compactor.app import CompactOptions, run_compact
from streamberg.monitoring.collect import collect_status
from streamberg.monitoring.metrics import exposition
from streamberg.table_meta.summary_keys import SummaryKeys
from tests.compactor.helpers import TOPIC, FakeIngest, compactor_snapshots, live_files, reload, setup_table, summary
from tests.monitoring.test_metrics import samples

pytestmark = pytest.mark.spark


def test_last_optimize_and_backlog_after_a_pass(spark, tmp_path, broker) -> None:
    made, _ = setup_table(tmp_path)  # unpartitioned: one group, one commit
    config = load_config(made.config_path, kafka={"topic": TOPIC, "bootstrap_servers": broker})
    ingest = FakeIngest(config, seed=3)
    for _ in range(3):
        ingest.append(200)
    before = collect_status(config)
    assert before.compactor.pending_files == len(live_files(reload(config))) and before.compactor.last_optimize is None

    out = run_compact(config, CompactOptions(once=True), spark=spark)
    late = ingest.append(100)  # committed after the optimize: pending again
    after = collect_status(config)

    table = reload(config)
    (optimize,) = compactor_snapshots(table)
    record = summary(optimize)
    opt = after.compactor.last_optimize
    assert opt.snapshot_id == optimize.snapshot_id and out["commits"] == 1
    assert (opt.files_in, opt.files_out) == (out["files_in"], out["files_out"])
    assert opt.strategy == record[SummaryKeys.COMPACTOR_STRATEGY] == config.compactor.strategy and opt.mode == "incremental"
    assert opt.duration_seconds == int(record[SummaryKeys.COMPACTOR_DURATION_MS]) / 1000 > 0
    assert after.compactor.pending_files == 1 and after.compactor.pending_snapshots == 1
    files = live_files(table)
    assert [snapshot for snapshot in files.values() if snapshot == late.snapshot_id] == [late.snapshot_id]
    assert after.files.data_files == len(files) == out["files_out"] + 1

    t = (("table", config.table.identifier),)
    got = samples(exposition(config))
    assert got[("streamberg_compactor_last_optimize_duration_seconds", t)] == opt.duration_seconds
    assert got[("streamberg_compactor_last_optimize_files_in", t)] == out["files_in"]
    assert got[("streamberg_compactor_pending_files", t)] == 1
