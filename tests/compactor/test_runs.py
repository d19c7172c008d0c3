"""Runs that converge: merges by size tier, finished partitions sealed, the health measure.

Real Spark with the Iceberg runtime, a SQLite catalog, real Parquet files; appends made the
way the ingest makes them (offsets in the summary). See compactor/planner.py and
docs/compactor.md ("Runs").
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pyarrow.parquet as pq
import pytest
from structlog.testing import capture_logs

from streamberg.common.catalog import load_catalog
from streamberg.compactor.app import CompactOptions, run_compact
from streamberg.compactor.commit import CommitManager
from streamberg.compactor.compactor import Compactor
from streamberg.compactor.lease import TableLease
from streamberg.table_meta.clustering import health
from streamberg.table_meta.summary_keys import SummaryKeys, TablePropertyKeys
from streamberg.table_meta.table_files import live_data_files, pending_files, sealed_sequence_numbers
from tests.compactor.helpers import (
    DAY,
    FakeIngest,
    compactor_snapshots,
    live_files,
    reload,
    removed_by,
    row_multiset,
    setup_table,
    summary,
)

pytestmark = pytest.mark.spark

SMALL_FILES = {"write.target-file-size-bytes": str(24 * 1024)}  # several files per run
APPEND_INTERVAL_SECONDS = 0.5  # the writer of test_merges_commit_safely_while_ingest_appends
MAX_RACING_PASSES = 12  # its bound on passes until a merge raced an append
RUNS_ON = {"merge_factor": 3, "seal_after_commits": None, "seal_after_seconds": None}
DAY1 = (19783,)  # 2024-03-01, the day FakeIngest writes without a day_offset
# Sealing by time: long enough that the two passes after day 1's last append (~2 s each when
# warm) plan well inside it on a loaded 2-core machine, short enough to wait out in a test.
SEAL_AFTER_SECONDS = 8.0


def _runs(table) -> dict[tuple, set[str]]:
    """(adding snapshot, partition) -> paths, for the files rewrites added (not pending)."""
    files, _ = live_data_files(table)
    pending = {f.path for f in pending_files(table, files)}
    out: dict[tuple, set[str]] = {}
    for f in files:
        if f.path not in pending:
            out.setdefault((f.snapshot_id, f.partition), set()).add(f.path)
    return out


def _pass(config, spark) -> dict:
    return run_compact(config, CompactOptions(once=True), spark=spark)


def test_runs_merge_by_size_tier_and_keep_every_row(spark, tmp_path) -> None:
    config, _ = setup_table(tmp_path, compactor={"strategy": "zorder", **RUNS_ON}, table_properties=SMALL_FILES)
    ingest = FakeIngest(config, seed=21)
    kinds = []
    for _round in range(4):
        for _ in range(2):
            ingest.append(400, days=1)
        rows = row_multiset(reload(config))
        before_runs = _runs(reload(config))
        _pass(config, spark)
        after = reload(config)
        assert row_multiset(after) == rows  # a merge rewrites rows, never loses or doubles one
        newest = compactor_snapshots(after)[-1]
        kinds.append(summary(newest)[SummaryKeys.COMPACTOR_GROUP_KINDS])
        if "merge" in kinds[-1]:
            merged = int(summary(newest)[SummaryKeys.COMPACTOR_RUNS_IN])
            # Exactly the merged runs' files were replaced, with the new files; others stay.
            assert merged >= 2
            gone = removed_by(after, newest)
            consumed = [k for k, paths in before_runs.items() if paths <= gone]
            assert len(consumed) == merged and all(before_runs[k].isdisjoint(live_files(after)) for k in consumed)
        assert not pending_files(after, live_data_files(after)[0])
    # Passes 1 and 2 cluster; the third run of tier 0 (counting the new files) merges all three.
    assert kinds[:3] == ["cluster:1", "cluster:1", "merge:1"], kinds
    assert len(_runs(reload(config))) == 2  # the merged run and the fourth pass's run


@pytest.mark.slow
def test_a_finished_partition_is_sealed_and_never_rewritten(spark, tmp_path) -> None:
    config, _ = setup_table(tmp_path, partition_spec=DAY, table_properties=SMALL_FILES,
                            compactor={"strategy": "hilbert", "merge_factor": 3, "seal_after_commits": 2,
                                       "seal_after_seconds": None})
    ingest = FakeIngest(config, seed=22)
    day1 = {}
    for _ in range(3):  # day 1: three appends, a pass after each
        ingest.append(300, days=1)
        _pass(config, spark)
    for _ in range(2):  # day 2 only: after two ingest commits day 1 is finished
        ingest.append(300, days=1, day_offset=1)
    _pass(config, spark)
    table = reload(config)
    sealed = sealed_sequence_numbers(table)
    assert len(sealed) == 1 and next(iter(sealed)).endswith("ts_day=19783")  # 2024-03-01
    day1 = {k: paths for k, paths in _runs(table).items() if k[1] == (19783,)}
    assert len(day1) == 1  # finished into one run
    sealed_paths = next(iter(day1.values()))

    # Late data for day 1 and more passes: the sealed run is never touched again.
    ingest.append(200, days=1)
    for _ in range(3):
        ingest.append(300, days=1, day_offset=1)
        _pass(config, spark)
    after = reload(config)
    assert sealed_paths <= set(live_files(after))
    late_runs = [paths for k, paths in _runs(after).items() if k[1] == (19783,) and paths != sealed_paths]
    assert late_runs  # the late rows became a run of their own, sealed in its turn
    assert len(sealed_sequence_numbers(after)) == 1
    assert sealed_sequence_numbers(after)[next(iter(sealed))] > sealed[next(iter(sealed))]


@pytest.mark.slow
def test_a_partition_without_new_data_for_seal_after_seconds_is_sealed_and_never_rewritten(spark, tmp_path) -> None:
    """Sealing by time alone (seal_after_commits off): while day 2 keeps getting appends, day 1
    is not finished before seal_after_seconds without new data, and is finished (its runs
    merged into one sealed run) by the first pass after that; later passes leave it alone."""
    config, _ = setup_table(tmp_path, partition_spec=DAY, table_properties=SMALL_FILES,
                            compactor={"strategy": "hilbert", "merge_factor": 3, "seal_after_commits": None,
                                       "seal_after_seconds": SEAL_AFTER_SECONDS})
    ingest = FakeIngest(config, seed=26)
    ingest.append(300, days=1)
    _pass(config, spark)
    last_day1 = ingest.append(300, days=1).timestamp_ms / 1000
    _pass(config, spark)
    ingest.append(300, days=1, day_offset=1)  # new data for day 2 only: a pass, day 1 idle
    _pass(config, spark)
    assert time.time() - last_day1 < SEAL_AFTER_SECONDS, "the passes were too slow to plan before the time was up"
    table = reload(config)
    assert sealed_sequence_numbers(table) == {}
    assert len([k for k in _runs(table) if k[1] == DAY1]) == 2  # two unsealed runs, not finished

    time.sleep(max(0.0, last_day1 + SEAL_AFTER_SECONDS + 0.5 - time.time()))
    ingest.append(300, days=1, day_offset=1)  # the next ingest commit triggers the next pass
    _pass(config, spark)
    table = reload(config)
    sealed = sealed_sequence_numbers(table)
    assert len(sealed) == 1 and next(iter(sealed)).endswith("ts_day=19783")
    day1 = [paths for k, paths in _runs(table).items() if k[1] == DAY1]
    assert len(day1) == 1  # both runs finished into one
    finishes = [s for s in compactor_snapshots(table) if "finish" in summary(s)[SummaryKeys.COMPACTOR_GROUP_KINDS]]
    assert len(finishes) == 1 and int(summary(finishes[0])[SummaryKeys.COMPACTOR_RUNS_IN]) == 2

    for _ in range(2):
        ingest.append(300, days=1, day_offset=1)
        _pass(config, spark)
    after = reload(config)
    assert day1[0] <= set(live_files(after))  # the sealed run is never rewritten
    assert sealed_sequence_numbers(after)[next(iter(sealed))] == sealed[next(iter(sealed))]


def test_a_compactor_that_lost_its_lease_does_not_record_sealed_partitions(spark, tmp_path) -> None:
    """The sealed-partitions property is a commit like a rewrite: a compactor whose lease another
    holder took writes neither; the holder's own pass records the seal."""
    config, _ = setup_table(tmp_path, partition_spec=DAY, table_properties=SMALL_FILES,
                            compactor={"strategy": "hilbert", "merge_factor": 3, "seal_after_commits": 1,
                                       "seal_after_seconds": None})
    ingest = FakeIngest(config, seed=27)
    ingest.append(300, days=1)
    _pass(config, spark)  # day 1: one run, not finished yet
    ingest.append(300, days=1, day_offset=1)  # day 1 finished: one run, to seal without a rewrite

    def lease(ttl: float) -> TableLease:
        return TableLease(load_catalog(config.catalog).engine, config.catalog.name, config.table.identifier, ttl)

    lost = lease(ttl=1)
    assert lost.try_acquire() is None  # no heartbeat: it expires
    time.sleep(1.5)
    holder = lease(ttl=120)
    assert holder.try_acquire() is None  # another compactor takes the expired lease over
    try:
        before = reload(config)
        with capture_logs() as logs:
            report = Compactor(config.compactor, config.target, spark, lease=lost).run_pass()
        assert report.plan["seal_only"] == 1  # it would have sealed day 1
        assert [c.status for c in report.commits] == ["lease-lost"]
        after = reload(config)
        assert TablePropertyKeys.COMPACTOR_SEALED not in after.properties and sealed_sequence_numbers(after) == {}
        assert after.metadata.last_updated_ms == before.metadata.last_updated_ms  # no metadata commit at all
        skipped = [e for e in logs if e["event"] == "lease lost; finished partitions not recorded as sealed"]
        assert skipped and skipped[0]["log_level"] == "error" and skipped[0]["partitions"][0].endswith("ts_day=19783")

        Compactor(config.compactor, config.target, spark, lease=holder).run_pass()
        assert next(iter(sealed_sequence_numbers(reload(config)))).endswith("ts_day=19783")
    finally:
        holder.release()


def test_a_crash_in_a_merge_leaves_the_table_whole_and_the_next_pass_merges(spark, tmp_path, monkeypatch) -> None:
    config, _ = setup_table(tmp_path, compactor={"strategy": "zorder", **RUNS_ON}, table_properties=SMALL_FILES)
    ingest = FakeIngest(config, seed=23)
    for _ in range(2):
        ingest.append(400, days=1)
        _pass(config, spark)
    ingest.append(400, days=1)  # the next pass merges two runs with these files
    table = reload(config)
    rows, files, runs = row_multiset(table), set(live_files(table)), _runs(table)
    assert len(runs) == 2

    def crash(self, results, props) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(CommitManager, "_commit_once", crash)
        with pytest.raises(KeyboardInterrupt):
            Compactor(config.compactor, config.target, spark).run_pass()
    table = reload(config)
    assert set(live_files(table)) == files and row_multiset(table) == rows  # nothing half-done is visible

    _pass(config, spark)
    after = reload(config)
    assert row_multiset(after) == rows
    assert len(_runs(after)) == 1  # the merge happened on the next pass
    assert "merge" in summary(compactor_snapshots(after)[-1])[SummaryKeys.COMPACTOR_GROUP_KINDS]


def test_merges_commit_safely_while_ingest_appends(spark, spark_catalog, tmp_path) -> None:
    """Compactor passes commit run merges while an ingest-like writer commits every half second
    (a twentieth of the default commit interval): appends that land after a plan are kept and
    validated against, no row is lost or doubled.

    The writer is paced, not a tight loop: a writer committing faster than one compare-and-swap
    window of the rewrite (a refresh, the validation and a metadata write: seconds on a loaded
    2-core machine) makes every rewrite commit lose its race. The compactor then gives up
    cleanly after its retries (its new files removed, the old ones still pending, nothing
    lost), which is the right outcome but not the one this test is about. The deterministic
    append-between-plan-and-commit case is in test_concurrency.py."""
    config, _ = setup_table(tmp_path, compactor={"strategy": "zorder", "merge_factor": 2, "seal_after_commits": None,
                                                 "seal_after_seconds": None}, table_properties=SMALL_FILES)
    spark_catalog(config)
    ingest = FakeIngest(config, seed=24)
    ingest.append(400, days=1)
    done = threading.Event()
    appended = []

    def keep_appending() -> None:
        while not done.wait(APPEND_INTERVAL_SECONDS):
            appended.append(ingest.append(200, days=1).snapshot_id)

    def merges_of(table) -> list:
        return [s for s in compactor_snapshots(table) if "merge" in summary(s)[SummaryKeys.COMPACTOR_GROUP_KINDS]]

    def rebased(merges: list) -> list:
        # A merge whose commit's parent is not the snapshot it planned on was validated over
        # appends that landed while it ran.
        return [s for s in merges if str(s.parent_snapshot_id) != summary(s)[SummaryKeys.COMPACTOR_PLAN_SNAPSHOT_ID]]

    writer = threading.Thread(target=keep_appending)
    writer.start()
    try:
        # Whether an append lands inside a given merge's window is timing (a merge takes about
        # as long as one append interval), so passes go on until one did, within a bound: three
        # passes are the least that merge, twelve make a miss on every one vanishingly unlikely.
        for attempt in range(MAX_RACING_PASSES):
            # Each pass has new appends to cluster: on an idle machine passes can end within one
            # append interval, leaving nothing to merge.
            seen = len(appended)
            deadline = time.monotonic() + 30
            while len(appended) == seen and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(appended) > seen, "the writer appended nothing for 30 s"
            Compactor(config.compactor, config.target, spark).run_pass()
            if attempt >= 2 and rebased(merges_of(reload(config))):
                break
    finally:
        done.set()
        writer.join()
    _pass(config, spark)
    after = reload(config)
    ids = Counter(after.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())
    assert sorted(ids) == list(range(ingest.next_id)) and set(ids.values()) == {1}
    merges = merges_of(after)
    assert merges, [summary(s)[SummaryKeys.COMPACTOR_GROUP_KINDS] for s in compactor_snapshots(after)]
    assert len(appended) >= 2
    assert rebased(merges), f"no merge of {len(merges)} was rebased over a concurrent append"


def test_health_measure_equals_a_brute_force_count_from_the_data(spark, tmp_path) -> None:
    """Files per point and overlap depth from manifest bounds equal a brute-force count over
    each file's real min/max (read from the Parquet data itself)."""
    config, _ = setup_table(tmp_path, compactor={"strategy": "zorder", **RUNS_ON}, table_properties=SMALL_FILES)
    ingest = FakeIngest(config, seed=25)
    for _ in range(3):
        ingest.append(300, days=1, users=50, cities=30)
    _pass(config, spark)
    ingest.append(300, days=1, users=50, cities=30)  # a pending file beside the run
    table = reload(config)
    files, _ = live_data_files(table)
    measured = health(files, table.schema(), ["user_id", "city", "id"])
    for column, h in measured.items():
        spans = []
        for f in files:
            values = pq.read_table(f.path.removeprefix("file://"), columns=[column]).column(column).to_pylist()
            spans.append((min(values), max(values)))
        contains = [sum(1 for lo, hi in spans if lo <= p <= hi) for p, _ in spans]
        assert h.files == len(files)
        assert h.files_per_point == pytest.approx(sum(contains) / len(spans)), column
        depth = max(sum(1 for lo, hi in spans if lo <= p <= hi) for p in {v for span in spans for v in span})
        assert h.overlap_depth == depth, column
    # The status reports the same measure, and the metrics export it.
    from streamberg.monitoring.collect import collect_status
    from streamberg.monitoring.metrics import exposition

    status = collect_status(config)
    assert status.clustering is not None
    for column in ("user_id", "city"):
        assert status.clustering.columns[column]["files_per_point"] == round(measured[column].files_per_point, 3)
    exported = [line for line in exposition(config).splitlines()
                if line.startswith("streamberg_clustering_files_per_point{") and 'column="user_id"' in line]
    assert exported and float(exported[0].rsplit(" ", 1)[1]) == pytest.approx(measured["user_id"].files_per_point, abs=1e-3)
    assert json.loads(summary(compactor_snapshots(table)[-1])[SummaryKeys.COMPACTOR_FILES_PER_POINT]).keys() == {
        "user_id", "city"}
