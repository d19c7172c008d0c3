"""One merge: the change log's newest changes applied to the primary-key table on Spark.

A merge reads the change-log snapshots after the one the table last applied (an incremental
append scan, start exclusive, end inclusive), keeps the last change of each key in Kafka
order (partition, offset: a key lives in one partition), and runs one `MERGE INTO` with
Iceberg's SQL extensions. The table is merge-on-read, so updates and deletes are position
deletes, which Spark, DuckDB and pyiceberg all read (docs/cdc.md).

The change-log snapshot applied goes into the merge's own snapshot summary
(SummaryKeys.CHANGELOG_APPLIED) through Iceberg's `CommitMetadata`, in the same atomic
commit. So a merge killed before its commit left nothing, one killed after it is seen by the
next, and no change is applied twice.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from py4j.protocol import Py4JError
from pyiceberg.catalog import Catalog

from streamberg.common.changelog import (
    BEFORE_KEY,
    DELETE,
    OFFSET,
    OP,
    PARTITION,
    SOURCE_TS,
    TRIM_OPERATION,
    applied_snapshot_id,
    merge_position,
)
from streamberg.common.config import CHANGELOG_COLUMNS, MergeConfig, TableTarget
from streamberg.common.errors import ResyncRefused
from streamberg.common.faults import MERGE_COMMIT, pause_point
from streamberg.common.jvm import IcebergFailure, iceberg_failure
from streamberg.common.log import get_logger
from streamberg.common.offsets import ancestry, summary_properties
from streamberg.common.retry import BACKGROUND_MAX_BACKOFF_SECONDS, commit_retrying
from streamberg.common.summary_keys import SummaryKeys
from streamberg.merge.tables import evolve_target


@dataclass(frozen=True)
class MergeOutcome:
    applied_snapshot_id: int  # the change-log snapshot now applied
    changelog_snapshots: int  # change-log snapshots with records this merge covered
    changes: int  # change-log rows read
    keys: int  # distinct keys, the last change of each applied
    deletes: int  # of them, keys whose last change deletes the row
    snapshot_id: int | None  # the table's snapshot (None: nothing to commit)
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"applied_changelog_snapshot_id": self.applied_snapshot_id, "changelog_snapshots": self.changelog_snapshots,
                "changes": self.changes, "keys": self.keys, "deletes": self.deletes, "snapshot_id": self.snapshot_id,
                "seconds": round(self.seconds, 2)}


class _Statement:
    """A java.util.concurrent.Callable (py4j) running one SQL statement. CommitMetadata
    calls it on the JVM thread that holds the summary properties; its Python exception is
    kept, because py4j hands Java only its text (the Iceberg failure class would be lost)."""

    def __init__(self, spark: Any, sql: str) -> None:
        self.spark, self.sql = spark, sql
        self.error: BaseException | None = None

    def call(self) -> None:
        try:
            self.spark.sql(self.sql)
        except BaseException as exc:
            self.error = exc
            raise

    class Java:
        implements = ["java.util.concurrent.Callable"]


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class Merger:
    """Applies a change log to its primary-key table, one merge per call of `merge`."""

    def __init__(self, spark: Any, catalog: Catalog, target: TableTarget, changelog: str, settings: MergeConfig,
                 run_id: str | None = None) -> None:
        self.spark, self.catalog, self.target, self.changelog, self.settings = spark, catalog, target, changelog, settings
        self.keys = list(target.table.primary_key)
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.log = get_logger("merge", table=target.identifier, changelog=changelog, run=self.run_id)
        self.spark_changelog = f"{target.catalog.name}.{changelog}"

    def merge(self) -> MergeOutcome | None:
        """Apply what the change log holds beyond the table's recorded position; None when
        there is nothing to apply. A commit that lost to a concurrent one (the compactor
        rewrote files this merge deletes from) is retried from a fresh read."""
        for attempt in commit_retrying(self.settings.commit_retries, _lost_race, log=self.log,
                                       max_backoff_seconds=BACKGROUND_MAX_BACKOFF_SECONDS,
                                       event="merge commit lost a race; retrying"):
            with attempt:
                return self._merge_once()
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _merge_once(self) -> MergeOutcome | None:
        started = time.monotonic()
        changelog = self.catalog.load_table(self.changelog)
        target = self.catalog.load_table(self.target.identifier)
        position = merge_position(changelog, target)
        end = position.changelog_snapshot_id
        if end is None or position.up_to_date:  # nothing with records after the applied snapshot
            return None
        log = self.log.bind(from_changelog_snapshot=position.applied_snapshot_id, to_changelog_snapshot=end,
                            pending_records=position.pending_records)
        target = evolve_target(target, changelog, log)
        columns = [f.name for f in target.schema().fields
                   if f.name not in CHANGELOG_COLUMNS and changelog.schema().find_field(f.name, True) is not None]
        self._last_changes(position.applied_snapshot_id, end, columns)
        counts = self.spark.sql(f"SELECT count(*) AS keys, count_if({_quote(OP)} = '{DELETE}') AS deletes "
                                "FROM streamberg_last_change").collect()[0]
        properties = {
            SummaryKeys.CHANGELOG_APPLIED: str(end), SummaryKeys.MERGE_RUN_ID: self.run_id,
            SummaryKeys.MERGE_CHANGES: str(position.pending_records), SummaryKeys.MERGE_KEYS: str(counts["keys"]),
            SummaryKeys.MERGE_DELETES: str(counts["deletes"]),
            SummaryKeys.MERGE_CHANGELOG_SNAPSHOTS: str(position.pending_snapshots),
        }
        pause_point(MERGE_COMMIT)
        self._run_recording(self._merge_sql(columns), properties, end)
        committed = self.catalog.load_table(self.target.identifier).current_snapshot()
        outcome = MergeOutcome(end, position.pending_snapshots, position.pending_records, counts["keys"],
                               counts["deletes"], committed.snapshot_id if committed is not None else None,
                               time.monotonic() - started)
        log.info("merged", **outcome.to_dict())
        return outcome

    def _last_changes(self, applied: int | None, end: int, columns: list[str]) -> None:
        """The view `streamberg_last_change`: per key, its last change in the snapshots after
        `applied` up to `end`; an update that changed the key also deletes the key before it.

        A key's own changes are ordered as Kafka holds them (offset; a key lives in one
        partition). The delete of a key before a key change is read from the new key's
        partition, where no offset compares with the old key's: it wins over the old key's
        last own change when it happened later in the source (`_source_ts`; on a tie, or
        without times, the own change wins). Debezium itself sends a key change as a delete
        of the old key and a create of the new, each on its key's partition."""
        from pyspark.sql import functions as F
        from pyspark.sql.window import Window

        changes = self._changes(applied, end)
        key = [F.col(_quote(k)) for k in self.keys]
        own = changes.select(*[F.col(_quote(c)) for c in [*columns, OP, PARTITION, OFFSET, SOURCE_TS]],
                             F.lit(0).alias("_streamberg_moved"))
        own = _first(own, Window.partitionBy(*key).orderBy(F.col(PARTITION).desc(), F.col(OFFSET).desc()))
        moved = changes.where(F.col(BEFORE_KEY).isNotNull()).select(
            *[F.col(f"{BEFORE_KEY}.{_quote(c)}").alias(c) if c in self.keys
              else F.lit(None).cast(changes.schema[c].dataType).alias(c) for c in columns],
            F.lit(DELETE).alias(OP), F.col(PARTITION), F.col(OFFSET), F.col(SOURCE_TS),
            F.lit(1).alias("_streamberg_moved"))
        last = _first(own.unionByName(moved), Window.partitionBy(*key).orderBy(
            F.col(SOURCE_TS).desc_nulls_last(), F.col("_streamberg_moved").asc(), F.col(PARTITION).desc(),
            F.col(OFFSET).desc()))
        last.drop("_streamberg_moved", SOURCE_TS).createOrReplaceTempView("streamberg_last_change")

    def delete_missing_since(self, since_ms: int) -> ResyncOutcome:
        """After the source was resynced (a new snapshot of every row, op r, from `since_ms`):
        delete the rows whose key no change since then touched. They were deleted in the
        source while its change stream was lost, so no delete event will ever come.

        Refused, changing nothing, unless the merge has applied the whole change log, the
        change log still holds every change committed since `since_ms` (not trimmed, not
        expired), and at least one change came since then (else every row would go)."""
        from pyspark.sql import functions as F

        changelog = self.catalog.load_table(self.changelog)
        position = merge_position(changelog, self.catalog.load_table(self.target.identifier))
        if not position.up_to_date:
            raise ResyncRefused(f"{position.pending_records:,} changes are not merged yet: merge them first")
        lineage = list(reversed(list(ancestry(changelog))))
        since = [s for s in lineage if s.timestamp_ms >= since_ms]
        if not since:
            raise ResyncRefused("the change log has no commit since then: nothing shows which rows the resync kept")
        if len(since) == len(lineage) and lineage[0].parent_snapshot_id is not None:
            raise ResyncRefused("the change log's oldest kept snapshot is after that time (expired): it no longer "
                                "holds every change since then")
        if trimmed := [s for s in since if summary_properties(s).get(SummaryKeys.OPERATION) == TRIM_OPERATION]:
            raise ResyncRefused(f"maintenance trimmed the change log at {trimmed[0].timestamp_ms} ms, after that time: "
                                "it no longer holds every change since then")
        before = lineage[lineage.index(since[0]) - 1] if since[0] is not lineage[0] else None
        keys = self._changes(before.snapshot_id if before is not None else None, since[-1].snapshot_id) \
            .select(*[F.col(_quote(k)) for k in self.keys]).distinct()
        keys.createOrReplaceTempView("streamberg_resync_keys")
        seen = keys.count()
        if seen == 0:
            raise ResyncRefused("no change since then: refusing to delete every row")
        on = " AND ".join(f"t.{_quote(k)} = k.{_quote(k)}" for k in self.keys)
        rows_before = self.spark.table(self.target.spark_name).count()
        self.spark.sql(f"MERGE INTO {self.target.spark_name} t USING streamberg_resync_keys k ON {on} "
                       "WHEN NOT MATCHED BY SOURCE THEN DELETE")
        snapshot = self.catalog.load_table(self.target.identifier).current_snapshot()
        deleted = rows_before - self.spark.table(self.target.spark_name).count()
        outcome = ResyncOutcome(seen, deleted, snapshot.snapshot_id if snapshot is not None else None)
        self.log.info("rows the resync did not keep deleted", since_ms=since_ms, **outcome.to_dict())
        return outcome

    def _changes(self, after: int | None, end: int) -> Any:
        """The change log's rows appended after snapshot `after` (exclusive; None: from its
        start) up to `end` (inclusive), as a Spark DataFrame."""
        reader = self.spark.read.format("iceberg")
        if after is None:
            reader = reader.option("snapshot-id", str(end))
        else:
            reader = reader.option("start-snapshot-id", str(after)).option("end-snapshot-id", str(end))
        return reader.load(self.spark_changelog)

    def _merge_sql(self, columns: list[str]) -> str:
        on = " AND ".join(f"t.{_quote(k)} = c.{_quote(k)}" for k in self.keys)
        values = [c for c in columns if c not in self.keys]
        update = ", ".join(f"t.{_quote(c)} = c.{_quote(c)}" for c in values)
        inserted = ", ".join(_quote(c) for c in columns)
        matched = f"WHEN MATCHED THEN UPDATE SET {update} " if values else ""
        return (f"MERGE INTO {self.target.spark_name} t USING streamberg_last_change c ON {on} "
                f"WHEN MATCHED AND c.{_quote(OP)} = '{DELETE}' THEN DELETE {matched}"
                f"WHEN NOT MATCHED AND c.{_quote(OP)} != '{DELETE}' THEN INSERT ({inserted}) "
                f"VALUES ({', '.join('c.' + _quote(c) for c in columns)})")

    def _run_recording(self, sql: str, properties: dict[str, str], end: int) -> None:
        """Run the MERGE with `properties` in its snapshot's summary (CommitMetadata keeps them
        in a thread-local of the JVM thread that runs the statement)."""
        from pyspark.java_gateway import ensure_callback_server_started

        # PySpark's own callback server (foreachBatch uses it too): a Java callback made any
        # other way leaves py4j in a state where a later foreachBatch in this process (the
        # compactor on a shared session) cannot start it.
        ensure_callback_server_started(self.spark.sparkContext._gateway)
        jvm = self.spark._jvm
        props = jvm.java.util.HashMap()
        for key, value in properties.items():
            props.put(key, value)
        statement = _Statement(self.spark, sql)
        try:
            jvm.org.apache.iceberg.spark.CommitMetadata.withCommitProperties(
                props, statement, jvm.java.lang.Class.forName("java.lang.RuntimeException"))
        except Py4JError as exc:
            error = statement.error or exc
            if iceberg_failure(error) is IcebergFailure.STATE_UNKNOWN and self._applied() == end:
                self.log.warning("merge commit state was unknown; it landed", changelog_snapshot=end)
                return
            raise error from None

    def _applied(self) -> int | None:
        return applied_snapshot_id(self.catalog.load_table(self.target.identifier))


@dataclass(frozen=True)
class ResyncOutcome:
    keys_seen: int  # distinct keys the change log holds changes of since the resync began
    rows_deleted: int  # rows of the table whose key is not among them
    snapshot_id: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"keys_seen": self.keys_seen, "rows_deleted": self.rows_deleted, "snapshot_id": self.snapshot_id}


def _first(frame: Any, order: Any) -> Any:
    """The first row of each window of `order`."""
    from pyspark.sql import functions as F

    return (frame.withColumn("_streamberg_rank", F.row_number().over(order))
            .where(F.col("_streamberg_rank") == 1).drop("_streamberg_rank"))


def _lost_race(exc: BaseException) -> bool:
    return iceberg_failure(exc) in (IcebergFailure.VALIDATION, IcebergFailure.COMMIT_FAILED,
                                    IcebergFailure.STATE_UNKNOWN)
