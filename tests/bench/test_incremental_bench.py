"""The incremental clustering benchmark's machinery, on a tiny stream (real Spark + Iceberg).

Checks what the figures rest on: both tables hold the same rows, the reference is a full
optimize, and the files-per-query count from manifest bounds equals what Iceberg's own scan
planning (pyiceberg) plans for the same predicates.
"""

from __future__ import annotations

import pytest
from pyiceberg.expressions import EqualTo

from streamberg.bench.incremental.commands import format_table
from streamberg.bench.incremental.scenario import COLUMNS, RunSpec, _points, run
from streamberg.common.catalog import load_catalog
from streamberg.common.config import CatalogConfig

pytestmark = pytest.mark.spark


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["day", "flat"])
def test_tiny_stream_measures_against_a_full_optimize(spark, tmp_path, scenario) -> None:
    spec = RunSpec(scenario=scenario, commits=6, rows_per_commit=3000, commits_per_pass=2, days=2,
                   target_file_size_bytes=32 * 1024, reference_every_passes=2, points_per_column=8,
                   compactor={"seal_after_commits": 2})
    result = run(spec, spark, tmp_path, progress=lambda _: None)
    assert [p.pass_number for p in result.passes] == [1, 2, 3]
    assert result.passes[1].reference_files_per_query is not None and result.passes[2].reference_files_per_query
    final = result.final
    assert final["commits"] == 6 and set(final["ratio_whole_table"]) == set(COLUMNS)
    assert final["write_amplification"] > 0
    if scenario == "day":
        assert final["sealed_partitions"] and final["ratio_finished_partitions"]  # day 1 stopped getting data
    catalog = load_catalog(CatalogConfig(name=final["catalog_name"], uri=f"sqlite:///{tmp_path / 'catalog.db'}",
                                         warehouse=str(tmp_path / "warehouse")))
    inc, ref = catalog.load_table("bench.incremental"), catalog.load_table("bench.reference")
    assert inc.scan().to_arrow().num_rows == ref.scan().to_arrow().num_rows == 6 * 3000
    # The bounds count is Iceberg's own pruning: pyiceberg plans the same files.
    points = _points(spec)
    last = result.passes[-1]
    for column in COLUMNS:
        planned = [len(list(inc.scan(row_filter=EqualTo(column, v)).plan_files())) for v in points[column]]
        assert last.files_per_query[column] == pytest.approx(sum(planned) / len(planned))
    assert "merge_factor 2" in format_table([result], [])
