"""`streamberg status` and `streamberg metrics`."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from streamberg.cli.configs import add_table_argument, config_of
from streamberg.cli.errors import CommandError
from streamberg.common.config import FleetConfig, StreambergConfig, load_tables
from streamberg.common.log import get_logger
from streamberg.common.redact import redact
from streamberg.monitoring.collect import collect_status
from streamberg.monitoring.health import with_health
from streamberg.monitoring.model import Status
from streamberg.monitoring.render import render_screen
from streamberg.table_meta.table_files import ManifestCache

DEFAULT_WATCH_SECONDS = 5.0
DEFAULT_REFRESH_SECONDS = 15.0  # the exporter's collection of every table (a typical scrape interval)
# Exit codes of `status`: alerting and cron act on 1.
EXIT = {"ok": 0, "warn": 0, "critical": 1}


def _status_once(config: StreambergConfig, cache: ManifestCache) -> Status:
    return with_health(collect_status(config, cache=cache), config)


def _print(status: Status, as_json: bool, watching: bool) -> None:
    if as_json:
        # One object per refresh; while watching, one per line (JSON lines) so a reader can stream them.
        print(redact(json.dumps(status.to_dict(), indent=None if watching else 2)), flush=True)
        return
    if watching and sys.stdout.isatty():
        print("\033[2J\033[H", end="")  # clear the terminal, cursor home
    print(redact(render_screen(status)), flush=True)
    if watching:
        print("" if sys.stdout.isatty() else "-" * 72, flush=True)


def _fleet_status(args: argparse.Namespace, fleet: FleetConfig) -> int:
    """A config of many tables: one line a table, worst first (monitoring/fleet.py)."""
    from streamberg.monitoring.fleet import collect_fleet, render_fleet
    from streamberg.monitoring.refresh import StatusModel

    model = StatusModel()
    while True:
        status = collect_fleet(fleet, model)
        if args.json:
            print(redact(json.dumps(status.to_dict(), indent=None if args.watch else 2)), flush=True)
        else:
            print(redact(render_fleet(status)), flush=True)
        if args.watch is None:
            return EXIT[status.verdict]
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return EXIT[status.verdict]


def _status(args: argparse.Namespace) -> int:
    if args.watch is not None and args.watch <= 0:
        raise CommandError("--watch needs a positive number of seconds")
    fleet = load_tables(args.config)
    if fleet.many and not args.table:
        return _fleet_status(args, fleet)
    config = config_of(args, fleet)
    cache = ManifestCache()
    status = _status_once(config, cache)
    _print(status, args.json, args.watch is not None)
    if args.watch is None:
        return EXIT[status.health.verdict]
    try:
        while True:
            time.sleep(args.watch)
            status = _status_once(config, cache)
            _print(status, args.json, True)
    except KeyboardInterrupt:
        # Ctrl-C ends the watch; the exit code is the last verdict's, as for a single check.
        return EXIT[status.health.verdict]


def _metrics(args: argparse.Namespace) -> int:
    from streamberg.common.tables import run_settings
    from streamberg.monitoring.dashboard.app import make_exporter_app, serve_app
    from streamberg.monitoring.fleet import collect_fleet
    from streamberg.monitoring.metrics import fleet_families, table_families, table_status
    from streamberg.monitoring.refresh import StatusModel
    from streamberg.monitoring.watch import Watch

    if args.refresh <= 0:
        raise CommandError("--refresh needs a positive number of seconds")
    cache = ManifestCache()
    fleet = load_tables(args.config)
    if fleet.many and not args.table:  # every table of the config, one `table` label each
        config = run_settings(fleet)
        scope = f"{len(fleet.tables)} routes of {args.config}"
        model = StatusModel(cache=cache)
        watch = Watch(lambda: collect_fleet(fleet, model), fleet_families, args.refresh, scope)
    else:
        config = config_of(args, fleet)
        scope = config.table.identifier
        watch = Watch(lambda: table_status(config, cache), table_families, args.refresh, scope)
    if args.once:
        facts = watch.refresh()
        print(redact(facts.text.decode()), end="")
        statuses = [s for _, s in facts.fleet.tables]
        # Exit 1 when nothing it reads answered (catalog and broker down): a cron or a check
        # must not take a scrape of absences for a healthy one.
        down = bool(statuses) and all(not s.catalog.reachable and not s.ingest.broker.reachable for s in statuses)
        return 1 if down else 0
    port = args.port or config.monitoring.metrics_port
    address = args.address or config.monitoring.metrics_address
    stop = threading.Event()
    refresher = watch.start(stop)  # the first collection starts now; scrapes wait for it (503 until then)
    try:
        server, thread = serve_app(make_exporter_app(watch), address, port, "metrics")
    except OSError as exc:
        stop.set()
        raise CommandError(f"cannot listen on {address}:{port}: {exc.strerror or exc}") from exc
    log = get_logger("monitoring.metrics", table=scope)
    log.info("serving metrics", url=f"http://{address}:{port}/metrics", refresh_seconds=args.refresh)
    try:
        while thread.is_alive():
            thread.join(1.0)
    except KeyboardInterrupt:
        log.info("stopping")
    finally:
        stop.set()
        server.shutdown()
        refresher.join(5)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    status = subparsers.add_parser(
        "status", help="one screen of truth about the table: ingest lag, last commit, backlog, health verdict",
        description="Reads the catalog, the table's metadata and the broker (never writes) and prints the last "
                    "ingest commit, ingest lag per Kafka partition (offsets recorded in the table vs the broker's "
                    "high watermark), data files and small files, files waiting for the compactor and the age of "
                    "the oldest, the last optimize, snapshot count and metadata size, dead letters, the last "
                    "maintenance run, and a health verdict (ok, warn, critical) with its reasons. Thresholds are "
                    "the config's monitoring.* keys (docs/monitoring.md). Exit status: 0 ok or warn, 1 critical "
                    "(also when the catalog, the table or the broker cannot be reached), 2 invalid configuration.",
    )
    status.add_argument("--config", required=True, help="the streamberg YAML config")
    status.add_argument("--table", default=None, metavar="NAMESPACE.TABLE",
                        help="with a config of many tables: this table's screen (without it: one line a table, "
                             "worst first); a pattern route's table is found through the broker's topics")
    status.add_argument("--json", action="store_true",
                        help="one JSON object (with --watch: one per line, per refresh) for scripts and alerting")
    status.add_argument("--watch", nargs="?", type=float, const=DEFAULT_WATCH_SECONDS, default=None, metavar="SECONDS",
                        help=f"refresh every SECONDS (default {DEFAULT_WATCH_SECONDS:g}) until Ctrl-C")
    status.set_defaults(func=_status)

    metrics = subparsers.add_parser(
        "metrics", help="Prometheus exporter: ingest, lag, compactor backlog and table metrics",
        description="Serves /metrics in the Prometheus text format: the same facts as `streamberg status` (table "
                    "snapshot summaries, the broker's end offsets), collected for every table in the background "
                    "every --refresh seconds, so a scrape answers at once and never calls the catalog; "
                    "/healthz says whether that collection loop lives, /readyz whether its last collection "
                    "reached the catalog and the broker. The facts are the tables' own, so the exporter can "
                    "restart at any time. --once collects once and prints the scrape to stdout "
                    "(for tests and node_exporter's textfile collector). With a config of many tables and no --table: every "
                    "table's series in one scrape, each with its `table` label, and which tables the ingest paused. "
                    "Metrics and sources: docs/monitoring.md.",
    )
    metrics.add_argument("--config", required=True, help="the streamberg YAML config")
    add_table_argument(metrics)
    metrics.add_argument("--port", type=int, default=None, help="port to listen on (default monitoring.metrics_port, 9464)")
    metrics.add_argument("--address", default=None,
                         help="address to bind (default monitoring.metrics_address, 127.0.0.1; 0.0.0.0 for every interface)")
    metrics.add_argument("--once", action="store_true", help="collect once, print the scrape to stdout and exit.")
    metrics.add_argument("--refresh", type=float, default=DEFAULT_REFRESH_SECONDS, metavar="SECONDS",
                         help=f"collect every table's facts this often (default {DEFAULT_REFRESH_SECONDS:g}); a "
                              f"scrape serves the last collection")
    metrics.set_defaults(func=_metrics)
