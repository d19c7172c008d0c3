"""The record of each maintenance run: one row in the catalog database.

Written by maintenance (`record_run`), read by monitoring (`last_maintenance_run`): the
table below is their contract, so it lives here.

Table ``streamberg_maintenance_runs`` (created on first write, next to pyiceberg's
``iceberg_tables`` and the compactor's lease table, so every host that shares the catalog
sees it)::

    run_id                      primary key
    catalog_name, table_identifier
    started_at, finished_at     epoch seconds
    dry_run                     dry runs are recorded too, and told apart
    status                      ok | failed (a step failed) | stopped (stop requested between steps)
    bytes_freed                 total space that came back
    result                      the run's JSON object (what `streamberg maintain --json` prints)

Not every step makes a snapshot (orphan removal and expiry only delete files), so the
snapshot summary could not hold this; a row per run can, including dry runs and failures.
``streamberg status`` reads it through :func:`last_maintenance_run`.
"""

from __future__ import annotations

import json
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from streamberg.common.config import StreambergConfig
from streamberg.common.times import iso_from_epoch
from streamberg.table_meta.private_tables import ensure_private_table, private_table, table_key_columns

RUNS_TABLE = "streamberg_maintenance_runs"
runs = private_table(
    RUNS_TABLE,
    sa.Column("run_id", sa.String(64), primary_key=True),
    *table_key_columns(primary_key=False),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("finished_at", sa.Float, nullable=False),
    sa.Column("dry_run", sa.Boolean, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("bytes_freed", sa.BigInteger, nullable=False),
    sa.Column("result", sa.Text, nullable=False),
    sa.Index("ix_streamberg_maintenance_runs_table", "catalog_name", "table_identifier", "finished_at"),
)


# Maintenance runs kept per table (an hourly pass: about six weeks).
KEEP_RUNS = 1000


def record_run(engine: Engine, catalog_name: str, result: dict[str, Any], *, started_at: float,
               finished_at: float) -> None:
    """Persist one run's result object (see maintenance/maintainer.py, Maintainer.run, for its keys)."""
    ensure_private_table(engine, runs)
    with engine.begin() as conn:
        conn.execute(runs.insert().values(
            run_id=result["run_id"], catalog_name=catalog_name, table_identifier=result["table"],
            started_at=started_at, finished_at=finished_at,
            dry_run=bool(result["dry_run"]), status=result["status"], bytes_freed=int(result["bytes_freed"]),
            result=json.dumps(result),
        ))
        # Bounded for months: the newest KEEP_RUNS runs of the table stay, older ones go.
        mine = (runs.c.catalog_name == catalog_name) & (runs.c.table_identifier == result["table"])
        cutoff = conn.execute(sa.select(runs.c.finished_at).where(mine).order_by(runs.c.finished_at.desc())
                              .offset(KEEP_RUNS - 1).limit(1)).scalar()
        if cutoff is not None:
            conn.execute(runs.delete().where(mine & (runs.c.finished_at < cutoff)))


def runs_recorded(engine: Engine) -> bool:
    """Whether the database holds the runs table at all (no run was ever recorded if not)."""
    return sa.inspect(engine).has_table(RUNS_TABLE)


def newest_runs(engine: Engine, catalog_name: str) -> dict[str, Any]:
    """The newest recorded run (not a dry run) of every table of the catalog, by identifier:
    one query for a pass over many tables (one a table was a tenth of a governor's CPU over
    1,000 tables). The runs table must exist (runs_recorded)."""
    latest = (sa.select(runs.c.table_identifier, sa.func.max(runs.c.finished_at).label("finished_at"))
              .where(runs.c.catalog_name == catalog_name, runs.c.dry_run.is_(False))
              .group_by(runs.c.table_identifier).subquery())
    query = (sa.select(runs)
             .join(latest, sa.and_(runs.c.table_identifier == latest.c.table_identifier,
                                   runs.c.finished_at == latest.c.finished_at))
             .where(runs.c.catalog_name == catalog_name, runs.c.dry_run.is_(False))
             .order_by(runs.c.run_id))
    with engine.connect() as conn:
        return {row.table_identifier: row for row in conn.execute(query)}


def last_maintenance_run(config: StreambergConfig, *, engine: Engine | None = None,
                         include_dry_runs: bool = False, now: float | None = None,
                         recorded: bool | None = None, newest: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The newest recorded maintenance run of the config's table, or None when there is none.

    Returns ``{"run_id", "started_at", "finished_at" (ISO-8601 UTC), "age_seconds" (since it
    finished), "status", "dry_run", "bytes_freed", "duration_seconds", "result"}`` where
    ``result`` is the run's full JSON object. Never creates anything; a catalog database that
    cannot be reached raises SQLAlchemy's OperationalError (the caller reports it).
    `recorded`: runs_recorded(engine), where the caller asked it once for many tables;
    `newest`: newest_runs(engine, catalog), where it read them once for many (no dry runs).
    """
    if newest is not None and not include_dry_runs:
        found = newest.get(config.table.identifier)
        return _run_of(found, now) if found is not None else None
    if engine is None:
        from streamberg.common.catalog import state_engine

        engine = state_engine(config.catalog)
    if not (recorded if recorded is not None else runs_recorded(engine)):
        return None
    query = (sa.select(runs)
             .where(runs.c.catalog_name == config.catalog.name, runs.c.table_identifier == config.table.identifier)
             .order_by(runs.c.finished_at.desc()).limit(1))
    if not include_dry_runs:
        query = query.where(runs.c.dry_run.is_(False))
    with engine.connect() as conn:
        row = conn.execute(query).first()
    return _run_of(row, now) if row is not None else None


def _run_of(row: Any, now: float | None) -> dict[str, Any]:
    now = now if now is not None else time.time()
    return {
        "run_id": row.run_id,
        "started_at": iso_from_epoch(row.started_at, "seconds"),
        "finished_at": iso_from_epoch(row.finished_at, "seconds"),
        "age_seconds": round(max(0.0, now - row.finished_at), 1),
        "status": row.status,
        "dry_run": bool(row.dry_run),
        "bytes_freed": int(row.bytes_freed),
        "duration_seconds": round(row.finished_at - row.started_at, 3),
        "result": json.loads(row.result),
    }
