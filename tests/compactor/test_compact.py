"""End-to-end optimize runs: real Spark + Iceberg runtime, SQLite catalog, Parquet files."""

from __future__ import annotations

import math

import pytest

from streamberg.common.config import LAYOUT_STRATEGIES
from streamberg.compactor.app import CompactOptions, run_compact
from streamberg.table_meta.offsets import committed_position
from streamberg.table_meta.summary_keys import SummaryKeys
from tests.compactor.helpers import (
    DAY,
    TOPIC,
    FakeIngest,
    added_by,
    compactor_snapshots,
    file_sizes,
    live_files,
    reload,
    removed_by,
    row_multiset,
    setup_table,
    summary,
)

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("strategy", LAYOUT_STRATEGIES)
def test_rows_identical_files_fewer_and_record_written(spark, tmp_path, strategy) -> None:
    config, _ = setup_table(tmp_path, partition_spec=DAY, compactor={"strategy": strategy})
    ingest = FakeIngest(config, seed=1)
    for _ in range(4):
        ingest.append(300, days=2)
    before = reload(config)
    rows_before = row_multiset(before)
    files_before = live_files(before)
    assert len(files_before) == 8  # 4 appends x 2 days

    out = run_compact(config, CompactOptions(once=True), spark=spark)

    after = reload(config)
    assert row_multiset(after) == rows_before
    files_after = live_files(after)
    # The table's target (128 MiB default) holds each day's data in one file.
    assert len(files_after) == 2 and out["files_in"] == 8 and out["files_out"] == 2
    assert set(files_after).isdisjoint(files_before)
    snapshots = compactor_snapshots(after)
    assert snapshots and all(s.summary.operation.value == "replace" for s in snapshots)
    records = [summary(s) for s in snapshots]
    assert len(snapshots) == out["commits"] and len(snapshots) <= config.compactor.max_commits
    for record in records:
        assert record[SummaryKeys.COMPACTOR_STRATEGY] == strategy and record[SummaryKeys.COMPACTOR_COLUMNS] == "user_id,city"
        assert record[SummaryKeys.COMPACTOR_MODE] == "incremental" and record[SummaryKeys.COMPACTOR_BATCH_ID] == "0"
        # each day partition holds files of all four appends
        assert record[SummaryKeys.COMPACTOR_COVERED_SNAPSHOTS] == ",".join(str(s.snapshot_id) for s in before.metadata.snapshots)
        assert record[SummaryKeys.COMPACTOR_PLAN_SNAPSHOT_ID] == str(before.current_snapshot().snapshot_id)
        assert SummaryKeys.COMPACTOR_COMMIT_ID in record and SummaryKeys.COMPACTOR_DURATION_MS in record
    assert sum(int(r[SummaryKeys.COMPACTOR_FILES_IN]) for r in records) == 8 and sum(int(r[SummaryKeys.COMPACTOR_FILES_OUT]) for r in records) == 2
    assert sum(int(r[SummaryKeys.COMPACTOR_BYTES_IN]) for r in records) == sum(file_sizes(before).values())
    assert sum(int(r[SummaryKeys.COMPACTOR_BYTES_OUT]) for r in records) == sum(file_sizes(after).values())
    assert sum(int(r[SummaryKeys.COMPACTOR_RECORDS]) for r in records) == sum(rows_before.values())
    assert set().union(*(removed_by(after, s) for s in snapshots)) == set(files_before)
    assert set().union(*(added_by(after, s) for s in snapshots)) == set(files_after)
    # The ingest job must still find its position behind the compactor's snapshot.
    assert not any(k.startswith(SummaryKeys.KAFKA_OFFSETS_PREFIX) for r in records for k in r)
    assert committed_position(after, TOPIC).offsets == {0: 1200}


def test_small_target_gives_files_no_larger_than_the_target(spark, tmp_path) -> None:
    target = 48 * 1024
    # Iceberg's writer rolls files on its size estimate, which counts the open Parquet page
    # uncompressed; small pages keep the estimate close to the real size at this tiny target.
    config, _ = setup_table(tmp_path, compactor={"strategy": "hilbert", "target_file_size_bytes": target},
                            table_properties={"write.parquet.page-size-bytes": "2048"})
    ingest = FakeIngest(config, seed=2)
    for _ in range(12):
        ingest.append(1000, days=1)
    before = reload(config)
    rows_before = row_multiset(before)
    run_compact(config, CompactOptions(once=True), spark=spark)
    after = reload(config)
    sizes = file_sizes(after)
    assert row_multiset(after) == rows_before
    assert 1 < len(sizes) < len(live_files(before))  # the data needs several files, fewer than before
    assert max(sizes.values()) <= target, sizes
    assert len(sizes) <= 2 * math.ceil(sum(sizes.values()) / target), sizes  # and they are not tiny


def test_full_mode_reclusters_optimized_files(spark, tmp_path) -> None:
    config, _ = setup_table(tmp_path, partition_spec=DAY, compactor={"strategy": "sort", "columns": ["city"]})
    ingest = FakeIngest(config, seed=3)
    for _ in range(2):
        ingest.append(200, days=2)
    run_compact(config, CompactOptions(once=True), spark=spark)
    optimized = set(live_files(reload(config)))
    rows = row_multiset(reload(config))
    out = run_compact(config, CompactOptions(full=True, strategy="hilbert", columns=["user_id", "city"]), spark=spark)
    after = reload(config)
    assert out["mode"] == "full" and out["files_in"] == len(optimized)
    assert set(live_files(after)).isdisjoint(optimized)
    assert row_multiset(after) == rows
    last = summary(compactor_snapshots(after)[-1])
    assert last[SummaryKeys.COMPACTOR_MODE] == "full" and last[SummaryKeys.COMPACTOR_STRATEGY] == "hilbert" and SummaryKeys.COMPACTOR_BATCH_ID not in last


@pytest.mark.slow  # 9-12 s alone on 2 cores (make test-fast --durations, 2026-11-29)
def test_bucket_and_day_partitions_written_by_spark(spark, spark_catalog, tmp_path) -> None:
    """The demo table's spec (day(ts), bucket[4](user_id)), appended by Spark SQL INSERTs."""
    spec = [{"source": "ts", "transform": "day"}, {"source": "user_id", "transform": "bucket[4]"}]
    config, _ = setup_table(tmp_path, partition_spec=spec, compactor={"strategy": "hilbert"})
    name = f"{spark_catalog(config)}.{config.table.identifier}"
    for i in range(3):
        spark.sql(f"""INSERT INTO {name}
            SELECT id, timestamp_seconds(1709251200 + (id * 7919) % 172800), format_string('user-%04d', id % 97),
                   format_string('city-%02d', id % 13), id / 10.0
            FROM range({i * 500}, {(i + 1) * 500})""")
    before = reload(config)
    files_before = live_files(before)
    partitions = {f.file.partition for f in before.scan().plan_files()}
    assert len(partitions) == 8  # 2 days x 4 buckets
    rows = row_multiset(before)

    out = run_compact(config, CompactOptions(once=True), spark=spark)

    after = reload(config)
    assert row_multiset(after) == rows
    assert out["files_in"] == len(files_before) and len(live_files(after)) == len(partitions)
    assert {f.file.partition for f in after.scan().plan_files()} == partitions
