"""`streamberg run`: the whole loop (ingest + compactor + maintenance) under one supervisor."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from streamberg.cli.errors import CommandError
from streamberg.common.config import FleetConfig, StreambergConfig, load_tables
from streamberg.common.config.components import COMPONENTS
from streamberg.common.errors import ConfigError, IngestFenced
from streamberg.common.exit_codes import ExitCode
from streamberg.common.tables import run_settings

DESCRIPTION = f"""\
Runs the whole loop on this machine: the ingest (`streamberg ingest`), the continuous
compactor (`streamberg compact`), scheduled maintenance (`streamberg maintain`) and, for a
primary-key table, the merge stage (`streamberg merge`), each its own process under one
small supervisor (run.components: {','.join(COMPONENTS)} by default). A config of many
tables (tables:) runs its one ingest job and `streamberg govern`, one service keeping every
table (docs/governor.md); `govern` may replace compact,maintain,merge for one table too. This
is the embedded local default; on clusters the same components run under Flink and Spark as
deploy/ describes.

- Ctrl-C / SIGTERM stops them all gracefully (the ingest drains and commits, the compactor
  finishes its pass, maintenance its step); each gets run.stop_timeout_seconds, then
  SIGKILL. A second Ctrl-C kills at once (safe: commits are atomic).
- A component that exits is restarted with exponential backoff (run.restart_backoff_seconds
  up to run.restart_backoff_max_seconds); restarts are logged and counted.
- A fenced ingest (another ingest writes this table; it exits {ExitCode.FENCED.value}) and an invalid
  configuration (exit {ExitCode.USAGE.value}) are not restarted: the supervisor stops the others
  and exits with that code.
- The compactor and maintenance wait for the ingest to create the table
  (compactor/maintenance.wait_for_table_seconds).
- Every line a component prints carries its name. On a terminal a live status line shows
  committed records and rate, lag, pending files, last optimize and the health verdict,
  refreshed every run.status_interval_seconds; otherwise the same facts are logged.

Prints one JSON summary line on stdout when it stops. Exit status: {ExitCode.OK.value} after a requested
stop, {ExitCode.FENCED.value} when the ingest was fenced, {ExitCode.USAGE.value} for an invalid configuration,
{ExitCode.FAILED.value} when the loop could not start.

Examples:
  streamberg run --config examples/demo.yaml
  streamberg run --config examples/demo.yaml --duration 90
  streamberg run --config examples/demo.yaml --components ingest,compact
  streamberg run --config examples/fleet.yaml                 # ingest + govern
"""


def status_collector(config: StreambergConfig) -> Callable[[], dict[str, Any]]:
    """Monitoring's own collection, called in process every run.status_interval_seconds.

    In process rather than `streamberg status --json` in a subprocess: the supervisor is a
    composition root (like the CLI) and may use monitoring, and keeping one manifest cache
    across refreshes means each refresh reads only the new manifests (one catalog read and
    one broker read), instead of a fresh interpreter re-reading every manifest.
    """
    from streamberg.monitoring.collect import collect_status
    from streamberg.monitoring.health import with_health
    from streamberg.table_meta.table_files import ManifestCache

    cache = ManifestCache()

    def collect() -> dict[str, Any]:
        status = with_health(collect_status(config, cache=cache), config)
        ingest, compactor = status.ingest, status.compactor
        last_optimize = compactor.last_optimize if compactor is not None else None
        return {
            "records": status.files.records if status.files is not None else None,
            "data_files": status.files.data_files if status.files is not None else None,
            "consumed_total": ingest.last_commit.consumed_total if ingest.last_commit is not None else None,
            "lag": ingest.lag.total if ingest.lag is not None else None,
            "pending_files": compactor.pending_files if compactor is not None else None,
            "last_optimize_age_seconds": None if last_optimize is None else round(last_optimize.age_seconds, 1),
            "dead_letters": status.dead_letters.records if status.dead_letters is not None else None,
            "health": status.health.verdict,
            "health_reasons": status.health.reasons,
        }

    return collect


def _components(text: str) -> list[str]:
    from streamberg.supervisor.supervisor import COMMANDS

    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [n for n in names if n not in COMMANDS]
    if not names or unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"give distinct names among {', '.join(COMMANDS)} (got {text!r})")
    if "govern" in names and (both := [n for n in names if n in ("compact", "maintain", "merge")]):
        raise argparse.ArgumentTypeError(f"govern keeps the tables itself: run it instead of {', '.join(both)}")
    return names


def fleet_status_collector(fleet: FleetConfig) -> Callable[[], dict[str, Any]]:
    """The status line of a config of many tables: its tables together (monitoring/fleet.py)."""
    from streamberg.monitoring.fleet import collect_fleet
    from streamberg.monitoring.refresh import StatusModel

    model = StatusModel()

    def collect() -> dict[str, Any]:
        status = collect_fleet(fleet, model)
        statuses = [s for _, s in status.tables]
        reasons = [f"{name}: {reason}" for name, reason in status.paused.items()] + \
            [f"{s.table}: {s.health.reasons[0]}" for s in statuses if s.health.reasons]
        return {
            "tables": len(statuses),
            "records": sum(s.files.records for s in statuses if s.files is not None),
            "consumed_total": sum(s.ingest.last_commit.consumed_total for s in statuses
                                  if s.ingest.last_commit is not None),
            "lag": sum(s.ingest.lag.total for s in statuses if s.ingest.lag is not None),
            "pending_files": sum(s.compactor.pending_files for s in statuses if s.compactor is not None),
            "last_optimize_age_seconds": None,
            "dead_letters": sum(s.dead_letters.records for s in statuses if s.dead_letters is not None),
            "health": status.verdict,
            "health_reasons": reasons[:5],
        }

    return collect


def _run(args: argparse.Namespace) -> int:
    from streamberg.supervisor.supervisor import Supervisor

    fleet = load_tables(args.config)  # an invalid file fails here (exit 2), before any child starts
    if args.duration is not None and args.duration <= 0:
        raise CommandError("--duration must be positive")
    config = run_settings(fleet)
    if fleet.many:
        # Many tables: the one ingest job writes them all and one governor keeps them all.
        components = args.components or ["ingest", "govern"]
        if set(components) - {"ingest", "govern"}:
            raise CommandError("a config of many tables runs its ingest and `govern` (one service keeping every table) "
                               "under `streamberg run`; one table alone: `streamberg compact|merge|maintain --config F "
                               "--table X`")
        line, page = fleet_status_collector(fleet), _fleet_collector(fleet)
    else:
        components, line, page = args.components, status_collector(config), _table_collector(config)
    supervisor = Supervisor(config, str(fleet.config_path or args.config), duration=args.duration,
                            components=components, status=not args.no_status, status_collector=line)
    return _supervise(supervisor, args, config, page)


def _fleet_collector(fleet: FleetConfig) -> Callable[[], Any]:
    from streamberg.monitoring.fleet import collect_fleet
    from streamberg.monitoring.refresh import StatusModel

    model = StatusModel()
    return lambda: collect_fleet(fleet, model)


def _table_collector(config: StreambergConfig) -> Callable[[], Any]:
    from streamberg.monitoring.metrics import table_status
    from streamberg.table_meta.table_files import ManifestCache

    cache = ManifestCache()
    return lambda: table_status(config, cache)


def _supervise(supervisor: Any, args: argparse.Namespace, base: StreambergConfig, collect: Callable[[], Any]) -> int:
    """Run the supervisor with the dashboard of its tables served beside it (cli/dashboard.py)."""
    import threading

    from streamberg.cli import dashboard

    stop = threading.Event()
    server = dashboard.start(args, base, collect, stop)
    try:
        code = supervisor.run()
    finally:
        stop.set()
        if server is not None:
            server.shutdown()
    return _finish(supervisor, code)


def _finish(supervisor: Any, code: int) -> int:
    print(json.dumps(supervisor.summary()), flush=True)
    if code == ExitCode.FENCED:
        raise IngestFenced("the ingest was fenced: another ingest instance is writing this table "
                           "(see its message above); stopped without restarting")
    if code == ExitCode.USAGE:
        # ConfigError: the CLI's exit 2, as the component's own.
        raise ConfigError(f"run stopped: {supervisor.stop_reason} (see the component's message above)")
    return code


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run", help="the whole loop on one machine: ingest + continuous compactor + scheduled maintenance",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="the streamberg YAML config")
    parser.add_argument("--duration", type=float, default=None,
                        help="stop gracefully after this many seconds (default: until Ctrl-C/SIGTERM)")
    parser.add_argument("--components", type=_components, default=None, metavar="A,B",
                        help=f"which components to run (default: run.components: {','.join(COMPONENTS)})")
    parser.add_argument("--no-status", action="store_true", help="no status line / periodic status log")
    from streamberg.cli import dashboard

    dashboard.add_arguments(parser)
    parser.set_defaults(func=_run)
