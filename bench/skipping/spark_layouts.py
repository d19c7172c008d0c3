"""Lay the random table out with each strategy, through Spark and Iceberg's Spark runtime.

Each layout reads the random baseline table, orders it with the compactor's layout function
(``streamberg.compactor.layouts``) into exactly N partitions, and appends them to a fresh
Iceberg table of the same schema and properties. One partition is one data file: the bench
tables have ``write.distribution-mode=none`` and an unreachable target file size, and Spark's
adaptive execution is told not to coalesce partitions, so nothing re-cuts the layout's files.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyiceberg.catalog import Catalog

from streamberg.common.config import CatalogConfig
from streamberg.common.log import get_logger

# The layouts the study compares, in its row order (the random baseline is written without Spark).
LAYOUTS: tuple[str, ...] = ("sort", "zorder-iceberg", "zorder", "hilbert")
# Further layouts one may ask for: no reordering, and Iceberg's own rewrite action with its
# zorder sort (a cross-check that the compactor's ``zorder-iceberg`` is Iceberg's z-order).
ICEBERG_ACTION = "iceberg-action-zorder"
EXTRA_LAYOUTS: tuple[str, ...] = ("binpack", ICEBERG_ACTION)

# Session settings the benchmark needs on top of the project's base Spark conf.
BENCH_SPARK_CONF: dict[str, str] = {
    # One partition must stay one file: no coalescing of the layout's shuffle partitions.
    "spark.sql.adaptive.coalescePartitions.enabled": "false",
}


@dataclass(frozen=True)
class LayoutOptions:
    """Passed through to ``streamberg.compactor.layouts.apply_layout`` (its defaults)."""

    bits: int = 10
    sample_rows: int = 20000
    seed: int = 0


@dataclass(frozen=True)
class LayoutRun:
    strategy: str
    identifier: str
    seconds: float
    implementation: str


def bench_spark_session(catalog: CatalogConfig, master: str = "local[2]", driver_memory: str = "4g") -> Any:
    """A SparkSession with the Iceberg runtime and ``catalog`` registered under its own name."""
    from streamberg.common.spark import base_spark_conf, spark_jars, spark_session

    conf = base_spark_conf(spark_jars(catalog), master, "streamberg-bench-skipping")
    conf["spark.driver.memory"] = driver_memory
    conf.update(BENCH_SPARK_CONF)
    spark = spark_session(conf)
    spark.sparkContext.setLogLevel("ERROR")
    register_bench_catalog(spark, catalog)
    return spark


def register_bench_catalog(spark: Any, catalog: CatalogConfig) -> str:
    """Register ``catalog`` on ``spark`` (the project's way) with the settings the benchmark needs."""
    from streamberg.common.spark import register_catalog

    name = register_catalog(spark, catalog)
    # The benchmark drops and recreates tables through pyiceberg; Spark must not serve a
    # cached Table object for a name whose metadata moved underneath it.
    spark.conf.set(f"spark.sql.catalog.{name}.cache-enabled", "false")
    # JdbcCatalog's start-up check for its tables (DatabaseMetaData.getTables on SQLite) leaves
    # a read transaction open on the pooled connection; in WAL mode that connection then sees
    # the database as of that moment, so tables pyiceberg creates or commits later stay
    # invisible to Spark. pyiceberg's SqlCatalog has already created the tables, so skip it.
    spark.conf.set(f"spark.sql.catalog.{name}.jdbc.init-catalog-tables", "false")
    return name


@contextmanager
def bench_conf(spark: Any) -> Iterator[None]:
    """Apply ``BENCH_SPARK_CONF`` for the duration, restoring a shared session's own values."""
    saved = {key: spark.conf.get(key, None) for key in BENCH_SPARK_CONF}
    for key, value in BENCH_SPARK_CONF.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def _spark_name(catalog: CatalogConfig, identifier: str) -> str:
    return f"{catalog.name}.{identifier}"


def _iceberg_zorder_rewrite(spark: Any, catalog: CatalogConfig, identifier: str, columns: Sequence[str], files: int) -> None:
    """Iceberg's own ``rewrite_data_files`` with ``zorder(...)``, sized to give about N files."""
    name = _spark_name(catalog, identifier)
    total = spark.sql(f"SELECT sum(file_size_in_bytes) FROM {name}.files").collect()[0][0]
    target = max(1, int(total // files))
    spark.sql(f"""
        CALL {catalog.name}.system.rewrite_data_files(
            table => '{name}', strategy => 'sort', sort_order => 'zorder({", ".join(columns)})',
            options => map('rewrite-all', 'true', 'target-file-size-bytes', '{target}',
                           'max-file-group-size-bytes', '{1 << 50}', 'min-input-files', '1'))
    """).collect()


def lay_out(
    spark: Any,
    catalog: Catalog,
    catalog_config: CatalogConfig,
    source: str,
    target: str,
    strategy: str,
    columns: Sequence[str],
    files: int,
    options: LayoutOptions = LayoutOptions(),
) -> LayoutRun:
    """Write ``source`` into a fresh table ``target`` laid out by ``strategy`` into ``files`` files."""
    from streamberg.compactor.layouts import apply_layout

    # Imported here: pyiceberg's pyarrow IO is heavy and every `streamberg` call imports this module.
    from .random_table import recreate_table

    log = get_logger("bench.layouts", strategy=strategy, target=target)
    source_table = catalog.load_table(source)
    recreate_table(catalog, target, source_table.schema())
    rows = int((source_table.current_snapshot().summary or {}).get("total-records", 0)) or None
    started = time.perf_counter()
    with bench_conf(spark):
        frame = spark.table(_spark_name(catalog_config, source))
        if strategy == ICEBERG_ACTION:
            # A plain copy, then Iceberg's own action re-clusters it in place.
            frame.writeTo(_spark_name(catalog_config, target)).append()
            _iceberg_zorder_rewrite(spark, catalog_config, target, columns, files)
            implementation = "Iceberg CALL rewrite_data_files(strategy => 'sort', sort_order => 'zorder(...)')"
        else:
            laid = apply_layout(frame, strategy, list(columns), num_files=files, bits=options.bits,
                                sample_rows=options.sample_rows, row_count=rows, seed=options.seed)
            laid.writeTo(_spark_name(catalog_config, target)).append()
            implementation = f"streamberg.compactor.layouts.apply_layout(strategy={strategy!r})"
    seconds = time.perf_counter() - started
    log.info("layout written", seconds=round(seconds, 1), implementation=implementation)
    return LayoutRun(strategy=strategy, identifier=target, seconds=seconds, implementation=implementation)
