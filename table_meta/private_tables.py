"""streamberg's own tables in the catalog database (beside the Iceberg catalog's tables):
the compactor's leases and the maintenance run log. One place declares them and creates
them on first use, so every private table is named, prefixed and created the same way."""

from __future__ import annotations

import threading

import sqlalchemy as sa
from sqlalchemy.engine import Engine

PREFIX = "streamberg_"
_metadata = sa.MetaData()
_lock = threading.Lock()  # one creator at a time in this process


def private_table(name: str, *columns: sa.Column | sa.Index) -> sa.Table:
    """Declare a private table; its name must carry the `streamberg_` prefix, so it can never
    be mistaken for (or collide with) a table of the Iceberg catalog."""
    if not name.startswith(PREFIX):
        raise ValueError(f"private table {name!r} must start with {PREFIX!r}")
    return sa.Table(name, _metadata, *columns)


def ensure_private_table(engine: Engine, table: sa.Table) -> None:
    """Create the table if the database does not have it yet (idempotent, and safe when many
    threads or processes ask at once: the governor's concurrent actions on a fresh catalog).
    Another creator winning the race between the check and the create is no error: the table
    is there, which is all that was asked."""
    with _lock:
        try:
            _metadata.create_all(engine, tables=[table], checkfirst=True)
        except sa.exc.DatabaseError:
            if not sa.inspect(engine).has_table(table.name):
                raise


def ensure_private_tables(engine: Engine) -> None:
    """Create every private table this process declared (the modules that declare them were
    imported): a service that runs many actions at once does this once, before any of them."""
    for table in list(_metadata.sorted_tables):
        ensure_private_table(engine, table)


def table_key_columns(primary_key: bool) -> tuple[sa.Column, sa.Column]:
    """The columns that name an Iceberg table in a private table: its catalog and identifier
    (the primary key of a table with one row per Iceberg table)."""
    return (sa.Column("catalog_name", sa.String(255), primary_key=primary_key, nullable=False),
            sa.Column("table_identifier", sa.String(255), primary_key=primary_key, nullable=False))
