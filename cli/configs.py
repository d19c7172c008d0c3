"""The configuration a command works on: the file's table, or with --table one table of a
config of many tables (common/config/fleet.py)."""

from __future__ import annotations

import argparse

from streamberg.cli.errors import CommandError
from streamberg.common.config import FleetConfig, StreambergConfig, fleet_table, load_tables, one_table
from streamberg.common.kafka_settings import connection_settings

TABLE_HELP = ("with a config of many tables (tables:): the table to work on, namespace.table (a pattern route's "
              "table is found through the broker's topics)")


def add_table_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--table", default=None, metavar="NAMESPACE.TABLE", help=TABLE_HELP)


def config_of(args: argparse.Namespace, fleet: FleetConfig | None = None) -> StreambergConfig:
    """The config's table, or --table's of a config of many (`fleet`: the config, when the
    command loaded it already)."""
    table = getattr(args, "table", None)
    fleet = load_tables(args.config) if fleet is None else fleet
    if (config := one_table(fleet)) is not None:
        if table and table.lower() != config.table.identifier.lower():
            raise CommandError(f"--table {table}: this config has one table, {config.table.identifier}")
        return config
    if not table:
        raise CommandError(f"{args.config} declares many tables: give --table <namespace.table>")
    topics: list[str] | None
    try:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({**connection_settings(fleet.kafka.bootstrap_servers, fleet.kafka.consumer), "log_level": 0})
        topics = sorted(admin.list_topics(timeout=5).topics)
    except Exception:  # noqa: BLE001 - the named topics' tables are found without the broker
        topics = None
    return fleet_table(fleet, table, topics)
