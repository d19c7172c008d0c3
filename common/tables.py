"""Which tables a config keeps: the one answer for ingest, status, metrics, govern, check,
deploy and run.

A config of one table keeps that table. A config of many (`tables:`) keeps the table of every
topic the broker has that a route takes (common/config/resolve.resolve_fleet: the owner rule,
the side-table names, the caps, each refusal that topic's alone) and, for a route by a record
field, the tables its values made (the catalog's record of them, trusted as far as it
validates: common/catalog.routed_values). The run folders of a config's ingest runs live under
`<ingest.state_dir>/runs/<run id>`, found here too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamberg.common.config import FleetConfig, StreambergConfig, config_from_dump, load_tables, one_table
from streamberg.common.config.fleet import PAUSED_TABLES_FILE, ROUTE_TOPIC_PROPERTY
from streamberg.common.config.resolve import resolve_fleet

RUNS = "runs"


@dataclass
class ConfigTables:
    """The tables of a config, each with its single-table configuration."""

    configs: dict[str, StreambergConfig] = field(default_factory=dict)  # identifier -> its config
    topics: dict[str, str] = field(default_factory=dict)  # identifier -> the topic feeding it
    refused_topics: dict[str, str] = field(default_factory=dict)  # topic -> why it is not read
    refused_tables: dict[str, str] = field(default_factory=dict)  # a table found and not kept -> why
    broker_error: str | None = None  # the broker did not answer: pattern routes' tables not listed
    fleet: FleetConfig | None = None
    run_settings: StreambergConfig | None = None  # the run-wide sections (any table's config carries them)


def run_settings(fleet: FleetConfig) -> StreambergConfig:
    """A config's run-wide settings (connection, catalog, state, limits) as a single-table
    configuration: a config of one table's own, as it loaded; a config of many's first route's,
    which carries every shared section."""
    if (one := one_table(fleet)) is not None:
        return one
    route = fleet.tables[0]
    return config_from_dump(fleet.document(route, (route.topics or ["sample.topic"])[0]))


def broker_topics(fleet: FleetConfig, settings: StreambergConfig) -> tuple[list[str], str | None]:
    """The broker's topics (the named ones alone, and why, when it does not answer)."""
    from confluent_kafka.admin import AdminClient

    from streamberg.common.kafka_settings import connection_settings

    try:
        admin = AdminClient({**connection_settings(settings.kafka.bootstrap_servers, settings.kafka.consumer),
                             "log_level": 0})
        return sorted(admin.list_topics(timeout=settings.monitoring.broker_timeout_seconds).topics), None
    except Exception as exc:  # noqa: BLE001 - reported by the callers, never raised
        return fleet.named_topics(), f"{type(exc).__name__}: {str(exc)[:200]}"


def config_tables(path: str | Path, topics: list[str] | None = None, catalog: Any = None) -> ConfigTables:
    """The tables of the config at `path` now (`topics`: the broker's, when the caller has
    them; `catalog`: an open one, read-only is enough; opened here when None)."""
    return fleet_tables(load_tables(path), topics, catalog)


def fleet_tables(fleet: FleetConfig, topics: list[str] | None = None, catalog: Any = None) -> ConfigTables:
    """The tables of a config now (see config_tables): a config of one table keeps its table
    whatever the broker lists (its topic may come later), with no broker or catalog asked."""
    if (one := one_table(fleet)) is not None:
        return ConfigTables({one.table.identifier: one}, {one.table.identifier: one.kafka.topic}, fleet=fleet,
                            run_settings=one)
    settings = run_settings(fleet)
    out = ConfigTables(fleet=fleet, run_settings=settings)
    if topics is None:
        topics, out.broker_error = broker_topics(fleet, settings)
    if catalog is None:
        from streamberg.common.catalog import open_catalog_readonly

        try:
            catalog = open_catalog_readonly(settings.catalog)
        except Exception:  # noqa: BLE001 - no catalog yet: the named order decides, no value tables
            catalog = None
    known: dict[str, StreambergConfig] = {}
    resolve_fleet(fleet, topics, known, out.refused_topics, owner_of=_owner(catalog))
    for topic, config in known.items():
        out.configs[config.table.identifier] = config
        out.topics[config.table.identifier] = topic
        route = fleet.route_of(topic)
        if route is None or route.route_field is None or catalog is None:
            continue
        from streamberg.common.catalog import routed_values

        rule = lambda value, route=route, topic=topic: route.table_identifier(topic, value)  # noqa: E731
        for value in routed_values(catalog, config.table.namespace, topic, rule, out.refused_tables):
            made = config_from_dump(fleet.document(route, topic, value))
            out.configs[made.table.identifier] = made
            out.topics[made.table.identifier] = topic
    return out


def _owner(catalog: Any) -> Any:
    """identifier -> the topic its table records as its own (None: no table, no record)."""
    if catalog is None:
        return None

    def owner(identifier: str) -> str | None:
        try:
            return catalog.load_table(identifier).properties.get(ROUTE_TOPIC_PROPERTY)
        except Exception:  # noqa: BLE001 - no such table yet
            return None

    return owner


def run_folder(state_dir: str | Path, run_id: str) -> Path:
    """The folder of one ingest run (ingest/run_folder.py writes it; status reads it)."""
    return Path(state_dir) / RUNS / run_id


def newest_run_folder(state_dir: str | Path) -> Path | None:
    runs = Path(state_dir) / RUNS
    try:
        return max((p for p in runs.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    except (OSError, ValueError):
        return None


def paused_tables(state_dir: str | Path) -> dict[str, str]:
    """The tables the newest ingest run paused (its run folder's record), table -> why."""
    newest = newest_run_folder(state_dir)
    if newest is None:
        return {}
    try:
        data = json.loads((newest / PAUSED_TABLES_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
