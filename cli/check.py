"""`streamberg check`: is this config usable, and (with --connect) can it reach what it names?

Validation lists every problem, one a line (the other commands print the first ten in one
line). `--connect` then reaches the broker (with kafka.consumer's connection settings: SASL,
TLS), the catalog (read only: nothing is created) and the schema registry, each within
`monitoring.broker_timeout_seconds`, and says what it found: the topics a route claims and
their partitions, whether each table exists yet, the registry's subjects.

Exit codes (common/exit_codes.py): 0 valid (and, with --connect, everything reached);
2 invalid config; 1 valid but something could not be reached or a named topic is missing.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from streamberg.common.config import StreambergConfig, load_tables, one_table
from streamberg.common.config.fleet import FleetConfig
from streamberg.common.errors import ConfigError
from streamberg.common.exit_codes import ExitCode
from streamberg.common.kafka_settings import connection_settings
from streamberg.common.redact import redact
from streamberg.common.tables import run_settings
from streamberg.common.watermarks import kafka_error_text
from streamberg.table_meta.policy import declared_problems


@dataclass
class Probe:
    """What one reach for a component found."""

    component: str  # broker | catalog | registry
    ok: bool
    detail: str
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    config: str
    valid: bool
    problems: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)  # what the config names (patterns as written)
    probes: list[Probe] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        if not self.valid:
            return ExitCode.USAGE
        return ExitCode.OK if all(p.ok for p in self.probes) else ExitCode.FAILED

    def render(self) -> str:
        if not self.valid:
            return "\n".join([f"{self.config}: invalid, {len(self.problems)} problem(s):",
                              *(f"  - {p}" for p in self.problems)])
        lines = [f"{self.config}: valid, {len(self.tables)} table route(s): {', '.join(self.tables)}"]
        for probe in self.probes:
            lines.append(f"  {probe.component:<8} {'ok' if probe.ok else 'FAILED'}  {probe.detail}")
        return "\n".join(lines)


def _broker(kafka: dict[str, Any], wanted: list[str], patterns: list[str], timeout: float) -> Probe:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    bootstrap = str(kafka.get("bootstrap_servers", "127.0.0.1:19092"))
    try:
        admin = AdminClient({**connection_settings(bootstrap, kafka.get("consumer")), "log_level": 0})
        topics = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        return Probe("broker", False, f"{bootstrap}: {kafka_error_text(exc)}")
    partitions = {t: len(topics[t].partitions) for t in wanted if t in topics}
    missing = [t for t in wanted if t not in topics]
    matched = {p: sorted(t for t in topics if re.fullmatch(p, t)) for p in patterns}
    parts = [f"{bootstrap}: {len(topics)} topic(s)"]
    parts += [f"{t} ({n} partitions)" for t, n in partitions.items()]
    parts += [f"pattern {p!r} matches {len(m)}" for p, m in matched.items()]
    parts += [f"MISSING topic {t}" for t in missing]
    return Probe("broker", not missing, "; ".join(parts),
                 {"topics": len(topics), "partitions": partitions, "missing": missing,
                  "pattern_matches": {p: len(m) for p, m in matched.items()}})


def _catalog(config: StreambergConfig, identifiers: list[str]) -> Probe:
    from streamberg.common.catalog import open_catalog_readonly
    from streamberg.common.catalog_kinds import kind_of

    kind = kind_of(config.catalog)
    where = kind.describe(config.catalog)
    if "uri" in kind.local_paths and config.catalog.uri.startswith("sqlite"):
        from sqlalchemy.engine import make_url

        database = make_url(config.catalog.uri).database
        if database and not Path(database).exists():  # a first run: the ingest makes it
            return Probe("catalog", True, f"{where}: no database yet (the first ingest creates it)",
                         {"tables": dict.fromkeys(identifiers, False)})
    try:
        catalog = open_catalog_readonly(config.catalog)
    except Exception as exc:  # noqa: BLE001 - reported as this probe's finding
        return Probe("catalog", False, f"{where}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    exists = {i: catalog.table_exists(i) for i in identifiers}
    shown = [f"{i} {'exists' if e else 'not yet (made on the first commit)'}" for i, e in exists.items()]
    return Probe("catalog", True, "; ".join([f"{where}: reachable", *shown]), {"tables": exists})


def _registry(config: StreambergConfig, timeout: float) -> Probe | None:
    registry = config.kafka.schema_registry
    if registry is None:
        return None
    from confluent_kafka.schema_registry import SchemaRegistryClient

    try:
        client = SchemaRegistryClient({"url": registry.url, "timeout": max(1, int(timeout)), **registry.properties})
        subjects = client.get_subjects()
    except Exception as exc:  # noqa: BLE001 - reported as this probe's finding
        return Probe("registry", False, f"{registry.url}: {type(exc).__name__}: {str(exc)[:200]}")
    return Probe("registry", True, f"{registry.url}: {len(subjects)} subject(s)", {"subjects": len(subjects)})


def check(path: Path, connect: bool) -> Report:
    report = Report(config=str(path), valid=True)
    try:
        fleet = load_tables(path)  # one table or many: routes
        sample = run_settings(fleet)
    except ConfigError as exc:
        return Report(config=str(path), valid=False, problems=exc.problems)
    report.tables = [r.identifier for r in fleet.tables]
    # What the components would refuse from the config alone, every table at once.
    problems = [f"{c.table.identifier}: {p}" if fleet.many else p
                for c in _declared_tables(fleet) for p in declared_problems(c)]
    if problems:
        return Report(config=str(path), valid=False, problems=problems, tables=report.tables)
    if not connect:
        return report
    timeout = sample.monitoring.broker_timeout_seconds
    patterns = [r.topic_pattern for r in fleet.tables if r.topic_pattern is not None]
    kafka: dict[str, Any] = {"bootstrap_servers": fleet.kafka.bootstrap_servers, "consumer": fleet.kafka.consumer}
    identifiers = [r.table_identifier(t) for r in fleet.tables for t in (r.topics or ()) if not r.route_field]
    report.probes.append(_broker(kafka, fleet.named_topics(), patterns, timeout))
    report.probes.append(_catalog(sample, identifiers))
    if (registry := _registry(sample, timeout)) is not None:
        report.probes.append(registry)
    return report


def _declared_tables(fleet: FleetConfig) -> list[StreambergConfig]:
    """The configs of the tables the file names: a config of one table's own, or each named
    topic's of a config of many (a pattern's tables are known only once the broker lists its
    topics)."""
    if (one := one_table(fleet)) is not None:
        return [one]
    from streamberg.common.config import config_from_dump

    out = []
    for route in fleet.tables:
        for topic in route.topics or ():
            try:
                out.append(config_from_dump(fleet.document(route, topic)))
            except ConfigError:
                continue  # reported by the loader already
    return out


def _run(args: argparse.Namespace) -> int:
    report = check(args.config, args.connect)
    if args.json:
        print(redact(json.dumps({**asdict(report), "exit_code": int(report.exit_code)}), key_values=False))
    else:
        # The problems name keys and say what is wrong, never a secret's value (common/config/
        # messages.py shows values only for harmless keys): the explanations are kept.
        print(redact(report.render(), key_values=False))
    return int(report.exit_code)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check", help="validate a config (every problem) and, with --connect, reach its broker, catalog and registry",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, type=Path, help="a config of one table or of many (tables:)")
    parser.add_argument("--connect", action="store_true",
                        help="also reach the broker, the catalog and the registry with the configured security")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    parser.set_defaults(func=_run)
