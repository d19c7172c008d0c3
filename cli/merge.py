"""`streamberg merge`: the merge stage of a primary-key table (docs/cdc.md)."""

from __future__ import annotations

import argparse
import json
import threading
from datetime import datetime

from streamberg.cli.configs import add_table_argument, config_of
from streamberg.cli.errors import CommandError
from streamberg.common.redact import redact

DESCRIPTION = """\
Keep a primary-key table (table.primary_key, kafka.envelope debezium or upsert) at the
source's current rows: apply the change log the ingest appends (<table>_changelog, or
merge.changelog_table) to it, every merge.interval_seconds.

Each merge reads the change-log snapshots after the one the table last applied, keeps the
last change of each key in Kafka order (partition, offset), and runs one Spark MERGE INTO
(Iceberg merge-on-read: position deletes, which Spark, DuckDB and pyiceberg read). The
change-log snapshot applied is recorded in the merge's own snapshot summary
(streamberg.changelog-applied) in the same atomic commit, so a merge killed at any moment
applies nothing twice and loses nothing: the next one starts where the table says. A
commit that loses to a concurrent one (the compactor) is retried (merge.commit_retries).

The table is created on the first start (format v2, merge-on-read, identifier fields =
table.primary_key) when absent. Columns the ingest added to the change log are added to the
table before the merge that first carries them.

Freshness: a change is in the table within about ingest.commit_interval_seconds +
merge.interval_seconds of its record. `streamberg status` shows the merge lag
(docs/runbooks/upsert-table-behind.md).

Prints one JSON summary line on stdout when it stops; structured logs go to stderr.
Examples:
  streamberg merge --config examples/cdc.yaml --once   # apply what is pending, then exit
  streamberg merge --config examples/cdc.yaml          # keep merging (Ctrl-C stops)
  streamberg merge --config examples/cdc.yaml --resynced-since 2026-11-25T10:00:00Z
  streamberg merge --config examples/cdc.yaml --new-source-epoch "restored into cluster B"
"""


def _moment(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO-8601 time: {text!r} (e.g. 2026-11-25T10:00:00Z)") from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone; add Z or an offset (e.g. +01:00)")
    return moment


def _offsets(text: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for part in text.split(","):
        partition, _, offset = part.strip().partition(":")
        if not partition.isdigit() or not offset.isdigit():
            raise argparse.ArgumentTypeError(f"not PARTITION:OFFSET[,...]: {text[:80]!r} (e.g. 0:1200,1:980)")
        out[int(partition)] = int(offset)
    return out


def _merge(args: argparse.Namespace) -> int:
    from streamberg.common.errors import MergeError
    from streamberg.common.stop import install_stop_handlers
    from streamberg.merge.app import MergeOptions, declare_source_epoch, run_merge

    config = config_of(args)
    if args.new_source_epoch is not None:
        try:
            print(redact(json.dumps(declare_source_epoch(config, args.new_source_epoch, args.since_offsets))))
        except MergeError as exc:
            raise CommandError(str(exc)) from exc
        return 0
    if args.since_offsets is not None:
        raise CommandError("--since-offsets goes with --new-source-epoch")
    stop = threading.Event()
    once = args.once or args.resynced_since is not None
    if not once:
        install_stop_handlers(stop)
    since = None if args.resynced_since is None else int(args.resynced_since.timestamp() * 1000)
    try:
        summary = run_merge(config, MergeOptions(once=once, resynced_since_ms=since,
                                                 ignore_dead_letters=args.ignore_dead_letters), stop=stop)
    except MergeError as exc:
        raise CommandError(str(exc)) from exc
    print(redact(json.dumps(summary)))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "merge", help="apply a primary-key table's change log to it (Spark MERGE INTO, merge-on-read)",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="the streamberg YAML config (catalog, table, kafka, merge)")
    add_table_argument(parser)
    parser.add_argument("--once", action="store_true", help="apply what is pending now, then exit; for cron and tests")
    parser.add_argument("--resynced-since", type=_moment, metavar="ISO-8601",
                        help="the source was resynced (every row sent again, op r) from this time: after merging, "
                             "delete the rows whose key no change since then touched (deleted in the source while "
                             "its change stream was lost); refused unless the change log holds every change since "
                             "then, or while records of the table went to the dead letters since then. Implies "
                             "--once (docs/runbooks/source-table-resynced.md)")
    parser.add_argument("--ignore-dead-letters", action="store_true",
                        help="with --resynced-since: delete even though records of the table went to the dead "
                             "letters since then (their rows are deleted too; replay them first instead)")
    parser.add_argument("--new-source-epoch", metavar="WHY",
                        help="the source started over (MySQL RESET MASTER, PostgreSQL restored into a new cluster, "
                             "a clock set back): changes from then on are newer than every change before, whatever "
                             "their positions. From the first change the merge found going backwards (those are "
                             "merged again), else from the change log's end, or --since-offsets. WHY is recorded. "
                             "Then exits (docs/runbooks/cdc-source-regressed.md)")
    parser.add_argument("--since-offsets", type=_offsets, metavar="P:O[,P:O...]",
                        help="with --new-source-epoch: the epoch's first Kafka offset in each partition named")
    parser.set_defaults(func=_merge)
