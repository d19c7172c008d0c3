"""`streamberg govern --config F`: one Spark application keeps every table of a config.

Which tables: the config's (one, or every table of a config of many that the broker's topics
route to), and with `--namespace N` every table of N whose properties carry `streamberg.*`
policy keys, whoever wrote it. Each round the governor (governor/app.py) probes every table
without Spark (the compactor's own planner: files waiting past its trigger; a change log's
unapplied changes; time since maintenance), the scheduler (governor/scheduler.py) picks by
need within `--budget` actions a round, no due action waiting past `--max-wait-seconds`, and the
chosen actions run on one Spark session with the components' own code (`compact --once`,
`merge --once`, `maintain --once`). Policy is read from the table's properties at every round
(common/policy.py; docs/governor.md), so a change takes effect at the next round.

`--dry-run` prints the plan (which table, which action, why) and changes nothing; `--once`
runs one round. State of every round: <ingest.state_dir>/govern.json.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

from streamberg.common.catalog import first_line
from streamberg.common.config import StreambergConfig, config_from_dump, is_fleet, load_config, load_fleet
from streamberg.common.config.fleet import per_table_checkpoint
from streamberg.common.config.loading import dump_config, resolve_fleet
from streamberg.common.policy import TablePolicy, policy_of
from streamberg.common.redact import redact
from streamberg.governor.app import Governor, Keeper
from streamberg.governor.scheduler import Due, Scheduler


def _configs(args: argparse.Namespace) -> list[StreambergConfig]:
    """The config's tables (a config of many: those the broker's topics route to now)."""
    if not is_fleet(args.config):
        return [load_config(args.config)]
    from streamberg.monitoring.fleet import broker_topics

    fleet = load_fleet(args.config)
    sample = config_from_dump(fleet.document(fleet.tables[0], (fleet.tables[0].topics or ["sample.topic"])[0]))
    topics, _ = broker_topics(fleet, sample)
    known: dict[str, StreambergConfig] = {}
    resolve_fleet(fleet, topics, known, {})
    return list(known.values())


def _opted_in(base: StreambergConfig, namespaces: list[str], have: set[str]) -> list[StreambergConfig]:
    """Tables of the opt-in namespaces that carry policy keys: the base config's settings,
    the table's own schema (table.schema unset: the table is the truth)."""
    if not namespaces:
        return []
    from streamberg.common.catalog import load_catalog

    catalog = load_catalog(base.catalog)
    found = []
    for namespace in namespaces:
        for identifier in catalog.list_tables(namespace):
            name = ".".join(identifier)
            if name in have:
                continue
            try:
                properties = catalog.load_table(name).properties
            except Exception:  # noqa: BLE001 - dropped between the listing and the load
                continue
            if not policy_of(properties).governed:
                continue
            document = dump_config(base)
            document["table"] = {"identifier": name}
            document["compactor"]["checkpoint_dir"] = per_table_checkpoint(base.compactor.checkpoint_dir, name)
            document["kafka"] = {**document["kafka"], "envelope": "none"}
            found.append(config_from_dump(document))
    return found


def _with_policy(config: StreambergConfig, policy: TablePolicy) -> StreambergConfig:
    updates: dict[str, Any] = {}
    if policy.cluster_columns is not None:
        updates["columns"] = policy.cluster_columns
    if policy.cluster_strategy is not None:
        updates["strategy"] = policy.cluster_strategy
    if not updates:
        return config
    return config.model_copy(update={"compactor": config.compactor.model_copy(update=updates)})


class TableKeeper:
    """Probe and runner of one table: the components' own code, the one shared session."""

    def __init__(self, config: StreambergConfig, session: Any) -> None:
        self.config, self.session = config, session
        self.effective = config

    def policy(self) -> TablePolicy:
        from streamberg.common.catalog import load_catalog

        return policy_of(load_catalog(self.config.catalog).load_table(self.config.table.identifier).properties)

    def probe(self) -> tuple[list[Due], list[str]]:
        from streamberg.common.changelog import changelog_identifier, has_changelog, merge_position
        from streamberg.common.maintenance_runs import last_maintenance_run
        from streamberg.compactor.app import CompactOptions, dry_run

        policy = self.policy()
        self.effective = config = _with_policy(self.config, policy)
        identifier, problems, due = config.table.identifier, list(policy.problems), []
        gap = policy.min_interval_seconds
        if policy.compact_enabled:
            try:
                plan = dry_run(config, CompactOptions(dry_run=True))
                if plan["groups"]:
                    urgency = max(1.0, plan["files"] / max(1, config.compactor.min_files))
                    due.append(Due(identifier, "compact", urgency,
                                   f"{plan['files']} files ({plan['bytes'] / 1e6:.1f} MB) in {plan['groups']} groups", gap))
            except Exception as exc:  # noqa: BLE001 - e.g. a clustering column the table lacks: this table's problem
                problems.append(f"compact: {first_line(exc)[:300]}")
        if policy.merge_enabled and has_changelog(config):
            from streamberg.common.catalog import load_catalog

            catalog = load_catalog(config.catalog)
            if catalog.table_exists(changelog_identifier(config)):
                position = merge_position(catalog.load_table(changelog_identifier(config)),
                                          catalog.load_table(identifier) if catalog.table_exists(identifier) else None)
                if not position.up_to_date:
                    age = time.time() - (position.oldest_pending_ms or 0) / 1000
                    due.append(Due(identifier, "merge", max(1.0, age / max(1.0, config.merge.interval_seconds)),
                                   f"{position.pending_records} changes in {position.pending_snapshots} snapshots", gap))
        if policy.maintain_enabled:
            last = last_maintenance_run(config)
            age = None if last is None else last["age_seconds"]
            interval = config.maintenance.interval_seconds
            if age is None or age >= interval:
                due.append(Due(identifier, "maintain", 1.0 if age is None else age / interval,
                               "never maintained" if age is None else f"last maintained {age:.0f} s ago", gap))
        return due, problems

    def run(self, action: str) -> dict[str, Any]:
        config = self.effective
        if action == "compact":
            from streamberg.compactor.app import CompactOptions, run_compact

            return run_compact(config, CompactOptions(once=True), spark=self.session)
        if action == "merge":
            from streamberg.merge.app import MergeOptions, run_merge

            return run_merge(config, MergeOptions(once=True), spark=self.session)
        from streamberg.maintenance.app import MaintainOptions, run_maintain

        summary = run_maintain(config, MaintainOptions(once=True), spark=self.session)
        if summary.failed_runs:
            raise RuntimeError(f"maintenance failed: {json.dumps(summary.last)[:300]}")
        return {"runs": summary.runs}


def _govern(args: argparse.Namespace) -> int:
    from streamberg.common.spark import build_spark_session, quiet_spark_logs
    from streamberg.common.stop import install_stop_handlers

    configs = _configs(args)
    base = configs[0] if configs else None
    if base is None:
        print("streamberg govern: no table yet (no topic of the config's routes on the broker)")
        return 0
    session = None
    if not args.dry_run:
        session = build_spark_session(base.catalog, base.compactor.spark_master, base.compactor.spark_conf,
                                      app_name="streamberg-governor")
        quiet_spark_logs(session)

    def keepers() -> list[Keeper]:
        tables = _configs(args) if is_fleet(args.config) else configs
        tables = tables + _opted_in(base, args.namespace, {c.table.identifier for c in tables})
        made = [TableKeeper(c, session) for c in tables]
        return [Keeper(k.config.table.identifier, k.probe, k.run) for k in made]

    governor = Governor(keepers, Scheduler(max_wait_seconds=args.max_wait_seconds), budget=args.budget,
                        state_dir=base.ingest.state_dir)
    try:
        if args.dry_run or args.once:
            report = governor.round(dry_run=args.dry_run)
            if args.json:
                print(redact(json.dumps({"planned": [{"table": c.due.table, "action": c.due.action, "why": c.reason}
                                                     for c in report.planned],
                                         "ran": report.ran, "problems": report.problems,
                                         "fleet": governor.fleet_line()})))
            else:
                print(redact("\n".join(report.plan_lines())))
            return 1 if any(not r["ok"] for r in report.ran) else 0
        stop = threading.Event()
        install_stop_handlers(stop)
        governor.run(stop, args.interval_seconds)
        return 0
    finally:
        if session is not None:
            session.stop()


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("govern", help="one service keeps every table of a config: clustering, merges, "
                                   "maintenance, by need", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a config of one table or of many (tables:)")
    parser.add_argument("--namespace", action="append", default=[], metavar="NAMESPACE",
                        help="also keep this namespace's tables that carry streamberg.* properties (repeatable)")
    parser.add_argument("--budget", type=int, default=1, help="actions a round (default 1: one at a time)")
    parser.add_argument("--max-wait-seconds", type=float, default=600.0,
                        help="a due action waiting this long goes before every other (default 600)")
    parser.add_argument("--interval-seconds", type=float, default=10.0, help="pause after a round with nothing due")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (table, action, why) and change nothing")
    parser.add_argument("--once", action="store_true", help="one round, then exit (cron, tests)")
    parser.add_argument("--json", action="store_true", help="with --once/--dry-run: one JSON object")
    parser.set_defaults(func=_govern)
