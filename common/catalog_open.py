"""How each kind of catalog is opened (pyiceberg's clients), for work or read-only, and closed.

The floor below the kinds' registry (common/catalog_kinds.py), which names these openers in
its entries; what works on tables through a catalog (common/catalog.py) stands above both.
Nothing here reads a config file or decides by `catalog.type`: the registry does.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy
from pyiceberg.catalog import Catalog

from streamberg.common.errors import CatalogUnreachable
from streamberg.common.metadata_files import PruningSqlCatalog, pruning_glue_catalog, pruning_hive_catalog
from streamberg.common.redact import redact, register_secret
from streamberg.common.retry import commit_retrying

if TYPE_CHECKING:  # annotations only: the config package's loading stands on the kinds' registry
    from streamberg.common.config.table import CatalogConfig

# How long a SQLite connection waits on a lock held by another process (the ingest
# committer, the compactor's JDBC catalog and the CLI all share one file).
SQLITE_BUSY_TIMEOUT_SECONDS = 60


def sqlalchemy_uri(uri: str) -> str:
    if uri.startswith("sqlite:") and "timeout=" not in uri:
        return f"{uri}{'&' if '?' in uri else '?'}timeout={SQLITE_BUSY_TIMEOUT_SECONDS}"
    return uri


def prepare_sqlite(uri: str) -> None:
    """Create the SQLite file's folder and switch it to WAL so readers never block the committer."""
    path = uri.removeprefix("sqlite:///").split("?")[0]
    if not path or path == ":memory:":
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = sqlalchemy.create_engine(sqlalchemy_uri(uri))
    try:
        for attempt in commit_retrying(WAL_SWITCH_RETRIES, _sqlite_locked):
            with attempt, engine.connect() as conn:
                if conn.exec_driver_sql("PRAGMA journal_mode").scalar() != "wal":
                    conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    finally:
        engine.dispose()


# SQLite answers a change of journal mode with "database is locked" at once, without waiting
# out the busy timeout, while another connection makes the same change: processes started
# together on a new database (a job's writers claiming their tables' slots, `streamberg run`'s
# components) saw it as a failure and paused a table for the run. The file is WAL a moment
# later; a few retries with backoff, then the error as it is.
WAL_SWITCH_RETRIES = 8


def _sqlite_locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlalchemy.exc.OperationalError) and "database is locked" in str(exc.orig)


# For commands that open the catalog to work on it (compact, maintain): long enough for a
# loaded server, short of libpq's wait for the OS TCP timeout on a silent host.
CATALOG_CONNECT_TIMEOUT_SECONDS = 10


def first_line(exc: BaseException) -> str:
    """A driver error's first line (SQLAlchemy appends SQL and a help link below it), redacted."""
    text = str(exc).strip().splitlines()
    return redact(f"{type(exc).__name__}: {text[0] if text else ''}".strip())


def _with_connect_timeout(uri: str, seconds: int) -> str:
    # libpq waits for the OS TCP timeout (minutes) on a host that drops packets.
    if uri.startswith("postgresql") and "connect_timeout=" not in uri:
        return f"{uri}{'&' if '?' in uri else '?'}connect_timeout={seconds}"
    return uri


def sqlite_path(uri: str) -> str | None:
    path = uri.removeprefix("sqlite:///").split("?")[0]
    return None if not uri.startswith("sqlite:") or not path or path == ":memory:" else path


def rest_catalog_readonly(config: CatalogConfig, connect_timeout_seconds: int = 0) -> Catalog:
    """Creating nothing is the server's business: one round trip (its client's own timeouts)."""
    catalog = open_rest_catalog(config)
    try:
        catalog.list_namespaces()
    except Exception as exc:
        raise CatalogUnreachable(f"REST catalog {redact(config.uri)} cannot be read: "
                                 f"{redact(first_line(exc))}") from exc
    return catalog


def open_sql_catalog_readonly(config: CatalogConfig, connect_timeout_seconds: int) -> Catalog:
    """The SQL catalog's database as it is: a missing SQLite file is an error, not a new catalog."""
    sqlite = sqlite_path(config.uri)
    if sqlite is not None and not Path(sqlite).is_file():
        raise CatalogUnreachable(f"catalog database {sqlite} does not exist")
    uri = _with_connect_timeout(sqlalchemy_uri(config.uri), connect_timeout_seconds)
    try:
        catalog = PruningSqlCatalog(config.name, uri=uri, warehouse=config.warehouse, init_catalog_tables="false",
                             **config.properties)
        # One real round trip: engines connect lazily, so an unreachable database would
        # otherwise surface later, in the middle of reading a table.
        catalog.list_namespaces()
    except Exception as exc:
        raise CatalogUnreachable(f"catalog database {redact(config.uri)} cannot be read: {first_line(exc)}") from exc
    return catalog


# Retries of opening a catalog whose tables another process was creating at the same moment.
CATALOG_TABLES_RETRIES = 4


def _lost_catalog_tables_race(exc: BaseException) -> bool:
    """Whether `exc` is another process creating the catalog's tables at the same moment:
    one side sees "no such table", the other "already exists". Anything else is a real error."""
    if not isinstance(exc, sqlalchemy.exc.DatabaseError):
        return False
    # Imported here, on the error path: a SQLite catalog never loads psycopg2 otherwise (~30 ms
    # on every command's start).
    import psycopg2.errors

    if isinstance(exc.orig, psycopg2.Error):
        # PostgreSQL names each way of losing the race by class: the table exists by then
        # (DuplicateTable), both CREATE TABLEs passed the existence check together and the
        # second hit pg_type's unique index (UniqueViolation), or the same for a constraint's
        # name (DuplicateObject).
        return isinstance(exc.orig, (psycopg2.errors.DuplicateTable, psycopg2.errors.UniqueViolation,
                                     psycopg2.errors.DuplicateObject))
    # No class to match: sqlite3 raises OperationalError, with the generic code SQLITE_ERROR,
    # for "no such table" and "table ... already exists" alike, and for real failures too
    # (locked, unreadable, full); only the message tells them apart. Other drivers alike.
    text = str(exc.orig if exc.orig is not None else exc).lower()
    return "no such table" in text or "already exists" in text


def _secret_of(value: str | None, path: str | None, key: str) -> str | None:
    """A secret given as is, or read from a file (a mounted secret), registered for redaction."""
    if path is not None:
        try:
            value = Path(path).read_text().strip()
        except OSError as exc:
            raise CatalogUnreachable(f"catalog.{key}_file {path}: cannot be read ({exc.strerror or exc})") from None
    register_secret(value)
    if key == "credential" and value:  # its secret part alone, as a server's error may quote it
        register_secret(value.partition(":")[2])
    return value


def rest_properties(config: CatalogConfig) -> dict[str, str]:
    """The properties of a REST catalog client, pyiceberg's and Iceberg Java's alike (they
    share the key names): URL, warehouse, authentication and the pass-through properties."""
    props = {"uri": config.uri, **({"warehouse": config.warehouse} if config.warehouse else {})}
    credential = _secret_of(config.credential, config.credential_file, "credential")
    token = _secret_of(config.token, config.token_file, "token")
    if credential:
        props["credential"] = credential
        # Both clients warn when the token endpoint is left implicit (the spec deprecates it).
        props["oauth2-server-uri"] = config.oauth2_server_uri or f"{config.uri.rstrip('/')}/v1/oauth/tokens"
    if token:
        props["token"] = token
    if config.scope:
        props["scope"] = config.scope
    props.update(config.properties)
    return props


def open_metastore_catalog(config: CatalogConfig, catalog_class: type, props: dict[str, str], where: str) -> Catalog:
    """pyiceberg's Glue or Hive catalog (`catalog_class`, common/metadata_files.py: deleting old
    metadata files after each commit as the SQL catalog does). Their clients connect on
    creation or first call: an unreachable service surfaces as one redacted sentence."""
    try:
        catalog = catalog_class(config.name, **{"warehouse": config.warehouse, **config.properties, **props})
        catalog.list_namespaces()
    except Exception as exc:  # noqa: BLE001 - no credentials, no route, a refusal: one clear sentence
        raise CatalogUnreachable(f"{where} cannot be used: {type(exc).__name__}: {redact(first_line(exc))}") from None
    return catalog


def open_rest_catalog(config: CatalogConfig) -> Catalog:
    """pyiceberg's REST client: it fetches /v1/config (and a token) on creation, so an
    unreachable server or refused credentials surface here, in one redacted sentence."""
    from pyiceberg.catalog.rest import RestCatalog

    try:
        return RestCatalog(config.name, **rest_properties(config))
    except CatalogUnreachable:
        raise
    except Exception as exc:  # noqa: BLE001 - connection refused, 401/403, a bad answer: one clear refusal
        text = first_line(exc)
        kind = "" if text.startswith(type(exc).__name__) else f"{type(exc).__name__}: "
        raise CatalogUnreachable(f"REST catalog {redact(config.uri)} cannot be used: {kind}{redact(text)}") from None


def close_catalog(catalog: Catalog | None) -> None:
    """Close a catalog's pooled connections (a SQL catalog's; other kinds hold none here). It
    stays usable: its next call connects anew."""
    engine = getattr(catalog, "engine", None)
    if engine is not None:
        engine.dispose()


def open_sql_catalog(config: CatalogConfig) -> Catalog:
    """pyiceberg's SqlCatalog, made where it is missing (the SQLite file, its folder, the
    warehouse folder, the catalog's tables): what a first run needs."""
    if config.uri.startswith("sqlite:"):
        prepare_sqlite(config.uri)
    if config.warehouse.startswith("file://"):
        Path(config.warehouse.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    # Processes opening a new catalog database together (`streamberg run` starts the ingest,
    # compactor and maintenance at once) race in pyiceberg's create-if-missing of its own
    # tables; the database is fine a moment later.
    catalog = commit_retrying(CATALOG_TABLES_RETRIES, _lost_catalog_tables_race)(
        PruningSqlCatalog, config.name, uri=sqlalchemy_uri(config.uri), warehouse=config.warehouse,
        **config.properties)
    if config.uri.startswith("sqlite:"):
        sqlalchemy.event.listen(catalog.engine, "connect", bounded_wal)
        catalog.engine.dispose()  # pooled connections were opened before the listener
    return catalog


# The SQLite WAL is reused from its start after each checkpoint (auto-checkpoint at 1000
# pages), so it never grows past the largest burst between two; this truncates it back to
# 64 MB after one. A per-connection setting: every connection streamberg opens sets it.
SQLITE_WAL_LIMIT_BYTES = 64 * 1024 * 1024


def bounded_wal(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA journal_size_limit = {SQLITE_WAL_LIMIT_BYTES}")
    cursor.close()


def open_glue_catalog(config: CatalogConfig, timeout: int = 0) -> Catalog:
    """pyiceberg's Glue catalog (the region from glue.region or the environment)."""
    region = config.properties.get("glue.region", "region from the environment")
    return open_metastore_catalog(config, pruning_glue_catalog(), {}, f"glue catalog Glue ({region})")


def open_hive_catalog(config: CatalogConfig, timeout: int = 0) -> Catalog:
    """pyiceberg's Hive catalog (a metastore's thrift URI)."""
    return open_metastore_catalog(config, pruning_hive_catalog(), {"uri": config.uri},
                                  f"hive catalog {redact(config.uri)}")
