"""Columns nobody reads, dropped knowingly (docs/governor.md, Column lifecycle).

A column no reported scan read (by field id, a leaf's read counting for its ancestors) in a
whole `streamberg.columns.unused_after_days` window *with the column present* is *unused*
(table_meta/query_stats.unused_columns). With `streamberg.columns.drop_unused=true` and the
acknowledgement `streamberg.columns.reporting_engines` (every engine reading the table
reports its scans: the one assumption) the governor drops it (maintenance/columns.py) and
records its name in the table's property `streamberg.ingest.ignored-fields`, and what was
dropped, when and why in `streamberg.columns.dropped`, in the same commit. The ingest then ignores that field
of the records knowingly: counted per path in every commit's field sightings (as a field
the schema lacks is counted with `schema_evolution: off`), never added back by schema
evolution, never a dead letter. The next rewrite of a file (compaction) leaves the dropped
column's bytes behind. Undo: remove the name from the property; with `schema_evolution:
add` the ingest adds the column again for new records (older rows read it as null).

Never dropped, whatever the statistics say: a primary-key or identifier column, a partition
source, a clustering column (configured, or chosen by `auto`: the config passed here is the
table's effective one, table_meta/policy.table_settings), the sequence, retention (the rows'
record time), key or route column, and the change log's own columns.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from streamberg.common.config import CHANGELOG_COLUMNS, StreambergConfig
from streamberg.common.errors import IgnoredFieldsRefused

IGNORED_FIELDS_PROPERTY = "streamberg.ingest.ignored-fields"
# What the governor dropped, when and why: a JSON list, the newest last (the table's history).
DROPPED_PROPERTY = "streamberg.columns.dropped"
# At most this many names recorded (a property is read at every writer's open).
MAX_IGNORED = 500
MAX_DROP_LOG = 100


def ignored_fields(properties: Mapping[str, str]) -> set[str]:
    """The top-level fields the ingest ignores (a value that does not parse ignores none)."""
    text = properties.get(IGNORED_FIELDS_PROPERTY)
    if not text:
        return set()
    try:
        names = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: a value nested thousands deep
        return set()
    if not isinstance(names, list):
        return set()
    return {n for n in names[:MAX_IGNORED] if isinstance(n, str) and n}


def checked_ignored_fields(identifier: str, properties: Mapping[str, str], columns: list[str]) -> set[str]:
    """`ignored_fields`, refused (IgnoredFieldsRefused) when one names a column the table still
    has: the governor records a name only in the commit that drops its column, so such an
    entry was edited or forged, and following it would leave that column's values unwritten."""
    ignored = ignored_fields(properties)
    present = sorted(ignored & set(columns))
    if present:
        raise IgnoredFieldsRefused(
            f"table {identifier}: its property {IGNORED_FIELDS_PROPERTY} names {', '.join(present)}, "
            f"{'a column' if len(present) == 1 else 'columns'} the table still has; the governor names a field "
            f"there only when it drops the column, so the value was edited by hand: remove "
            f"{'that name' if len(present) == 1 else 'those names'} from the property (the ingest of this table "
            f"waits until then; the others go on)")
    return ignored


def protected_columns(config: StreambergConfig, table: Any) -> dict[str, str]:
    """column -> why it is never dropped."""
    out: dict[str, str] = {}
    schema = table.schema()
    for field_id in schema.identifier_field_ids:
        out[schema.find_column_name(field_id) or str(field_id)] = "an identifier column"
    for name in config.table.primary_key or []:
        out[name] = "a primary-key column"
    for spec in table.specs().values():
        for part in spec.fields:
            name = schema.find_column_name(part.source_id)
            if name is not None:
                out[name.split(".")[0]] = "a partition source"
    for name in config.compactor.columns:
        out[str(name).split(".")[0]] = "a clustering column"
    named = {"the sequence column": config.table.sequence_field,
             "the retention column": config.maintenance.retention.column,
             "the key column": config.kafka.key_field,
             "the route column": config.route_field}
    for why, name in named.items():
        if name:
            out[str(name).split(".")[0]] = why
    for name in CHANGELOG_COLUMNS:
        out[name] = "a change-log column"
    return out


def droppable(config: StreambergConfig, table: Any, unused: list[str]) -> tuple[list[str], dict[str, str]]:
    """Of the unused columns, those that may go, and those kept with why."""
    protected = protected_columns(config, table)
    top = {f.name for f in table.schema().fields}
    kept = {c: protected[c] for c in unused if c in protected}
    drop = [c for c in unused if c in top and c not in protected]
    if drop and len(drop) == len(top):
        kept.update({c: "the table's last columns" for c in drop})
        drop = []
    return drop, kept
