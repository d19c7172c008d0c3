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

Not read fresh (FreshReadRefused, with why): primary-key tables (their state needs the merge's
rules over the change log and the tail) and the tables of a field-routed topic.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue, BooleanExpression

from streamberg.common.catalog import load_catalog
from streamberg.common.changelog import has_changelog
from streamberg.common.config import StreambergConfig
from streamberg.common.config.fleet import ROUTE_VALUE_PROPERTY
from streamberg.common.errors import FreshReadRefused
from streamberg.fresh.bounds import FreshBounds, pin
from streamberg.fresh.tail import Tail, read_tail

DEFAULT_TIMEOUT_SECONDS = 60.0


@dataclass
class FreshRead:
    rows: pa.Table
    bounds: FreshBounds
    snapshot_rows: int  # of `rows`, read from the pinned snapshot
    tail: Tail | None  # None: the committed snapshot only
    seconds: float

    def to_json(self) -> dict[str, Any]:
        out = {**self.bounds.to_json(), "rows": self.rows.num_rows, "snapshot_rows": self.snapshot_rows,
               "seconds": round(self.seconds, 3)}
        if self.tail is not None:
            out.update(tail_rows=self.tail.rows.num_rows, tail_cached_records=self.tail.cached,
                       tail_rejected=self.tail.rejected,
                       tail_skipped=self.tail.skipped, tail_seconds=round(self.tail.seconds, 3))
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


_catalogs: dict[str, Any] = {}


def _catalog(config: StreambergConfig) -> Any:
    """The catalog of a config, opened once a process (opening one costs more than a small read)."""
    key = config.catalog.model_dump_json()
    found = _catalogs.get(key)
    if found is None:
        found = _catalogs[key] = load_catalog(config.catalog)
    return found


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

    def tail(self, timeout_seconds: float) -> Tail:
        """The tail after the pinned snapshot; the bounds then hold the ends it was read to."""
        tail = read_tail(self.config, self.table.schema(), self.bounds, timeout_seconds)
        self.bounds = replace(self.bounds, watermarks=tail.ends)
        return tail

    def shaped(self, rows: pa.Table, target: pa.Schema) -> pa.Table:
        """Tail rows as the scan gave the snapshot's: filtered, projected, same Arrow types."""
        if not isinstance(self.expression, AlwaysTrue):
            from pyiceberg.expressions.visitors import bind
            from pyiceberg.io.pyarrow import expression_to_pyarrow

            rows = rows.filter(expression_to_pyarrow(bind(self.table.schema(), self.expression, case_sensitive=True)))
        return rows.select([f.name for f in target]).cast(target)


def plan_read(config: str | Path | StreambergConfig, identifier: str | None = None, *,
              columns: list[str] | None = None, row_filter: str | BooleanExpression | None = None,
              fresh: bool = True, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> ReadPlan:
    """Check what is asked against the table and pin the snapshot (and, fresh, the tail's start)."""
    config = table_config(config, identifier)
    if fresh and has_changelog(config):
        raise FreshReadRefused(f"{config.table.identifier}: a primary-key table is not read fresh yet (its state "
                               f"needs the merge over the change log and the tail); read it without --fresh")
    table = _catalog(config).load_table(config.table.identifier)
    if fresh and table.properties.get(ROUTE_VALUE_PROPERTY) is not None:
        raise FreshReadRefused(f"{config.table.identifier}: a table of a field-routed topic is not read fresh yet; "
                               f"read it without --fresh")
    expression = _filter(row_filter)
    names = [f.name for f in table.schema().fields]
    unknown = [c for c in columns or [] if c not in names]
    if unknown:
        raise FreshReadRefused(f"{config.table.identifier} has no column {', '.join(unknown)} (columns: "
                               f"{', '.join(names)})")
    if fresh:
        bounds = pin(table, config, timeout_seconds)
    else:
        from streamberg.common.offsets import committed_position

        snapshot = table.current_snapshot()
        bounds = FreshBounds(table=config.table.identifier, topic=config.kafka.topic,
                             snapshot_id=snapshot.snapshot_id if snapshot else None,
                             committed=dict(committed_position(table, config.kafka.topic).offsets))
    return ReadPlan(config, table, expression, columns, bounds, fresh)


def read(config: str | Path | StreambergConfig, identifier: str | None = None, *,
         columns: list[str] | None = None, row_filter: str | BooleanExpression | None = None,
         fresh: bool = True, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> FreshRead:
    """The table's rows as of now (`fresh`), or as of its current snapshot."""
    started = time.monotonic()
    plan = plan_read(config, identifier, columns=columns, row_filter=row_filter, fresh=fresh,
                     timeout_seconds=timeout_seconds)
    _report(plan)
    schema = plan.table.schema()
    selected = tuple(columns) if columns else ("*",)
    try:
        scan = plan.table.scan(row_filter=plan.expression, selected_fields=selected,
                               snapshot_id=plan.bounds.snapshot_id)
        committed = scan.to_arrow() if plan.bounds.snapshot_id is not None else None
    except ValueError as exc:  # a filter naming a column the table lacks
        raise FreshReadRefused(f"{plan.config.table.identifier}: {str(exc).splitlines()[0]}") from None
    if committed is None:
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        committed = schema_to_pyarrow(schema.select(*columns) if columns else schema).empty_table()
    tail = plan.tail(timeout_seconds) if fresh else None
    rows = committed
    if tail is not None and tail.rows.num_rows:
        rows = pa.concat_tables([committed, plan.shaped(tail.rows, committed.schema)])
    return FreshRead(rows=rows, bounds=plan.bounds, snapshot_rows=committed.num_rows, tail=tail,
                     seconds=time.monotonic() - started)


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
    """The read as a scan report, where the catalog collects them (common/query_stats.py)."""
    folder = plan.config.catalog.scan_reports_dir
    if not folder:
        return
    from streamberg.common.query_stats import record_read

    try:
        record_read(folder, plan.config.table.identifier, filter_json(plan.expression),
                    plan.columns or [f.name for f in plan.table.schema().fields])
    except OSError:
        pass  # a read never fails for its report
