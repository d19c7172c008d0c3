"""The demo's layout report: data files a point query reads before and after the compactor.

"Before" is the table as the ingest wrote it: every data file an ingest append added,
including those the compactor has since replaced (their manifests are still reachable from
the append snapshots). "After" is the current snapshot. Both hold the same records, so the
two counts compare two layouts of one data set. Counts are Iceberg's own scan planning
(partition pruning, then the min/max metrics evaluator over each file's bounds), exactly
what `table.scan(row_filter=...).plan_files()` does, applied to each file set; nothing is
estimated. Writes a PNG (matplotlib, installed by `make setup` through the bench extra) and
prints its path with the figures.

    python scripts/demo_layout.py --config examples/demo.yaml --out .streamberg/demo-layout.png
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

from pyiceberg.expressions import And, EqualTo
from pyiceberg.expressions.visitors import _InclusiveMetricsEvaluator
from pyiceberg.manifest import ManifestEntryStatus

from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.table_meta.offsets import summary_properties
from streamberg.table_meta.summary_keys import kafka_offsets_key
from streamberg.table_meta.table_files import snapshot_entries


def ingest_files(table, topic: str) -> list:
    """(spec id, DataFile) of every data file an ingest append added (offsets in its summary)."""
    key = kafka_offsets_key(topic)
    files = []
    for snapshot in table.metadata.snapshots:
        if key not in summary_properties(snapshot):
            continue
        files.extend(snapshot_entries(table.io, snapshot, ManifestEntryStatus.ADDED))
    return files


def planned(table, files: list, expression) -> int:
    """Files of `files` that Iceberg's scan planning keeps for `expression` (partition, then metrics)."""
    scan = table.scan(row_filter=expression)
    by_spec = {}
    metrics = _InclusiveMetricsEvaluator(table.schema(), scan.row_filter, True, False).eval
    count = 0
    for spec_id, data_file in files:
        if spec_id not in by_spec:
            by_spec[spec_id] = scan._build_partition_evaluator(spec_id)
        if by_spec[spec_id](data_file) and metrics(data_file):
            count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--queries", type=int, default=40, help="point queries per column (sampled values)")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    current = table.current_snapshot()
    if current is None:
        print("demo layout: the table is empty", file=sys.stderr)
        return 1
    before_files = ingest_files(table, config.kafka.topic)
    after_files = sum(1 for _ in table.scan().plan_files())
    replaces = sum(1 for s in table.metadata.snapshots if s.summary and s.summary.operation.value == "replace")
    rows = table.scan(selected_fields=("user_id", "city")).to_arrow()
    rng = random.Random(7)
    columns = ("user_id", "city")
    distinct = {c: sorted({v for v in rows.column(c).to_pylist() if v is not None}) for c in columns}
    samples = {c: rng.sample(distinct[c], k=min(args.queries, len(distinct[c]))) for c in columns}
    queries = {c: [EqualTo(c, v) for v in samples[c]] for c in columns}
    queries["user_id and city"] = [And(EqualTo("user_id", u), EqualTo("city", c))
                                   for u, c in zip(samples["user_id"], samples["city"])]
    figures = {}
    for label, exprs in queries.items():
        if not exprs:
            continue
        figures[label] = (statistics.mean(planned(table, before_files, e) for e in exprs),
                          statistics.mean(sum(1 for _ in table.scan(row_filter=e).plan_files()) for e in exprs))

    print(f"layout report for {config.table.identifier}: {len(before_files)} data files as ingested, "
          f"{after_files} after the compactor ({replaces} replace snapshots)")
    print(f"  {'point query':<18} {'files read before':>18} {'after':>8}")
    for label, (before, after) in figures.items():
        print(f"  {label:<18} {before:>18.1f} {after:>8.1f}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    labels = list(figures)
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], [figures[k][0] for k in labels], width=0.4, label="as ingested", color="#c44e52")
    # Without clustering columns every strategy degenerates to bin-packing.
    strategy = config.compactor.strategy if config.compactor.columns else "binpack"
    ax.bar([i + 0.2 for i in x], [figures[k][1] for k in labels], width=0.4,
           label=f"after the compactor ({strategy})", color="#4c72b0")
    ax.set_xticks(list(x), [f"{k} = ?" for k in labels])
    ax.set_ylabel("data files read per point query (mean)")
    ax.set_title(f"{config.table.identifier}: {len(before_files)} files as ingested, {after_files} after")
    ax.legend()
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"layout report: {out.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
