"""The merge's key state: per key, the sequence and Kafka position of the last change applied.

The table itself holds only the source's columns, and a delete removes its row; so what the
merge needs to refuse an older change (merge/order.py) lives beside it, in the Iceberg table
`<table>_merge_keys` (merge.key_state_table): one row per key, `key` (a struct of the key
columns, so no key column can collide with the state's own names), `seq`, `kafka_partition`,
`kafka_offset`, `source_ts`, `deleted` and `applied_at`.

A deleted key keeps its row (a tombstone) for `merge.deleted_keys_keep_seconds` (7 days), so
an older change replayed after the delete does not bring the row back; then the merge removes
it (at most once an hour). Live keys are kept for as long as they live.

Iceberg commits one table at a time. The merge commits the key state first, recording in its
summary the change-log snapshot the merge covers, then the table: a merge killed between the
two left the key state ahead of the table. The next merge sees it (`recorded` differs from the
table's applied snapshot) and re-applies the changes equal to the stored ones instead of
skipping them as repeats (merge/order.newer_than_stored).
"""

from __future__ import annotations

import time
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table
from pyiceberg.types import (
    BooleanType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from streamberg.common.catalog import ensure_namespace
from streamberg.common.metadata_files import BOUNDED_METADATA
from streamberg.table_meta.changelog import KEY_STATE_COLUMNS
from streamberg.table_meta.offsets import ancestry, summary_properties
from streamberg.table_meta.summary_keys import SummaryKeys

KEY, SEQ, PARTITION, OFFSET, SOURCE_TS, DELETED, APPLIED_AT = KEY_STATE_COLUMNS
# The key state is rewritten in place (copy-on-write): no delete files pile up in a table no
# compactor keeps.
PROPERTIES = {"format-version": "2", "write.merge.mode": "copy-on-write", "write.update.mode": "copy-on-write",
              "write.delete.mode": "copy-on-write", "streamberg.private": "merge-key-state", **BOUNDED_METADATA}
# Tombstones past their keep are removed at most this often (a DELETE reads the whole state).
FORGET_EVERY_SECONDS = 3600.0


def key_state_schema(target: Table, keys: list[str]) -> Schema:
    fields = [target.schema().find_field(k) for k in keys]
    key = StructType(*[NestedField(f.field_id, f.name, f.field_type, required=True) for f in fields])
    return assign_fresh_schema_ids(Schema(
        NestedField(1, KEY, key, required=True),
        NestedField(2, SEQ, StringType(), required=False),
        NestedField(3, PARTITION, IntegerType(), required=True),
        NestedField(4, OFFSET, LongType(), required=True),
        NestedField(5, SOURCE_TS, TimestamptzType(), required=False),
        NestedField(6, DELETED, BooleanType(), required=True),
        NestedField(7, APPLIED_AT, TimestamptzType(), required=True),
    ))


def ensure_key_state(catalog: Catalog, identifier: str, target: Table, keys: list[str]) -> Table:
    """The key state, created empty when absent."""
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        pass
    ensure_namespace(catalog, identifier.rsplit(".", 1)[0])
    try:
        return catalog.create_table(identifier, schema=key_state_schema(target, keys), properties=PROPERTIES)
    except Exception:  # noqa: BLE001 - another merge created it meanwhile: theirs is as good
        return catalog.load_table(identifier)


def recorded(state: Table) -> int | None:
    """The change-log snapshot the key state's newest merge recorded (None: none yet)."""
    for snapshot in ancestry(state):
        value = summary_properties(snapshot).get(SummaryKeys.CHANGELOG_APPLIED)
        if value is not None:
            return int(value)
    return None


class Forgetting:
    """When the merge next removes the tombstones past their keep."""

    def __init__(self, keep_seconds: float) -> None:
        self.keep_seconds = keep_seconds
        self.last: float | None = None

    def due(self) -> bool:
        return self.last is None or time.monotonic() - self.last >= FORGET_EVERY_SECONDS

    def forget(self, spark: Any, spark_name: str) -> None:
        """Remove the deleted keys older than the keep."""
        self.last = time.monotonic()
        cutoff_ms = int((time.time() - self.keep_seconds) * 1000)
        spark.sql(f"DELETE FROM {spark_name} WHERE {DELETED} AND {APPLIED_AT} < timestamp_millis({cutoff_ms})")
