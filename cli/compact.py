"""`streamberg compact`: the asynchronous compactor's command line."""

from __future__ import annotations

import argparse
import json
import threading

from streamberg.cli.configs import add_table_argument, config_of
from streamberg.cli.errors import CommandError
from streamberg.common.config import LAYOUT_STRATEGIES
from streamberg.common.redact import redact

DESCRIPTION = """\
Keep an ingest table fast to query: rewrite the small files that streaming ingest makes
into large, clustered files, without touching the ingest path and without redoing work.

A Spark Structured Streaming query watches the table's snapshots (Spark's checkpoint in
compactor.checkpoint_dir records how far it got). For each new batch of ingest (append)
snapshots it plans over the files those appends added that are still unoptimized, groups
them per partition, and rewrites a partition when a rule fires (compactor.min_files,
min_bytes, max_delay_seconds, every_n_snapshots: any one suffices). Each rewrite is one
atomic replace validated against the snapshot the plan started from, so concurrent ingest
appends are never lost; its record (strategy, columns, files/bytes in and out, covered
ingest snapshots) is in the snapshot summary (streamberg.compactor.*) and in the log.
Files the compactor wrote are never rewritten by the incremental pass; --full re-clusters
everything once.

Only one compactor per table runs at a time (a lease in the catalog database): a second
one exits with status 1, or waits up to compactor.lease_wait_seconds.

Layouts (--strategy, default compactor.strategy):
  zorder          boundary/rank-based Z-order on compactor.columns (every column counts evenly)
  hilbert         the same ranks on a Hilbert curve (less overlap between files)
  zorder-iceberg  Iceberg's built-in zorder(...) z-value
  sort            linear sort by the columns
  binpack         no reordering, just fewer, bigger files (also used when no columns are set)

Prints one JSON summary line on stdout when it stops; structured logs go to stderr.
Examples:
  streamberg compact --config examples/demo.yaml --once        # what is pending, then exit
  streamberg compact --config examples/demo.yaml               # keep watching (Ctrl-C stops)
  streamberg compact --config examples/demo.yaml --full --strategy hilbert
  streamberg compact --config examples/demo.yaml --dry-run     # show the plan, change nothing
"""


def _columns(text: str) -> list[str]:
    columns = [c.strip() for c in text.split(",") if c.strip()]
    if not columns:
        raise argparse.ArgumentTypeError("give at least one column, e.g. --columns user_id,city")
    return columns


def _compact(args: argparse.Namespace) -> int:
    from streamberg.common.errors import CompactError
    from streamberg.common.stop import install_stop_handlers
    from streamberg.compactor.app import CompactOptions, run_compact

    if args.full and args.once:
        raise CommandError("--full is already a single pass; drop --once")
    config = config_of(args)
    options = CompactOptions(once=args.once, full=args.full, dry_run=args.dry_run, strategy=args.strategy,
                             columns=args.columns)
    stop = threading.Event()
    if not (args.once or args.full or args.dry_run):
        install_stop_handlers(stop)
    try:
        summary = run_compact(config, options, stop=stop)
    except CompactError as exc:
        raise CommandError(str(exc)) from exc
    print(redact(json.dumps(summary)))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compact", help="incremental Z-order/Hilbert compaction of the ingest table (Spark Structured Streaming)",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="the streamberg YAML config (sections catalog, table, compactor)")
    add_table_argument(parser)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true",
                      help="process what is pending now (Trigger.AvailableNow), then exit; for cron and tests")
    mode.add_argument("--dry-run", action="store_true",
                      help="print the plan (groups, deferred partitions, rules that fired) and exit; no Spark, no changes")
    parser.add_argument("--full", action="store_true",
                        help="one pass over every live file, optimized or not (an explicit re-cluster), then exit")
    parser.add_argument("--strategy", choices=LAYOUT_STRATEGIES, help="layout for this run (default: compactor.strategy)")
    parser.add_argument("--columns", type=_columns, metavar="A,B",
                        help="clustering columns for this run (default: compactor.columns)")
    parser.set_defaults(func=_compact)
