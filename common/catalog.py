"""What works on tables through a catalog, shared by ingest, compactor and the CLI: a
catalog opened by its kind (common/catalog_kinds.py; read-only for readers, the shared one
the runtime's), tables and namespaces made or checked, route records, schema evolution, and
the database of streamberg's own tables.

How each kind is opened lives a floor below (common/catalog_open.py). A SQL catalog's
database (SQLite by default, PostgreSQL in production) is read by Spark's Iceberg
JdbcCatalog too, so both engines see one table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import sqlalchemy
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from streamberg.common.catalog_kinds import kind_of
from streamberg.common.catalog_open import bounded_wal, prepare_sqlite, sqlalchemy_uri
from streamberg.common.config import CatalogConfig, TableConfig
from streamberg.common.errors import SchemaMismatchError
from streamberg.common.log import get_logger
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
    """The database of streamberg's own small tables (common/private_tables.py): the SQL
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
