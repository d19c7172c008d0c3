"""``streamberg bench incremental``: does the incremental layout converge, and at what cost."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

DESCRIPTION = """\
Stream ingest commits into a table while the compactor runs a pass every few commits, and
after every pass measure the files a point query on each clustering column reads, next to a
full optimize of the same data, and the write amplification (bytes the compactor wrote /
bytes ingested). Two scenarios, each with both layouts:

  day   a day-partitioned table whose commits arrive in time order over several days:
        finished days are sealed; goal: finished days within 1.05x of a full optimize,
        the whole table within 1.2x, write amplification at most 3x;
  flat  an unpartitioned table where every commit spans the key space: goal within 1.5x,
        write amplification at most 4x.

Then the policy's main knob (compactor.merge_factor) over several values on the flat
scenario: query cost against write amplification. Prints a table, writes a JSON file and
PNG charts. Three clustering columns with 250, 250 and 1000 values, 256 KiB files.
"""

EPILOG = """\
examples:
  streamberg bench incremental                          # both scenarios, both layouts, the knob
  streamberg bench incremental --commits 20 --rows 20000 --knob   # a quick look (no knob sweep)
"""


def _run(args: argparse.Namespace) -> int:
    from streamberg.cli.errors import CommandError
    from streamberg.common.spark import base_spark_conf, quiet_spark_logs, spark_jars, spark_session

    from .report import write_report
    from .scenario import RunSpec, run, write_json

    if args.commits < args.commits_per_pass or args.rows < 1:
        raise CommandError("--commits must be at least --commits-per-pass, --rows at least 1")
    os.environ.setdefault("STREAMBERG_LOG_LEVEL", "warning")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="streamberg-bench-incremental-"))
    conf = base_spark_conf(spark_jars(), args.spark_master, "streamberg-bench-incremental")
    conf.update({"spark.sql.shuffle.partitions": "4", "spark.driver.memory": args.driver_memory,
                 "spark.ui.enabled": "false"})
    spark = spark_session(conf)
    quiet_spark_logs(spark, "ERROR")
    common = {"commits": args.commits, "rows_per_commit": args.rows, "commits_per_pass": args.commits_per_pass}
    runs, knob = [], []
    try:
        for scenario in args.scenarios:
            for strategy in args.layouts:
                spec = RunSpec(scenario=scenario, strategy=strategy, **common)
                print(f"{scenario} / {strategy}: {args.commits} commits of {args.rows:,} rows, a pass every "
                      f"{args.commits_per_pass}", flush=True)
                runs.append(run(spec, spark, workdir / f"{scenario}-{strategy}", lambda m: print(m, flush=True)))
        for factor in args.knob or []:
            spec = RunSpec(scenario="flat", strategy=args.layouts[0], compactor={"merge_factor": factor}, **common)
            print(f"knob: flat / {spec.strategy}, merge_factor {factor}", flush=True)
            knob.append(run(spec, spark, workdir / f"knob-{factor}", lambda m: print(m, flush=True)))
    finally:
        spark.stop()
    print(format_table(runs, knob))
    out = Path(args.report)
    write_json(runs + knob, out / "incremental.json")
    # The knob curve: the default run of the flat scenario with the first layout, and the others.
    curve = sorted([r for r in runs if r.spec["scenario"] == "flat" and r.spec["strategy"] == args.layouts[0]] + knob,
                   key=lambda r: r.final["policy"]["merge_factor"])
    written = write_report(runs, curve if knob else [], out)
    print(f"\nresults: {out / 'incremental.json'}; charts: " + ", ".join(str(p) for p in written))
    return 0


def format_table(runs: list, knob: list) -> str:
    lines = ["", f"{'run':<34}{'passes':>7}{'c1':>7}{'c2':>7}{'c3':>7}{'finished c1/c2/c3':>22}{'WA':>6}",
             "(files read per point query: incremental / full optimize of the same data)"]
    for r in runs + knob:
        f = r.final
        name = f"{r.spec['scenario']}/{r.spec['strategy']} merge_factor {r.final['policy']['merge_factor']}"
        ratios = f["ratio_whole_table"]
        finished = f.get("ratio_finished_partitions")
        fin = "/".join(f"{finished[c]:.2f}" for c in ("c1", "c2", "c3")) if finished else "-"
        lines.append(f"{name:<34}{f['passes']:>7}{ratios['c1']:>7.2f}{ratios['c2']:>7.2f}{ratios['c3']:>7.2f}"
                     f"{fin:>22}{f['write_amplification']:>6.2f}")
    return "\n".join(lines)


def register(kinds: argparse._SubParsersAction) -> None:
    parser = kinds.add_parser("incremental", help="incremental clustering: files read and write amplification "
                              "over passes, against a full optimize", description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=60, help="ingest commits per run (default 60)")
    parser.add_argument("--rows", type=int, default=50_000, help="rows per commit (default 50,000)")
    parser.add_argument("--commits-per-pass", type=int, default=2, help="a compactor pass every N commits (default 2)")
    parser.add_argument("--scenarios", nargs="+", choices=("day", "flat"), default=["day", "flat"])
    parser.add_argument("--layouts", nargs="+", choices=("zorder", "hilbert"), default=["zorder", "hilbert"])
    parser.add_argument("--knob", type=int, nargs="*", default=[3, 4, 6],
                        help="merge_factor values for the knob curve on the flat scenario, besides the "
                             "default run (default: 3 4 6; none: skip)")
    parser.add_argument("--report", default=".streamberg/bench-incremental", help="folder for the JSON and PNGs")
    parser.add_argument("--workdir", default=None, help="tables and catalog (default: a temporary folder)")
    parser.add_argument("--spark-master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g")
    parser.set_defaults(func=_run)
