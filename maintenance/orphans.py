"""Orphan files: files under the table's location that no snapshot or metadata file references.

Found by Iceberg's ``DeleteOrphanFiles`` Spark action (through py4j), not the
``remove_orphan_files`` procedure: the procedure refuses any ``older_than`` under 24 hours
("use the Action API"), while streamberg's floor is a configurable safety age (1 hour unless
overridden), which no in-flight write reaches. The action is given a delete function that
only collects the paths (a ``java.util.stream.Stream.Builder`` is a ``Consumer<String>``), so
it finds orphans and deletes nothing; this step confines and sizes them, then deletes them
through the table's FileIO. One directory listing serves both the dry run and the real run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamberg.common.catalog import warehouse_location
from streamberg.common.errors import LocationRefused
from streamberg.common.jvm import iterate, java_message
from streamberg.common.times import iso_from_ms
from streamberg.maintenance.confine import check_location, confine, outside_reason
from streamberg.maintenance.reachability import file_sizes, still_present
from streamberg.maintenance.step import SparkTable, Step, StepResult, detail

# Orphan paths listed in the result (all are counted; the log carries the same sample).
MAX_LISTED_PATHS = 100


def find_orphans(spark_table: SparkTable, older_than_ms: int) -> list[str]:
    """Files under the table location, older than the cutoff, referenced by no snapshot or
    metadata file (Iceberg's DeleteOrphanFiles logic); nothing is deleted here."""
    table = spark_table.java_table()
    spark = spark_table.spark
    collect_only = spark._jvm.java.util.stream.Stream.builder()
    result = (spark._jvm.org.apache.iceberg.spark.actions.SparkActions.get(spark._jsparkSession)
              .deleteOrphanFiles(table).olderThan(older_than_ms).deleteWith(collect_only).execute())
    return sorted(str(p) for p in iterate(result.orphanFileLocations()))


def delete_files(spark_table: SparkTable, paths: list[str],
                 check: Callable[[str], str | None] | None = None) -> dict[str, str]:
    """Delete through the table's Java FileIO, as Iceberg's own actions do (on a local
    warehouse, Hadoop's file system then removes each file's .crc sidecar with it).

    `check(path)` runs just before each delete; a reason it returns skips the path.
    Returns {skipped path: reason}."""
    io = spark_table.java_table().io()
    skipped = {}
    for path in paths:
        reason = check(path) if check is not None else None
        if reason is not None:
            skipped[path] = reason
            continue
        io.deleteFile(path)
    return skipped


@dataclass
class OrphansResult(StepResult):
    removed: int = 0
    bytes_freed: int = 0
    older_than: str | None = detail()
    paths: list[str] | None = detail()
    skipped: list[dict[str, str]] | None = detail()
    skipped_count: int | None = detail()
    not_removed: list[str] | None = detail()
    unchecked_tables: list[str] | None = detail()  # other tables whose location could not be read


class OrphansStep(Step):
    key = "orphan_files"
    section = "orphan"
    result_type = OrphansResult

    def _run(self, dry_run: bool, log: Any) -> OrphansResult:
        context = self.context
        settings = context.settings.orphan
        older_than_ms = context.now_ms() - int(settings.safety_age_seconds * 1000)
        table = context.load()
        current = table.current_snapshot()
        log = log.bind(step=self.key, snapshot_id=current.snapshot_id if current is not None else None)
        location = table.location()
        try:
            # Refuses a location outside the warehouse or holding another table (confine.py).
            unchecked = check_location(context.settings, warehouse_location(context.target.catalog, context.catalog),
                                       context.catalog, context.target.identifier, location)
        except LocationRefused as exc:
            log.error("orphan removal refused", location=location, reason=str(exc))
            raise
        if unchecked:
            log.warning("tables whose location could not be read were passed over; orphan removal goes on",
                        tables=unchecked[:20], count=len(unchecked))
        listed = find_orphans(context.spark, older_than_ms)
        # Hadoop's local listing follows symlinks: what lies behind one, or outside the
        # location, is never the table's to delete.
        orphans, skipped = confine(listed, location)
        sizes = file_sizes(table, orphans)
        out = OrphansResult(ran=not dry_run, removed=len(orphans), bytes_freed=sum(sizes.values()),
                            older_than=iso_from_ms(older_than_ms), paths=orphans[:MAX_LISTED_PATHS],
                            unchecked_tables=unchecked[:MAX_LISTED_PATHS] or None)
        if skipped:
            out.skipped = [{"path": p, "reason": r} for p, r in sorted(skipped.items())[:MAX_LISTED_PATHS]]
            out.skipped_count = len(skipped)
            log.warning("orphan candidates skipped: not the table's to delete (outside its location or behind a "
                        "symlink)", count=len(skipped), sample=out.skipped[:10])
        if dry_run or not orphans:
            log.info("orphan files found" if orphans else "no orphan files", count=len(orphans),
                     bytes=out.bytes_freed, older_than=out.older_than, sample=orphans[:10])
            return out
        try:
            late = delete_files(context.spark, orphans, check=lambda path: outside_reason(path, location))
        except Exception as exc:  # noqa: BLE001 - what did go is still counted below
            log.warning("orphan deletion stopped", error=java_message(exc))
        else:
            if late:
                log.warning("orphan candidates skipped at deletion (changed since the listing)",
                            count=len(late), sample=sorted(late.items())[:10])
        left = still_present(table, orphans)
        gone = [p for p in orphans if p not in left]
        out.removed, out.bytes_freed = len(gone), sum(sizes.get(p, 0) for p in gone)
        if left:
            out.not_removed = sorted(left)[:MAX_LISTED_PATHS]
            log.warning("some orphan files could not be deleted", count=len(left), sample=sorted(left)[:10])
        log.info("orphan files removed", removed=out.removed, bytes_freed=out.bytes_freed,
                 older_than=out.older_than, sample=gone[:10])
        return out
