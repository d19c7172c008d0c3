"""How many tables a route, or a job, may make: counted once for every writer, exactly.

A many-table ingest makes tables as records ask for them (a route field's new value), in
parallel writers that do not talk to each other. A count kept in each writer's memory lets
every writer make its own `max_tables_per_route` (two writers made 6 tables of a cap of 3), so
the count lives in the catalog's database, in streamberg's private table
`streamberg_table_slots`: a table takes one numbered slot of its scope (a route, a job), and
the database's primary key (scope, slot) makes two writers racing for the last slot end with
one winner. A table that holds a slot keeps it (a restart, another writer opening the same
table: the same slot), so the count is of tables, never of attempts.
"""

from __future__ import annotations

import hashlib
import time

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from streamberg.table_meta.private_tables import ensure_private_table, private_table

SLOTS_TABLE = "streamberg_table_slots"
slots = private_table(
    SLOTS_TABLE,
    sa.Column("catalog_name", sa.String(255), primary_key=True, nullable=False),
    sa.Column("scope", sa.String(255), primary_key=True, nullable=False),
    sa.Column("slot", sa.Integer, primary_key=True, nullable=False),
    sa.Column("table_identifier", sa.String(255), nullable=False),
    sa.Column("claimed_at", sa.Float, nullable=False),
    sa.UniqueConstraint("catalog_name", "scope", "table_identifier", name="uq_streamberg_table_slots_table"),
)


def scope_of(kind: str, *parts: str) -> str:
    """A scope's key: its kind and a short digest of what names it (a route's identifier
    template and topics, a job's routes), bounded to fit the column whatever the names."""
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:24]
    return f"{kind}:{digest}"


def claim(engine: Engine, catalog_name: str, scope: str, identifier: str, cap: int) -> bool:
    """Give `identifier` a slot of `scope` (True), or say there is none left of `cap` (False).
    Idempotent: a table holding a slot keeps it."""
    ensure_private_table(engine, slots)
    key = sa.and_(slots.c.catalog_name == catalog_name, slots.c.scope == scope)
    for _ in range(cap + 1):
        with engine.connect() as conn:
            rows = conn.execute(sa.select(slots.c.slot, slots.c.table_identifier).where(key)).all()
        if any(r.table_identifier == identifier for r in rows):
            return True
        free = sorted(set(range(cap)) - {r.slot for r in rows})
        if not free:
            return False
        try:
            with engine.begin() as conn:
                conn.execute(slots.insert().values(catalog_name=catalog_name, scope=scope, slot=free[0],
                                                   table_identifier=identifier, claimed_at=time.time()))
            return True
        except sa.exc.IntegrityError:
            continue  # another writer took that slot, or claimed this table: look again
    return False


def held(engine: Engine, catalog_name: str, scope: str) -> list[str]:
    """The tables holding a slot of `scope` (status: what a cap counts)."""
    ensure_private_table(engine, slots)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(slots.c.table_identifier).where(
            sa.and_(slots.c.catalog_name == catalog_name, slots.c.scope == scope)).order_by(slots.c.slot)).all()
    return [r.table_identifier for r in rows]
