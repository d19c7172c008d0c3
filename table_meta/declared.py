"""A table made from its config's declaration, or checked against it, and evolved towards it.

The config declares a table (schema, partition spec, properties); a table that exists is the
truth, so it is checked, never rewritten: `ensure_table` creates the table when absent (with
`BOUNDED_METADATA` and the target file size) and refuses a table its records cannot go into;
`evolve_table` adds what the config adds (`streamberg ingest --evolve`). The columns the
governor dropped as unused (table_meta/column_lifecycle.py) stay dropped: the config may still
declare them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from streamberg.common.catalog import ensure_namespace
from streamberg.common.config import TableConfig
from streamberg.common.errors import SchemaMismatchError
from streamberg.common.log import get_logger
from streamberg.common.metadata_files import BOUNDED_METADATA
from streamberg.common.schema import (
    SchemaEvolution,
    describe_schema_differences,
    partition_spec_from_config,
    plan_schema_evolution,
    schema_from_config,
)
from streamberg.table_meta.column_lifecycle import checked_ignored_fields
from streamberg.table_meta.table_files import TARGET_SIZE_PROPERTY


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
    those fields knowingly (table_meta/column_lifecycle.py), so a config still declaring them fits."""
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
