"""Incremental passes rewrite only what ingest added since; optimized files are left alone."""

from __future__ import annotations

import pytest

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


def test_next_pass_rewrites_only_files_added_since_the_last(spark, tmp_path) -> None:
    config, _ = setup_table(tmp_path, partition_spec=DAY, compactor={"strategy": "zorder"})
    ingest = FakeIngest(config, seed=11)
    for _ in range(3):
        ingest.append(200, days=2)
    first = run_compact(config, CompactOptions(once=True), spark=spark)
    assert first["files_in"] == 6
    optimized = set(live_files(reload(config)))
    first_commits = {s.snapshot_id for s in compactor_snapshots(reload(config))}

    # New data lands in one old partition and one new one.
    new_snapshots = [ingest.append(150, days=3) for _ in range(2)]
    table = reload(config)
    added_since = {p for p, sid in live_files(table).items() if sid in {s.snapshot_id for s in new_snapshots}}
    assert len(added_since) == 6 and added_since.isdisjoint(optimized)
    rows = row_multiset(table)

    second = run_compact(config, CompactOptions(once=True), spark=spark)

    after = reload(config)
    new_commits = [s for s in compactor_snapshots(after) if s.snapshot_id not in first_commits]
    rewritten = set().union(*(removed_by(after, s) for s in new_commits))
    assert rewritten == added_since  # exactly the new files: nothing older, nothing skipped
    assert optimized <= set(live_files(after))  # earlier optimized files untouched
    assert second["files_in"] == len(added_since)
    assert row_multiset(after) == rows
    assert all(summary(s)[SummaryKeys.COMPACTOR_BATCH_ID] == "1" for s in new_commits)  # the checkpoint moved on to batch 1
    covered = {int(x) for s in new_commits for x in summary(s)[SummaryKeys.COMPACTOR_COVERED_SNAPSHOTS].split(",")}
    assert covered == {s.snapshot_id for s in new_snapshots}
    assert all(added_by(after, s) for s in new_commits)


def test_a_pass_with_nothing_new_changes_nothing(spark, tmp_path) -> None:
    config, _ = setup_table(tmp_path, compactor={"strategy": "hilbert"})
    FakeIngest(config, seed=12).append(300, days=1)
    run_compact(config, CompactOptions(once=True), spark=spark)
    snapshot = reload(config).current_snapshot().snapshot_id
    again = run_compact(config, CompactOptions(once=True), spark=spark)
    assert again["batches"] == 0 and again["commits"] == 0
    assert reload(config).current_snapshot().snapshot_id == snapshot


def test_rules_defer_until_enough_files_then_act(spark, tmp_path) -> None:
    config, _ = setup_table(tmp_path, compactor={"strategy": "zorder", "min_files": 3})
    ingest = FakeIngest(config, seed=13)
    for _ in range(2):
        ingest.append(100, days=1)
    deferred = run_compact(config, CompactOptions(once=True), spark=spark)
    assert deferred["batches"] == 1 and deferred["commits"] == 0 and len(live_files(reload(config))) == 2
    ingest.append(100, days=1)
    acted = run_compact(config, CompactOptions(once=True), spark=spark)
    # The files deferred by the first batch are still pending and are picked up now.
    assert acted["commits"] == 1 and acted["files_in"] == 3 and len(live_files(reload(config))) == 1
