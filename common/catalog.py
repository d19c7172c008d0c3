"""Catalog access shared by ingest, compactor and the CLI.

One SQL catalog (pyiceberg SqlCatalog; SQLite by default, PostgreSQL in production). The
same database is read by Spark's Iceberg JdbcCatalog, so both engines see one table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import sqlalchemy
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from streamberg.common.config import CatalogConfig, TableConfig
from streamberg.common.errors import CatalogUnreachable, SchemaMismatchError
from streamberg.common.log import get_logger
from streamberg.common.metadata_files import PruningSqlCatalog
from streamberg.common.redact import redact, register_secret
from streamberg.common.retry import commit_retrying
from streamberg.common.runtime import current as current_runtime
from streamberg.common.schema import (
    SchemaEvolution,
    describe_schema_differences,
    partition_spec_from_config,
    plan_schema_evolution,
    schema_from_config,
)
from streamberg.common.summary_keys import BOUNDED_METADATA
from streamberg.common.table_files import TARGET_SIZE_PROPERTY

# How long a SQLite connection waits on a lock held by another process (the ingest
# committer, the compactor's JDBC catalog and the CLI all share one file).
SQLITE_BUSY_TIMEOUT_SECONDS = 60


def _sqlalchemy_uri(uri: str) -> str:
    if uri.startswith("sqlite:") and "timeout=" not in uri:
        return f"{uri}{'&' if '?' in uri else '?'}timeout={SQLITE_BUSY_TIMEOUT_SECONDS}"
    return uri


def _prepare_sqlite(uri: str) -> None:
    """Create the SQLite file's folder and switch it to WAL so readers never block the committer."""
    path = uri.removeprefix("sqlite:///").split("?")[0]
    if not path or path == ":memory:":
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = sqlalchemy.create_engine(_sqlalchemy_uri(uri))
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


def _sqlite_path(uri: str) -> str | None:
    path = uri.removeprefix("sqlite:///").split("?")[0]
    return None if not uri.startswith("sqlite:") or not path or path == ":memory:" else path


def open_catalog_readonly(config: CatalogConfig, connect_timeout_seconds: int = 3) -> Catalog:
    """A catalog that has answered one query, opened without creating anything.

    `load_catalog` is for writers: it creates the SQLite file, its folder, the warehouse
    folder and the catalog tables when they are missing. Readers (`streamberg status`,
    `streamberg table`) must never do that: a mistyped path would be hidden behind a new,
    empty catalog. Raises CatalogUnreachable, in one redacted sentence, otherwise.
    """
    from streamberg.common.catalog_kinds import kind_of

    return kind_of(config).open_readonly(config, connect_timeout_seconds)


def open_rest_catalog_readonly(config: CatalogConfig) -> Catalog:
    """Creating nothing is the server's business: one round trip."""
    catalog = open_rest_catalog(config)
    try:
        catalog.list_namespaces()
    except Exception as exc:
        raise CatalogUnreachable(f"REST catalog {redact(config.uri)} cannot be read: "
                                 f"{redact(first_line(exc))}") from exc
    return catalog


def open_sql_catalog_readonly(config: CatalogConfig, connect_timeout_seconds: int) -> Catalog:
    """The SQL catalog's database as it is: a missing SQLite file is an error, not a new catalog."""
    sqlite = _sqlite_path(config.uri)
    if sqlite is not None and not Path(sqlite).is_file():
        raise CatalogUnreachable(f"catalog database {sqlite} does not exist")
    uri = _with_connect_timeout(_sqlalchemy_uri(config.uri), connect_timeout_seconds)
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


def warehouse_location(config: CatalogConfig, catalog: Catalog) -> str | None:
    """Where the catalog keeps its tables, as a location: the SQL catalog's warehouse; for a
    REST catalog the warehouse its server states (the client's properties after /v1/config)
    when that is a location, else None (a warehouse known by name only)."""
    from streamberg.common.catalog_kinds import kind_of

    if not kind_of(config).warehouse_named_by_server:
        return config.warehouse
    for key in ("warehouse", "default-base-location"):  # the latter: Polaris's name for it
        stated = str(catalog.properties.get(key, ""))
        if "://" in stated or stated.startswith("/"):
            return stated
    return None


def state_engine(config: CatalogConfig, catalog: Catalog | None = None) -> sqlalchemy.engine.Engine:
    """The database of streamberg's own small tables (common/private_tables.py): the SQL
    catalog's own, else catalog.state_uri's (one engine per URI in a process)."""
    from streamberg.common.catalog_kinds import kind_of

    kind = kind_of(config)
    uri = kind.state_uri(config)
    if uri is None:  # the catalog's own database
        sql = catalog if catalog is not None else load_catalog(config)
        assert isinstance(sql, SqlCatalog)
        return sql.engine

    def make() -> sqlalchemy.engine.Engine:
        if uri.startswith("sqlite:"):
            _prepare_sqlite(uri)
        engine = sqlalchemy.create_engine(_sqlalchemy_uri(uri))
        if uri.startswith("sqlite:"):
            sqlalchemy.event.listen(engine, "connect", _bounded_wal)
        return engine

    return current_runtime().engine(uri, make)  # one engine a URI, owned by the runtime (common/runtime.py)


def load_catalog(config: CatalogConfig) -> Catalog:
    """The catalog of `config`, for work: its kind's own opening (common/catalog_kinds.py)."""
    from streamberg.common.catalog_kinds import kind_of

    return kind_of(config).open(config)


def shared_catalog(config: CatalogConfig) -> Catalog:
    """The catalog of `config` as the process's runtime holds it (common/runtime.py): opened
    once, closed with the runtime."""
    return current_runtime().catalog(config)


def close_shared_catalogs() -> None:
    """Close every catalog, state engine and Kafka client the current runtime holds (the next
    use opens anew): for a process that outlives its catalogs (a test session)."""
    current_runtime().close()


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
        _prepare_sqlite(config.uri)
    if config.warehouse.startswith("file://"):
        Path(config.warehouse.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    # Processes opening a new catalog database together (`streamberg run` starts the ingest,
    # compactor and maintenance at once) race in pyiceberg's create-if-missing of its own
    # tables; the database is fine a moment later.
    catalog = commit_retrying(CATALOG_TABLES_RETRIES, _lost_catalog_tables_race)(
        PruningSqlCatalog, config.name, uri=_sqlalchemy_uri(config.uri), warehouse=config.warehouse,
        **config.properties)
    if config.uri.startswith("sqlite:"):
        sqlalchemy.event.listen(catalog.engine, "connect", _bounded_wal)
        catalog.engine.dispose()  # pooled connections were opened before the listener
    return catalog


# The SQLite WAL is reused from its start after each checkpoint (auto-checkpoint at 1000
# pages), so it never grows past the largest burst between two; this truncates it back to
# 64 MB after one. A per-connection setting: every connection streamberg opens sets it.
SQLITE_WAL_LIMIT_BYTES = 64 * 1024 * 1024


def _bounded_wal(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA journal_size_limit = {SQLITE_WAL_LIMIT_BYTES}")
    cursor.close()


def ensure_namespace(catalog: Catalog, namespace: str) -> None:
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass


def routed_values(catalog: Catalog, namespace: str, topic: str, made: Callable[[str], str] | None = None,
                  refused: dict[str, str] | None = None) -> list[str]:
    """The route values (common/config/fleet.py route_field) whose tables `topic` feeds in
    `namespace`: the tables' own record of them (table properties the ingest writes).

    The record is trusted only as far as it validates: anyone can write table properties, so
    a value that is not a route value, or (`made`: the route's rule, value -> identifier) one
    whose table would be another than the table that records it, is skipped and put in
    `refused` under the recording table's own name, never raised."""
    from streamberg.common.config.fleet import ROUTE_TOPIC_PROPERTY, ROUTE_VALUE_PROPERTY, route_value

    try:
        identifiers = catalog.list_tables(namespace)
    except Exception:  # noqa: BLE001 - no namespace yet: no table yet
        return []
    values = set()
    for identifier in identifiers:
        name = ".".join(identifier) if isinstance(identifier, tuple) else str(identifier)
        try:
            props = catalog.load_table(identifier).properties
        except Exception:  # noqa: BLE001 - dropped meanwhile, or a table pyiceberg cannot read
            continue
        if props.get(ROUTE_TOPIC_PROPERTY) != topic or ROUTE_VALUE_PROPERTY not in props:
            continue
        recorded = props[ROUTE_VALUE_PROPERTY]
        try:
            value = route_value(recorded)
            if made is not None and made(value).lower() != name.lower():
                raise ValueError(f"{recorded[:60]!r} makes table {made(value)}, not this one")
        except ValueError as exc:
            if refused is not None:
                refused[name] = (f"table property {ROUTE_VALUE_PROPERTY}={str(recorded)[:60]!r} of topic {topic!r} is "
                                 f"not a route value this config makes ({exc}); the table is not kept as a route's")
            continue
        values.add(value)
    return sorted(values)


def ensure_table(catalog: Catalog, table: TableConfig, derive: Callable[[], Schema] | None = None,
                 made_with: Mapping[str, str] | None = None) -> Table:
    """Create the table from the config when absent; when present, check it can take our records.

    `derive`: where the schema of a table to create comes from when the config declares none
    (the registry's writer schema of an Avro topic); asked only then. `made_with`: properties
    a table made here starts with (a route's topic: recorded in the creating commit, not in
    a second one)."""
    log = get_logger("catalog", table=table.identifier)
    ensure_namespace(catalog, table.namespace)
    try:
        existing = catalog.load_table(table.identifier)
    except NoSuchTableError:
        if table.schema_ is None and derive is None:
            raise SchemaMismatchError(
                f"table {table.identifier} does not exist and the config declares no table.schema to create it "
                "from: declare the schema (the table is the truth only once it exists)") from None
        if table.schema_ is not None:
            expected = schema_from_config(table)
        else:
            assert derive is not None  # checked above
            expected = derive()
        properties = {TARGET_SIZE_PROPERTY: str(table.target_file_size_bytes), **BOUNDED_METADATA, **table.properties,
                      **(made_with or {})}
        try:
            created = catalog.create_table(
                table.identifier, schema=expected,
                partition_spec=partition_spec_from_config(table, expected), properties=properties,
            )
            log.info("table created", location=created.location(), spec=str(created.spec()))
            return created
        except TableAlreadyExistsError:  # another process won the race; check theirs
            existing = catalog.load_table(table.identifier)
    if table.schema_ is None:
        log.info("table.schema not declared: the table's own schema is used", schema_id=existing.schema().schema_id)
    elif problems := describe_schema_differences(_declared_kept(table, existing), existing.schema()):
        raise SchemaMismatchError(
            f"table {table.identifier} exists with a schema the config does not match:\n  - " + "\n  - ".join(problems)
        )
    try:
        wanted_spec = partition_spec_from_config(table, existing.schema())
    except ValueError as exc:  # a source the table lacks (possible when the schema is the table's)
        log.warning("partition spec of the config does not fit the table; writing with the table's spec",
                    table_spec=str(existing.spec()), problem=str(exc))
        return existing
    if [(f.source_id, str(f.transform)) for f in wanted_spec.fields] != [
        (f.source_id, str(f.transform)) for f in existing.spec().fields
    ]:
        log.warning("partition spec differs from the config; writing with the table's spec",
                    table_spec=str(existing.spec()), config_spec=str(wanted_spec))
    return existing


def _declared_kept(table: TableConfig, existing: Table) -> Schema:
    """The config's schema less the columns the governor dropped as unused: the ingest ignores
    those fields knowingly (common/column_lifecycle.py), so a config still declaring them fits."""
    from streamberg.common.column_lifecycle import checked_ignored_fields

    declared = schema_from_config(table)
    ignored = checked_ignored_fields(table.identifier, existing.properties,
                                     [f.name for f in existing.schema().fields])
    if not ignored:
        return declared
    return Schema(*[f for f in declared.fields if f.name not in ignored], schema_id=declared.schema_id,
                  identifier_field_ids=list(declared.identifier_field_ids))


def evolve_table(catalog: Catalog, table: TableConfig, dry_run: bool = False) -> SchemaEvolution:
    """Add the config's optional columns the table lacks (and relax required ones) in one commit.

    Raises SchemaMismatchError, changing nothing, when the config differs in any other way.
    """
    existing = catalog.load_table(table.identifier)
    if table.schema_ is None:
        return SchemaEvolution(table.identifier)  # no declared schema: nothing to evolve towards
    # Columns dropped as unused stay dropped (their names are the table's ignored fields).
    plan = plan_schema_evolution(table.identifier, _declared_kept(table, existing), existing.schema())
    if plan.refused:
        raise SchemaMismatchError(
            f"table {table.identifier}: --evolve changes nothing, because the config differs in ways it does not "
            f"make:\n  - " + "\n  - ".join(plan.refused))
    if dry_run or not plan.changes:
        return plan
    with existing.update_schema() as update:
        for parent, f in plan.add:
            # pyiceberg adds under a struct, a list's element struct or a map's value struct by
            # the parent's path, and gives the new field (and what it nests) fresh ids.
            update.add_column((*parent.split("."), f.name) if parent else f.name, f.field_type, doc=f.doc)
        for path in plan.make_optional:
            update.make_column_optional(path)
    get_logger("catalog", table=table.identifier).info(
        "schema evolved", changes=plan.changes, schema_id=catalog.load_table(table.identifier).schema().schema_id)
    return plan
