"""A fresh read of a primary-key table: its state at the watermark, by the merge's own rules.

A primary-key table has three halves (docs/cdc.md): the table the merge keeps (pinned at its
current snapshot T, which records the change-log snapshot A it applied), the change log's
changes after A up to the change log's current snapshot C (appended, not merged yet), and
the Kafka records after the offsets C recorded (the tail, decoded into change-log rows by the
ingest's own decoder). The read takes the newest change of every key among the last two
with merge/order.py's rule (sequence, then offset in a partition, then source time, a delete
first, then offset), drops those not newer than what the merge's key state held at A (a
replay, a rewound topic), and applies the rest to T's rows: a delete removes the key, any
other change is the row. Source epochs order the sequences as the merge orders them
(table_meta/source_epochs.py); a source name the record lacks opens the next epoch, as the merge
would open it.

The rule is written here in DuckDB SQL over Arrow: the merge's is Spark's. The two are held
equal by tests/fresh/test_fresh_keyed.py, which merges what it read fresh with the real
merge and compares.

Refused (FreshReadRefused): a change log whose epochs record does not parse; a table whose
applied change-log snapshot is no longer in the change log's history (expired, recreated);
a key state that no longer holds the state of the table's merge (a merge committed the key
state of a later merge and then the first one's snapshot was expired: read again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table import FileScanTask, Table

from streamberg.common.config import CHANGELOG_COLUMNS, StreambergConfig
from streamberg.common.errors import FreshReadRefused
from streamberg.table_meta.change_order import (
    DUCKDB,
    ChangeColumns,
    encoded_sequence_sql,
    last_changes_sql,
    newer_than_stored_sql,
    references,
)
from streamberg.table_meta.changelog import (
    BEFORE_KEY,
    DELETE,
    KEY_STATE_COLUMNS,
    OFFSET,
    OP,
    PARTITION,
    SOURCE_ID,
    SOURCE_SEQ,
    SOURCE_TS,
    applied_snapshot_id,
    changelog_config,
    key_state_identifier,
    unapplied_snapshots,
)
from streamberg.table_meta.offsets import ancestry, summary_properties
from streamberg.table_meta.source_epochs import Epochs, read_epochs, reapply_after
from streamberg.table_meta.summary_keys import SummaryKeys
from streamberg.table_meta.table_files import snapshot_entries

STATE_KEY, STATE_SEQ, STATE_PARTITION, STATE_OFFSET, STATE_SOURCE_TS = KEY_STATE_COLUMNS[:5]


@dataclass
class KeyedSource:
    """What a keyed read pins besides the table: its change log, the change-log snapshot the
    table's merge applied, and the key state as that merge left it."""

    config: StreambergConfig  # the change log's (what the ingest writes, what the tail decodes as)
    changelog: Table  # loaded once: its current snapshot is C
    keys: list[str]
    after: int | None  # the change-log snapshot the changes are read after (A, or an epoch's re-read)
    stored: pa.Table  # the key state at A: key columns k0.., seq, part, off, ts
    epochs: Epochs
    sequence_field: str | None


def open_keyed(catalog: Catalog, config: StreambergConfig, target: Table) -> KeyedSource:
    """The change log and key state of `target` (loaded after it: the change log holds at
    least what the table's merge applied)."""
    view = changelog_config(config)
    try:
        changelog = catalog.load_table(view.table.identifier)
    except NoSuchTableError:
        raise FreshReadRefused(f"{config.table.identifier}: its change log {view.table.identifier} does not exist "
                               f"(nothing ingested yet)") from None
    epochs, unreadable = read_epochs(changelog.properties)
    if unreadable is not None:
        raise FreshReadRefused(f"{view.table.identifier}: {unreadable}: the merge refuses it too "
                               "(docs/runbooks/cdc-source-regressed.md)")
    applied = applied_snapshot_id(target)
    reapply = reapply_after(changelog.properties)
    after = applied
    if reapply is not None:  # an epoch declared over a regression: the merge reads again from there
        after = reapply if changelog.snapshot_by_id(reapply) is not None else None
    keys = list(config.table.primary_key)
    return KeyedSource(view, changelog, keys, after, _stored(catalog, config, target, keys, applied), epochs,
                       config.table.sequence_field)


def _stored(catalog: Catalog, config: StreambergConfig, target: Table, keys: list[str],
            applied: int | None) -> pa.Table:
    """The key state as the merge that applied `applied` left it (merge/key_state.py): its
    newest snapshot whose recorded change-log snapshot is `applied`. A merge stopped between
    its two commits left a newer one ahead of the table: that one is not the table's."""
    names = [f"k{i}" for i in range(len(keys))]
    empty = pa.table({**{n: pa.array([], type=_key_type(target, k)) for n, k in zip(names, keys)},
                      "seq": pa.array([], pa.string()), "part": pa.array([], pa.int32()),
                      "off": pa.array([], pa.int64()), "ts": pa.array([], pa.timestamp("us", tz="UTC"))})
    if applied is None:
        return empty
    try:
        state = catalog.load_table(key_state_identifier(config))
    except NoSuchTableError:
        raise FreshReadRefused(f"{config.table.identifier}: the merge's key state is missing; the merge makes it "
                               f"again on its next run") from None
    chosen, recorded = None, None
    for snapshot in reversed(ancestry(state)):  # oldest first: the newest one at `applied` wins
        value = summary_properties(snapshot).get(SummaryKeys.CHANGELOG_APPLIED)
        if value is not None:
            recorded = int(value)
        if recorded == applied:
            chosen = snapshot
    if chosen is None:
        raise FreshReadRefused(f"{config.table.identifier}: the key state no longer holds the state of the table's "
                               f"last merge (change-log snapshot {applied}); read again")
    rows = state.scan(snapshot_id=chosen.snapshot_id,
                      selected_fields=(STATE_KEY, STATE_SEQ, STATE_PARTITION, STATE_OFFSET, STATE_SOURCE_TS)).to_arrow()
    key = rows.column(STATE_KEY).combine_chunks()
    columns = {n: pc.struct_field(key, [k]) for n, k in zip(names, keys)}
    out = pa.table({**columns, "seq": rows.column(STATE_SEQ), "part": rows.column(STATE_PARTITION),
                    "off": rows.column(STATE_OFFSET), "ts": rows.column(STATE_SOURCE_TS)})
    return out.cast(empty.schema)


def _key_type(table: Table, name: str) -> pa.DataType:
    return schema_to_pyarrow(table.schema().select(name), include_field_ids=False).field(name).type


def pending_changes(source: KeyedSource) -> pa.Table:
    """The change log's rows appended after `source.after` up to its pinned snapshot: the data
    files each append on that stretch of its lineage added (a compaction's rewrite is skipped,
    as Iceberg's incremental append scan skips it: its rows are in the files it replaced)."""
    changelog = source.changelog
    try:
        newer = unapplied_snapshots(changelog, source.after)
    except ValueError as exc:
        raise FreshReadRefused(f"{source.config.table.identifier}: {exc}") from None
    tasks = [FileScanTask(data_file) for snapshot in newer
             if snapshot.summary is not None and snapshot.summary.operation.value == "append"
             for _, data_file in snapshot_entries(changelog.io, snapshot, ManifestEntryStatus.ADDED)]
    schema = changelog.schema()
    if not tasks:
        return schema_to_pyarrow(schema, include_field_ids=False).empty_table()
    return ArrowScan(changelog.metadata, changelog.io, schema, AlwaysTrue()).to_table(tasks)


@dataclass
class KeyedDelta:
    """What the changes do to the pinned table: the keys they touch (every one leaves the
    table's rows) and the rows they make (the last change of a key that is not a delete)."""

    removed: pa.Table  # the key columns
    upserts: pa.Table  # the table's columns (of the change log's), one row per key
    changes: int  # change rows considered (pending and tail, a key change counted once)
    stale: int  # keys whose last change was not newer than the table's: not applied


def delta(source: KeyedSource, changes: pa.Table, columns: list[str]) -> KeyedDelta:
    """Apply the change-order rule (table_meta/change_order.py) to `changes` (change-log rows) against the key state.
    `columns`: the table's columns the change log holds (the rows made carry them)."""
    keys = source.keys
    knames = [f"k{i}" for i in range(len(keys))]
    values = [c for c in columns if c not in keys]
    vnames = [f"v{i}" for i in range(len(values))]
    seq = _sequence(source, changes)
    own = pa.table({**{n: changes.column(k) for n, k in zip(knames, keys)},
                    **{n: changes.column(c) for n, c in zip(vnames, values)},
                    "op": changes.column(OP), "part": changes.column(PARTITION), "off": changes.column(OFFSET),
                    "ts": changes.column(SOURCE_TS), "seq": seq})
    # An update that changed the key deletes the key before it, at the update's position.
    if BEFORE_KEY in changes.column_names:
        moved_rows = own.append_column("bk", changes.column(BEFORE_KEY)).filter(pc.is_valid(changes.column(BEFORE_KEY)))
    else:
        moved_rows = own.append_column("bk", pa.nulls(own.num_rows, pa.struct([]))).slice(0, 0)
    before = moved_rows.column("bk").combine_chunks()
    moved = pa.table({**{n: (pc.struct_field(before, [k]) if moved_rows.num_rows else own.column(n).slice(0, 0))
                         .cast(own.schema.field(n).type) for n, k in zip(knames, keys)},
                      **{n: pa.nulls(moved_rows.num_rows, own.schema.field(n).type) for n in vnames},
                      "op": pa.array([DELETE] * moved_rows.num_rows, own.schema.field("op").type),
                      **{n: moved_rows.column(n) for n in ("part", "off", "ts", "seq")}})
    all_changes = pa.concat_tables([own, moved.cast(own.schema)])
    stored = source.stored.cast(pa.schema([*(own.schema.field(n) for n in knames),
                                           *(source.stored.schema.field(n) for n in ("seq", "part", "off", "ts"))]))
    last = newest_against_stored(all_changes, stored, knames)
    applied = last.filter(pc.field("apply"))
    upserts = applied.filter(pc.field("op") != DELETE)
    return KeyedDelta(
        removed=pa.table({k_: applied.column(n).cast(own.schema.field(n).type) for n, k_ in zip(knames, keys)}),
        upserts=pa.table({**{k_: upserts.column(n) for n, k_ in zip(knames, keys)},
                          **{c: upserts.column(n) for n, c in zip(vnames, values)}}),
        changes=all_changes.num_rows, stale=last.num_rows - applied.num_rows)


def newest_against_stored(changes: pa.Table, stored: pa.Table, keys: list[str]) -> pa.Table:
    """Per key, the newest of `changes` (columns: the keys, op, part, off, ts, seq and values)
    by the change-order rule (table_meta/change_order.py, the text Spark runs in the merge), with
    `apply`: whether it is newer than what `stored` (the keys, seq, part, off, ts) holds."""
    import duckdb

    names = ChangeColumns(tuple(keys), seq="seq", op="op", partition="part", offset="off", source_ts="ts")
    newest = last_changes_sql(DUCKDB, "changes", changes.column_names, names, "streamberg_rank")
    applies = newer_than_stored_sql(references(DUCKDB, names, "l"), references(DUCKDB, names, "s"), recovering=False)
    on = " AND ".join(f"l.{DUCKDB.quote(k)} = s.{DUCKDB.quote(k)}" for k in keys)
    con = duckdb.connect()
    try:
        con.register("changes", changes)
        con.register("stored", stored)
        last = con.execute(f"WITH newest AS ({newest}) SELECT l.*, {applies} AS apply "
                           f"FROM newest l LEFT JOIN stored s ON {on}").arrow()
    finally:
        con.close()
    return last.read_all() if isinstance(last, pa.RecordBatchReader) else last


def _sequence(source: KeyedSource, changes: pa.Table) -> pa.Array:
    """Each change's sequence as the merge orders it: the sequence_field as ordered text, else
    the source position, else none; then its epoch's prefix (merge/epochs.py)."""
    n = changes.num_rows
    if source.sequence_field is not None:
        base = _encoded(changes.column(source.sequence_field),
                        source.changelog.schema().find_field(source.sequence_field).field_type)
    elif SOURCE_SEQ in changes.column_names:
        base = changes.column(SOURCE_SEQ).combine_chunks().cast(pa.string())
    else:
        base = pa.nulls(n, pa.string())
    epochs = source.epochs
    if SOURCE_ID in changes.column_names and n:
        ids = changes.column(SOURCE_ID).combine_chunks()
        partitions, offsets = changes.column(PARTITION).to_pylist(), changes.column(OFFSET).to_pylist()
        first: dict[str, dict[int, int]] = {}
        for name, p, o in zip(ids.to_pylist(), partitions, offsets):
            if name is not None and (p not in first.setdefault(name, {}) or o < first[name][p]):
                first[name][p] = o
        epochs = epochs.with_sources(sorted(first), first, "")  # as the merge opens them (not recorded)
    else:
        ids = pa.nulls(n, pa.string())
    prefixes = epochs.prefixes()
    if not prefixes or n == 0:
        return base
    by_name = pa.array([epochs.sources.get(s, 0) if s is not None else 0 for s in ids.to_pylist()], pa.int64())
    epoch = by_name
    part, off = changes.column(PARTITION).combine_chunks(), changes.column(OFFSET).combine_chunks()
    by_position = pa.array([0] * n, pa.int64())
    for declared in sorted((e for e in epochs.epochs if e.source is None), key=lambda e: e.epoch):
        before = pa.array([False] * n)
        for p, o in declared.since.items():
            before = pc.or_(before, pc.and_(pc.equal(part, p), pc.less(off, o)))
        by_position = pc.if_else(before, by_position, declared.epoch)
    epoch = pc.max_element_wise(by_name, by_position)
    prefix = pc.fill_null(pc.take(pa.array([prefixes.get(i, "") for i in range(max(prefixes) + 1)]), epoch), "")
    return pc.binary_join_element_wise(prefix, base, "")


def _encoded(values: Any, field_type: Any) -> pa.Array:
    """A sequence_field's values as ordered text: table_meta/change_order.encoded_sequence_sql, the
    text the merge runs on Spark, run by DuckDB."""
    import duckdb

    column = values.combine_chunks() if hasattr(values, "combine_chunks") else values
    try:
        text = encoded_sequence_sql(DUCKDB, DUCKDB.quote("value"), field_type)
    except ValueError as exc:
        raise FreshReadRefused(str(exc)) from None
    con = duckdb.connect()
    try:
        con.register("sequence_values", pa.table({"value": column}))
        out = con.execute(f"SELECT {text} AS encoded FROM sequence_values").arrow()
    finally:
        con.close()
    out = out.read_all() if isinstance(out, pa.RecordBatchReader) else out
    return out.column("encoded").combine_chunks().cast(pa.string())


def _loose_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _loose_type(f.type), nullable=True) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return type(t)(pa.field(t.value_field.name, _loose_type(t.value_type), nullable=True)) \
            if pa.types.is_list(t) else pa.large_list(_loose_type(t.value_type))
    return t


def joined_changes(pending: pa.Table, tail: pa.Table) -> pa.Table:
    """The change log's rows and the tail's in one table: every field nullable (a null
    struct of the tail has null children a required child field refuses)."""
    schema = pa.schema([pa.field(f.name, _loose_type(f.type), nullable=True) for f in pending.schema])
    if not tail.num_rows:
        return pending.cast(schema)
    return pa.concat_tables([pending.cast(schema), tail.select(schema.names).cast(schema)])


def table_columns(target: Table, changelog: Table) -> list[str]:
    """The table's columns the change log holds (the merge's own choice, merge/merger.py)."""
    return [f.name for f in target.schema().fields
            if f.name not in CHANGELOG_COLUMNS and changelog.schema().find_field(f.name, True) is not None]
