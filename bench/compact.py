"""Compactor benchmarks (`make bench-compact`): real Spark + Iceberg runtime, SQLite catalog.

1. Incremental cost stays flat as the table grows. Two tables share the same shape; the
   second holds 10x the (already optimized) data in the same partitions. The same new
   ingest appends land in both, and one incremental pass rewrites them. Reported: both
   pass times and their ratio, beside Iceberg's own ``rewrite_data_files`` (zorder sort,
   rewrite-all) over the whole 10x table, which is what re-clustering without an
   incremental planner costs.
2. Rewrite speed against Iceberg's built-in action on the same files, same Spark, same run:
   ``zorder`` (this project) vs ``CALL rewrite_data_files(strategy => 'sort',
   sort_order => 'zorder(...)')``. The table is rolled back to the same snapshot before each
   run, so both rewrite exactly the same files; runs alternate (A B A B ...) so machine
   noise hits both alike. ``hilbert`` is timed the same way for reference.

Usage: python bench/compact.py [--scale 1.0] [--rounds 3] [--only incremental|speed]
Prints a table and writes bench/results/compact-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["user_id", "city"]
SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "ts", "type": "timestamptz", "required": True},
    {"name": "user_id", "type": "string", "required": True},
    {"name": "url", "type": "string"},
    {"name": "city", "type": "string"},
    {"name": "amount", "type": "double"},
]


def make_config(workdir: Path, name: str, *, partitioned: bool, target: int) -> Any:
    from streamberg.common.config import load_config

    directory = workdir / name
    directory.mkdir(parents=True)
    doc = {
        "kafka": {"topic": "bench"},
        "catalog": {"name": f"b{uuid.uuid4().hex[:8]}", "uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "table": {"identifier": "bench.events", "schema": SCHEMA,
                  "partition_spec": [{"source": "ts", "transform": "day"}] if partitioned else [],
                  "target_file_size_bytes": target},
        "compactor": {"strategy": "zorder", "columns": COLUMNS, "checkpoint_dir": "checkpoint", "min_files": 1,
                      "max_delay_seconds": None, "every_n_snapshots": None, "max_group_bytes": 8 * 1024**3,
                      "max_commits": 1},
    }
    path = directory / "streamberg.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_config(path)


def generate(spark: Any, start: int, rows: int, seed: int, days: int = 2) -> Any:
    """Deterministic events: skewed users, 60 cities, URLs with a long shared prefix."""
    from pyspark.sql import functions as F

    base = 1_709_251_200  # 2024-03-01T00:00:00Z
    cities = F.array(*[F.lit(f"city-{i:02d}") for i in range(60)])
    return spark.range(start, start + rows, numPartitions=1).select(
        F.col("id"),
        F.timestamp_seconds(F.lit(base) + (F.rand(seed) * days * 86400).cast("long")).alias("ts"),
        F.format_string("user-%06d", (F.pow(F.rand(seed + 1), 2) * 200_000).cast("int")).alias("user_id"),
        F.format_string("https://www.example.com/shop/catalogue/item/%08d", (F.rand(seed + 2) * 1e7).cast("int")).alias("url"),
        F.element_at(cities, (F.rand(seed + 3) * 60).cast("int") + 1).alias("city"),
        F.round(F.rand(seed + 4) * 100, 2).alias("amount"),
    )


def append(spark: Any, table: str, start: int, rows: int, seed: int) -> None:
    generate(spark, start, rows, seed).writeTo(table).append()


def timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def data_files(spark: Any, table: str) -> tuple[int, int]:
    row = spark.sql(f"SELECT count(*) AS n, coalesce(sum(file_size_in_bytes), 0) AS b FROM {table}.files").first()
    return int(row.n), int(row.b)


def bench_incremental(spark: Any, workdir: Path, scale: float, rounds: int) -> dict[str, Any]:
    from streamberg.common.catalog import load_catalog
    from streamberg.common.spark import register_catalog
    from streamberg.compactor.compactor import Compactor
    from streamberg.table_meta.declared import ensure_table

    base_rows = int(300_000 * scale)
    new_rows, new_commits = int(100_000 * scale), 10
    step = new_rows // new_commits
    results: dict[str, Any] = {"base_rows_1x": base_rows, "new_rows": new_rows, "new_commits": new_commits,
                               "rounds": rounds}
    tables: dict[int, tuple[Any, str]] = {}
    for factor in (0, 1, 10):  # 0: a throwaway table that warms the JVM up (JIT, codegen caches)
        config = make_config(workdir, f"incremental-{factor}x", partitioned=True, target=128 * 1024**2)
        ensure_table(load_catalog(config.catalog), config.table)
        register_catalog(spark, config.catalog)
        table = config.target.spark_name
        rows = base_rows * max(factor, 1) if factor else step * 2
        print(f"  building the {factor}x table ({rows:,} optimized rows) ...", flush=True)
        for i in range(max(factor, 1)):
            append(spark, table, i * base_rows, rows // max(factor, 1), seed=100 + i)
        # The base is optimized data: rewritten once (replace snapshots), so never pending again.
        spark.sql(f"CALL {config.catalog.name}.system.rewrite_data_files(table => 'bench.events', "
                  "options => map('rewrite-all', 'true'))").collect()
        tables[factor] = (config, table)
    config, table = tables.pop(0)
    for i in range(new_commits):
        append(spark, table, 10**9 + i * step, step, seed=7 + i)
    Compactor(config.compactor, config.target, spark).run_pass()  # warm-up, not measured
    runs: dict[int, list[float]] = {1: [], 10: []}
    for r in range(rounds):
        for factor, (config, table) in tables.items():  # alternate 1x / 10x so noise hits both
            for i in range(new_commits):  # the same new rows land in both tables
                append(spark, table, 10**9 + (r * new_commits + i) * step, step, seed=1000 * r + i)
            seconds, report = timed(lambda config=config: Compactor(config.compactor, config.target, spark).run_pass())
            totals = report.totals()
            files, size = data_files(spark, table)
            runs[factor].append(seconds)
            print(f"  round {r + 1}: {factor:2d}x table ({size:,} bytes, {files} files after): incremental pass "
                  f"{seconds:.2f} s, rewrote {totals['files_in']} files ({totals['bytes_in']:,} bytes)", flush=True)
            results.setdefault(f"{factor}x", {})["table_bytes"] = size
            results[f"{factor}x"]["files_rewritten_per_pass"] = totals["files_in"]
    for factor in (1, 10):
        results[f"{factor}x"]["pass_seconds"] = [round(x, 2) for x in runs[factor]]
        results[f"{factor}x"]["median_seconds"] = round(statistics.median(runs[factor]), 2)
    results["ratio_10x_over_1x"] = round(results["10x"]["median_seconds"] / results["1x"]["median_seconds"], 3)
    config, table = tables[10]
    seconds, _ = timed(lambda: spark.sql(
        f"CALL {config.catalog.name}.system.rewrite_data_files(table => 'bench.events', strategy => 'sort', "
        f"sort_order => 'zorder({','.join(COLUMNS)})', options => map('rewrite-all', 'true', "
        "'max-file-group-size-bytes', '8589934592'))").collect())
    results["iceberg_rewrite_all_10x_seconds"] = round(seconds, 2)
    print(f"  Iceberg rewrite_data_files zorder over the whole 10x table: {seconds:.2f} s", flush=True)
    return results


def bench_speed(spark: Any, workdir: Path, scale: float, rounds: int) -> dict[str, Any]:
    from streamberg.common.catalog import load_catalog
    from streamberg.common.spark import register_catalog
    from streamberg.compactor.compactor import Compactor
    from streamberg.table_meta.declared import ensure_table

    rows, files = int(2_000_000 * scale), 40
    config = make_config(workdir, "speed", partitioned=False, target=128 * 1024**2)
    ensure_table(load_catalog(config.catalog), config.table)
    register_catalog(spark, config.catalog)
    table = config.target.spark_name
    print(f"  building {files} small files, {rows:,} rows ...", flush=True)
    for i in range(files):
        append(spark, table, i * (rows // files), rows // files, seed=1000 + i)
    start_snapshot = spark.sql(f"SELECT snapshot_id FROM {table}.snapshots ORDER BY committed_at DESC LIMIT 1").first()[0]
    in_files, in_bytes = data_files(spark, table)
    # A group that becomes several files, as a large group does in production (8 x 128 MB
    # from 1 GB): this exercises how rows are routed to files, not only the sort.
    target = max(1024**2, in_bytes // 4)
    config = config.model_copy(update={"compactor": config.compactor.model_copy(update={"target_file_size_bytes": target})})
    cat = config.catalog.name

    def rollback() -> None:
        spark.sql(f"CALL {cat}.system.rollback_to_snapshot('bench.events', {start_snapshot})").collect()

    def ours(strategy: str) -> Any:
        def run() -> None:
            report = Compactor(config.compactor, config.target, spark, strategy=strategy).run_pass(mode="full")
            assert report.totals()["files_in"] == in_files, report.totals()
        return run

    def iceberg() -> None:
        spark.sql(f"CALL {cat}.system.rewrite_data_files(table => 'bench.events', strategy => 'sort', "
                  f"sort_order => 'zorder({','.join(COLUMNS)})', options => map('rewrite-all', 'true', "
                  f"'target-file-size-bytes', '{target}', 'max-file-group-size-bytes', '8589934592'))").collect()

    runs: dict[str, list[float]] = {"zorder": [], "iceberg_zorder": [], "hilbert": []}
    outputs: dict[str, tuple[int, int]] = {}
    warm = make_config(workdir, "speed-warmup", partitioned=False, target=128 * 1024**2)
    ensure_table(load_catalog(warm.catalog), warm.table)
    register_catalog(spark, warm.catalog)
    for i in range(5):
        append(spark, warm.target.spark_name, i * 20_000, 20_000, seed=i)
    for strategy in ("zorder", "hilbert"):  # warm-up (JIT, codegen caches) on a small table, not measured
        Compactor(warm.compactor, warm.target, spark, strategy=strategy).run_pass(mode="full")
    spark.sql(f"CALL {warm.catalog.name}.system.rewrite_data_files(table => 'bench.events', strategy => 'sort', "
              f"sort_order => 'zorder({','.join(COLUMNS)})', options => map('rewrite-all', 'true'))").collect()
    for r in range(rounds):
        for name, fn in (("zorder", ours("zorder")), ("iceberg_zorder", iceberg), ("hilbert", ours("hilbert"))):
            rollback()
            seconds, _ = timed(fn)
            runs[name].append(seconds)
            outputs[name] = data_files(spark, table)
            print(f"  round {r + 1}: {name:15s} {seconds:6.2f} s  -> {outputs[name][0]} files", flush=True)
    rollback()
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {
        "rows": rows, "input_files": in_files, "input_bytes": in_bytes, "target_file_size_bytes": target,
        "runs_seconds": {k: [round(x, 2) for x in v] for k, v in runs.items()},
        "median_seconds": {k: round(v, 2) for k, v in med.items()},
        "output_files": {k: v[0] for k, v in outputs.items()},
        "ratio_zorder_over_iceberg": round(med["zorder"] / med["iceberg_zorder"], 3),
        "ratio_hilbert_over_iceberg": round(med["hilbert"] / med["iceberg_zorder"], 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="row-count multiplier (default 1.0)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds in the speed benchmark")
    parser.add_argument("--only", choices=("incremental", "speed"), help="run one of the two benchmarks")
    parser.add_argument("--workdir", type=Path, help="where tables are written (default: a temp dir, removed)")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    os.environ.setdefault("STREAMBERG_LOG_LEVEL", "warning")

    from streamberg.common.spark import base_spark_conf, quiet_spark_logs, spark_jars, spark_session

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="streamberg-bench-"))
    conf = base_spark_conf(spark_jars(), args.master, "streamberg-bench-compact")
    conf.update({"spark.sql.shuffle.partitions": "4", "spark.driver.memory": "4g", "spark.ui.enabled": "false"})
    spark = spark_session(conf)
    quiet_spark_logs(spark, "ERROR")
    results: dict[str, Any] = {"master": args.master, "scale": args.scale, "cpus": os.cpu_count(),
                               "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        if args.only in (None, "incremental"):
            print("1. incremental cost as the table grows", flush=True)
            results["incremental"] = bench_incremental(spark, workdir, args.scale, args.rounds)
        if args.only in (None, "speed"):
            print("2. rewrite speed vs Iceberg's rewrite_data_files zorder, same files", flush=True)
            results["speed"] = bench_speed(spark, workdir, args.scale, args.rounds)
    finally:
        spark.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    if "incremental" in results:
        inc = results["incremental"]
        print(f"incremental pass, same {inc['new_rows']:,} new rows in {inc['new_commits']} commits "
              f"(median of {inc['rounds']}):")
        print(f"  1x table: {inc['1x']['median_seconds']:.2f} s (runs {inc['1x']['pass_seconds']})   "
              f"10x table: {inc['10x']['median_seconds']:.2f} s (runs {inc['10x']['pass_seconds']})   "
              f"ratio of medians 10x/1x: {inc['ratio_10x_over_1x']:.2f}")
        print(f"  Iceberg rewrite_data_files (zorder, rewrite-all) on the whole 10x table: "
              f"{inc['iceberg_rewrite_all_10x_seconds']:.2f} s")
    if "speed" in results:
        sp = results["speed"]
        print(f"rewrite of {sp['input_files']} files / {sp['rows']:,} rows / {sp['input_bytes']:,} bytes (median of "
              f"{len(sp['runs_seconds']['zorder'])}):")
        for name, label in (("zorder", "zorder (streamberg)"), ("iceberg_zorder", "Iceberg zorder sort"),
                            ("hilbert", "hilbert (streamberg)")):
            print(f"  {label:22s} {sp['median_seconds'][name]:6.2f} s  runs {sp['runs_seconds'][name]}  "
                  f"-> {sp['output_files'][name]} files")
        print(f"  ratio zorder / Iceberg zorder: {sp['ratio_zorder_over_iceberg']:.2f}   "
              f"hilbert / Iceberg zorder: {sp['ratio_hilbert_over_iceberg']:.2f}")
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"compact-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
