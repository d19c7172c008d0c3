"""Compaction keeps working after any snapshot expiry (issue 38, item 2).

Iceberg's streaming source starts from offsets kept in the compactor's checkpoint; with
`Trigger.AvailableNow` (`--once`, and so every governor action) it plans from the checkpoint's
*initial* offset (apache/iceberg#18000): once that one snapshot is expired, every run failed
with "Cannot load current offset at snapshot S, the snapshot was expired or removed". Here every
old snapshot is expired (Spark's own `expire_snapshots`, retain_last 1) between passes, and each
pass must still rewrite exactly the new files, rows unchanged: `--once` three times, then the
continuous compactor, whose running stream's offset is expired under it.
"""

from __future__ import annotations

import threading
import time

import pytest
from structlog.testing import capture_logs

from streamberg.common.spark import register_catalog
from streamberg.compactor.app import CompactOptions, run_compact
from streamberg.table_meta.table_files import live_data_files, pending_files
from tests.compactor.helpers import FakeIngest, live_files, reload, row_multiset, setup_table

pytestmark = pytest.mark.spark


def _pending(table) -> set[str]:
    files, _ = live_data_files(table)
    return {f.path for f in pending_files(table, files)}


def _expire_all_but_current(spark, config) -> int:
    """Expire every snapshot but the current one; return how many went."""
    register_catalog(spark, config.catalog)
    before = len(reload(config).metadata.snapshots)
    spark.sql(f"CALL {config.catalog.name}.system.expire_snapshots(table => '{config.table.identifier}', "
              f"older_than => TIMESTAMP '{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(time.time() + 1))}', "
              "retain_last => 1)").collect()
    after = reload(config).metadata.snapshots
    assert len(after) == 1
    return before - 1


@pytest.mark.slow
def test_once_and_continuous_passes_survive_expiry_of_every_old_snapshot(spark, tmp_path) -> None:
    config, _ = setup_table(tmp_path, compactor={"trigger_interval_seconds": 1})
    ingest = FakeIngest(config, seed=21)
    for round_ in range(3):
        for _ in range(3):
            ingest.append(100, days=1)
        rows = row_multiset(reload(config))
        new = _pending(reload(config))
        assert len(new) == 3
        out = run_compact(config, CompactOptions(once=True), spark=spark)
        table = reload(config)
        assert out["commits"] >= 1 and out["files_in"] == 3, (round_, out)
        assert not _pending(table) and not new & set(live_files(table)), round_
        assert row_multiset(table) == rows
        assert sorted(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()) == \
            list(range(ingest.next_id))
        # Everything old goes, the checkpoint's initial and last offsets included.
        assert _expire_all_but_current(spark, config) >= 3

    # The continuous compactor: its stream's offset is expired while it runs.
    stop = threading.Event()
    outcome: dict = {}

    def compact() -> None:
        try:
            outcome.update(run_compact(config, CompactOptions(), spark=spark, stop=stop))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=compact)
    with capture_logs() as logs:
        thread.start()
        _continuous_rounds(spark, config, ingest, thread, outcome, stop)
    assert "error" not in outcome, outcome
    # The running stream's offset was expired under it: reset and started again, in-process.
    assert any(e["event"].startswith("the stream's checkpoint names an expired snapshot") for e in logs)
    table = reload(config)
    assert sorted(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()) == \
        list(range(ingest.next_id))


def _continuous_rounds(spark, config, ingest, thread, outcome, stop) -> None:
    try:
        for _ in range(2):
            for _ in range(2):
                ingest.append(100, days=1)
            deadline = time.monotonic() + 120
            while _pending(reload(config)) and "error" not in outcome and thread.is_alive():
                if time.monotonic() > deadline:
                    pytest.fail(f"the continuous compactor did not compact the new files: {outcome}")
                time.sleep(0.5)
            assert "error" not in outcome, outcome
            _expire_all_but_current(spark, config)
    finally:
        stop.set()
        thread.join(120)
