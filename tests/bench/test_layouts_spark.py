"""The whole benchmark on a small table, through the shared Spark session and the compactor's layouts."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from streamberg.bench.skipping.datagen import STUDY_COLUMNS
from streamberg.bench.skipping.pipeline import BenchOptions, BenchRun, catalog_config, run
from streamberg.bench.skipping.planning import coverage_depth, planned_files
from streamberg.bench.skipping.predicates import SamplerSpec
from streamberg.bench.skipping.report import write_report
from streamberg.bench.skipping.results import BenchResult, format_tables

# Its layouts are built once for the module: 43 s on 2 cores (make test-fast --durations, 2026-11-29).
pytestmark = [pytest.mark.spark, pytest.mark.slow]

FILES = 20


@pytest.fixture(scope="module")
def bench(spark, tmp_path_factory: pytest.TempPathFactory) -> tuple[BenchRun, BenchOptions]:
    workdir = tmp_path_factory.mktemp("bench-skipping")
    options = BenchOptions(
        scale=0.01, files=FILES, workdir=workdir, catalog_name="bench_skipping_test", progress=False,
        layouts=("sort", "zorder-iceberg", "zorder", "hilbert"),
        sampler=SamplerSpec(points_per_column=10, pairs_per_column_pair=2, ranges_per_column=2),
    )
    return run(options, spark=spark), options


def _point(result, layout: str, column: str) -> float:
    value = result.mean_skipped(result.layout(layout), "point", column)
    assert value is not None
    return value


@pytest.mark.slow
def test_every_layout_keeps_rows_and_file_count(bench) -> None:
    done, _ = bench
    result = done.result
    assert [r.layout for r in result.layouts] == ["random", "sort", "zorder-iceberg", "zorder", "hilbert"]
    for r in result.layouts:
        assert r.rows == result.rows > 50_000, r.layout
        assert r.files == FILES, r.layout
        assert len(r.planned) == len(result.predicates)
        assert all(0 <= n <= r.files for n in r.planned)


def test_random_skips_nothing_and_linear_order_skips_almost_everything_on_its_first_column(bench) -> None:
    result = bench[0].result
    for column in STUDY_COLUMNS:
        assert _point(result, "random", column) == 0.0
    # Sorted by s_city into 20 files: a city sits in one file, or two where a file boundary cuts it.
    assert _point(result, "sort", "s_city") >= 100 * (1 - 2 / FILES)
    assert _point(result, "sort", "p_brand") < 10, "the third sort column is not clustered"


def test_multi_column_layouts_cluster_every_column(bench) -> None:
    result = bench[0].result
    for layout in ("zorder", "hilbert"):
        for column in STUDY_COLUMNS:
            assert _point(result, layout, column) > 25, (layout, column)
        assert result.mean_skipped(result.layout(layout), "two-column", "s_city+c_city") > _point(result, layout, "s_city")


def test_counts_agree_with_manifest_bounds_and_pruning_is_safe(bench) -> None:
    """Iceberg's planner and an independent reading of the manifests agree, and no match is pruned."""
    from streamberg.common.catalog import load_catalog

    done, options = bench
    result = done.result
    catalog = load_catalog(catalog_config(options.workdir, options.catalog_name))
    for layout in result.layouts:
        for i, predicate in enumerate(result.predicates):
            if predicate.kind != "point":
                continue
            column, value = predicate.columns[0], predicate.values[0]
            values = done.distinct[column]
            depth = coverage_depth(done.bounds[layout.layout][column], values)
            assert layout.planned[i] == depth[values.index(value)], (layout.layout, predicate.sql())
    table = catalog.load_table(result.layout("hilbert").table)
    whole = table.scan().to_arrow()
    for predicate in [p for p in result.predicates if p.kind == "point"][:: 10]:
        column, value = predicate.columns[0], predicate.values[0]
        expected = pc.sum(pc.equal(whole.column(column), value)).as_py()
        assert table.scan(row_filter=predicate.expression()).to_arrow().num_rows == expected
        assert planned_files(table, predicate.expression()) < FILES


def test_outputs_table_json_and_report(bench, tmp_path: Path) -> None:
    done, _ = bench
    text = format_tables(done.result)
    assert "Point predicates" in text and "| hilbert" in text and "Targets" in text
    path = tmp_path / "r.json"
    done.result.write_json(path)
    data = json.loads(path.read_text())
    assert data["files"] == FILES and set(data["summary_skipped_percent"]) == {"random", "sort", "zorder-iceberg", "zorder", "hilbert"}
    assert data["layouts"][0]["planned"] == done.result.layouts[0].planned
    assert format_tables(BenchResult.from_json(data)) == text, "--show re-prints the same tables from the file"
    written = write_report(done.result, done.bounds, done.distinct, tmp_path / "report")
    names = {p.name for p in written}
    assert {"skipped_point.png", "skipped_other.png", "overlap_depth.png", "file_ranges_s_city.png"} <= names
    assert all(p.stat().st_size > 10_000 for p in written)
