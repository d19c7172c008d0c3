"""One merge: the change log's newest changes applied to the primary-key table on Spark.

A merge reads the change-log snapshots after the one the table last applied (an incremental
append scan, start exclusive, end inclusive), keeps the newest change of each key by its
sequence (merge/order.py), drops those not newer than what the key state (merge/key_state.py)
says the table holds, records the rest in the key state, and applies them with one
`MERGE INTO` with Iceberg's SQL extensions. The table is merge-on-read, so updates and
deletes are position deletes, which Spark, DuckDB and pyiceberg all read (docs/cdc.md).

The change-log snapshot applied goes into the merge's own snapshot summary
(SummaryKeys.CHANGELOG_APPLIED) through Iceberg's `CommitMetadata`, in the same atomic
commit. So a merge killed before its commit left nothing in the table, one killed after it
is seen by the next, and no change is applied twice.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from py4j.protocol import Py4JError
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from streamberg.common.config import CHANGELOG_COLUMNS, MergeConfig, TableTarget
from streamberg.common.errors import MergeRefused, ResyncRefused
from streamberg.common.faults import MERGE_COMMIT, pause_point
from streamberg.common.jvm import IcebergFailure, iceberg_failure
from streamberg.common.log import get_logger
from streamberg.common.retry import BACKGROUND_MAX_BACKOFF_SECONDS, commit_retrying
from streamberg.merge.epochs import epoch_of, first_offsets, regressed, source_names, with_epoch
from streamberg.merge.key_state import APPLIED_AT as KS_APPLIED_AT
from streamberg.merge.key_state import DELETED as KS_DELETED
from streamberg.merge.key_state import KEY, Forgetting, ensure_key_state, recorded
from streamberg.merge.key_state import OFFSET as KS_OFFSET
from streamberg.merge.key_state import PARTITION as KS_PARTITION
from streamberg.merge.key_state import SEQ as KS_SEQ
from streamberg.merge.key_state import SOURCE_TS as KS_SOURCE_TS
from streamberg.merge.order import WorkingNames, encoded_sequence, last_changes, newer_than_stored, quote
from streamberg.merge.tables import evolve_target
from streamberg.table_meta.changelog import (
    BEFORE_KEY,
    DELETE,
    OFFSET,
    OP,
    PARTITION,
    SOURCE_ID,
    SOURCE_SEQ,
    SOURCE_TS,
    TRIM_OPERATION,
    applied_snapshot_id,
    merge_position,
)
from streamberg.table_meta.offsets import ancestry, summary_properties
from streamberg.table_meta.source_epochs import (
    EPOCHS_PROPERTY,
    REAPPLY_PROPERTY,
    REGRESSION_PROPERTY,
    Epochs,
    Regression,
    now_text,
    read_epochs,
    read_regression,
    reapply_after,
    update_changelog_properties,
)
from streamberg.table_meta.summary_keys import SummaryKeys


@dataclass(frozen=True)
class MergeOutcome:
    applied_snapshot_id: int  # the change-log snapshot now applied
    changelog_snapshots: int  # change-log snapshots with records this merge covered
    changes: int  # change-log rows read
    keys: int  # distinct keys whose last change was applied
    deletes: int  # of them, keys whose last change deletes the row
    snapshot_id: int | None  # the table's snapshot (None: nothing to commit)
    seconds: float
    stale: int = 0  # keys whose last change was older than what the table holds: not applied
    regressed: int = 0  # of the changes read, those whose source position went backwards (source_epochs)

    def to_dict(self) -> dict[str, Any]:
        return {"applied_changelog_snapshot_id": self.applied_snapshot_id, "changelog_snapshots": self.changelog_snapshots,
                "changes": self.changes, "keys": self.keys, "deletes": self.deletes, "stale": self.stale,
                "regressed": self.regressed,
                "snapshot_id": self.snapshot_id, "seconds": round(self.seconds, 2)}


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


class Merger:
    """Applies a change log to its primary-key table, one merge per call of `merge`."""

    def __init__(self, spark: Any, catalog: Catalog, target: TableTarget, changelog: str, settings: MergeConfig,
                 key_state: str, run_id: str | None = None) -> None:
        self.spark, self.catalog, self.target, self.changelog, self.settings = spark, catalog, target, changelog, settings
        self.keys = list(target.table.primary_key)
        self.sequence_field = target.table.sequence_field
        self.key_state = key_state
        self.spark_key_state = f"{target.catalog.name}.{key_state}"
        self.forgetting = Forgetting(settings.deleted_keys_keep_seconds)
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
        epochs, unreadable = read_epochs(changelog.properties)
        if unreadable is not None:  # ordering by a guess could drop changes: refused, and status says so
            raise MergeRefused(f"{self.changelog}: {unreadable}; fix or remove the property "
                               "(docs/runbooks/cdc-source-regressed.md)")
        # An epoch declared over a regression: the changes from before it are read again.
        reapply = reapply_after(changelog.properties)
        if end is None or (position.up_to_date and reapply is None):  # nothing after the applied snapshot
            return None
        after = position.applied_snapshot_id
        if reapply is not None:
            after = reapply if changelog.snapshot_by_id(reapply) is not None else None
        log = self.log.bind(from_changelog_snapshot=after, to_changelog_snapshot=end,
                            pending_records=position.pending_records)
        target = evolve_target(target, changelog, log)
        state = ensure_key_state(self.catalog, self.key_state, target, self.keys)
        # Killed between its two commits, the last merge left the key state ahead of the table.
        recovering = recorded(state) not in (None, position.applied_snapshot_id)
        if recovering:
            log.warning("the key state is ahead of the table (a merge stopped between its two commits): its "
                        "changes are applied again", key_state_changelog_snapshot=recorded(state))
        columns = [f.name for f in target.schema().fields
                   if f.name not in CHANGELOG_COLUMNS and changelog.schema().find_field(f.name, True) is not None]
        names = WorkingNames([f.name for f in changelog.schema().fields] + [f.name for f in target.schema().fields])
        regressed, regressed_since = self._last_changes(after, end, columns, names, changelog, target, state,
                                                        recovering, epochs, log)
        apply = names("apply")
        counts = self.spark.sql(
            f"SELECT count_if({apply}) AS keys, count_if({apply} AND {quote(OP)} = '{DELETE}') AS deletes, "
            f"count_if(NOT {apply}) AS stale FROM streamberg_candidate").collect()[0]
        if counts["stale"]:
            log.warning("changes older than what the table holds were not applied (a replay, a rewound topic)",
                        stale_keys=counts["stale"])
        properties = {
            SummaryKeys.CHANGELOG_APPLIED: str(end), SummaryKeys.MERGE_RUN_ID: self.run_id,
            SummaryKeys.MERGE_CHANGES: str(position.pending_records), SummaryKeys.MERGE_KEYS: str(counts["keys"]),
            SummaryKeys.MERGE_DELETES: str(counts["deletes"]), SummaryKeys.MERGE_STALE: str(counts["stale"]),
            SummaryKeys.MERGE_CHANGELOG_SNAPSHOTS: str(position.pending_snapshots),
            SummaryKeys.MERGE_REGRESSED: str(regressed),
        }
        self._run_recording(self._key_state_sql(names), {SummaryKeys.CHANGELOG_APPLIED: str(end),
                                                         SummaryKeys.MERGE_RUN_ID: self.run_id},
                            lambda: recorded(self.catalog.load_table(self.key_state)) == end)
        pause_point(MERGE_COMMIT)
        self._run_recording(self._merge_sql(columns), properties, lambda: self._applied() == end)
        self._record_regression(regressed, regressed_since, position.applied_snapshot_id, reapply, log)
        if self.forgetting.due():
            self.forgetting.forget(self.spark, self.spark_key_state)
        committed = self.catalog.load_table(self.target.identifier).current_snapshot()
        outcome = MergeOutcome(end, position.pending_snapshots, position.pending_records, counts["keys"],
                               counts["deletes"], committed.snapshot_id if committed is not None else None,
                               time.monotonic() - started, counts["stale"], regressed)
        log.info("merged", **outcome.to_dict())
        return outcome

    def _record_regression(self, regressed: int, since: dict[int, int], applied_before: int | None,
                           reapply: int | None, log: Any) -> None:
        """Keep what went backwards in the change log's record (status turns critical; the
        runbook declares the epoch), and end a re-read an epoch declaration asked for."""
        updates: dict[str, str] = {}
        if regressed:
            known = read_regression(self.catalog.load_table(self.changelog).properties) or Regression()
            after = reapply if reapply is not None else applied_before
            updates[REGRESSION_PROPERTY] = known.joined(regressed, since, after, now_text()).model_dump_json()
            log.error("source positions went backwards with no epoch to explain them: those changes were not "
                      "applied; declare a source epoch (docs/runbooks/cdc-source-regressed.md)",
                      regressed=regressed, since_offsets=since)
        update_changelog_properties(self.catalog, self.changelog, updates,
                                    (REAPPLY_PROPERTY,) if reapply is not None else ())

    def _last_changes(self, applied: int | None, end: int, columns: list[str], names: WorkingNames,
                      changelog: Table, target: Table, state: Table, recovering: bool, epochs: Epochs,
                      log: Any) -> tuple[int, dict[int, int]]:
        """The views `streamberg_candidate` (per key, its newest change in the snapshots after
        `applied` up to `end`, and whether it is newer than the key state's: names("apply"))
        and `streamberg_last_change` (the candidates that apply). An update that changed the
        key also deletes the key before it: that delete is a change of the old key, with the
        update's partition, offset, time and sequence (merge/order.py)."""
        from pyspark.sql import functions as F

        seq = names("seq")
        changes = self._changes(applied, end)
        if self.sequence_field is not None:
            sequence = encoded_sequence(self.sequence_field, target.schema().find_field(self.sequence_field).field_type)
        elif changelog.schema().find_field(SOURCE_SEQ, True) is not None:
            sequence = F.col(SOURCE_SEQ)
        else:  # a change log of an earlier release, not yet given the column by the ingest
            sequence = F.lit(None).cast("string")
        epochs = self._with_new_sources(changes, changelog, epochs, log)
        named = changelog.schema().find_field(SOURCE_ID, True) is not None
        epoch = epoch_of(epochs, F.col(SOURCE_ID) if named else F.lit(None).cast("string"))
        changes = changes.withColumn(seq, with_epoch(sequence, epoch, epochs))
        facts = [OP, PARTITION, OFFSET, SOURCE_TS, seq]
        own = changes.select(*[F.col(quote(c)) for c in [*columns, *facts]])
        moved = changes.where(F.col(BEFORE_KEY).isNotNull()).select(
            *[F.col(f"{BEFORE_KEY}.{quote(c)}").alias(c) if c in self.keys
              else F.lit(None).cast(changes.schema[c].dataType).alias(c) for c in columns],
            F.lit(DELETE).alias(OP), F.col(PARTITION), F.col(OFFSET), F.col(SOURCE_TS), F.col(seq))
        last = last_changes(own.unionByName(moved), self.keys, names)
        stored = {c: names(f"stored_{c}") for c in ("seq", "partition", "offset", "source_ts")}
        snapshot = state.current_snapshot()
        reader = self.spark.read.format("iceberg")
        if snapshot is not None:  # pinned: the views read the same state after the key state's commit
            reader = reader.option("snapshot-id", str(snapshot.snapshot_id))
        known = reader.load(self.spark_key_state).select(
            *[F.col(f"{KEY}.{quote(k)}").alias(names(f"key_{k}")) for k in self.keys],
            F.col(KS_SEQ).alias(stored["seq"]), F.col(KS_PARTITION).alias(stored["partition"]),
            F.col(KS_OFFSET).alias(stored["offset"]), F.col(KS_SOURCE_TS).alias(stored["source_ts"]))
        on = [F.col(quote(k)).eqNullSafe(F.col(names(f"key_{k}"))) for k in self.keys]
        condition = on[0] if len(on) == 1 else _all(on)
        # Every change of the batch against the ones before it and the key state's: where
        # positions went backwards, from which offset (merge/epochs.py).
        regressions = first_offsets(regressed(own.join(known, on=condition, how="left"), self.keys, seq, stored, names),
                                    names("regressed"))
        candidates = last.join(known, on=condition, how="left") \
            .withColumn(names("apply"), newer_than_stored(seq, stored, recovering)) \
            .drop(*[names(f"key_{k}") for k in self.keys], *stored.values())
        # Materialised once: the counts, the key state's MERGE and the table's MERGE see the
        # same candidates, whatever either commit changes meanwhile.
        candidates = candidates.localCheckpoint(eager=True)
        candidates.createOrReplaceTempView("streamberg_candidate")
        candidates.where(F.col(names("apply"))).createOrReplaceTempView("streamberg_last_change")
        return regressions

    def _with_new_sources(self, changes: Any, changelog: Table, epochs: Epochs, log: Any) -> Epochs:
        """The epochs with one more for each source name the batch brings first (recorded in
        the change log before the batch is ordered by them)."""
        seen, first = source_names(changes, changelog.schema().find_field(SOURCE_ID, True) is not None)
        grown = epochs.with_sources(seen, first, now_text())
        if grown != epochs:
            update_changelog_properties(self.catalog, self.changelog, {EPOCHS_PROPERTY: grown.to_property()})
            log.warning("a new source epoch: positions of another source begin", sources=grown.sources)
        return grown

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
            .select(*[F.col(quote(k)) for k in self.keys]).distinct()
        keys.createOrReplaceTempView("streamberg_resync_keys")
        seen = keys.count()
        if seen == 0:
            raise ResyncRefused("no change since then: refusing to delete every row")
        on = " AND ".join(f"t.{quote(k)} = k.{quote(k)}" for k in self.keys)
        # The key state first (merge/key_state.py): the rows about to go are deleted keys.
        ensure_key_state(self.catalog, self.key_state, self.catalog.load_table(self.target.identifier), self.keys)
        state_on = " AND ".join(f"t.{KEY}.{quote(k)} = k.{quote(k)}" for k in self.keys)
        self.spark.sql(f"MERGE INTO {self.spark_key_state} t USING streamberg_resync_keys k ON {state_on} "
                       f"WHEN NOT MATCHED BY SOURCE AND NOT t.{KS_DELETED} THEN UPDATE SET t.{KS_DELETED} = true, "
                       f"t.{KS_APPLIED_AT} = current_timestamp()")
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

    def _key_state_sql(self, names: WorkingNames) -> str:
        """The key state's MERGE: each applied change's sequence and position recorded for its
        key (a change without a sequence keeps the key's last one: merge/order.py)."""
        on = " AND ".join(f"t.{KEY}.{quote(k)} = c.{quote(k)}" for k in self.keys)
        key = "named_struct(" + ", ".join(f"'{k}', c.{quote(k)}" for k in self.keys) + ")"
        seq, now = quote(names("seq")), "current_timestamp()"
        deleted = f"c.{quote(OP)} = '{DELETE}'"
        return (f"MERGE INTO {self.spark_key_state} t USING streamberg_last_change c ON {on} "
                f"WHEN MATCHED THEN UPDATE SET t.{KS_SEQ} = coalesce(c.{seq}, t.{KS_SEQ}), "
                f"t.{KS_PARTITION} = c.{quote(PARTITION)}, t.{KS_OFFSET} = c.{quote(OFFSET)}, "
                f"t.{KS_SOURCE_TS} = c.{quote(SOURCE_TS)}, t.{KS_DELETED} = {deleted}, t.{KS_APPLIED_AT} = {now} "
                f"WHEN NOT MATCHED THEN INSERT ({KEY}, {KS_SEQ}, {KS_PARTITION}, {KS_OFFSET}, {KS_SOURCE_TS}, "
                f"{KS_DELETED}, {KS_APPLIED_AT}) VALUES ({key}, c.{seq}, c.{quote(PARTITION)}, c.{quote(OFFSET)}, "
                f"c.{quote(SOURCE_TS)}, {deleted}, {now})")

    def _merge_sql(self, columns: list[str]) -> str:
        on = " AND ".join(f"t.{quote(k)} = c.{quote(k)}" for k in self.keys)
        values = [c for c in columns if c not in self.keys]
        update = ", ".join(f"t.{quote(c)} = c.{quote(c)}" for c in values)
        inserted = ", ".join(quote(c) for c in columns)
        matched = f"WHEN MATCHED THEN UPDATE SET {update} " if values else ""
        return (f"MERGE INTO {self.target.spark_name} t USING streamberg_last_change c ON {on} "
                f"WHEN MATCHED AND c.{quote(OP)} = '{DELETE}' THEN DELETE {matched}"
                f"WHEN NOT MATCHED AND c.{quote(OP)} != '{DELETE}' THEN INSERT ({inserted}) "
                f"VALUES ({', '.join('c.' + quote(c) for c in columns)})")

    def _run_recording(self, sql: str, properties: dict[str, str], landed: Callable[[], bool]) -> None:
        """Run the MERGE with `properties` in its snapshot's summary (CommitMetadata keeps them
        in a thread-local of the JVM thread that runs the statement). `landed`: whether the
        commit is there, asked when its state was unknown."""
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
            if iceberg_failure(error) is IcebergFailure.STATE_UNKNOWN and landed():
                self.log.warning("merge commit state was unknown; it landed")
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


def _all(conditions: list[Any]) -> Any:
    out = conditions[0]
    for condition in conditions[1:]:
        out = out & condition
    return out


def _lost_race(exc: BaseException) -> bool:
    return iceberg_failure(exc) in (IcebergFailure.VALIDATION, IcebergFailure.COMMIT_FAILED,
                                    IcebergFailure.STATE_UNKNOWN)
