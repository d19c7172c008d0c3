"""``streamberg bench skipping``: the data-skipping benchmark and layout report."""

from __future__ import annotations

import argparse
from pathlib import Path

from .datagen import STUDY_COLUMNS

DESCRIPTION = """\
Measure how many files Iceberg's own scan planning (min/max pruning in the manifests)
skips per query, for each row layout of the compactor, on the same data in the same run.

What it does:
  1. generates a deterministic SSB-like denormalised lineorder table with DuckDB's TPC-H
     generator (SSB's s_city / c_city: 250 cities each, p_brand: 1000 brands);
  2. writes it into an Iceberg table as N files of random rows (the 'random' layout);
  3. rewrites that table with each layout of streamberg.compactor.layouts (linear sort,
     zorder-iceberg, zorder, hilbert) through Spark + Iceberg into N files again;
  4. samples point predicates per column, two-column predicates and range predicates, and
     counts the files Iceberg plans to read for each on every table;
  5. prints the table of % files skipped next to the published study's figures and the
     issue's targets, writes a JSON result file and, with --report, PNG charts.

Sizing: --scale is the SSB/TPC-H scale factor (SF1 = 6M rows). Without --files the file
count is rows/6000 between 10 and 1000: the default SF0.1 gives 100 files (a few minutes on
2 cores), --scale 1 gives the study's 1000 files at ~6k rows each, and --scale 100 the
study's full shape (600M rows, 1000 files of ~600k rows; a cluster-sized run).
"""

EPILOG = """\
examples:
  streamberg bench skipping                                   # SF0.1, 100 files, ~minutes
  streamberg bench skipping --scale 1 --report out/skipping   # 1000 files, with PNG charts
  streamberg bench skipping --scale 100 --spark-master spark://host:7077 --driver-memory 16g
  streamberg bench skipping --layouts sort zorder --columns s_city c_city --points 50
"""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _skipping(args: argparse.Namespace) -> int:
    from streamberg.cli.errors import CommandError
    from streamberg.common.log import get_logger

    from .datagen import GeneratorUnavailable
    from .pipeline import BenchOptions, run, unknown_layouts
    from .predicates import SamplerSpec
    from .report import write_report
    from .results import format_tables
    from .spark_layouts import LayoutOptions

    if args.show:
        import json

        from .results import BenchResult

        try:
            data = json.loads(Path(args.show).read_text())
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot read {args.show}: {exc}") from exc
        print(format_tables(BenchResult.from_json(data)))
        return 0
    if bad := unknown_layouts(args.layouts):
        raise CommandError(f"unknown layout(s): {', '.join(bad)}")
    workdir = Path(args.workdir)
    options = BenchOptions(
        scale=args.scale, files=args.files, columns=tuple(args.columns), layouts=tuple(args.layouts), seed=args.seed,
        sampler=SamplerSpec(points_per_column=args.points, pairs_per_column_pair=args.pairs,
                            ranges_per_column=args.ranges, seed=args.seed),
        layout=LayoutOptions(bits=args.bits, sample_rows=args.sample_rows),
        workdir=workdir, spark_master=args.spark_master, driver_memory=args.driver_memory, progress=not args.quiet,
    )
    log = get_logger("bench.skipping")
    try:
        done = run(options)
    except (GeneratorUnavailable, ValueError) as exc:
        raise CommandError(str(exc)) from exc
    print(format_tables(done.result), flush=True)
    json_path = Path(args.json) if args.json else workdir / "results.json"
    done.result.write_json(json_path)
    print(f"\nresults: {json_path}")
    log.info("results written", path=str(json_path))
    if args.report:
        written = write_report(done.result, done.bounds, done.distinct, Path(args.report))
        print("report: " + ", ".join(str(p) for p in written))
    return 0


def register(kinds: argparse._SubParsersAction) -> None:
    """`streamberg bench skipping` (registered by bench/commands.py)."""
    from .spark_layouts import EXTRA_LAYOUTS, LAYOUTS

    parser = kinds.add_parser(
        "skipping", help="files skipped by Iceberg scan planning: random vs linear vs Z-order vs Hilbert",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    size = parser.add_argument_group("size")
    size.add_argument("--scale", type=_positive_float, default=0.1,
                      help="SSB/TPC-H scale factor: rows = 6,001,215 x scale (default 0.1)")
    size.add_argument("--files", type=_positive_int, default=None,
                      help="files per layout (default: rows/6000, between 10 and 1000)")
    what = parser.add_argument_group("what to measure")
    what.add_argument("--columns", nargs="+", default=list(STUDY_COLUMNS), metavar="COL",
                      help=f"columns to cluster on and filter by (default: {' '.join(STUDY_COLUMNS)})")
    what.add_argument("--layouts", nargs="*", default=list(LAYOUTS), metavar="LAYOUT",
                      help=f"layouts besides the random baseline (default: {' '.join(LAYOUTS)}; "
                           f"also: {' '.join(EXTRA_LAYOUTS)}; none: only the random baseline, no Spark)")
    what.add_argument("--points", type=_positive_int, default=20, help="point predicates per column (default 20)")
    what.add_argument("--pairs", type=int, default=5, help="two-column predicates per column pair (default 5)")
    what.add_argument("--ranges", type=int, default=5, help="range predicates per column (default 5)")
    what.add_argument("--seed", type=int, default=42, help="seed of the random layout and the predicate sample")
    what.add_argument("--bits", type=_positive_int, default=10,
                      help="rank bits per column for zorder/hilbert (the compactor's default: 10)")
    what.add_argument("--sample-rows", type=_positive_int, default=20000,
                      help="rows sampled for zorder/hilbert boundaries (the compactor's default: 20000)")
    out = parser.add_argument_group("where")
    out.add_argument("--workdir", default=".streamberg/bench-skipping",
                     help="catalog, warehouse and DuckDB scratch space (default .streamberg/bench-skipping)")
    out.add_argument("--json", default=None, help="result file (default WORKDIR/results.json)")
    out.add_argument("--report", default=None, metavar="DIR", help="write the PNG layout report into DIR")
    out.add_argument("--spark-master", default="local[2]", help="Spark master (default local[2])")
    out.add_argument("--driver-memory", default="4g", help="Spark driver memory (default 4g)")
    out.add_argument("--quiet", action="store_true", help="no progress bars")
    out.add_argument("--show", default=None, metavar="JSON",
                     help="only re-print the tables of an earlier run from its result file (no new run)")
    parser.set_defaults(func=_skipping)
