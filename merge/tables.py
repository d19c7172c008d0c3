"""The primary-key table the merge keeps: made when absent, evolved as its change log is.

The table is format v2 with merge-on-read updates, deletes and merges (position deletes,
which Spark, DuckDB and pyiceberg read alike); its identifier fields are table.primary_key.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import NestedField

from streamberg.common.config import CHANGELOG_COLUMNS, TableConfig
from streamberg.table_meta.declared import ensure_table

# Table properties of a primary-key table (Iceberg's TableProperties names); the config's
# own table.properties may add to them, not change them.
MERGE_ON_READ = {
    "format-version": "2",
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
}


def ensure_target(catalog: Catalog, table: TableConfig) -> Table:
    """The primary-key table, created from the config when absent (checked when present)."""
    made = table.model_copy(update={"properties": {**table.properties, **MERGE_ON_READ}})
    return ensure_table(catalog, made)


def evolve_target(target: Table, changelog: Table, log: Any) -> Table:
    """Add to the table the columns the change log gained (the ingest's schema evolution adds
    them there first), and widen what it widened; never relax a required column.

    The change log's columns are the table's with the required flags relaxed, so the wanted
    schema takes each top-level column's flag from the table where the table has it."""
    have = {f.name: f for f in target.schema().fields}
    wanted = Schema(*[NestedField(field_id=f.field_id, name=f.name, field_type=f.field_type, doc=f.doc,
                                  required=have[f.name].required if f.name in have else False)
                      for f in changelog.schema().fields if f.name not in CHANGELOG_COLUMNS])
    update = target.update_schema()
    update.union_by_name(wanted)
    if update._apply().as_struct() == target.schema().as_struct():
        return target  # the usual case: nothing new, no commit
    update.commit()
    evolved = target.refresh()
    log.info("table schema evolved from its change log", schema_id=evolved.schema().schema_id,
             columns=[f.name for f in evolved.schema().fields if f.name not in have])
    return evolved
