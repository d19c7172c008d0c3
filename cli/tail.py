"""`streamberg tail`: keep every table's Kafka tail decoded, for fresh reads (fresh/cache.py)."""

from __future__ import annotations

import argparse
import threading

from streamberg.cli.errors import CommandError, UsageError

DESCRIPTION = """\
Keeps the Kafka tail of every table of a config (or of --table) decoded on local disk
(<ingest.state_dir>/tail-cache/<table>/), so a fresh read (`streamberg query --fresh`,
streamberg.fresh.read) costs what arrived in the last fraction of a second, not the whole
commit interval. A primary-key table's tail is kept as its change log's change rows (a fresh
read merges them by key). Segments a commit covers are deleted; a schema change decodes the
tail again.
A fresh read uses the kept tail only while this command is alive (a heartbeat), chains its
segments from the snapshot's own offsets and reads the rest from Kafka: exact with the
keeper ahead, behind, stopped or absent. Runs until Ctrl-C or SIGTERM. docs/fresh-read.md."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tail", help="keep the tables' Kafka tails decoded, for fast fresh reads",
                                   description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the config file (one table or many)")
    parser.add_argument("--table", action="append", default=None, metavar="NAMESPACE.TABLE",
                        help="only this table (repeatable; default: every table of the config)")
    parser.set_defaults(func=_tail)


def _tail(args: argparse.Namespace) -> int:
    from streamberg.common.log import get_logger
    from streamberg.common.stop import install_stop_handlers
    from streamberg.common.tables import config_tables
    from streamberg.fresh.cache import TailKeeper
    from streamberg.table_meta.changelog import ingest_config

    tables = config_tables(args.config)
    wanted = {t.lower() for t in args.table} if args.table else None
    # A primary-key table's tail is its change log's (change rows): the keeper follows that.
    configs = [ingest_config(c) for name, c in sorted(tables.configs.items())
               if wanted is None or name.lower() in wanted]
    if wanted is not None and len(configs) < len(wanted):
        raise UsageError(f"--table: not a table of {args.config} ({', '.join(sorted(tables.configs))})")
    # A field-routed topic's tables share one topic: a fresh read picks its value's records
    # from Kafka (fresh/tail.routed_here); a kept tail of the whole topic would not serve it.
    routed = sorted(c.table.identifier for c in configs if c.route_field is not None)
    configs = [c for c in configs if c.route_field is None]
    if routed:
        get_logger("fresh.cache").info("tails not kept: tables of a field-routed topic (fresh reads read their "
                                       "tail from Kafka)", tables=routed[:20], count=len(routed))
    # Under ingest.keep_tail the ingest's own writers keep the tail (ingest/tail_spool.py).
    by_ingest = sorted(c.table.identifier for c in configs if c.ingest.keep_tail)
    configs = [c for c in configs if not c.ingest.keep_tail]
    if by_ingest:
        get_logger("fresh.cache").info("tails kept by the ingest itself (ingest.keep_tail)", tables=by_ingest[:20],
                                       count=len(by_ingest))
    if not configs:
        raise CommandError("the config names no table whose tail this command keeps" if routed or by_ingest
                           else "the config names no table")
    stop = threading.Event()
    install_stop_handlers(stop)
    threads = [threading.Thread(target=TailKeeper(c, stop).run, name=c.table.identifier, daemon=True) for c in configs]
    get_logger("fresh.cache").info("keeping the tails", tables=[c.table.identifier for c in configs])
    for thread in threads:
        thread.start()
    while not stop.wait(1.0):
        pass
    for thread in threads:
        thread.join(30)
    return 0
