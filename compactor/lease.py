"""One compactor per table: a lease row in the catalog database.

Table ``streamberg_compactor_leases`` (created on first use, next to pyiceberg's
``iceberg_tables`` in the same SQLite/PostgreSQL database)::

    catalog_name, table_identifier   primary key
    owner       "<host>:<pid>:<random>" of the holder
    host, pid   where the holder runs
    acquired_at, expires_at          epoch seconds

A compactor takes the lease when there is no row, when the row has expired, or when the
holder ran on this host and its process is gone (a killed compactor does not block a
restart for a whole TTL). Every take-over is a compare-and-swap on (owner, expires_at), so
two contenders never both win. The holder renews the lease every TTL/3 from a background
thread and checks it before each commit; a compactor that lost its lease commits nothing.
Clocks of hosts sharing a catalog are assumed roughly in sync (NTP); the TTL absorbs skew.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from streamberg.common.errors import LeaseHeldError, LeaseLostError
from streamberg.common.log import get_logger
from streamberg.table_meta.private_tables import ensure_private_table, private_table, table_key_columns

LEASE_TABLE = "streamberg_compactor_leases"
leases = private_table(
    LEASE_TABLE,
    *table_key_columns(primary_key=True),
    sa.Column("owner", sa.String(255), nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("acquired_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
)


@dataclass(frozen=True)
class LeaseHolder:
    owner: str
    host: str
    pid: int
    acquired_at: float
    expires_at: float

    def describe(self, now: float | None = None) -> str:
        now = now if now is not None else time.time()
        return f"{self.owner} (pid {self.pid} on {self.host}, lease expires in {max(0.0, self.expires_at - now):.0f} s)"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class TableLease:
    def __init__(self, engine: Engine, catalog_name: str, table_identifier: str, ttl_seconds: float) -> None:
        self.engine = engine
        self.catalog_name = catalog_name
        self.table_identifier = table_identifier
        self.ttl = ttl_seconds
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.owner = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:8]}"
        self.log = get_logger("compactor.lease", table=table_identifier, owner=self.owner)
        self._held = False
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        ensure_private_table(engine, leases)

    def _key(self) -> sa.ColumnElement[bool]:
        return sa.and_(leases.c.catalog_name == self.catalog_name, leases.c.table_identifier == self.table_identifier)

    def holder(self) -> LeaseHolder | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(leases).where(self._key())).first()
        if row is None:
            return None
        return LeaseHolder(row.owner, row.host, int(row.pid), float(row.acquired_at), float(row.expires_at))

    def try_acquire(self) -> LeaseHolder | None:
        """Take the lease if free; returns None on success, else the current holder."""
        now = time.time()
        current = self.holder()
        values = dict(owner=self.owner, host=self.host, pid=self.pid, acquired_at=now, expires_at=now + self.ttl)
        with self.engine.begin() as conn:
            if current is None:
                try:
                    conn.execute(leases.insert().values(catalog_name=self.catalog_name,
                                                        table_identifier=self.table_identifier, **values))
                except sa.exc.IntegrityError:
                    return self.holder()  # someone inserted first
                self._held = True
                return None
            takeover = (current.owner == self.owner or current.expires_at < now
                        or (current.host == self.host and current.pid != self.pid and not _pid_alive(current.pid)))
            if not takeover:
                return current
            updated = conn.execute(
                leases.update()
                .where(self._key(), leases.c.owner == current.owner, leases.c.expires_at == current.expires_at)
                .values(**values)
            ).rowcount
        if updated != 1:
            return self.holder()
        if current.owner != self.owner:
            self.log.info("lease taken over", previous_owner=current.owner,
                          reason="expired" if current.expires_at < now else "holder process is gone")
        self._held = True
        return None

    def acquire(self, wait_seconds: float = 0.0, poll_seconds: float = 2.0) -> None:
        deadline = time.monotonic() + wait_seconds
        while True:
            holder = self.try_acquire()
            if holder is None:
                self.log.info("lease acquired", ttl_seconds=self.ttl)
                self._start_heartbeat()
                return
            if time.monotonic() >= deadline:
                raise LeaseHeldError(
                    f"table {self.table_identifier} is being compacted by {holder.describe()}; "
                    + ("exiting" if wait_seconds <= 0 else f"gave up after waiting {wait_seconds:g} s")
                )
            self.log.info("lease held by another compactor; waiting", holder=holder.owner,
                          expires_in_seconds=round(holder.expires_at - time.time(), 1))
            time.sleep(min(poll_seconds, max(0.1, deadline - time.monotonic())))

    def renew(self) -> bool:
        now = time.time()
        with self.engine.begin() as conn:
            updated = conn.execute(
                leases.update().where(self._key(), leases.c.owner == self.owner).values(expires_at=now + self.ttl)
            ).rowcount
        return updated == 1

    def check(self) -> None:
        """Raise LeaseLostError unless this process still holds the lease (renews it too)."""
        if not self._held:
            raise LeaseLostError("lease not acquired")
        if self._lost is not None:
            raise LeaseLostError(self._lost)
        if not self.renew():
            self._lost = f"lease on {self.table_identifier} now held by {self.holder().owner if self.holder() else 'nobody'}"
            raise LeaseLostError(self._lost)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._held:
            with self.engine.begin() as conn:
                conn.execute(leases.delete().where(self._key(), leases.c.owner == self.owner))
            self._held = False
            self.log.info("lease released")

    def _start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(self.ttl / 3):
                try:
                    if not self.renew():
                        self._lost = "lease renewal found another owner"
                        self.log.error("lease lost; this compactor will not commit again")
                        return
                except Exception as exc:  # noqa: BLE001 - a missed beat is retried; the TTL covers it
                    self.log.warning("lease renewal failed; retrying", error=str(exc))

        self._stop.clear()
        self._thread = threading.Thread(target=beat, name="streamberg-lease", daemon=True)
        self._thread.start()

    def __enter__(self) -> TableLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
