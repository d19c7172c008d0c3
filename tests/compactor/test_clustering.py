"""Clustering works: point predicates plan fewer files after a zorder/hilbert optimize.

Measured with Iceberg's own scan planning (pyiceberg ``plan_files``: partition pruning plus
per-file min/max metrics), the way a query engine decides which files to read.
"""

from __future__ import annotations

import random
import statistics

import pytest
from pyiceberg.expressions import EqualTo

from streamberg.compactor.app import CompactOptions, run_compact
from tests.compactor.helpers import FakeIngest, live_files, reload, row_multiset, setup_table

pytestmark = pytest.mark.spark


def _planned(table, column: str, values: list[str]) -> float:
    return statistics.mean(len(list(table.scan(row_filter=EqualTo(column, v)).plan_files())) for v in values)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["zorder", "hilbert"])
def test_point_predicates_plan_fewer_files_after_clustering(spark, tmp_path, strategy) -> None:
    # Iceberg rolls files on an estimate that counts the open page uncompressed; small pages
    # keep that estimate honest at this test's small target size.
    config, _ = setup_table(tmp_path, compactor={"strategy": strategy},
                            table_properties={"write.parquet.page-size-bytes": "2048"})
    ingest = FakeIngest(config, seed=41)
    for _ in range(16):
        ingest.append(1500, days=1, users=3000, cities=40)
    before = reload(config)
    files_before = len(live_files(before))
    rng = random.Random(7)
    users = sorted({f"user-{rng.randrange(3000):05d}" for _ in range(25)})
    cities = [f"city-{i:02d}" for i in range(0, 40, 3)]
    users_before, cities_before = _planned(before, "user_id", users), _planned(before, "city", cities)
    # Unclustered appends: every file spans (nearly) every value, so nothing is skipped.
    assert users_before > 0.9 * files_before and cities_before > 0.9 * files_before

    bytes_in = sum(f.file_size_in_bytes for f in (t.file for t in before.scan().plan_files()))
    target = bytes_in // 10  # fewer files than were ingested, enough to cluster into
    config = config.model_copy(update={"compactor": config.compactor.model_copy(
        update={"target_file_size_bytes": target})})
    run_compact(config, CompactOptions(once=True), spark=spark)

    after = reload(config)
    files_after = len(live_files(after))
    assert row_multiset(after) == row_multiset(before)
    assert 4 <= files_after < files_before
    users_after, cities_after = _planned(after, "user_id", users), _planned(after, "city", cities)
    # Each clustered column alone now prunes files, both absolutely and as a share of the table.
    assert users_after < users_before and cities_after < cities_before
    print(f"{strategy}: {files_before} -> {files_after} files; planned for a user {users_before:.1f} -> {users_after:.1f}, for a city {cities_before:.1f} -> {cities_after:.1f}")
    assert users_after / files_after < 0.65, (users_after, files_after)
    assert cities_after / files_after < 0.65, (cities_after, files_after)
