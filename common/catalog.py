"""What works on tables through a catalog, shared by ingest, compactor and the CLI: a
catalog opened by its kind (common/catalog_kinds.py; read-only for readers, the shared one
the runtime's), namespaces made, route records, and the database of streamberg's own tables.
A table made or checked against its config is table_meta/declared.py's.

How each kind is opened lives a floor below (common/catalog_open.py). A SQL catalog's
database (SQLite by default, PostgreSQL in production) is read by Spark's Iceberg
JdbcCatalog too, so both engines see one table.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError

from streamberg.common.catalog_kinds import kind_of
from streamberg.common.catalog_open import bounded_wal, prepare_sqlite, sqlalchemy_uri
from streamberg.common.config import CatalogConfig
from streamberg.common.runtime import current as current_runtime


def open_catalog_readonly(config: CatalogConfig, connect_timeout_seconds: int = 3) -> Catalog:
    """A catalog that has answered one query, opened without creating anything.

    `load_catalog` is for writers: it creates the SQLite file, its folder, the warehouse
    folder and the catalog tables when they are missing. Readers (`streamberg status`,
    `streamberg table`) must never do that: a mistyped path would be hidden behind a new,
    empty catalog. Raises CatalogUnreachable, in one redacted sentence, otherwise.
    """
    return kind_of(config).open_readonly(config, connect_timeout_seconds)


def warehouse_location(config: CatalogConfig, catalog: Catalog) -> str | None:
    """Where the catalog keeps its tables, as a location: the SQL catalog's warehouse; for a
    REST catalog the warehouse its server states (the client's properties after /v1/config)
    when that is a location, else None (a warehouse known by name only)."""
    if not kind_of(config).warehouse_named_by_server:
        return config.warehouse
    for key in ("warehouse", "default-base-location"):  # the latter: Polaris's name for it
        stated = str(catalog.properties.get(key, ""))
        if "://" in stated or stated.startswith("/"):
            return stated
    return None


def state_engine(config: CatalogConfig, catalog: Catalog | None = None) -> sqlalchemy.engine.Engine:
    """The database of streamberg's own small tables (table_meta/private_tables.py): the SQL
    catalog's own, else catalog.state_uri's (one engine per URI in a process)."""
    kind = kind_of(config)
    uri = kind.state_uri(config)
    if uri is None:  # the catalog's own database
        sql = catalog if catalog is not None else shared_catalog(config)
        assert isinstance(sql, SqlCatalog)
        return sql.engine

    def make() -> sqlalchemy.engine.Engine:
        if uri.startswith("sqlite:"):
            prepare_sqlite(uri)
        engine = sqlalchemy.create_engine(sqlalchemy_uri(uri))
        if uri.startswith("sqlite:"):
            sqlalchemy.event.listen(engine, "connect", bounded_wal)
        return engine

    return current_runtime().engine(uri, make)  # one engine a URI, owned by the runtime (common/runtime.py)


def load_catalog(config: CatalogConfig) -> Catalog:
    """The catalog of `config`, for work: its kind's own opening (common/catalog_kinds.py)."""
    return kind_of(config).open(config)


def shared_catalog(config: CatalogConfig) -> Catalog:
    """The catalog of `config` as the process's runtime holds it (common/runtime.py): opened
    once, closed with the runtime."""
    return current_runtime().catalog(config)


def close_shared_catalogs() -> None:
    """Close every catalog, state engine and Kafka client the current runtime holds (the next
    use opens anew): for a process that outlives its catalogs (a test session)."""
    current_runtime().close()


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
