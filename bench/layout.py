"""The layout follows the queries: a table fed by a stream while a query mix runs against it.

    .venv/bin/python bench/layout.py [--steps 24] [--rows 20000] [--queries 30]   (make bench-layout)

One tansu broker, the real ingest code (in-process, tests/runbooks/inprocess.py) appending
a batch of events a step; Spark (the product's session, with the scan-report writer) runs the
step's queries; then the governor's executors act as in `streamberg govern` (compact: its
due and run; drop-columns: its due and run), the table carrying
`streamberg.cluster.columns=auto` and `streamberg.columns.drop_unused=true`.

- Phase 1 (first half): three query shapes filtering `city`; phase 2: the same shapes on
  `user_id`. No query projects `note_a` or `note_b` (the records carry them).
- A compressed clock: the statistics' half-life (7 days in production, query_stats
  HALF_LIFE_DAYS) is `--half-life-seconds` (60), so a shift plays out in minutes, not days.
- Files read per query: Iceberg's own planning (pyiceberg plan_files: manifest and min/max
  pruning) of each shape with sample values, on the table at the end of each phase, beside
  two copies of the same rows fully optimized (every file rewritten): by the phase's best
  hand-chosen column, and by a wrong one (`amount`).
- Adaptation: steps (and seconds) from the shift until 90 % of the table's bytes are in
  files laid out by the new choice.
- Dropped columns: the bytes the notes held in the live files when they were dropped, and
  what is left of them at the end; ingest unaffected: rows = records produced, each id once,
  no dead letter.

Prints the figures and writes bench/results/layout-<time>.json. Every figure is measured here.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from streamberg.bench.harness import broker_in, checkout_tests, results_path, stamp
from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.table_meta.summary_keys import SummaryKeys
from streamberg.table_meta.table_runtime import TableRuntime

SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "ts", "type": "timestamptz", "required": True},
    {"name": "user_id", "type": "string"},
    {"name": "city", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "note_a", "type": "string"},
    {"name": "note_b", "type": "string"},
]
CITIES = [f"city-{i:03d}" for i in range(200)]
USERS = [f"user-{i:05d}" for i in range(5000)]


def shapes(column: str, rng: random.Random) -> list[str]:
    """The phase's three query shapes on `column`, with sample values."""
    values = CITIES if column == "city" else USERS
    a, b, c = rng.sample(values, 3)
    return [f"{column} = '{a}'", f"{column} = '{b}' AND amount > 500", f"{column} IN ('{a}', '{c}')"]


def events(start: int, count: int, rng: random.Random) -> list[bytes]:
    out = []
    for i in range(start, start + count):
        out.append(json.dumps({
            "id": i, "ts": "2026-11-27T00:00:00+00:00", "user_id": rng.choice(USERS), "city": rng.choice(CITIES),
            "amount": round(rng.random() * 1000, 2), "note_a": "n" * rng.randrange(20, 60),
            "note_b": f"free text {rng.random()} " * 3}).encode())
    return out


def planned(table: Any, where: str) -> int:
    from pyiceberg.expressions.parser import parse

    return sum(1 for _ in table.scan(row_filter=parse(where)).plan_files())


def optimized_copy(spark: Any, config: Any, source: Any, name: str, column: str) -> Any:
    """The same rows in a table of their own, every file rewritten clustered by `column`."""
    from streamberg.compactor.compactor import Compactor

    catalog = load_catalog(config.catalog)
    copy = config.model_copy(update={
        "table": config.table.model_copy(update={"identifier": f"bench.{name}", "properties": {}}),
        "compactor": config.compactor.model_copy(update={"columns": [column]})})
    table = catalog.create_table(copy.table.identifier, schema=source.schema())
    table.append(source.scan().to_arrow())
    Compactor(copy.compactor, copy.target, spark).run_pass(mode="full")
    return catalog.load_table(copy.table.identifier)


def layout_share(table: Any, columns: list[str]) -> float:
    """The share of the table's live bytes in files a rewrite laid out by `columns`."""
    wanted = ",".join(columns)
    total = by_new = 0
    for task in table.scan().plan_files():
        size = task.file.file_size_in_bytes
        total += size
    snapshot = table.current_snapshot()
    if snapshot is None or not total:
        return 0.0
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            made = table.snapshot_by_id(entry.snapshot_id)
            props = made.summary.additional_properties if made is not None and made.summary else {}
            if props.get(SummaryKeys.COMPACTOR_COLUMNS) == wanted:
                by_new += entry.data_file.file_size_in_bytes
    return by_new / total


def column_bytes(table: Any, names: list[str]) -> int:
    """Bytes the live data files hold for the columns `names` (their manifests' column sizes),
    by the field ids they had (a dropped column's bytes stay until its files are rewritten)."""
    ids = {f.field_id for f in table.metadata.schema_by_id(0).fields if f.name in names} \
        if table.metadata.schema_by_id(0) is not None else set()
    out = 0
    for task in table.scan().plan_files():
        out += sum(size for field_id, size in (task.file.column_sizes or {}).items() if field_id in ids)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=24, help="steps in all (half a phase each)")
    parser.add_argument("--rows", type=int, default=20000, help="events a step")
    parser.add_argument("--queries", type=int, default=30, help="queries a step")
    parser.add_argument("--file-bytes", type=int, default=1024**2, help="target size of the files rewrites write")
    parser.add_argument("--half-life-seconds", type=float, default=60.0, help="the statistics' half-life (compressed)")
    args = parser.parse_args()
    import streamberg.table_meta.query_stats as query_stats

    query_stats.HALF_LIFE_DAYS = args.half_life_seconds / 86400
    from streamberg.common.spark import build_spark_session
    from streamberg.compactor.executor import CompactExecutor
    from streamberg.ingest.dead_letters import open_tables
    from streamberg.maintenance.columns import DropColumnsExecutor
    from streamberg.table_meta.column_lifecycle import IGNORED_FIELDS_PROPERTY
    from streamberg.table_meta.column_usage import ColumnFacts
    checkout_tests()
    from tests.helpers import dead_letters
    from tests.runbooks.inprocess import ingest_until, produce_values

    rng = random.Random(42)
    run_at = stamp()
    with tempfile.TemporaryDirectory(prefix="sb-layout-") as tmp:
        folder = Path(tmp)
        with broker_in(folder) as bootstrap:
            path = folder / "streamberg.yaml"
            path.write_text(yaml.safe_dump({
                "kafka": {"bootstrap_servers": bootstrap, "topic": "layout"},
                "catalog": {"name": "layout", "uri": "sqlite:///catalog.db", "warehouse": "warehouse",
                            "scan_reports_dir": "reports"},
                "table": {"identifier": "bench.events", "schema": SCHEMA,
                          "properties": {"streamberg.cluster.columns": "auto", "streamberg.columns.drop_unused": "true",
                                         "streamberg.columns.reporting_engines": "spark,streamberg",
                                         # unused after a few steps of queries (days: 0.0002 = 17 s)
                                         "streamberg.columns.unused_after_days": "0.0002"}},
                "ingest": {"parallelism": 1, "state_dir": "state", "schema_evolution": "add"},
                "compactor": {"columns": ["id"], "min_files": 2, "target_file_size_bytes": args.file_bytes, "max_delay_seconds": None, "every_n_snapshots": None,
                              "relayout_max_bytes": 8 * 1024**2, "seal_after_commits": None,
                              "seal_after_seconds": None}}))
            config = load_config(path)
            ensure_topic(bootstrap, config.kafka.topic, 1)
            open_tables(config)
            spark = build_spark_session(config.catalog, "local[2]", {}, "streamberg-bench-layout")
            name = f"{config.catalog.name}.{config.table.identifier}"
            catalog = load_catalog(config.catalog)
            compact, drop = CompactExecutor(0.0), DropColumnsExecutor()
            produced, steps, shift_at, adapted_at = 0, [], args.steps // 2, None
            first_choice: list[str] = []
            shift_started = time.monotonic()
            dropped_bytes: int | None = None
            started = time.monotonic()
            phases: dict[str, Any] = {}
            for step in range(args.steps):
                column = "city" if step < shift_at else "user_id"
                produce_values(config, events(produced, args.rows, rng), 0, 1)
                produced += args.rows
                ingest_until(config, {0: produced})
                for _ in range(args.queries // 3):
                    for where in shapes(column, rng):
                        spark.sql(f"SELECT id, ts, user_id, city, amount FROM {name} WHERE {where}").collect()
                table = catalog.load_table(config.table.identifier)
                kept = TableRuntime.of(config, table)
                chosen = kept.settings
                if drop.due(kept, catalog, None) is not None:
                    dropped_bytes = column_bytes(table, ["note_a", "note_b"])
                    drop.run(kept, spark)
                    table = catalog.load_table(config.table.identifier)
                    kept = TableRuntime.of(config, table)
                chosen = kept.settings
                for _ in range(3):  # the governor's passes this step (its budget: relayout_max_bytes each)
                    if compact.due(kept, catalog, None) is None:
                        break
                    compact.run(kept, spark)
                    table = catalog.load_table(config.table.identifier)
                    kept = TableRuntime.of(config, table)
                chosen = kept.settings
                share = layout_share(table, list(chosen.compactor.columns))
                if step < shift_at:
                    first_choice = list(chosen.compactor.columns)
                elif adapted_at is None and chosen.compactor.columns != first_choice and share >= 0.9:
                    adapted_at = (step - shift_at + 1, time.monotonic() - shift_started)
                if step == shift_at - 1 or step == args.steps - 1:
                    phases[column] = {"table": table, "queries": shapes(column, random.Random(step))}
                if step == shift_at - 1:
                    shift_started = time.monotonic()
                steps.append({"step": step, "phase": column, "chosen": list(chosen.compactor.columns),
                              "share_laid_out_by_chosen": round(share, 3),
                              "files": sum(1 for _ in table.scan().plan_files()),
                              "last_commit": {k: v for k, v in (table.current_snapshot().summary.additional_properties
                                                                if table.current_snapshot() else {}).items()
                                              if k in (SummaryKeys.COMPACTOR_COLUMNS, SummaryKeys.COMPACTOR_MODE)},
                              "unused": (query_stats.usage(str(config.catalog.scan_reports_dir), config.table.identifier,
                                                           ColumnFacts.of_table(table),
                                                           0.0002) or {}).get("unused_columns"),
                              "seconds": round(time.monotonic() - started, 1)})
                print(json.dumps(steps[-1]), file=sys.stderr)
            results: dict[str, Any] = {}
            for column, phase in phases.items():
                best = optimized_copy(spark, config, phase["table"], f"best_{column}", column)
                wrong = optimized_copy(spark, config, phase["table"], f"wrong_{column}", "amount")
                per = {kind: [planned(t, q) for q in phase["queries"]]
                       for kind, t in (("governed", phase["table"]), ("best", best), ("wrong", wrong))}
                mean = {k: sum(v) / len(v) for k, v in per.items()}
                results[column] = {"files_per_query": mean, "per_query": per,
                                   "governed_vs_best": round(mean["governed"] / max(mean["best"], 1e-9), 2),
                                   "wrong_vs_governed": round(mean["wrong"] / max(mean["governed"], 1e-9), 2)}
                for kind in ("best", "wrong"):
                    catalog.drop_table(f"bench.{kind}_{column}")
            table = catalog.load_table(config.table.identifier)
            ids = table.scan(selected_fields=("id",)).to_arrow().column("id")
            import pyarrow.compute as pc

            outcome = {
                "at": run_at, "steps": args.steps, "rows_a_step": args.rows, "queries_a_step": args.queries,
                "phases": {c: {k: v for k, v in r.items() if k != "per_query"} for c, r in results.items()},
                "per_query": {c: r["per_query"] for c, r in results.items()},
                "adapted_after": None if adapted_at is None else {"steps": adapted_at[0],
                                                                    "seconds": round(adapted_at[1], 1)},
                "dropped": json.loads(table.properties.get(IGNORED_FIELDS_PROPERTY, "[]")),
                "note_bytes_when_dropped": dropped_bytes, "note_bytes_left": column_bytes(table, ["note_a", "note_b"]),
                "rows": len(ids), "distinct_ids": pc.count_distinct(ids).as_py(), "produced": produced,
                "dead_letters": dead_letters(config).num_rows, "steps_detail": steps,
            }
            spark.stop()
    for column, r in outcome["phases"].items():
        m = r["files_per_query"]
        print(f"phase {column}: files per query governed {m['governed']:.1f}, best full optimize {m['best']:.1f}, "
              f"wrong column {m['wrong']:.1f}: governed/best {r['governed_vs_best']}x (goal <= 1.2x), "
              f"wrong/governed {r['wrong_vs_governed']}x (goal >= 5x)")
    print(f"after the shift, 90 % of the bytes laid out by the new choice after: {outcome['adapted_after']}")
    print(f"dropped {outcome['dropped']}: their bytes {outcome['note_bytes_when_dropped']} when dropped, "
          f"{outcome['note_bytes_left']} left")
    print(f"rows {outcome['rows']:,}, distinct ids {outcome['distinct_ids']:,}, produced {outcome['produced']:,}, "
          f"dead letters {outcome['dead_letters']}")
    out = results_path("layout", run_at)
    out.write_text(json.dumps(outcome, indent=2, default=str))
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
