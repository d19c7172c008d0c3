"""Schema evolution from the records (`ingest.schema_evolution: add`): nothing a record
carries is lost, and no snapshot references a file with a column its schema lacks.

How it runs:
- A writer decodes against the schema it loaded. A record that carries a field the schema
  lacks (decode/unknown_fields.py) is not written by the writer: it is *held*, its raw key
  and value travel in the writer's unit with the inferred types of its new fields.
- The single committer, the only place that assigns field ids, plans the additions
  (`plan_additions`: bounds, names, depth), adds them with Iceberg's schema update, decodes
  the held records against the evolved schema with the ingest's own decoder, writes their
  Parquet file and appends it with the interval's other files, all in ONE transaction: the
  schema change and the first files that carry the new columns become visible together.
  A lost race re-plans against the table it re-reads.
- Writers look at the table's schema again while they hold records (at most once a second)
  and decode against the evolved schema from then on, so only the records of the first
  interval or so take the committer's path. A writer stops reading while it holds more than
  HELD_BYTES_LIMIT, until the schema changed, so a unit stays small.

Only additions: a field the table has keeps its type, and a value that contradicts it is
dead-lettered by the decoder with the field's path and both types. A new field is optional,
so every older row reads it as null. Records whose fields cannot be added (a bound, a name
no engine can resolve, nesting too deep) are dead-lettered with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyiceberg.schema import Schema, index_by_id
from pyiceberg.table import Transaction
from pyiceberg.types import (
    IcebergType,
    ListType,
    MapType,
    StructType,
)

from streamberg.common.config.types import MAX_FIELD_NAME, MAX_SCHEMA_FIELDS, MAX_TYPE_DEPTH, count_fields, depth
from streamberg.common.schema import type_spec
from streamberg.decode.interface import DecodeResult
from streamberg.decode.records import RecordDecoder
from streamberg.decode.types import Widening, join, widens, wider_of
from streamberg.decode.unknown_fields import Path, display
from streamberg.ingest.files import PartitionedFileWriter, WrittenFile
from streamberg.ingest.units import DeadLetter, HeldRecord

# A writer holding more raw bytes than this stops reading until the schema has changed.
HELD_BYTES_LIMIT = 16 * 1024 * 1024
# How often a writer holding records reads the table's schema again.
SCHEMA_RECHECK_SECONDS = 1.0
# Candidate fields one writer carries per unit; beyond, records are still held (and then
# dead-lettered by the committer's bound), but their fields are not listed.
MAX_CANDIDATES_PER_UNIT = MAX_SCHEMA_FIELDS


def merge_candidates(into: dict[Path, IcebergType], path: Path, t: IcebergType) -> None:
    if path in into:
        into[path] = join(into[path], t)
    elif len(into) < MAX_CANDIDATES_PER_UNIT:
        into[path] = t


@dataclass
class SchemaChanges:
    """What records asked of the schema, in the order first seen: fields to add (Iceberg path
    -> inferred type) and columns to widen (path -> the narrowest wider type that takes them)."""

    add: dict[Path, IcebergType] = field(default_factory=dict)
    widen: dict[Path, IcebergType] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.add or self.widen)

    def add_field(self, path: Path, t: IcebergType) -> None:
        merge_candidates(self.add, path, t)

    def widen_to(self, path: Path, t: IcebergType) -> None:
        self.widen[path] = wider_of(self.widen[path], t) if path in self.widen else t

    def merge(self, other: SchemaChanges) -> None:
        for path, t in other.add.items():
            self.add_field(path, t)
        for path, t in other.widen.items():
            self.widen_to(path, t)


def iceberg_path(schema: Schema, dotted: str) -> Path | None:
    """The Iceberg path of a value the decoder names by its dotted path (list and map levels
    left out: `items.qty` is `items.element.qty`, `attrs.n` is `attrs.value.n`, and `scores`
    names the primitive inside: `scores.element`); None when absent."""
    t: IcebergType = schema.as_struct()
    path: list[str] = []

    def step_in() -> IcebergType:
        inner = t
        while isinstance(inner, (ListType, MapType)):
            path.append("element" if isinstance(inner, ListType) else "value")
            inner = inner.element_type if isinstance(inner, ListType) else inner.value_type
        return inner

    for part in dotted.split("."):
        t = step_in()
        if not isinstance(t, StructType):
            return None
        found = next((f for f in t.fields if f.name == part), None)
        if found is None:
            return None
        path.append(part)
        t = found.field_type
    step_in()
    return tuple(path)


@dataclass
class HeldBack:
    """A decoded batch split for schema evolution: the rows to write now, and the records to
    hold for the committer (they carry a field the schema lacks, or a value a wider column
    would take); `rejected` are the batch's dead letters."""

    table: pa.Table
    kept: np.ndarray
    held: np.ndarray  # batch indexes
    rejected: list[tuple[int, str]]


def hold_back(result: DecodeResult, schema: Schema, changes: SchemaChanges) -> HeldBack:
    """Split `result` (decoded with unknown="report"), noting what the held records ask of the
    schema in `changes`."""
    unknown_rows = result.rows_with_unknown()
    for unknown in result.unknown:
        changes.add_field(unknown.path, unknown.type)
    widen_rows: list[int] = []
    rejected: list[tuple[int, str]] = []
    for index, reason in result.rejected:
        wanted = _widenings(schema, reason) if isinstance(reason, Widening) else None
        if wanted is None:
            rejected.append((index, str(reason)))
            continue
        for path, wider in wanted:
            changes.widen_to(path, wider)
        widen_rows.append(index)
    held = np.union1d(unknown_rows, np.asarray(widen_rows, dtype=np.int64)).astype(np.int64)
    if not len(unknown_rows):  # the usual batch: nothing to take out of the table
        return HeldBack(result.table, result.kept, held, rejected)
    keep = ~np.isin(result.kept, unknown_rows)
    return HeldBack(result.table.filter(pa.array(keep)), result.kept[keep], held, rejected)


def _widenings(schema: Schema, reason: Widening) -> list[tuple[Path, IcebergType]] | None:
    """The columns a Widening asks for, as Iceberg paths; None when one of them is not a
    widening the schema allows (the record is then a dead letter with the reason)."""
    out = []
    for dotted, wider in reason.columns():
        path = iceberg_path(schema, dotted)
        if path is None or not widens(_resolve(schema, path), wider):
            return None
        out.append((path, wider))
    return out


def _resolve(schema: Schema, path: Path) -> IcebergType | None:
    """The type at an Iceberg path (`element`, `key` and `value` step into lists and maps)."""
    t: IcebergType = schema.as_struct()
    for part in path:
        if isinstance(t, StructType):
            found = next((f for f in t.fields if f.name == part), None)
            if found is None:
                return None
            t = found.field_type
        elif isinstance(t, ListType) and part == "element":
            t = t.element_type
        elif isinstance(t, MapType) and part in ("key", "value"):
            t = t.key_type if part == "key" else t.value_type
        else:
            return None
    return t


@dataclass
class AdditionPlan:
    """What one commit adds, in order, and why the rest is not added."""

    added: list[tuple[Path, IcebergType]] = field(default_factory=list)
    refused: dict[Path, str] = field(default_factory=dict)
    widened: list[tuple[Path, IcebergType, IcebergType]] = field(default_factory=list)  # (path, from, to)


def plan_additions(schema: Schema, candidates: Mapping[Path, IcebergType], max_new: int) -> AdditionPlan:
    """Which candidate fields to add to `schema`, within the bounds, in the order seen."""
    plan = AdditionPlan()
    total = len(index_by_id(schema))
    new = 0
    for path, t in candidates.items():
        name, parent_path = path[-1], path[:-1]
        if _resolve(schema, path) is not None:
            continue  # added meanwhile (another commit): the records decode against its type
        parent = _resolve(schema, parent_path) if parent_path else schema.as_struct()
        where = display(path)
        if not isinstance(parent, StructType):
            plan.refused[path] = f"field {where!r} cannot be added: {display(parent_path)!r} is not an object in the table"
            continue
        if len(name) > MAX_FIELD_NAME:
            plan.refused[path] = (f"field {where!r} cannot be added: its name has {len(name):,} characters; at most "
                                  f"{MAX_FIELD_NAME}")
            continue
        clash = next((f.name for f in parent.fields if f.name.lower() == name.lower()), None)
        if not name or "." in name or clash is not None:
            why = (f"it differs only in case from {clash!r}, which engines resolving names without case confuse"
                   if clash is not None else "a column name must be non-empty and without '.'")
            plan.refused[path] = f"field {where!r} cannot be added: {why}"
            continue
        spec = type_spec(t)  # the config's view of a type counts fields and levels as the bounds do
        if len(path) + depth(spec) > MAX_TYPE_DEPTH:
            plan.refused[path] = f"field {where!r} cannot be added: it would nest deeper than {MAX_TYPE_DEPTH} levels"
            continue
        count = 1 + count_fields(spec)
        if new + count > max_new:
            plan.refused[path] = (f"field {where!r} was not added: the commit would add more than {max_new} fields "
                                  "(ingest.max_new_fields_per_commit); an object whose keys are ids belongs in a map "
                                  "column of table.schema")
            continue
        if total + new + count > MAX_SCHEMA_FIELDS:
            plan.refused[path] = f"field {where!r} was not added: the table would have more than {MAX_SCHEMA_FIELDS:,} fields"
            continue
        plan.added.append((path, t))
        new += count
    return plan


@dataclass
class EvolvedBatch:
    """The held records of one commit, after the schema change: their files and dead letters."""

    files: list[WrittenFile]
    dead_letters: list[DeadLetter]
    added: list[tuple[str, str]]  # (path, type) the commit adds
    records: int
    widened: list[tuple[str, str, str]] = field(default_factory=list)  # (path, from, to)
    landed: list[HeldRecord] = field(default_factory=list)  # the held records now written


def plan_widenings(schema: Schema, widen: Mapping[Path, IcebergType]) -> list[tuple[Path, IcebergType, IcebergType]]:
    """The columns to widen, as Iceberg allows: (path, from, to)."""
    out = []
    for path, wider in widen.items():
        current = _resolve(schema, path)
        if current is not None and widens(current, wider):
            out.append((path, current, wider))
    return out


# Rounds of plan-and-decode in one commit: held records may ask more once decoded against the
# changed schema (a record held to widen a column also carries a new field, say).
EVOLUTION_ROUNDS = 3


def evolve_and_write(tx: Transaction, held: list[HeldRecord], changes: SchemaChanges, max_new: int,
                     decoder_for: Callable[[Schema], RecordDecoder],
                     files_for: Callable[[Schema], PartitionedFileWriter] | None) -> EvolvedBatch:
    """Add the planned fields to the transaction's schema (and widen the planned columns),
    then decode `held` against it and write the rows that decode (`files_for` None: a dry run,
    nothing written). What the decode against the changed schema still asks for is planned
    again, within the same bounds, for a few rounds. Records that still carry a field the
    schema lacks (not added: a bound, a name) or that contradict a type are returned as dead
    letters."""
    plan = AdditionPlan()
    wanted = SchemaChanges()
    wanted.merge(changes)
    for _ in range(EVOLUTION_ROUNDS):
        current = tx.table_metadata.schema()
        done = {path for path, _ in plan.added} | set(plan.refused)
        step = plan_additions(current, {p: t for p, t in wanted.add.items() if p not in done},
                              max_new - sum(1 + count_fields(type_spec(t)) for _, t in plan.added))
        widened = plan_widenings(current, wanted.widen)
        if step.added or widened:
            with tx.update_schema() as update:
                for path, t in step.added:
                    update.add_column(path, t)
                for path, _, wider in widened:
                    update.update_column(path, field_type=wider)
        plan.added += step.added
        plan.refused.update(step.refused)
        plan.widened += widened
        schema = tx.table_metadata.schema()
        decoded = decoder_for(schema).decode([h.value for h in held], [h.key for h in held],
                                             ([h.partition for h in held], [h.offset for h in held]))
        asked = SchemaChanges()
        hold_back(decoded, schema, asked)
        fresh_adds = {p: t for p, t in asked.add.items() if p not in plan.refused and p not in wanted.add}
        fresh_widen = {p: t for p, t in asked.widen.items() if widens(_resolve(schema, p), t)}
        if not fresh_adds and not fresh_widen:
            break
        wanted.merge(SchemaChanges(fresh_adds, fresh_widen))
    reasons = {i: str(r) for i, r in decoded.rejected}
    for unknown in decoded.unknown:
        why = plan.refused.get(unknown.path) or (
            f"field {display(unknown.path)!r} is not in the table and was not added (over "
            f"ingest.max_new_fields_per_commit={max_new} candidates in one interval)")
        for row in unknown.rows:
            reasons.setdefault(int(row), why)
    dead = [DeadLetter(h.partition, h.offset, h.timestamp_ms, h.key, h.value, reasons[i])
            for i, h in enumerate(held) if i in reasons]
    landed = [held[i] for i in range(len(held)) if i not in reasons]
    table = decoded.table
    still = decoded.rows_with_unknown()
    if len(still):
        table = table.filter(pa.array(~np.isin(decoded.kept, still)))
    files: list[WrittenFile] = []
    if table.num_rows and files_for is not None:
        writer = files_for(schema)
        try:
            writer.write(table)
            files = writer.flush()
        except BaseException:
            writer.abort()
            raise
    return EvolvedBatch(files=files, dead_letters=dead, records=table.num_rows, landed=landed,
                        widened=[(display(path), str(old), str(new)) for path, old, new in plan.widened],
                        added=[(display(path), str(schema.find_type(".".join(path)))) for path, _ in plan.added])
