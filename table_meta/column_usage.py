"""A table's columns by field id, across its schema history: what a scan report's names and
ids refer to, which top-level column each leaf belongs to, and since when each field is
proven to exist. The facts behind "this column is unused" (table_meta/query_stats.usage).

Scan reports name what they read as the engine saw it: leaves (`geo.city`, `tags.element`,
`attrs.key`, `attrs.value`), sometimes ids (`projected-field-ids`), under the names of the
schema of the moment. So a name is resolved against every schema the table ever had (a
renamed column keeps its field id and so its history), and a use of a leaf is a use of every
ancestor up to its top-level column. When unsure, a name counts for every field it ever
named: the error is always towards "used".
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pyiceberg.schema import Schema, index_by_id, index_by_name
from pyiceberg.types import ListType, MapType, StructType


def _children(field_type: Any) -> list[int]:
    if isinstance(field_type, StructType):
        return [f.field_id for f in field_type.fields]
    if isinstance(field_type, ListType):
        return [field_type.element_id]
    if isinstance(field_type, MapType):
        return [field_type.key_id, field_type.value_id]
    return []


@dataclass(frozen=True)
class ColumnFacts:
    """What usage needs of one table, read once from its metadata."""

    uuid: str
    top: dict[int, str]  # the current schema's top-level field ids -> names
    ids_of_name: dict[str, frozenset[int]]  # every dotted name any schema gave a field -> those ids
    parent: dict[int, int]  # field id -> its parent's, over every schema (ids never move)
    appeared: dict[int, float]  # field id -> the earliest snapshot (epoch s) whose schema holds it
    current_ids: frozenset[int]  # every field id of the current schema, nested ones too
    loaded_at: float  # when these facts were read

    def top_of(self, field_id: int) -> int | None:
        """The top-level field id holding `field_id` (itself when top-level), None when it is
        not a column of the current schema."""
        seen = 0
        while field_id not in self.top:
            found = self.parent.get(field_id)
            seen += 1
            if found is None or seen > 1000:
                return None
            field_id = found
        return field_id

    def tops_of_name(self, name: str) -> set[int]:
        out = set()
        for field_id in self.ids_of_name.get(name, ()):
            top = self.top_of(field_id)
            if top is not None:
                out.add(top)
        return out

    @classmethod
    def of_schemas(cls, uuid: str, current: Schema, history: list[Schema],
                   appeared: dict[int, float] | None = None, loaded_at: float | None = None) -> ColumnFacts:
        ids_of_name: dict[str, set[int]] = {}
        parent: dict[int, int] = {}
        for schema in [*history, current]:
            for name, field_id in index_by_name(schema).items():
                ids_of_name.setdefault(name, set()).add(field_id)
            for field_id, found in index_by_id(schema).items():
                for child in _children(found.field_type):
                    parent[child] = field_id
        return cls(uuid=uuid, top={f.field_id: f.name for f in current.fields},
                   ids_of_name={n: frozenset(i) for n, i in ids_of_name.items()}, parent=parent,
                   appeared=dict(appeared or {}), current_ids=frozenset(index_by_id(current)),
                   loaded_at=time.time() if loaded_at is None else loaded_at)

    @classmethod
    def of_table(cls, table: Any) -> ColumnFacts:
        """From a pyiceberg table: its schemas, and each field's earliest snapshot (a snapshot
        records the schema it was written with: proof the field existed then)."""
        metadata = table.metadata
        schemas = {s.schema_id: s for s in metadata.schemas}
        first_use: dict[int, float] = {}  # schema id -> its earliest snapshot (one pass over them)
        for snapshot in metadata.snapshots:
            if snapshot.schema_id is not None:
                at = snapshot.timestamp_ms / 1000
                first_use[snapshot.schema_id] = min(at, first_use.get(snapshot.schema_id, at))
        appeared: dict[int, float] = {}
        for schema_id, at in first_use.items():
            if (schema := schemas.get(schema_id)) is None:
                continue
            for field_id in index_by_id(schema):
                if at < appeared.get(field_id, float("inf")):
                    appeared[field_id] = at
        return cls.of_schemas(str(metadata.table_uuid), table.schema(), list(schemas.values()), appeared)
