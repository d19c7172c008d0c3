"""Open the catalog for reading only, and say plainly why it cannot be opened.

`common.catalog.load_catalog` is for writers: it creates the SQLite file, its folder and
the catalog tables when they are missing. A status check must never do that (it would
hide a wrong path behind a new empty catalog), and must not wait long for a database
nobody answers for. So this opens pyiceberg's SqlCatalog without creating anything, with a
short connect timeout for PostgreSQL, and turns every failure into one sentence.
"""

from __future__ import annotations

from pathlib import Path

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog

from streamberg.common.catalog import _sqlalchemy_uri
from streamberg.common.config import CatalogConfig


class CatalogUnreachable(RuntimeError):
    """The catalog database cannot be read; the message says which and why."""


def _with_connect_timeout(uri: str, seconds: int) -> str:
    # libpq waits for the OS TCP timeout (minutes) on a host that drops packets.
    if uri.startswith("postgresql") and "connect_timeout=" not in uri:
        return f"{uri}{'&' if '?' in uri else '?'}connect_timeout={seconds}"
    return uri


def _sqlite_path(uri: str) -> str | None:
    path = uri.removeprefix("sqlite:///").split("?")[0]
    return None if not uri.startswith("sqlite:") or not path or path == ":memory:" else path


def first_line(exc: BaseException) -> str:
    """A driver error's first line (SQLAlchemy appends SQL and a help link below it)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def open_catalog_readonly(config: CatalogConfig, connect_timeout_seconds: int = 3) -> Catalog:
    """A catalog that has answered one query; raise CatalogUnreachable otherwise."""
    sqlite = _sqlite_path(config.uri)
    if sqlite is not None and not Path(sqlite).is_file():
        raise CatalogUnreachable(f"catalog database {sqlite} does not exist")
    uri = _with_connect_timeout(_sqlalchemy_uri(config.uri), connect_timeout_seconds)
    try:
        catalog = SqlCatalog(config.name, uri=uri, warehouse=config.warehouse, init_catalog_tables="false",
                             **config.properties)
        # One real round trip: engines connect lazily, so an unreachable database would
        # otherwise surface later, in the middle of reading a table.
        catalog.list_namespaces()
    except Exception as exc:  # noqa: BLE001 - any driver failure means "unreachable" here
        raise CatalogUnreachable(f"catalog database {_redacted(config.uri)} cannot be read: {first_line(exc)}") from exc
    return catalog


def _redacted(uri: str) -> str:
    """The URI without its password (it ends up in logs and alerts)."""
    scheme, sep, rest = uri.partition("://")
    if "@" not in rest:
        return uri
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}"
