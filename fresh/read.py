"""An exact read of a table as of now: its pinned snapshot's rows plus its Kafka tail.

    from streamberg.fresh import read
    result = read("fleet.yaml", "shop.events", columns=["id", "city"], row_filter="city = 'c'")
    result.rows          # a pyarrow.Table
    result.bounds        # the snapshot, its offsets and the watermarks the tail was read to

Exact: for every partition, every record below the captured watermark once: those the
snapshot covers from the table, the rest decoded from Kafka (fresh/tail.py), dead letters
excluded in both. Commits, compactions and restarts of the ingest during the read change
nothing (the snapshot is pinned, its offsets are in its own lineage). `fresh=False` reads
the committed snapshot only. The filter and the columns are applied to both halves (pushed
into the table's scan: its files are pruned by the filter).

A primary-key table read fresh is its state at the watermark: the table the merge keeps, its
change log's unmerged changes and the tail, merged by key with the merge's rules
(fresh/keyed.py). A table of a field-routed topic keeps its route value's records of the
tail alone, by the writers' rule (fresh/tail.routed_here); such a table is never a
primary-key table (a field route carries rows, envelope none: the config refuses others).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import AlwaysTrue, BooleanExpression

from streamberg.common.catalog import shared_catalog
from streamberg.common.config import StreambergConfig
from streamberg.common.config.fleet import ROUTE_VALUE_PROPERTY
from streamberg.common.errors import FreshReadRefused
from streamberg.fresh.bounds import FreshBounds, pin, pin_kept, pin_snapshot
from streamberg.fresh.keyed import (
    KeyedDelta,
    KeyedSource,
    delta,
    joined_changes,
    open_keyed,
    pending_changes,
    table_columns,
)
from streamberg.fresh.tail import Tail, kept_tail_alive, read_kept, read_tail, tail_identity
from streamberg.table_meta.changelog import has_changelog
from streamberg.table_meta.tail_segments import TailIdentity

DEFAULT_TIMEOUT_SECONDS = 60.0
# Where a fresh read's tail ends: "now", each partition's end at the read (Kafka asked), or
# "kept", where the ingest's kept tail ends (no broker round trip; fresh/tail.read_kept).
Until = Literal["now", "kept"]


@dataclass
class FreshRead:
    rows: pa.Table
    bounds: FreshBounds
    snapshot_rows: int  # of `rows`, read from the pinned snapshot
    tail: Tail | None  # None: the committed snapshot only
    seconds: float
    keyed: KeyedDelta | None = None  # a primary-key table read fresh: what its changes did
    until: Until = "now"  # where the tail ended: "now" (Kafka's end at the read) or "kept" (the kept tail's)

    def to_json(self) -> dict[str, Any]:
        out = {**self.bounds.to_json(), "rows": self.rows.num_rows, "snapshot_rows": self.snapshot_rows,
               "seconds": round(self.seconds, 3)}
        if self.tail is not None:
            out.update(until=self.until, tail_rows=self.tail.rows.num_rows, tail_cached_records=self.tail.cached,
                       tail_rejected=self.tail.rejected, tail_routed_elsewhere=self.tail.elsewhere,
                       tail_skipped=self.tail.skipped, tail_seconds=round(self.tail.seconds, 3))
        if self.keyed is not None:
            out.update(changes=self.keyed.changes, keys_changed=self.keyed.removed.num_rows,
                       stale_keys=self.keyed.stale)
        return out


def table_config(config: str | Path | StreambergConfig, identifier: str | None = None) -> StreambergConfig:
    """The configuration of `identifier` in a config file of one table or many (or as given)."""
    if isinstance(config, StreambergConfig):
        if identifier and identifier.lower() != config.table.identifier.lower():
            raise FreshReadRefused(f"{identifier}: the configuration given is {config.table.identifier}'s")
        return config
    from streamberg.common.tables import config_tables

    found = config_tables(config)
    if identifier is None:
        if len(found.configs) != 1:
            raise FreshReadRefused(f"{config} holds {len(found.configs)} tables: name one "
                                   f"({', '.join(sorted(found.configs)[:10])})")
        return next(iter(found.configs.values()))
    for name, table_config_ in found.configs.items():
        if name.lower() == identifier.lower():
            return table_config_
    why = found.refused_tables.get(identifier)
    raise FreshReadRefused(f"{identifier}: not a table of {config}" + (f" ({why})" if why else ""))


def _filter(row_filter: str | BooleanExpression | None) -> BooleanExpression:
    if row_filter is None:
        return AlwaysTrue()
    if isinstance(row_filter, str):
        from pyiceberg.expressions.parser import parse

        try:
            return parse(row_filter)
        except Exception as exc:  # noqa: BLE001 - the parser's own words
            raise FreshReadRefused(f"row filter {row_filter!r} does not parse: {str(exc).splitlines()[0]}") from None
    return row_filter


@dataclass
class ReadPlan:
    """What one read is: the table's configuration and metadata (loaded once), the filter
    and columns checked against it, and the pinned bounds."""

    config: StreambergConfig
    table: Any  # pyiceberg Table
    expression: BooleanExpression
    columns: list[str] | None
    bounds: FreshBounds
    fresh: bool
    keyed: KeyedSource | None = None  # a primary-key table read fresh: its change log and key state
    until: Until = "now"  # "kept": the tail's rows as far as the kept tail goes, no Kafka

    @property
    def read_columns(self) -> list[str] | None:
        """The columns the table's scan reads: a keyed read needs the key besides those asked."""
        if self.columns is None or self.keyed is None:
            return self.columns
        return self.columns + [k for k in self.keyed.keys if k not in self.columns]

    def tail(self, timeout_seconds: float) -> Tail:
        """The tail after the pinned snapshot; the bounds then hold the ends it was read to.
        A keyed table's tail is its change log's: change rows, decoded as the ingest writes them."""
        if self.keyed is not None:
            tail = read_tail(self.keyed.config, self.keyed.changelog.schema(), self.bounds, timeout_seconds,
                             identity=_kept_identity(self.keyed.config, self.keyed.changelog))
        elif self.until == "kept":
            tail = read_kept(self.config, self.table.schema(), self.bounds, tail_identity(self.config, self.table))
        else:
            tail = read_tail(self.config, self.table.schema(), self.bounds, timeout_seconds,
                             self.table.properties.get(ROUTE_VALUE_PROPERTY),
                             identity=_kept_identity(self.config, self.table))
        self.bounds = replace(self.bounds, watermarks=tail.ends)
        return tail

    def keyed_delta(self, tail: Tail) -> KeyedDelta:
        """What the change log's unmerged changes and the tail do to the pinned table."""
        assert self.keyed is not None
        changes = joined_changes(pending_changes(self.keyed), tail.rows)
        return delta(self.keyed, changes, table_columns(self.table, self.keyed.changelog))

    def keyed_rows(self, committed: pa.Table, change: KeyedDelta) -> tuple[pa.Table, int]:
        """The pinned table's rows (filtered, with their keys) less every key the changes
        touch, plus the rows the changes make (filtered, projected)."""
        assert self.keyed is not None
        keys = self.keyed.keys
        position = "__streamberg_row"
        index = committed.select(keys).append_column(position, pa.array(range(committed.num_rows), pa.int64()))
        removed = change.removed.select(keys).cast(index.select(keys).schema)
        kept = committed.take(index.join(removed, keys=keys, join_type="left anti").column(position).combine_chunks()
                              .sort()) if removed.num_rows else committed
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        whole = schema_to_pyarrow(self.table.schema(), include_field_ids=False)
        made = pa.table({f.name: (change.upserts.column(f.name) if f.name in change.upserts.column_names
                                  else pa.nulls(change.upserts.num_rows, f.type)) for f in whole})
        return pa.concat_tables([kept, self.shaped(made, committed.schema)]), kept.num_rows

    def shaped(self, rows: pa.Table, target: pa.Schema) -> pa.Table:
        """Tail rows as the scan gave the snapshot's: filtered, projected, same Arrow types."""
        wanted = [f.name for f in target]
        if not isinstance(self.expression, AlwaysTrue):
            from pyiceberg.expressions.visitors import bind, extract_field_ids
            from pyiceberg.io.pyarrow import expression_to_pyarrow

            schema = self.table.schema()
            bound = bind(schema, self.expression, case_sensitive=True)
            # The columns asked for and those the filter reads, before filtering: a filter
            # copies every column it keeps.
            referenced = [schema.find_column_name(i) or "" for i in extract_field_ids(bound)]
            rows = rows.select([n for n in rows.column_names
                                if n in wanted or any(r == n or r.startswith(n + ".") for r in referenced)])
            rows = rows.filter(expression_to_pyarrow(bound))
        return rows.select(wanted).cast(target)


def _kept_identity(config: StreambergConfig, table: Any) -> TailIdentity | None:
    """The identity a kept tail must have to serve this read; None where no live keeper keeps
    one (nothing to take: the topic's id is not asked for)."""
    return tail_identity(config, table) if kept_tail_alive(config) else None


def plan_read(config: str | Path | StreambergConfig, identifier: str | None = None, *,
              columns: list[str] | None = None, row_filter: str | BooleanExpression | None = None,
              fresh: bool = True, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
              until: Until = "now") -> ReadPlan:
    """Check what is asked against the table and pin the snapshot (and, fresh, the tail's start)."""
    config = table_config(config, identifier)
    try:
        table = shared_catalog(config.catalog).load_table(config.table.identifier)  # opened once a process
    except NoSuchTableError:
        made_by = "the merge, when it starts" if has_changelog(config) else "the ingest, when it starts"
        raise FreshReadRefused(f"{config.table.identifier} does not exist yet (made by {made_by})") from None
    # A configuration given alone: which field routes is the fleet's.
    if fresh and table.properties.get(ROUTE_VALUE_PROPERTY) is not None and config.route_field is None:
        raise FreshReadRefused(f"{config.table.identifier}: a table of a field-routed topic is read fresh "
                               f"through its config of many (which names the route's field)")
    expression = _filter(row_filter)
    names = [f.name for f in table.schema().fields]
    unknown = [c for c in columns or [] if c not in names]
    if unknown:
        raise FreshReadRefused(f"{config.table.identifier} has no column {', '.join(unknown)} (columns: "
                               f"{', '.join(names)})")
    keyed = None
    # To the kept tail's end only where a live one serves this (append) table; else to Kafka's.
    kept = fresh and until == "kept" and not has_changelog(config) and kept_tail_alive(config)
    if fresh and has_changelog(config):
        keyed = open_keyed(shared_catalog(config.catalog), config, table)  # after the table: it holds what the table applied
        snapshot = table.current_snapshot()
        bounds = replace(pin(keyed.changelog, keyed.config, timeout_seconds), table=config.table.identifier,
                         snapshot_id=snapshot.snapshot_id if snapshot is not None else None,
                         changelog_snapshot_id=_snapshot_id(keyed.changelog))
    elif kept:
        bounds = pin_kept(table, config)  # no broker asked: the read ends where the kept tail does
    elif fresh:
        bounds = pin(table, config, timeout_seconds)
    else:
        bounds = pin_snapshot(table, config)
    return ReadPlan(config, table, expression, columns, bounds, fresh, keyed, "kept" if kept else "now")


def _snapshot_id(table: Any) -> int | None:
    snapshot = table.current_snapshot()
    return snapshot.snapshot_id if snapshot is not None else None


def read(config: str | Path | StreambergConfig, identifier: str | None = None, *,
         columns: list[str] | None = None, row_filter: str | BooleanExpression | None = None,
         fresh: bool = True, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS, until: Until = "now") -> FreshRead:
    """The table's rows as of now (`fresh`), or as of its current snapshot. `until="kept"`:
    fresh as far as the ingest's kept tail goes (ingest.keep_tail), exact to that end, with no
    broker round trip: a fraction of a second behind Kafka, at about a snapshot read's cost;
    where no live kept tail serves the table (another machine, a primary-key table, a
    field-routed one), the read is the full one, to Kafka's end."""
    started = time.monotonic()
    plan = plan_read(config, identifier, columns=columns, row_filter=row_filter, fresh=fresh,
                     timeout_seconds=timeout_seconds, until=until)
    _report(plan)
    schema = plan.table.schema()
    read_columns = plan.read_columns
    selected = tuple(read_columns) if read_columns else ("*",)
    try:
        scan = plan.table.scan(row_filter=plan.expression, selected_fields=selected,
                               snapshot_id=plan.bounds.snapshot_id)
        committed = scan.to_arrow() if plan.bounds.snapshot_id is not None else None
    except ValueError as exc:  # a filter naming a column the table lacks
        raise FreshReadRefused(f"{plan.config.table.identifier}: {str(exc).splitlines()[0]}") from None
    if committed is None:
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        committed = schema_to_pyarrow(schema.select(*read_columns) if read_columns else schema).empty_table()
    tail = plan.tail(timeout_seconds) if fresh else None
    rows, snapshot_rows, change = committed, committed.num_rows, None
    if tail is not None and plan.keyed is not None:
        change = plan.keyed_delta(tail)
        rows, snapshot_rows = plan.keyed_rows(committed, change)
        if columns:
            rows = rows.select(columns)
    elif tail is not None and tail.rows.num_rows:
        rows = pa.concat_tables([committed, plan.shaped(tail.rows, committed.schema)])
    return FreshRead(rows=rows, bounds=plan.bounds, snapshot_rows=snapshot_rows, tail=tail,
                     seconds=time.monotonic() - started, keyed=change, until=plan.until)


# pyiceberg's predicates by class name, as Iceberg's expression JSON names them.
_JSON_TYPES = {"EqualTo": "eq", "NotEqualTo": "not-eq", "In": "in", "NotIn": "not-in", "LessThan": "lt",
               "LessThanOrEqual": "lt-eq", "GreaterThan": "gt", "GreaterThanOrEqual": "gt-eq", "IsNull": "is-null",
               "NotNull": "not-null", "IsNaN": "is-nan", "NotNaN": "not-nan", "StartsWith": "starts-with",
               "NotStartsWith": "not-starts-with"}


def filter_json(expression: BooleanExpression) -> Any:
    """A pyiceberg filter in Iceberg's JSON form (ExpressionParser), values left out, as a
    Java engine's scan report carries it."""
    name = type(expression).__name__
    if name in ("And", "Or"):
        return {"type": name.lower(), "left": filter_json(expression.left),  # type: ignore[attr-defined]
                "right": filter_json(expression.right)}  # type: ignore[attr-defined]
    if name == "Not":
        return {"type": "not", "child": filter_json(expression.child)}  # type: ignore[attr-defined]
    term = getattr(getattr(expression, "term", None), "name", None)
    if term is not None:
        return {"type": _JSON_TYPES.get(name, name.lower()), "term": str(term)}
    return "true" if name == "AlwaysTrue" else "false" if name == "AlwaysFalse" else str(expression)[:200]


def _report(plan: ReadPlan) -> None:
    """The read as a scan report, where the catalog collects them (table_meta/query_stats.py)."""
    folder = plan.config.catalog.scan_reports_dir
    if not folder:
        return
    from streamberg.table_meta.query_stats import record_read

    try:
        record_read(folder, plan.config.table.identifier, filter_json(plan.expression),
                    plan.columns or [f.name for f in plan.table.schema().fields])
    except OSError:
        pass  # a read never fails for its report
