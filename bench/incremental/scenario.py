"""One benchmark run: a stream of ingest commits, a compactor pass every few, the measures.

Two tables receive exactly the same appends (pyiceberg appends, like the ingest's: one file
per partition per commit): the *incremental* table, compacted by the real compactor
(`Compactor.run_pass`, the policy under test), and the *reference* table, fully optimized
(`run_pass(mode="full")`: every live file rewritten into one layout) at a few checkpoints
and at the end. Files read by a point query `column = value` are counted from the manifest
bounds of the live files (exactly Iceberg's min/max pruning when no bound is truncated: the
values here are short), for a fixed sample of values per column, averaged.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import yaml

from streamberg.table_meta.clustering import column_intervals
from streamberg.table_meta.summary_keys import SummaryKeys
from streamberg.table_meta.table_files import ManifestCache, live_data_files

Scenario = Literal["day", "flat"]
COLUMNS = ("c1", "c2", "c3")
CARDINALITY = {"c1": 250, "c2": 250, "c3": 1000}
SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "ts", "type": "timestamptz", "required": True},
    {"name": "c1", "type": "string"},
    {"name": "c2", "type": "string"},
    {"name": "c3", "type": "string"},
    {"name": "amount", "type": "double"},
]
BASE = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class RunSpec:
    scenario: Scenario
    strategy: str = "zorder"
    commits: int = 60
    rows_per_commit: int = 50_000
    commits_per_pass: int = 2
    days: int = 5  # day scenario: the commits arrive in time order over this many days
    target_file_size_bytes: int = 256 * 1024
    reference_every_passes: int = 10  # full optimize of the reference table (and at the end)
    points_per_column: int = 30
    compactor: dict[str, Any] = field(default_factory=dict)  # overrides (the knob under study)
    seed: int = 7


@dataclass
class PassMeasure:
    pass_number: int
    commits: int
    files: int
    files_per_query: dict[str, float]  # incremental table, mean over the sampled points
    bytes_ingested: int
    bytes_written: int  # by the compactor so far
    group_kinds: dict[str, int]
    seconds: float
    reference_files_per_query: dict[str, float] | None = None  # the full optimize, at checkpoints

    @property
    def write_amplification(self) -> float:
        return self.bytes_written / self.bytes_ingested if self.bytes_ingested else 0.0


@dataclass
class RunResult:
    spec: dict[str, Any]
    passes: list[PassMeasure]
    final: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "final": self.final,
                "passes": [{**asdict(p), "write_amplification": round(p.write_amplification, 3)} for p in self.passes]}


def _config(workdir: Path, catalog_name: str, identifier: str, spec: RunSpec) -> Any:
    from streamberg.common.config import load_config

    document = {
        "kafka": {"topic": "bench-incremental"},
        "catalog": {"name": catalog_name, "uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "table": {"identifier": identifier, "schema": SCHEMA,
                  "partition_spec": [{"source": "ts", "transform": "day"}] if spec.scenario == "day" else [],
                  "target_file_size_bytes": spec.target_file_size_bytes},
        # Every pass acts on whatever is pending; merges and sealing are the defaults unless
        # the spec overrides them (the knob under study).
        "compactor": {"strategy": spec.strategy, "columns": list(COLUMNS), "checkpoint_dir": "checkpoint",
                      "min_files": 1, "max_delay_seconds": None, "every_n_snapshots": None, "max_commits": 1,
                      "spark_master": "local[2]", **spec.compactor},
    }
    path = workdir / f"{identifier.replace('.', '_')}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_config(path)


def _rows(spec: RunSpec, commit: int, arrow_schema: pa.Schema) -> pa.Table:
    rng = np.random.default_rng(spec.seed * 1_000_003 + commit)
    n = spec.rows_per_commit
    if spec.scenario == "day":  # in time order: commit k lands in day k * days / commits
        day = commit * spec.days // spec.commits
        seconds = day * 86400 + rng.integers(0, 86400, n)
    else:
        seconds = rng.integers(0, spec.days * 86400, n)
    columns: dict[str, Any] = {
        "id": np.arange(commit * n, (commit + 1) * n, dtype=np.int64),
        "ts": pa.array((np.datetime64(BASE.replace(tzinfo=None)) + seconds.astype("timedelta64[s]")).astype("datetime64[us]"),
                       pa.timestamp("us", tz="UTC")),
        "amount": rng.random(n) * 100,
    }
    for name in COLUMNS:
        columns[name] = pa.array([f"{name}-{v:04d}" for v in rng.integers(0, CARDINALITY[name], n)])
    return pa.Table.from_pydict(columns, schema=arrow_schema)


def _points(spec: RunSpec) -> dict[str, list[str]]:
    rng = np.random.default_rng(spec.seed)
    return {c: [f"{c}-{v:04d}" for v in rng.integers(0, CARDINALITY[c], spec.points_per_column)] for c in COLUMNS}


def files_per_query(table: Any, points: dict[str, list[str]], cache: ManifestCache,
                    keep: Callable[[Any], bool] | None = None) -> dict[str, float]:
    """Mean files whose bounds admit `column = value`, over the sampled values (optionally
    only among the files `keep` accepts, e.g. one partition's)."""
    files, _ = live_data_files(table, cache)
    if keep is not None:
        files = [f for f in files if keep(f)]
    out = {}
    for column, values in points.items():
        intervals = column_intervals(files, table.schema(), column)
        counts = [sum(1 for i in intervals if i is None or i[0] <= v <= i[1]) for v in values]
        out[column] = float(np.mean(counts)) if counts else 0.0
    return out


def _compactor_bytes_written(table: Any) -> int:
    total = 0
    for snapshot in table.metadata.snapshots:
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if SummaryKeys.COMPACTOR_BYTES_OUT in props:
            total += int(props[SummaryKeys.COMPACTOR_BYTES_OUT])
    return total


def run(spec: RunSpec, spark: Any, workdir: Path, progress: Callable[[str], None] = print) -> RunResult:
    """Stream spec.commits commits into both tables, a pass every spec.commits_per_pass."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from streamberg.common.catalog import load_catalog
    from streamberg.common.spark import register_catalog
    from streamberg.compactor.compactor import Compactor
    from streamberg.table_meta.declared import ensure_table

    workdir.mkdir(parents=True, exist_ok=True)
    name = f"b{uuid.uuid4().hex[:8]}"
    incremental = _config(workdir, name, "bench.incremental", spec)
    reference = _config(workdir, name, "bench.reference", spec)
    catalog = load_catalog(incremental.catalog)
    tables = {c.table.identifier: ensure_table(catalog, c.table) for c in (incremental, reference)}
    register_catalog(spark, incremental.catalog)
    arrow_schema = schema_to_pyarrow(tables["bench.incremental"].schema())
    points = _points(spec)
    cache = ManifestCache()
    ingested = 0
    measures: list[PassMeasure] = []
    compactor = Compactor(incremental.compactor, incremental.target, spark)
    total_passes = -(-spec.commits // spec.commits_per_pass)
    for commit in range(spec.commits):
        rows = _rows(spec, commit, arrow_schema)
        for identifier in tables:
            table = catalog.load_table(identifier)
            table.append(rows)
            if identifier == "bench.incremental":
                ingested += int(table.current_snapshot().summary["added-files-size"])
        if (commit + 1) % spec.commits_per_pass and commit + 1 != spec.commits:
            continue
        started = time.perf_counter()
        report = compactor.run_pass()
        seconds = time.perf_counter() - started
        number = len(measures) + 1
        table = catalog.load_table("bench.incremental")
        kinds = report.plan.get("group_kinds", {})
        measure = PassMeasure(
            pass_number=number, commits=commit + 1, files=len(live_data_files(table, cache)[0]),
            files_per_query=files_per_query(table, points, cache), bytes_ingested=ingested,
            bytes_written=_compactor_bytes_written(table), group_kinds=dict(kinds), seconds=round(seconds, 3))
        if number % spec.reference_every_passes == 0 or number == total_passes:
            Compactor(reference.compactor, reference.target, spark).run_pass(mode="full")
            measure.reference_files_per_query = files_per_query(catalog.load_table("bench.reference"), points, cache)
        measures.append(measure)
        progress(f"  {spec.scenario}/{spec.strategy} pass {number}/{total_passes}: "
                 + ", ".join(f"{c} {v:.1f}" for c, v in measure.files_per_query.items())
                 + f" files/query, WA {measure.write_amplification:.2f}, {seconds:.1f} s")
    final = _final(spec, catalog, points, cache, measures)
    final["catalog_name"] = name
    final["policy"] = {k: getattr(incremental.compactor, k)
                       for k in ("merge_factor", "seal_after_commits", "seal_after_seconds")}
    return RunResult(spec=asdict(spec), passes=measures, final=final)


def _final(spec: RunSpec, catalog: Any, points: dict[str, list[str]], cache: ManifestCache,
           measures: Sequence[PassMeasure]) -> dict[str, Any]:
    """The goals' figures after the last pass: ratios to the full optimize, per column."""
    from streamberg.table_meta.table_files import partition_path, sealed_sequence_numbers

    inc, ref = catalog.load_table("bench.incremental"), catalog.load_table("bench.reference")
    last = measures[-1]
    assert last.reference_files_per_query is not None
    whole = {c: last.files_per_query[c] / last.reference_files_per_query[c] for c in COLUMNS}
    out: dict[str, Any] = {
        "passes": len(measures), "commits": last.commits, "files": last.files,
        "files_per_query": last.files_per_query, "full_optimize_files_per_query": last.reference_files_per_query,
        "ratio_whole_table": whole, "write_amplification": round(last.write_amplification, 3),
        "sealed_partitions": sorted(sealed_sequence_numbers(inc)),
        "mean_pass_seconds": round(float(np.mean([m.seconds for m in measures])), 3),
    }
    if spec.scenario == "day":
        sealed = {key.split("|", 1)[1] for key in sealed_sequence_numbers(inc)}

        def finished(table: Any) -> Callable[[Any], bool]:
            return lambda f: partition_path(table, f.spec_id, f.partition) in sealed

        if sealed:
            mine = files_per_query(inc, points, cache, finished(inc))
            theirs = files_per_query(ref, points, cache, finished(ref))
            out["finished_partitions"] = sorted(sealed)
            out["ratio_finished_partitions"] = {c: mine[c] / theirs[c] for c in COLUMNS if theirs[c]}
    return out


def write_json(results: list[RunResult], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([r.to_dict() for r in results], indent=2))
