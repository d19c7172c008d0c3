"""A primary-key table's change log, trimmed of what the merge applied (docs/cdc.md).

The change log is an append table that only grows; the merge stage records in the primary-key
table which change-log snapshot it applied last (table_meta/changelog.py). Everything at or
before that snapshot is in the table already, so once older than
maintenance.changelog.keep_applied_seconds it can go:

1. the data files those snapshots added leave the change log in one delete commit (Iceberg's
   DeleteFiles, given the DataFiles; `streamberg.operation: changelog-trim`). The merge reads only
   appends after its position, and the ingest finds its offsets by walking past
   snapshots without them, so neither notices;
2. the change log's snapshots older than the applied one are expired (Iceberg's
   expire_snapshots with the applied snapshot's time and depth as bounds: it, the ingest's
   position after it and everything newer stay), which removes the trimmed files. As for the
   table's own expiry, the files only those snapshots reference are listed first and a file
   outside the change log's location refuses the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamberg.common.config import TableTarget
from streamberg.common.jvm import iterate
from streamberg.common.times import iso_from_ms
from streamberg.maintenance.side_tables import expire_to
from streamberg.maintenance.step import SparkTable, Step, StepResult, detail
from streamberg.table_meta.changelog import TRIM_OPERATION, applied_snapshot_id
from streamberg.table_meta.dead_letter_outbox import outbox_chain
from streamberg.table_meta.offsets import ancestry
from streamberg.table_meta.source_epochs import read_regression, reapply_after
from streamberg.table_meta.summary_keys import SummaryKeys, TablePropertyKeys
from streamberg.table_meta.table_files import live_data_files


@dataclass
class ChangelogResult(StepResult):
    files_removed: int = 0
    rows_removed: int = 0
    snapshots_expired: int = 0
    kept_for_dead_letters: int = 0  # snapshots kept because they name dead letters not yet applied
    bytes_freed: int = 0
    applied_snapshot_id: int | None = detail()
    kept_after: str | None = detail()  # applied changes committed after this are kept


class ChangelogStep(Step):
    key = "changelog"
    section = "changelog"
    result_type = ChangelogResult

    def _run(self, dry_run: bool, log: Any) -> ChangelogResult:
        context = self.context
        if context.changelog is None:
            return ChangelogResult(reason="an append table: no change log")
        changelog = context.catalog.load_table(context.changelog)
        applied = applied_snapshot_id(context.load())
        log = log.bind(step=self.key, changelog=context.changelog, applied_changelog_snapshot=applied)
        if applied is None:
            return ChangelogResult(reason="the merge has applied nothing yet")
        # Changes whose source positions went backwards, or that an epoch declared since will
        # have merged again, stay until that is done (table_meta/source_epochs.py).
        regression = read_regression(changelog.properties)
        held = reapply_after(changelog.properties) or (regression.after_snapshot if regression else None)
        if regression is not None and held is None:
            return ChangelogResult(reason="source positions went backwards before the first merge; nothing trimmed "
                                          "until an epoch is declared (docs/runbooks/cdc-source-regressed.md)")
        if held is not None:
            applied = held
        lineage = list(ancestry(changelog))
        depth = next((i for i, s in enumerate(lineage) if s.snapshot_id == applied), None)
        if depth is None:
            return ChangelogResult(reason=f"the applied change-log snapshot {applied} is not on the change log's lineage "
                                          "(recreated?); nothing trimmed")
        applied_ids = {s.snapshot_id for s in lineage[depth:]}
        cutoff_ms = context.now_ms() - int(context.settings.changelog.keep_applied_seconds * 1000)
        done = [f for f in live_data_files(changelog)[0]
                if f.snapshot_id in applied_ids and f.added_at_ms is not None and f.added_at_ms <= cutoff_ms]
        out = ChangelogResult(ran=not dry_run, applied_snapshot_id=applied, kept_after=iso_from_ms(cutoff_ms),
                              files_removed=len(done), rows_removed=sum(f.record_count for f in done))
        spark = SparkTable(context.spark.spark, TableTarget(context.target.catalog, context.target.table.model_copy(
            update={"identifier": context.changelog})))
        if done and not dry_run:
            # By DataFile: py4j hands a path string to the DataFile overload, which matches nothing.
            table = spark.java_table()
            paths = {f.path for f in done}
            # The delete and the running total of trimmed rows in one atomic commit.
            transaction = table.newTransaction()
            trimmed = int(table.properties().getOrDefault(TablePropertyKeys.CHANGELOG_TRIMMED_RECORDS, "0"))
            delete = transaction.newDelete()
            matched = 0
            for task in iterate(table.newScan().planFiles()):
                if str(task.file().location()) in paths:
                    delete.deleteFile(task.file())
                    matched += 1
            if matched != len(paths):
                raise RuntimeError(f"change-log trim found {matched} of the {len(paths)} applied files in Iceberg's scan; "
                                   "nothing trimmed")
            delete.set(SummaryKeys.OPERATION, TRIM_OPERATION).commit()
            transaction.updateProperties().set(TablePropertyKeys.CHANGELOG_TRIMMED_RECORDS,
                                               str(trimmed + out.rows_removed)).commit()
            transaction.commitTransaction()
            log.info("applied changes trimmed from the change log", files=len(done), rows=out.rows_removed)
        changelog = changelog.refresh()
        lineage = list(ancestry(changelog))
        depth = next(i for i, s in enumerate(lineage) if s.snapshot_id == applied)
        older_than, retain_last = lineage[depth].timestamp_ms, depth + 1
        # Snapshots naming dead letters not yet in the dead-letter table are kept too.
        if outbox := outbox_chain(changelog, context.load_dead_letters(), context.changelog):
            older_than, retain_last = min(older_than, outbox[-1].timestamp_ms), max(retain_last, len(outbox))
            out.kept_for_dead_letters = len(outbox)
        expiry = expire_to(context, context.changelog, changelog, older_than, retain_last, dry_run, log)
        out.snapshots_expired, out.bytes_freed = expiry.snapshots, expiry.bytes_freed
        return out
