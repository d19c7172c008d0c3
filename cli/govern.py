"""`streamberg govern --config F`: one Spark application keeps every table of a config.

Which tables: the config's (one, or every table of a config of many that the broker's topics
route to, with the tables a route field's values made), and in the namespaces of
`govern.namespaces` (or `--namespace N`) every table whose properties carry `streamberg.*`
policy keys, whoever wrote it. Each round the governor
(governor/app.py) probes every table without Spark (the compactor's own planner: files
waiting past its trigger; a change log's unapplied changes; time since maintenance), the
scheduler (governor/scheduler.py) picks by need, `govern.max_concurrent` actions at once (each
on another table), no due action waiting past `govern.max_wait_seconds`, and the chosen
actions run on one Spark session with the components' own code (`compact --once`, `merge
--once`, `maintain --once`). Policy is read from the table's properties at every round
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
from streamberg.common.policy import policy_for, policy_of
from streamberg.common.redact import redact
from streamberg.governor.app import Governor, Keeper
from streamberg.governor.scheduler import Due, Scheduler


def _configs(args: argparse.Namespace, refused: dict[str, str] | None = None) -> list[StreambergConfig]:
    """The config's tables (a config of many: those the broker's topics route to now, and the
    tables a field-routed topic's values made, by the catalog's record of them, as far as that
    record validates: a bad entry goes into `refused` under its table's own name)."""
    if not is_fleet(args.config):
        return [load_config(args.config)]
    from streamberg.monitoring.fleet import broker_topics

    refused = {} if refused is None else refused
    fleet = load_fleet(args.config)
    sample = config_from_dump(fleet.document(fleet.tables[0], (fleet.tables[0].topics or ["sample.topic"])[0]))
    topics, _ = broker_topics(fleet, sample)
    known: dict[str, StreambergConfig] = {}
    resolve_fleet(fleet, topics, known, {})
    out = list(known.values())
    field_routed = [(topic, route) for topic in known if (route := fleet.route_of(topic)) is not None and route.route_field]
    if field_routed:
        from streamberg.common.catalog import load_catalog, routed_values

        catalog = load_catalog(sample.catalog)
        for topic, route in field_routed:
            made = lambda value, route=route, topic=topic: route.table_identifier(topic, value)  # noqa: E731
            for value in routed_values(catalog, known[topic].table.namespace, topic, made, refused):
                out.append(config_from_dump(fleet.document(route, topic, value)))
    return out


def _opted_in(base: StreambergConfig, namespaces: list[str], have: set[str],
              refused: dict[str, str] | None = None) -> list[StreambergConfig]:
    """Tables of the opt-in namespaces that carry policy keys: the base config's settings
    without its destructive ones (`undeclared`: no retention, no expiry more eager than the
    defaults; the table's own keys may set them), the table's own schema (table.schema unset:
    the table is the truth). A table that cannot be kept (a name no config can hold, metadata
    that cannot be read) goes into `refused` under its own name, and the others are kept."""
    if not namespaces:
        return []
    from streamberg.common.catalog import load_catalog
    from streamberg.common.errors import ConfigError
    from streamberg.common.policy import undeclared

    refused = {} if refused is None else refused
    catalog = load_catalog(base.catalog)
    found = []
    for namespace in namespaces:
        try:
            identifiers = catalog.list_tables(namespace)
        except Exception as exc:  # noqa: BLE001 - a namespace that is not there (yet) is this namespace's problem
            refused[f"{namespace}.*"] = f"namespace cannot be listed: {first_line(exc)[:200]}"
            continue
        for identifier in identifiers:
            name = ".".join(identifier)
            if name in have:
                continue
            try:
                properties = catalog.load_table(identifier).properties
            except Exception as exc:  # noqa: BLE001 - dropped between the listing and the load, or unreadable
                if catalog.table_exists(identifier):
                    refused[name] = f"cannot be read: {first_line(exc)[:200]}"
                continue
            if not policy_of(properties).governed:
                continue
            document = dump_config(base)
            document["table"] = {"identifier": name}
            document["compactor"]["checkpoint_dir"] = per_table_checkpoint(base.compactor.checkpoint_dir, name)
            document["kafka"] = {**document["kafka"], "envelope": "none"}
            try:
                found.append(undeclared(config_from_dump(document)))
            except ConfigError as exc:
                refused[name] = f"not kept: {exc.problems[0] if exc.problems else first_line(exc)}"[:300]
    return found


class SharedCatalogs:
    """One catalog (and state database) per catalog config for the whole service: a round
    probes every table, and opening a catalog is far dearer than reading a table."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[Any, Any]] = {}

    def get(self, config: StreambergConfig) -> tuple[Any, Any]:
        from streamberg.common.catalog import load_catalog, state_engine

        key = config.catalog.model_dump_json()
        if key not in self._open:
            # Importing them declares the private tables they write (maintenance runs, leases).
            import streamberg.common.maintenance_runs
            import streamberg.compactor.lease  # noqa: F401
            from streamberg.common.private_tables import ensure_private_tables

            catalog = load_catalog(config.catalog)
            engine = state_engine(config.catalog, catalog)
            # The product's own tables made once, before any action: concurrent actions on a
            # fresh catalog would otherwise race to create them.
            ensure_private_tables(engine)
            self._open[key] = (catalog, engine)
        return self._open[key]


class TableKeeper:
    """Probe and runner of one table: the components' own code, the one shared session. It
    lives across rounds: a table whose metadata has not changed keeps its compaction plan
    (planning reads manifests; probing a hundred tables every round must stay cheap) for
    `govern.replan_seconds`, then plans again: the time triggers (held-back files, idle
    partitions to finish) change a plan without a commit."""

    def __init__(self, config: StreambergConfig, session: Any, catalogs: SharedCatalogs) -> None:
        self.config, self.session, self.catalogs = config, session, catalogs
        self.effective = config
        self._plan: tuple[tuple[Any, ...], float, dict[str, Any]] | None = None  # (key, made at, plan)
        self._maintained: tuple[float, float | None] | None = None  # (read at, age then)

    def probe(self) -> tuple[list[Due], list[str]]:
        from streamberg.common.changelog import changelog_identifier, has_changelog, merge_position

        catalog, _ = self.catalogs.get(self.config)
        identifier = self.config.table.identifier
        changelog = changelog_identifier(self.config) if has_changelog(self.config) else None
        if changelog is not None and not catalog.table_exists(identifier) and catalog.table_exists(changelog):
            table = None  # a primary-key table its first merge makes: only the merge is due
        else:
            table = catalog.load_table(identifier)
        policy, config = policy_for(self.config, table.properties if table is not None else {})
        self.effective = config
        problems, due = list(policy.problems), []
        gap = policy.min_interval_seconds
        if table is not None and policy.compact_enabled:
            try:
                plan = self._compaction_plan(config, table)
                if plan["groups"] or plan["seal_only"]:
                    urgency = max(1.0, plan["files"] / max(1, config.compactor.min_files or 1))
                    why = (f"{plan['files']} files ({plan['bytes'] / 1e6:.1f} MB) in {plan['groups']} groups"
                           if plan["groups"] else f"{plan['seal_only']} finished partition(s) to seal")
                    if deletes := plan.get("group_kinds", {}).get("deletes", 0):
                        # Deletes past the compactor's thresholds slow every read of the table
                        # (merge-on-read): urgent beside any number of waiting files.
                        urgency = max(urgency, 2.0 * deletes)
                        why += f"; deletes past their threshold in {deletes} partition(s)"
                    due.append(Due(identifier, "compact", urgency, why, gap))
            except Exception as exc:  # noqa: BLE001 - e.g. a clustering column the table lacks: this table's problem
                problems.append(f"compact: {first_line(exc)[:300]}")
        if policy.merge_enabled and changelog is not None and catalog.table_exists(changelog):
            position = merge_position(catalog.load_table(changelog), table)
            if not position.up_to_date:
                age = time.time() - (position.oldest_pending_ms or 0) / 1000
                due.append(Due(identifier, "merge", max(1.0, age / max(1.0, config.merge.interval_seconds)),
                               f"{position.pending_records} changes in {position.pending_snapshots} snapshots", gap))
        if table is not None and policy.maintain_enabled:
            age = self._maintenance_age(config)
            interval = config.maintenance.interval_seconds
            if age is None or age >= interval:
                due.append(Due(identifier, "maintain", 1.0 if age is None else age / max(1.0, interval),
                               "never maintained" if age is None else f"last maintained {age:.0f} s ago", gap))
        return due, problems

    def _compaction_plan(self, config: StreambergConfig, table: Any) -> dict[str, Any]:
        from streamberg.compactor.app import CompactOptions, dry_run

        key = (table.metadata_location, config.compactor.model_dump_json())
        now = time.monotonic()
        # An unchanged table's plan still ages: files held back reach max_delay_seconds, an idle
        # partition reaches seal_after_seconds (a plan with nothing in it is the one that
        # changes by time alone), so it is made again after replan_seconds.
        if self._plan is not None and self._plan[0] == key and now - self._plan[1] < config.govern.replan_seconds:
            return self._plan[2]
        plan = dry_run(config, CompactOptions(dry_run=True), table)
        self._plan = (key, now, plan)
        return plan

    def _maintenance_age(self, config: StreambergConfig) -> float | None:
        """Seconds since the table's last maintenance run (None: never): read from the runs
        table at most once a minute, the time since then added."""
        from streamberg.common.maintenance_runs import last_maintenance_run

        now = time.monotonic()
        if self._maintained is None or now - self._maintained[0] >= 60.0:
            last = last_maintenance_run(config, engine=self.catalogs.get(config)[1])
            self._maintained = (now, None if last is None else float(last["age_seconds"]))
        read_at, age = self._maintained
        return None if age is None else age + (now - read_at)

    def run(self, action: str) -> dict[str, Any]:
        config = self.effective
        self._plan = None  # whatever ran, the next probe plans afresh
        if action == "compact":
            from streamberg.compactor.app import CompactOptions, run_compact

            return run_compact(config, CompactOptions(once=True), spark=self.session)
        if action == "merge":
            from streamberg.merge.app import MergeOptions, run_merge

            return run_merge(config, MergeOptions(once=True), spark=self.session)
        from streamberg.maintenance.app import MaintainOptions, run_maintain

        self._maintained = None
        summary = run_maintain(config, MaintainOptions(once=True), spark=self.session)
        if summary.failed_runs:
            raise RuntimeError(f"maintenance failed: {json.dumps(summary.last)[:300]}")
        return {"runs": summary.runs}


def _never_run(action: str) -> dict[str, Any]:
    raise RuntimeError(f"{action}: the table is not kept (see its problem)")


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


def _health(args: argparse.Namespace) -> int:
    """`govern --health`: exit 0 when the governor of this config writes its heartbeat."""
    from streamberg.governor.app import health

    if is_fleet(args.config):
        fleet = load_fleet(args.config)
        route = fleet.tables[0]
        state_dir = config_from_dump(fleet.document(route, (route.topics or ["sample.topic"])[0])).ingest.state_dir
    else:
        state_dir = load_config(args.config).ingest.state_dir
    alive, line = health(state_dir)
    print(line)
    return 0 if alive else 1


def _govern(args: argparse.Namespace) -> int:
    from streamberg.common.spark import build_spark_session, quiet_spark_logs
    from streamberg.common.stop import install_stop_handlers

    if args.health:
        return _health(args)

    # Tables found and not kept (a forged route record, a name no config holds), by their own
    # names, from the last listing of the config's tables and of the opted-in namespaces.
    refused: dict[str, dict[str, str]] = {"routed": {}, "listed": {}}
    configs = _configs(args, refused["routed"])
    if not configs:
        print("streamberg govern: no table yet (no topic of the config's routes on the broker)")
        return 0
    base = _settings(args, configs[0])
    settings = base.govern
    session = None
    if not args.dry_run:
        session = build_spark_session(base.catalog, base.compactor.spark_master, base.compactor.spark_conf,
                                      app_name="streamberg-governor")
        quiet_spark_logs(session)
    catalogs = SharedCatalogs()
    kept: dict[str, TableKeeper] = {}
    listed: list[Any] = [0.0, []]  # (when, the opted-in tables' configs) of the last namespace listing
    routed: list[Any] = [time.monotonic(), configs]  # (when, the config's tables) of the last broker listing

    def keepers() -> list[Keeper]:
        # A config of many is listed again (new topics, new route values) every replan_seconds.
        if is_fleet(args.config) and time.monotonic() - routed[0] >= settings.replan_seconds:
            found: dict[str, str] = {}
            try:
                routed[:] = [time.monotonic(), _configs(args, found)]
            except Exception as exc:  # noqa: BLE001 - the config's tables cannot be listed now: keep the last list
                routed[0] = time.monotonic()
                found = {**refused["routed"], "(config)": f"its tables could not be listed again: {first_line(exc)[:200]}"}
            refused["routed"] = found
        tables = routed[1]
        if settings.namespaces and time.monotonic() - listed[0] >= settings.replan_seconds:
            found = {}
            try:
                listed[:] = [time.monotonic(), _opted_in(base, settings.namespaces,
                                                         {c.table.identifier for c in tables}, found)]
            except Exception as exc:  # noqa: BLE001 - the catalog cannot be listed now: keep the last list
                listed[0] = time.monotonic()
                found = {**refused["listed"],
                         "(namespaces)": f"{', '.join(settings.namespaces)} could not be listed: {first_line(exc)[:200]}"}
            refused["listed"] = found
        wanted = {c.table.identifier: c for c in tables}  # the config's own first, then the opted-in
        for c in listed[1]:
            wanted.setdefault(c.table.identifier, c)
        for gone in set(kept) - set(wanted):
            del kept[gone]
        for identifier, c in wanted.items():
            if identifier not in kept or kept[identifier].config != c:
                kept[identifier] = TableKeeper(c, session, catalogs)
        out = [Keeper(k.config.table.identifier, k.probe, k.run, streams=f"streamberg-compactor-{k.config.table.identifier}")
               for k in kept.values()]
        # A table found and not kept is reported under its own name every round (status, the plan).
        out += [Keeper(name, lambda why=why: ([], [why]), _never_run)
                for name, why in sorted({**refused["listed"], **refused["routed"]}.items()) if name not in kept]
        return out

    from streamberg.common.spark import JobGroups

    governor = Governor(keepers, Scheduler(max_wait_seconds=settings.max_wait_seconds),
                        budget=settings.max_concurrent, concurrent=settings.max_concurrent,
                        state_dir=base.ingest.state_dir, timeout_seconds=settings.action_timeout_seconds,
                        jobs=JobGroups(session) if session is not None else None)
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
        governor.run(stop, settings.interval_seconds)
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
    parser.set_defaults(func=_govern)
