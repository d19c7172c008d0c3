"""Runs the whole benchmark: generate, write random, lay out, plan, summarise, report."""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamberg.common.catalog import load_catalog
from streamberg.common.config import CatalogConfig
from streamberg.common.log import get_logger
from streamberg.table_meta.summary_keys import SummaryKeys

from .datagen import STUDY_COLUMNS, GenerationSpec, LineorderGenerator
from .planning import FileBounds, column_bounds, coverage_depth, planned_files, total_files
from .predicates import SamplerSpec, sample_predicates
from .random_table import recreate_table, write_files
from .results import STUDY_FILES, BenchResult, LayoutResult
from .spark_layouts import LAYOUTS, LayoutOptions, bench_spark_session, lay_out, register_bench_catalog

NAMESPACE = "ssb"
RANDOM = "random"
CATALOG_NAME = "streamberg_bench"
# Auto file count: files of about this many rows, at least 10 and at most the study's 1000.
# SF0.1 -> 100 files, SF1 -> 1000 files of ~6k rows, SF100 -> 1000 files of ~600k rows
# (the study: 533M rows in 1000 files).
AUTO_ROWS_PER_FILE = 6000


def auto_files(scale: float) -> int:
    return max(10, min(STUDY_FILES, round(GenerationSpec(scale, 1).expected_rows / AUTO_ROWS_PER_FILE)))


@dataclass(frozen=True)
class BenchOptions:
    scale: float = 0.1
    files: int | None = None  # None: auto_files(scale)
    columns: tuple[str, ...] = STUDY_COLUMNS
    layouts: tuple[str, ...] = LAYOUTS
    seed: int = 42
    sampler: SamplerSpec = field(default_factory=SamplerSpec)
    layout: LayoutOptions = field(default_factory=LayoutOptions)
    workdir: Path = Path(".streamberg/bench-skipping")
    catalog_name: str = CATALOG_NAME
    spark_master: str = "local[2]"
    driver_memory: str = "4g"
    progress: bool = True

    @property
    def file_count(self) -> int:
        return self.files if self.files is not None else auto_files(self.scale)


def table_identifier(layout: str) -> str:
    return f"{NAMESPACE}.lineorder_{layout.replace('-', '_')}"


def catalog_config(workdir: Path, name: str = CATALOG_NAME) -> CatalogConfig:
    root = workdir.resolve()
    return CatalogConfig(name=name, uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")


def environment() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    from streamberg.common.jars import ICEBERG_RUNTIME_JAR

    env = {"python": platform.python_version(), "cpus": str(os.cpu_count()), "machine": platform.machine(),
           "iceberg_spark_runtime": ICEBERG_RUNTIME_JAR}
    for package in ("pyspark", "pyiceberg", "pyarrow", "duckdb"):
        try:
            env[package] = version(package)
        except PackageNotFoundError:
            env[package] = "not installed"
    return env


def _bar(options: BenchOptions, **kwargs: Any) -> Any:
    from tqdm import tqdm

    return tqdm(file=sys.stderr, disable=not options.progress, dynamic_ncols=True, **kwargs)


@dataclass
class BenchRun:
    """The result plus what the report draws from (kept out of the JSON: one entry per file)."""

    result: BenchResult
    bounds: dict[str, dict[str, list[FileBounds]]]
    distinct: dict[str, list[Any]]


def run(options: BenchOptions, spark: Any = None) -> BenchRun:
    """The whole benchmark. ``spark``: an existing session to use (tests share one); by default
    one is built from the options."""
    log = get_logger("bench.skipping", scale=options.scale, files=options.file_count)
    seconds: dict[str, float] = {}
    files = options.file_count
    config = catalog_config(options.workdir, options.catalog_name)
    catalog = load_catalog(config)
    spec = GenerationSpec(scale=options.scale, files=files, seed=options.seed)

    started = time.perf_counter()
    log.info("generating SSB-like data", expected_rows=spec.expected_rows)
    # DuckDB reports no progress to Python; the bar moves per step (dbgen, then the join + shuffle).
    gen_bar = _bar(options, total=len(LineorderGenerator.STEPS), desc=f"generate SF{options.scale} (DuckDB)", unit="step")
    with gen_bar, LineorderGenerator(spec, spill_dir=options.workdir / "duckdb",
                                     progress=lambda step: (gen_bar.set_postfix_str(step), gen_bar.update(1))) as generator:
        gen_bar.close()  # generated; the bars below take over
        seconds["generate"] = time.perf_counter() - started
        missing = [c for c in options.columns if c not in generator.schema().names]
        if missing:
            raise ValueError(f"unknown column(s) {', '.join(missing)}; the table has {', '.join(generator.schema().names)}")
        distinct = {c: generator.distinct_values(c) for c in options.columns}
        started = time.perf_counter()
        table = recreate_table(catalog, table_identifier(RANDOM), generator.schema())
        with _bar(options, total=files, desc="write random files", unit="file") as bar:
            written = write_files(table, generator.slots(), progress=bar.update,
                                  snapshot_properties={SummaryKeys.BENCH_LAYOUT: RANDOM})
        seconds["write_random"] = time.perf_counter() - started
    rows = written.rows

    predicates = sample_predicates(distinct, options.sampler)
    log.info("predicates sampled", count=len(predicates))

    runs: list[tuple[str, str, str, float | None]] = [(RANDOM, table_identifier(RANDOM), "pyiceberg write_file, one task per random slot", None)]
    if options.layouts:
        started = time.perf_counter()
        if spark is None:
            spark = bench_spark_session(config, master=options.spark_master, driver_memory=options.driver_memory)
        else:
            register_bench_catalog(spark, config)
        seconds["spark_start"] = time.perf_counter() - started
        with _bar(options, total=len(options.layouts), desc="layouts", unit="layout") as bar:
            for layout in options.layouts:
                bar.set_postfix_str(layout)
                done = lay_out(spark, catalog, config, table_identifier(RANDOM), table_identifier(layout),
                               layout, options.columns, files, options.layout)
                seconds[f"layout_{layout}"] = done.seconds
                runs.append((layout, done.identifier, done.implementation, done.seconds))
                bar.update(1)

    results: list[LayoutResult] = []
    bounds: dict[str, dict[str, list[FileBounds]]] = {}
    started = time.perf_counter()
    with _bar(options, total=len(runs) * len(predicates), desc="plan predicates", unit="plan") as bar:
        for layout, identifier, implementation, layout_seconds in runs:
            tbl = catalog.load_table(identifier)
            table_rows = int((tbl.current_snapshot().summary or {}).get("total-records", 0)) if tbl.current_snapshot() else 0
            if table_rows != rows:
                log.error("layout changed the row count", layout=layout, rows=table_rows, expected=rows)
                raise RuntimeError(f"{layout}: table has {table_rows} rows, the random table {rows}")
            planned = []
            for predicate in predicates:
                planned.append(planned_files(tbl, predicate.expression()))
                bar.update(1)
            bounds[layout] = {c: column_bounds(tbl, c) for c in options.columns}
            depth = {c: sum(d) / len(d) for c in options.columns if (d := coverage_depth(bounds[layout][c], distinct[c]))}
            results.append(LayoutResult(layout=layout, table=identifier, implementation=implementation,
                                        files=total_files(tbl), rows=table_rows, seconds=layout_seconds,
                                        planned=planned, mean_depth=depth))
            if results[-1].files != files:
                log.warning("layout wrote a different number of files", layout=layout, files=results[-1].files, wanted=files)
    seconds["planning"] = time.perf_counter() - started

    result = BenchResult(scale=options.scale, files=files, rows=rows, seed=options.seed, columns=list(options.columns),
                         predicates=predicates, layouts=results, seconds=seconds, environment=environment())
    return BenchRun(result=result, bounds=bounds, distinct=distinct)


def unknown_layouts(layouts: Sequence[str]) -> list[str]:
    from .spark_layouts import EXTRA_LAYOUTS

    return [name for name in layouts if name not in (*LAYOUTS, *EXTRA_LAYOUTS)]
