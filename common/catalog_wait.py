"""Waiting for what another process makes: the catalog database (the ingest creates a SQLite
catalog at its first start; a database server may still be starting) and a table (made by
the ingest's first commit). The compactor, maintenance and the merge open theirs here, so an
orchestrator starting everything at once sees them wait, not crash-loop. Nothing is created."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from streamberg.common.catalog import open_catalog_readonly
from streamberg.common.catalog_open import CATALOG_CONNECT_TIMEOUT_SECONDS
from streamberg.common.config import CatalogConfig, StreambergConfig
from streamberg.common.errors import CatalogUnreachable, StreambergError
from streamberg.common.log import get_logger
from streamberg.common.redact import redact


def _poll_until(attempt: Callable[[], Any], waiting_for: tuple[type[BaseException], ...], timeout_seconds: float,
                log: Any, message: str, stop: threading.Event | None) -> Any:
    """`attempt()` until it does not raise one of `waiting_for`, with backoff (0.5 s doubling to
    10 s) for up to `timeout_seconds`; then re-raise. None when `stop` is set while waiting."""
    import time

    deadline = time.monotonic() + timeout_seconds
    delay, logged = 0.5, False
    while True:
        try:
            result = attempt()
            if logged:
                log.info("found; starting", waited_for=message)
            return result
        except waiting_for as exc:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise
            if not logged:
                log.info(message, wait_seconds=timeout_seconds, reason=redact(str(exc).splitlines()[0] if str(exc) else ""))
                logged = True
            pause = min(delay, remaining)
            if stop is not None:
                if stop.wait(pause):
                    return None
            else:
                time.sleep(pause)
            delay = min(delay * 2, 10.0)


def wait_for_catalog(config: CatalogConfig, timeout_seconds: float, component: str,
                     stop: threading.Event | None = None) -> Catalog | None:
    """`open_catalog_readonly`, retried for up to `timeout_seconds` while the database cannot be
    read (the ingest creates a SQLite catalog on its first start; a database server may still
    be starting). Raises CatalogUnreachable when the wait is over (0: no wait); None when `stop`
    is set while waiting. Nothing is created either way."""
    log = get_logger(component)
    return _poll_until(lambda: open_catalog_readonly(config, connect_timeout_seconds=CATALOG_CONNECT_TIMEOUT_SECONDS),
                       (CatalogUnreachable,), timeout_seconds, log, "waiting for the catalog database", stop)


def wait_for_table(catalog: Catalog, identifier: str, timeout_seconds: float, component: str,
                   stop: threading.Event | None = None) -> Table | None:
    """Load `identifier`, polling with backoff for up to `timeout_seconds` while it does not exist.

    A compactor or maintenance started beside (or before) the ingest would otherwise fail
    until the ingest's first commit creates the table, and an orchestrator starting them all
    at once would see a crash loop. Raises NoSuchTableError when the wait is over (0: no
    wait); returns None when `stop` is set while waiting.
    """
    log = get_logger(component, table=identifier)
    return _poll_until(lambda: catalog.load_table(identifier), (NoSuchTableError,), timeout_seconds, log,
                       "waiting for the table to be created by the ingest", stop)


def open_existing_table(config: StreambergConfig, component: str, error: type[StreambergError],
                        wait_seconds: float = 0.0,
                        stop: threading.Event | None = None) -> tuple[Catalog | None, Table | None]:
    """Catalog and table, opened without creating anything (a mistyped catalog.uri must not
    leave an empty catalog behind); waits up to `wait_seconds` for the ingest to create the
    catalog database and then the table. The table is None (and the catalog too, if it was
    not open yet) when `stop` was set while waiting.

    `component` ("compactor", "maintenance") names the logger and the config section whose
    `wait_for_table_seconds` the messages cite; a missing catalog or table raises `error`.
    """
    waited = f" after waiting {wait_seconds:g} s ({component}.wait_for_table_seconds)" if wait_seconds else ""
    try:
        catalog = wait_for_catalog(config.catalog, wait_seconds, component, stop)
    except CatalogUnreachable as exc:
        raise error(f"{exc}{waited}") from None
    if catalog is None:
        return None, None
    try:
        return catalog, wait_for_table(catalog, config.table.identifier, wait_seconds, component, stop)
    except NoSuchTableError:
        raise error(f"table {config.table.identifier} does not exist yet in {redact(config.catalog.uri)}{waited} "
                    "(it is created by `streamberg ingest`)") from None
