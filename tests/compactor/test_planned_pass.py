"""The governor's compact action: one pass planned from the table, with no streaming query.

A streaming query's offsets add nothing to a compaction the governor already found due (a
pass plans every pending file from the table), only the query's start-up and its checkpoint's
writes; the continuous `streamberg compact` and `compact --once` keep their stream."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamberg.compactor.app import CompactOptions, run_compact
from streamberg.compactor.executor import CompactExecutor
from streamberg.table_meta.table_runtime import TableRuntime
from tests.cdc.helpers import rows_by_duckdb
from tests.compactor.helpers import DAY, FakeIngest, live_files, reload, row_multiset, setup_table

pytestmark = pytest.mark.spark

APPENDS, ROWS = 3, 200


def _filled(directory: Path):
    config, _ = setup_table(directory, partition_spec=DAY, compactor={"strategy": "zorder"})
    ingest = FakeIngest(config, seed=21)
    for _ in range(APPENDS):
        ingest.append(ROWS, days=2)
    return config


def _record_counts(config) -> list[int]:
    return sorted(task.file.record_count for task in reload(config).scan().plan_files())


def test_the_governors_pass_rewrites_what_once_would_and_starts_no_query(spark, tmp_path) -> None:
    streamed, planned = _filled(tmp_path / "streamed"), _filled(tmp_path / "planned")
    rows = row_multiset(reload(planned))
    assert rows == row_multiset(reload(streamed))  # the same appends in both tables

    once = run_compact(streamed, CompactOptions(once=True), spark=spark)
    executor = CompactExecutor(replan_seconds=60.0)
    kept = TableRuntime.of(planned, reload(planned))
    due = executor.due(kept, None, None)
    assert due is not None and due.action == "compact"
    out = executor.run(kept, spark)

    assert once["mode"] == "once" and once["batches"] == 1
    assert out["mode"] == "pass" and out["batches"] == 0
    for key in ("groups", "files_in", "files_out", "commits", "bytes_in"):
        assert out[key] == once[key], key
    assert out["files_in"] == APPENDS * 2  # every file the appends made (2 days each)
    # The same layout as the streamed pass: Z-order is deterministic over the same rows.
    assert _record_counts(planned) == _record_counts(streamed)
    assert len(live_files(reload(planned))) == out["files_out"] < out["files_in"]
    # No streaming query ran for it: a query writes its checkpoint before its first batch.
    assert Path(streamed.compactor.checkpoint_dir, "offsets").is_dir()
    assert not Path(planned.compactor.checkpoint_dir).exists()
    assert not spark.streams.active
    # Rows and keys as the test wrote them, read by pyiceberg and by DuckDB.
    assert row_multiset(reload(planned)) == rows
    by_duckdb = rows_by_duckdb(planned)
    assert len(by_duckdb) == APPENDS * ROWS and set(by_duckdb) == set(range(APPENDS * ROWS))

    # Nothing pending now: not due, and a pass run anyway commits nothing.
    kept = TableRuntime.of(planned, reload(planned))
    assert executor.due(kept, None, None) is None
    snapshot = reload(planned).current_snapshot().snapshot_id
    assert executor.run(kept, spark)["commits"] == 0
    assert reload(planned).current_snapshot().snapshot_id == snapshot
