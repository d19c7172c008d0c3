"""Retention: rows older than ``maintenance.retention.days`` on a date or timestamp column
are deleted with Spark SQL ``DELETE FROM <table> WHERE <column> < <cutoff>`` (first step, so
later steps see the final data)."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any, Literal, cast

from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import LessThan
from pyiceberg.table import Table
from pyiceberg.types import DateType, PrimitiveType, TimestampType, TimestamptzType

from streamberg.common.config import RetentionConfig
from streamberg.common.errors import RetentionColumnError
from streamberg.common.schema import field_through_structs
from streamberg.maintenance.step import SparkTable, Step, StepResult, detail

ColumnKind = Literal["date", "timestamp", "timestamptz"]


@dataclass(frozen=True)
class RetentionPlan:
    column: str
    kind: ColumnKind
    # Rows with column < cutoff are deleted.
    cutoff: dt.datetime
    requested_cutoff: dt.datetime
    # The partition granularity the cutoff was rounded down to (whole-file deletes), or None.
    aligned_to: str | None

    def sql_literal(self) -> str:
        """The cutoff as a Spark SQL literal of the column's type (session time zone is UTC)."""
        if self.kind == "date":
            return f"DATE '{self.cutoff.date().isoformat()}'"
        text = self.cutoff.strftime("%Y-%m-%d %H:%M:%S.%f")
        return f"TIMESTAMP '{text}'" if self.kind == "timestamptz" else f"TIMESTAMP_NTZ '{text}'"

    def pyiceberg_literal(self) -> str:
        if self.kind == "date":
            return self.cutoff.date().isoformat()
        if self.kind == "timestamptz":
            return self.cutoff.isoformat()
        return self.cutoff.replace(tzinfo=None).isoformat()


_KINDS: dict[type, ColumnKind] = {DateType: "date", TimestampType: "timestamp", TimestamptzType: "timestamptz"}
# Partition transforms a cutoff can be rounded down to so whole partitions (files) go.
_ALIGNABLE = {"hour": dt.timedelta(hours=1), "day": dt.timedelta(days=1)}


def column_kind(table: Table, column: str) -> ColumnKind:
    """The kind of the retention column: a column, or a field reached through structs."""
    field, blocked_by = field_through_structs(table.schema(), column)
    if blocked_by is not None:
        raise RetentionColumnError(f"{column!r} is inside {blocked_by} in the table; "
                                   "it must be a date or timestamp outside lists and maps")
    if field is None:
        names = ", ".join(f.name for f in table.schema().fields)
        raise RetentionColumnError(f"{column!r} is not a column of the table (columns: {names})")
    kind = _KINDS.get(type(field.field_type))
    if kind is None:
        raise RetentionColumnError(f"{column!r} is {field.field_type} in the table; it must be a date or timestamp")
    return kind


def plan_retention(table: Table, settings: RetentionConfig, now_ms: int) -> RetentionPlan | None:
    """Rows older than now - days go. When the table is partitioned by day/hour of the column,
    the cutoff is rounded down to that boundary so only whole partitions, i.e. whole files,
    are deleted: a metadata-only delete that rewrites nothing and cannot conflict with
    appends of newer rows. Rows just past the boundary go on a later run."""
    if settings.days is None or not settings.column:
        return None
    kind = column_kind(table, settings.column)
    requested = dt.datetime.fromtimestamp(now_ms / 1000, tz=dt.timezone.utc) - dt.timedelta(days=settings.days)
    source_id = table.schema().find_field(settings.column).field_id
    transforms = {str(f.transform) for f in table.spec().fields if f.source_id == source_id}
    aligned_to = None
    cutoff = requested
    for name in ("day", "hour"):  # the coarser boundary works for both partitionings
        if name in transforms or (kind == "date" and name == "day"):
            step = _ALIGNABLE[name]
            epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
            cutoff = epoch + step * math.floor((requested - epoch) / step)
            aligned_to = name
            break
    return RetentionPlan(settings.column, kind, cutoff, requested, aligned_to)


def _quote(column: str) -> str:
    """A column, or a nested field's dotted path, as Spark SQL names it."""
    return ".".join("`" + part.replace("`", "``") + "`" for part in column.split("."))


def files_older_than(table: Table, plan: RetentionPlan) -> tuple[int, int]:
    """(files whose rows are all older than the cutoff, files that are only partly)."""
    if table.current_snapshot() is None:
        return 0, 0
    field = table.schema().find_field(plan.column)
    if plan.kind == "date":
        bound: int = (plan.cutoff.date() - dt.date(1970, 1, 1)).days
    else:
        delta = plan.cutoff.replace(tzinfo=dt.timezone.utc) - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
        bound = delta // dt.timedelta(microseconds=1)
    whole = partial = 0
    for task in table.scan(row_filter=LessThan(plan.column, plan.pyiceberg_literal())).plan_files():
        upper = (task.file.upper_bounds or {}).get(field.field_id)
        if upper is not None and cast(int, from_bytes(cast(PrimitiveType, field.field_type), upper)) < bound:
            whole += 1
        else:
            partial += 1
    return whole, partial


def count_older_than(spark_table: SparkTable, plan: RetentionPlan) -> int:
    rows = spark_table.sql(f"SELECT count(*) AS n FROM {spark_table.name} "
                           f"WHERE {_quote(plan.column)} < {plan.sql_literal()}")
    return int(rows[0]["n"])


def delete_older_than(spark_table: SparkTable, plan: RetentionPlan) -> None:
    spark_table.sql(f"DELETE FROM {spark_table.name} WHERE {_quote(plan.column)} < {plan.sql_literal()}")


@dataclass
class RetentionResult(StepResult):
    column: str | None = None
    older_than: str | None = detail()
    requested_older_than: str | None = detail()
    # None is a value here (no partition boundary to align to), so it is always reported.
    aligned_to: str | None = None
    records_deleted: int = 0
    files_deleted: int = 0
    files_rewritten: int | None = detail()
    # The delete's snapshot; None until it ran.
    snapshot_id: int | None = None
    operation: str | None = None
    delete_files_added: int | None = detail()


class RetentionStep(Step):
    key = "retention"
    result_type = RetentionResult

    def _run(self, dry_run: bool, log: Any) -> RetentionResult:
        context = self.context
        settings = context.settings.retention
        table = context.load()
        try:
            plan = plan_retention(table, settings, context.now_ms())
        except RetentionColumnError as exc:
            raise RetentionColumnError(f"maintenance.retention.column: {exc}") from None
        if plan is None:
            return RetentionResult(reason="maintenance.retention.days is null (retention off)", column=settings.column)
        current = table.current_snapshot()
        log = log.bind(step=self.key, snapshot_id=current.snapshot_id if current is not None else None)
        whole, partial = files_older_than(table, plan)
        records = count_older_than(context.spark, plan) if current is not None else 0
        out = RetentionResult(column=plan.column, older_than=plan.cutoff.isoformat(),
                              requested_older_than=plan.requested_cutoff.isoformat(), aligned_to=plan.aligned_to,
                              records_deleted=records, files_deleted=whole, files_rewritten=partial)
        if records == 0:
            out.reason = "no rows older than the cutoff"
            log.info("retention: nothing to delete", older_than=out.older_than)
            return out
        if dry_run:
            log.info("retention would delete", records=records, whole_files=whole, partially_matching_files=partial,
                     older_than=out.older_than, aligned_to=plan.aligned_to)
            return out
        delete_older_than(context.spark, plan)
        snapshot = context.load().current_snapshot()
        summary = dict(snapshot.summary.additional_properties) if snapshot and snapshot.summary else {}

        def n(key: str) -> int:
            return int(summary.get(key, 0))

        out.ran = True
        out.snapshot_id = snapshot.snapshot_id if snapshot else None
        out.operation = snapshot.summary.operation.value if snapshot and snapshot.summary else None
        # Copy-on-write rewrites keep the surviving rows of a partially matching file in
        # new files: deleted-records counts whole removed files, added-records the survivors.
        out.records_deleted = n("deleted-records") - n("added-records") + n("added-position-deletes")
        out.files_deleted, out.files_rewritten = n("deleted-data-files"), n("added-data-files")
        out.delete_files_added = n("added-delete-files")
        log.info("retention applied", new_snapshot_id=out.snapshot_id, operation=out.operation,
                 records_deleted=out.records_deleted, files_deleted=out.files_deleted,
                 files_rewritten=out.files_rewritten, older_than=out.older_than, aligned_to=plan.aligned_to)
        return out
