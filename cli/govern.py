"""`streamberg govern --config F`: one Spark application keeps every table of a config.

Which tables: the config's (one, or every table of a config of many that the broker's topics
route to, with the tables a route field's values made), and in the namespaces of
`govern.namespaces` (or `--namespace N`) every table whose properties carry `streamberg.*`
policy keys, whoever wrote it (governor/tables.py). Each round the governor (governor/app.py)
probes every table without Spark through the components' own rules (each component's
executor: the compactor's planner, the change log's unapplied changes, the time since
maintenance; table_meta/keeping.py), the scheduler (table_meta/schedule.py) picks by need,
`govern.max_concurrent` actions at once (each on another table), no due action waiting past
`govern.max_wait_seconds`, and the chosen actions run on one Spark session with the
components' own code. Policy is read from the table's properties at every round
(table_meta/policy.py; docs/governor.md), so a change takes effect at the next round.

`--dry-run` prints the plan (which table, which action, why) and changes nothing; `--once`
runs one round; `--health` says whether the running service is alive (its heartbeat). State
of every round: <ingest.state_dir>/govern.json.
"""

from __future__ import annotations

import argparse
import json
import threading
from typing import Any

from streamberg.common.config import StreambergConfig
from streamberg.common.redact import redact


def executors(config: StreambergConfig, cache: Any = None) -> list[Any]:
    """A table's executors, one per component (the composition hands them to the governor);
    `cache`: the ManifestCache every table's planning shares."""
    from streamberg.compactor.executor import CompactExecutor
    from streamberg.maintenance.columns import DropColumnsExecutor
    from streamberg.maintenance.executor import MaintainExecutor
    from streamberg.merge.executor import MergeExecutor

    return [CompactExecutor(config.govern.replan_seconds, cache), MergeExecutor(), MaintainExecutor(),
            DropColumnsExecutor()]


def _settings(args: argparse.Namespace, base: StreambergConfig) -> StreambergConfig:
    """The config's `govern` section with the command line's flags over it, checked as the
    config's own keys are (a bad flag names itself)."""
    from pydantic import ValidationError

    from streamberg.common.config import GovernConfig
    from streamberg.common.config.messages import config_error

    flags = {"max_concurrent": args.max_concurrent, "max_wait_seconds": args.max_wait_seconds,
             "interval_seconds": args.interval_seconds, "action_timeout_seconds": args.action_timeout_seconds}
    updates: dict[str, Any] = {k: v for k, v in flags.items() if v is not None}
    if args.namespace:
        updates["namespaces"] = list(dict.fromkeys([*base.govern.namespaces, *args.namespace]))
    try:
        govern = GovernConfig(**{**base.govern.model_dump(), **updates})
    except ValidationError as exc:
        raise config_error("the command line (--max-concurrent, --max-wait-seconds, --interval-seconds, "
                           "--action-timeout-seconds, --namespace)", exc) from None
    return base.model_copy(update={"govern": govern})


def _health(base: StreambergConfig) -> int:
    """`govern --health`: exit 0 when the governor of this config writes its heartbeat."""
    from streamberg.governor.app import health

    alive, line = health(base.ingest.state_dir)
    print(line)
    return 0 if alive else 1


def _govern(args: argparse.Namespace) -> int:
    from streamberg.common.config import load_tables
    from streamberg.common.spark import JobGroups, process_session
    from streamberg.common.stop import install_stop_handlers
    from streamberg.common.tables import run_settings
    from streamberg.governor.service import build_service
    from streamberg.governor.tables import GovernedTables

    raw = run_settings(load_tables(args.config))
    if args.health:
        return _health(raw)
    base = _settings(args, raw)
    settings = base.govern
    if not (args.dry_run or args.once):
        from streamberg.cli import dashboard

        dashboard.check(args)
    tables = GovernedTables(args.config, list(settings.namespaces), settings.replan_seconds)
    if not tables.current():
        print("streamberg govern: no table yet (no topic of the config's routes on the broker)")
        return 0
    session = None
    if not args.dry_run:
        # The process's session (its runtime's: stopped when the command ends).
        session = process_session(base.catalog, base.compactor.spark_master, base.compactor.spark_conf,
                                  app_name="streamberg-governor")
    from streamberg.table_meta.table_files import ManifestCache

    cache = ManifestCache()  # one for the service's life: every table's replanning reads it
    service = build_service(args.config, settings, base, session, lambda config: executors(config, cache),
                            jobs=JobGroups(session) if session is not None else None, tables=tables)
    if args.dry_run or args.once:
        report = service.round(dry_run=args.dry_run)
        if args.json:
            print(redact(json.dumps({"planned": [{"table": c.due.table, "action": c.due.action, "why": c.reason}
                                                 for c in report.planned],
                                     "ran": report.ran, "problems": report.problems,
                                     "fleet": service.governor.fleet_line()})))
        else:
            print(redact("\n".join(report.plan_lines())))
        return 1 if any(not r["ok"] for r in report.ran) else 0
    stop = threading.Event()
    install_stop_handlers(stop)
    from streamberg.cli import dashboard

    # The dashboard reads the kept tables' statuses (collected apart from the rounds) and
    # each table's runtime for its settings: the same objects the governor keeps.
    collect = dashboard.governed_collector(lambda: [k.config for k in list(service.kept.values())],
                                           service.tables.refusals, base.ingest.state_dir, service.runtime_of)
    server = dashboard.start(args, base, collect, stop)
    try:
        service.run(stop, settings.interval_seconds)
    finally:
        stop.set()
        if server is not None:
            server.shutdown()
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("govern", help="one service keeps every table of a config: clustering, merges, "
                                   "maintenance, by need", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a config of one table or of many (tables:)")
    parser.add_argument("--namespace", action="append", default=[], metavar="NAMESPACE",
                        help="also keep this namespace's tables that carry streamberg.* properties (repeatable; "
                        "added to govern.namespaces)")
    parser.add_argument("--max-concurrent", type=int, default=None, metavar="N",
                        help="actions at once, each on another table (default: govern.max_concurrent, 1)")
    parser.add_argument("--max-wait-seconds", type=float, default=None,
                        help="a due action waiting this long goes before every other (default: "
                        "govern.max_wait_seconds, 600.0)")
    parser.add_argument("--interval-seconds", type=float, default=None,
                        help="pause after a round with nothing due (default: govern.interval_seconds, 10.0)")
    parser.add_argument("--action-timeout-seconds", type=float, default=None,
                        help="an action running longer is cancelled and its table backs off (default: "
                        "govern.action_timeout_seconds, 3600.0)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (table, action, why) and change nothing")
    parser.add_argument("--once", action="store_true", help="one round, then exit (cron, tests)")
    parser.add_argument("--json", action="store_true", help="with --once/--dry-run: one JSON object")
    parser.add_argument("--health", action="store_true",
                        help="exit 0 if the governor of this config is alive (its heartbeat under ingest.state_dir is "
                        "younger than 120 s), else 1; a pod's liveness probe")
    from streamberg.cli import dashboard

    dashboard.add_arguments(parser)
    parser.set_defaults(func=_govern)
