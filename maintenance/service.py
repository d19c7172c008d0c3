"""One maintenance run over one table: plan (planner.py) -> execute (runner.py) -> record (record.py).

Steps, in this order, each planned against the table as the previous step left it:

1. retention   delete rows older than the cutoff (first, so later steps see the final data);
2. expire      drop old snapshots, keeping what ingest and the compactor need;
3. orphans     delete unreferenced files older than the safety age (after expiry, so files
               expiry dereferences are deleted and counted by expiry itself);
4. manifests   rewrite the manifests when past a threshold (last, over the final file set).

A failing step is logged and reported; the others still run (each is independently safe).
Every step logs with the table and snapshot ids; the run's JSON object is returned and
recorded in ``streamberg_maintenance_runs``.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from pyiceberg.expressions import LessThan
from pyiceberg.table import Table

from streamberg.common.catalog import load_catalog
from streamberg.common.config import MaintenanceConfig, TableTarget
from streamberg.common.errors import LocationRefused, RetentionColumnError
from streamberg.common.jvm import java_message
from streamberg.common.log import get_logger
from streamberg.common.maintenance_runs import record_run
from streamberg.common.redact import redact
from streamberg.common.retry import BACKGROUND_MAX_BACKOFF_SECONDS, commit_retrying
from streamberg.common.times import iso_from_epoch, iso_from_ms
from streamberg.maintenance.confine import check_location, confine, outside_reason
from streamberg.maintenance.planner import (
    RetentionPlan,
    manifest_rewrite_snapshot,
    plan_expire,
    plan_manifests,
    plan_retention,
)
from streamberg.maintenance.procedures import MaintenanceRunner, lost_commit_race
from streamberg.maintenance.reachability import file_sizes, only_referenced_by, still_present

# Orphan paths listed in the result (all are counted; the log carries the same sample).
MAX_LISTED_PATHS = 100
# Iceberg's expire_snapshots output columns, and reachability's file kinds, as result keys.
_DELETED_KEYS = {
    "deleted_data_files_count": "data", "deleted_position_delete_files_count": "delete_files",
    "deleted_equality_delete_files_count": "delete_files", "deleted_manifest_files_count": "manifests",
    "deleted_manifest_lists_count": "manifest_lists", "deleted_statistics_files_count": "statistics",
}
_KIND_KEYS = {"data": "data", "delete": "delete_files", "manifest": "manifests", "manifest-list": "manifest_lists"}


def _by_kind(counts: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, n in counts.items():
        if n:
            name = _DELETED_KEYS.get(key) or _KIND_KEYS.get(key, key)
            out[name] = out.get(name, 0) + n
    return out



def _off(reason: str, **zeros: Any) -> dict[str, Any]:
    return {"ran": False, "reason": reason, **zeros}


class Maintainer:
    """Runs maintenance passes on one table with one SparkSession."""

    def __init__(self, settings: MaintenanceConfig, target: TableTarget, topic: str, spark: Any, *,
                 clock: Callable[[], float] = time.time) -> None:
        """`settings`: the `maintenance` section; `target`: the catalog and table; `topic`: the
        Kafka topic whose committed offsets expiry must keep reachable."""
        self.settings = settings
        self.target = target
        self.topic = topic
        self.identifier = target.identifier
        self.catalog = load_catalog(target.catalog)
        self.runner = MaintenanceRunner(spark, target)
        self.clock = clock
        self.log = get_logger("maintenance", table=self.identifier)

    def load(self) -> Table:
        return self.catalog.load_table(self.identifier)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # -- one run ------------------------------------------------------------------------------

    def run(self, *, dry_run: bool = False, stop: threading.Event | None = None) -> dict[str, Any]:
        """One pass of every enabled step; returns the run's JSON object (also recorded)."""
        run_id = uuid.uuid4().hex
        started, t0 = time.time(), time.monotonic()
        table = self.load()
        before = table.current_snapshot()
        log = self.log.bind(run_id=run_id, dry_run=dry_run,
                            snapshot_id=before.snapshot_id if before is not None else None)
        log.info("maintenance run started")
        # Keys in the documented order; the steps run in execution order (module docstring).
        result: dict[str, Any] = {"table": self.identifier, "dry_run": dry_run, "expire_snapshots": None,
                                  "orphan_files": None, "rewrite_manifests": None, "retention": None}
        steps: dict[str, Callable[[bool, Any], dict[str, Any]]] = {
            "retention": self.retention, "expire_snapshots": self.expire,
            "orphan_files": self.remove_orphans, "rewrite_manifests": self.rewrite_manifests,
        }
        status = "ok"
        for name, step in steps.items():
            if stop is not None and stop.is_set():
                result[name] = _off("stop requested before this step")
                status = "stopped" if status == "ok" else status
                continue
            try:
                result[name] = self._retrying(name, step, dry_run, log)
            except Exception as exc:  # noqa: BLE001 - one failed step must not stop the others
                message = java_message(exc)
                log.error("maintenance step failed", step=name, error=message)
                result[name] = _off("failed", error=message)
                status = "failed"
        expire, orphans = result["expire_snapshots"], result["orphan_files"]
        result["bytes_freed"] = int(expire.get("bytes_freed", 0)) + int(orphans.get("bytes_freed", 0))
        finished = time.time()
        after = self.load().current_snapshot()
        result.update({
            "duration_seconds": round(time.monotonic() - t0, 3),
            "status": status, "run_id": run_id,
            "started_at": iso_from_epoch(started), "finished_at": iso_from_epoch(finished),
            "snapshot_id_before": before.snapshot_id if before is not None else None,
            "snapshot_id_after": after.snapshot_id if after is not None else None,
        })
        try:
            record_run(self.catalog.engine, self.target.catalog.name, result, started_at=started, finished_at=finished)
        except Exception as exc:  # noqa: BLE001 - the work is done; a missing record is reported, not fatal
            log.error("could not record the maintenance run", error=str(exc))
            result["status"] = "failed"
        log.info("maintenance run done", status=result["status"], bytes_freed=result["bytes_freed"],
                 duration_seconds=result["duration_seconds"], snapshot_id_after=result["snapshot_id_after"])
        return result

    def _retrying(self, name: str, step: Callable[[bool, Any], dict[str, Any]], dry_run: bool,
                  log: Any) -> dict[str, Any]:
        """Run a step; when its commit lost to concurrent commits even after Iceberg's own
        retries, plan and run it again (up to maintenance.commit_retries times, backing off)."""
        for attempt in commit_retrying(self.settings.commit_retries, lost_commit_race,
                                       max_backoff_seconds=BACKGROUND_MAX_BACKOFF_SECONDS, log=log.bind(step=name),
                                       event="step lost a commit race; retrying"):
            with attempt:
                out = step(dry_run, log)
                if attempt.retry_state.attempt_number > 1:
                    out["attempts"] = attempt.retry_state.attempt_number
                return out
        raise AssertionError("unreachable: the last attempt returns or raises")

    # -- steps --------------------------------------------------------------------------------

    def expire(self, dry_run: bool, log: Any) -> dict[str, Any]:
        zeros = {"expired": 0, "kept": 0, "protected_snapshot_ids": [], "deleted_files": 0, "bytes_freed": 0}
        if not self.settings.expire.enabled:
            return _off("maintenance.expire.enabled is false", **zeros)
        table = self.load()
        plan = plan_expire(table, self.settings.expire, self.topic, self.now_ms())
        log = log.bind(step="expire_snapshots", snapshot_id=plan.current_snapshot_id)
        out: dict[str, Any] = {
            "ran": False, "expired": len(plan.expired_ids), "kept": len(plan.kept_ids),
            "protected_snapshot_ids": plan.protected_ids,
            "protected": [{"snapshot_id": p.snapshot_id, "committed_at": iso_from_ms(p.timestamp_ms), "reason": p.reason}
                          for p in plan.protected],
            "held_back_snapshot_ids": list(plan.held_back_ids),
            "older_than": iso_from_ms(plan.older_than_ms), "retain_last": plan.retain_last,
            "configured_older_than": iso_from_ms(plan.configured_older_than_ms),
            "deleted_files": 0, "bytes_freed": 0,
        }
        log.info("expire plan", expired=out["expired"], kept=out["kept"], older_than=out["older_than"],
                 retain_last=plan.retain_last, protected=out["protected"], held_back=out["held_back_snapshot_ids"])
        if plan.refusal:
            log.error("expiry refused", reason=plan.refusal)
            raise RuntimeError(plan.refusal)
        if not plan.expired_ids:
            out["reason"] = "no snapshot is past the age/count bounds"
            return out
        doomed = only_referenced_by(table, plan.expired_ids, plan.kept_ids)
        # Iceberg's procedure deletes every file the expired snapshots alone reference, wherever
        # it is (a file added from elsewhere with add_files included): deletes never leave the
        # table's location, so such an expiry is refused and left to the operator.
        location = table.location()
        outside = {path: reason for path in doomed if (reason := outside_reason(path, location))}
        if outside:
            example = next(iter(outside))
            reason = (f"expiry would delete {len(outside)} file(s) not safely inside the table location "
                      f"{redact(location)}, e.g. {redact(example)} ({outside[example]}); streamberg deletes only "
                      "inside the table's location: check those files and expire these snapshots by hand")
            log.error("expiry refused", reason=reason, outside_files=len(outside))
            raise LocationRefused(reason)
        if dry_run:
            kinds = [ref.kind for ref in doomed.values()]
            out.update(deleted_files=len(doomed), deleted_by_kind=_by_kind({k: kinds.count(k) for k in set(kinds)}),
                       bytes_freed=sum(r.size_bytes for r in doomed.values()))
            return out
        counts = self.runner.expire_snapshots(plan)
        after = self.load()
        remaining = {s.snapshot_id for s in after.metadata.snapshots}
        expired = [s for s in plan.expired_ids + plan.kept_ids if s not in remaining]
        gone = set(doomed) - still_present(after, doomed)
        out.update(
            ran=True, expired=len(expired), kept=len(remaining),
            deleted_files=sum(counts.values()),
            deleted_by_kind=_by_kind(counts),
            bytes_freed=sum(doomed[p].size_bytes for p in gone),
        )
        if sorted(expired) != sorted(plan.expired_ids):
            log.warning("expired snapshots differ from the plan (concurrent commit?)",
                        planned=len(plan.expired_ids), expired=len(expired))
        if lost := sorted(set(plan.protected_ids) - remaining):
            # Cannot happen with the bounds above; if it ever does, make it loud.
            log.critical("protected snapshots were expired", snapshot_ids=lost)
            raise RuntimeError(f"protected snapshots were expired: {lost}")
        log.info("snapshots expired", expired=out["expired"], kept=out["kept"], deleted_files=out["deleted_files"],
                 deleted_by_kind=out["deleted_by_kind"], bytes_freed=out["bytes_freed"],
                 protected_snapshot_ids=plan.protected_ids)
        return out

    def remove_orphans(self, dry_run: bool, log: Any) -> dict[str, Any]:
        settings = self.settings.orphan
        if not settings.enabled:
            return _off("maintenance.orphan.enabled is false", removed=0, bytes_freed=0)
        older_than_ms = self.now_ms() - int(settings.safety_age_seconds * 1000)
        table = self.load()
        current = table.current_snapshot()
        log = log.bind(step="orphan_files", snapshot_id=current.snapshot_id if current is not None else None)
        location = table.location()
        try:
            # Refuses a location outside the warehouse or holding another table (confine.py).
            check_location(self.settings, self.target.catalog.warehouse, self.catalog, self.identifier, location)
        except LocationRefused as exc:
            log.error("orphan removal refused", location=location, reason=str(exc))
            raise
        listed = self.runner.find_orphans(older_than_ms)
        # Hadoop's local listing follows symlinks: what lies behind one, or outside the
        # location, is never the table's to delete.
        orphans, skipped = confine(listed, location)
        sizes = file_sizes(table, orphans)
        out: dict[str, Any] = {"ran": not dry_run, "removed": len(orphans), "bytes_freed": sum(sizes.values()),
                               "older_than": iso_from_ms(older_than_ms),
                               "paths": orphans[:MAX_LISTED_PATHS]}
        if skipped:
            out["skipped"] = [{"path": p, "reason": r} for p, r in sorted(skipped.items())[:MAX_LISTED_PATHS]]
            out["skipped_count"] = len(skipped)
            log.warning("orphan candidates skipped: not the table's to delete (outside its location or behind a "
                        "symlink)", count=len(skipped), sample=out["skipped"][:10])
        if dry_run or not orphans:
            log.info("orphan files found" if orphans else "no orphan files", count=len(orphans),
                     bytes=out["bytes_freed"], older_than=out["older_than"], sample=orphans[:10])
            return out
        try:
            late = self.runner.delete_files(orphans, check=lambda path: outside_reason(path, location))
        except Exception as exc:  # noqa: BLE001 - what did go is still counted below
            log.warning("orphan deletion stopped", error=java_message(exc))
        else:
            if late:
                log.warning("orphan candidates skipped at deletion (changed since the listing)",
                            count=len(late), sample=sorted(late.items())[:10])
        left = still_present(table, orphans)
        gone = [p for p in orphans if p not in left]
        out.update(removed=len(gone), bytes_freed=sum(sizes.get(p, 0) for p in gone))
        if left:
            out["not_removed"] = sorted(left)[:MAX_LISTED_PATHS]
            log.warning("some orphan files could not be deleted", count=len(left), sample=sorted(left)[:10])
        log.info("orphan files removed", removed=out["removed"], bytes_freed=out["bytes_freed"],
                 older_than=out["older_than"], sample=gone[:10])
        return out

    def rewrite_manifests(self, dry_run: bool, log: Any) -> dict[str, Any]:
        settings = self.settings.manifests
        if not settings.enabled:
            return _off("maintenance.manifests.enabled is false", manifests_before=None, manifests_after=None)
        table = self.load()
        plan = plan_manifests(table, settings)
        log = log.bind(step="rewrite_manifests", snapshot_id=plan.snapshot_id)
        out: dict[str, Any] = {"ran": False, "manifests_before": plan.count, "manifests_after": plan.count,
                               "manifest_bytes_before": plan.total_bytes, "reasons": list(plan.reasons)}
        if not plan.run:
            out["reason"] = (f"below thresholds (min_count {settings.min_count}, "
                             f"min_total_bytes {settings.min_total_bytes})" if not plan.reasons
                             else "already one manifest per content type")
            log.info("manifests left as they are", count=plan.count, bytes=plan.total_bytes, reason=out["reason"])
            return out
        if dry_run:
            out.update(would_run=True, manifests_after=None)
            log.info("manifests would be rewritten", count=plan.count, bytes=plan.total_bytes, reasons=plan.reasons)
            return out
        known = {s.snapshot_id for s in table.metadata.snapshots}
        counts = self.runner.rewrite_manifests()
        after = self.load()
        # The rewrite's own snapshot, not the current one: ingest may have appended since.
        snapshot = manifest_rewrite_snapshot(after, known)
        manifests = snapshot.manifests(after.io) if snapshot is not None else []
        out.update(ran=True, manifests_after=len(manifests),
                   manifest_bytes_after=sum(m.manifest_length for m in manifests),
                   snapshot_id=snapshot.snapshot_id if snapshot is not None else None,
                   rewritten=counts.get("rewritten_manifests_count", 0), added=counts.get("added_manifests_count", 0))
        log.info("manifests rewritten", manifests_before=plan.count, manifests_after=out["manifests_after"],
                 new_snapshot_id=out["snapshot_id"], reasons=plan.reasons)
        return out

    def retention(self, dry_run: bool, log: Any) -> dict[str, Any]:
        settings = self.settings.retention
        zeros = {"column": settings.column, "records_deleted": 0, "files_deleted": 0}
        table = self.load()
        try:
            plan = plan_retention(table, settings, self.now_ms())
        except RetentionColumnError as exc:
            raise RetentionColumnError(f"maintenance.retention.column: {exc}") from None
        if plan is None:
            return _off("maintenance.retention.days is null (retention off)", **zeros)
        current = table.current_snapshot()
        log = log.bind(step="retention", snapshot_id=current.snapshot_id if current is not None else None)
        whole, partial = self._files_older_than(table, plan)
        records = self.runner.count_older_than(plan) if current is not None else 0
        out: dict[str, Any] = {
            "ran": False, "column": plan.column, "older_than": plan.cutoff.isoformat(),
            "requested_older_than": plan.requested_cutoff.isoformat(), "aligned_to": plan.aligned_to,
            "records_deleted": records, "files_deleted": whole, "files_rewritten": partial,
        }
        if records == 0:
            out["reason"] = "no rows older than the cutoff"
            log.info("retention: nothing to delete", older_than=out["older_than"])
            return out
        if dry_run:
            log.info("retention would delete", records=records, whole_files=whole, partially_matching_files=partial,
                     older_than=out["older_than"], aligned_to=plan.aligned_to)
            return out
        self.runner.delete_older_than(plan)
        snapshot = self.load().current_snapshot()
        summary = dict(snapshot.summary.additional_properties) if snapshot and snapshot.summary else {}

        def n(key: str) -> int:
            return int(summary.get(key, 0))

        out.update(
            ran=True, snapshot_id=snapshot.snapshot_id if snapshot else None,
            operation=snapshot.summary.operation.value if snapshot and snapshot.summary else None,
            # Copy-on-write rewrites keep the surviving rows of a partially matching file in
            # new files: deleted-records counts whole removed files, added-records the survivors.
            records_deleted=n("deleted-records") - n("added-records") + n("added-position-deletes"),
            files_deleted=n("deleted-data-files"), files_rewritten=n("added-data-files"),
            delete_files_added=n("added-delete-files"),
        )
        log.info("retention applied", new_snapshot_id=out["snapshot_id"], operation=out["operation"],
                 records_deleted=out["records_deleted"], files_deleted=out["files_deleted"],
                 files_rewritten=out["files_rewritten"], older_than=out["older_than"], aligned_to=plan.aligned_to)
        return out

    @staticmethod
    def _files_older_than(table: Table, plan: RetentionPlan) -> tuple[int, int]:
        """(files whose rows are all older than the cutoff, files that are only partly)."""
        from pyiceberg.conversions import from_bytes

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
            if upper is not None and from_bytes(field.field_type, upper) < bound:
                whole += 1
            else:
                partial += 1
        return whole, partial
