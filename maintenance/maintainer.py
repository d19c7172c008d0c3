"""One maintenance run over one table: each step plans, executes and reports (its own module);
the maintainer runs them in order, retries a lost commit race, and records the run.

Steps, in this order, each planned against the table as the previous step left it:

1. retention   delete rows older than the cutoff (first, so later steps see the final data);
2. expire      drop old snapshots, keeping what ingest, the merge and the compactor need;
   changelog   a primary-key table's change log: trim what the merge applied (changelog.py);
3. orphans     delete unreferenced files older than the safety age (after expiry, so files
               expiry dereferences are deleted and counted by expiry itself);
4. manifests   rewrite the manifests when past a threshold (last, over the final file set).

A failing step is logged and reported; the others still run (each is independently safe).
Every step logs with the table and snapshot ids; the run's JSON object is returned and
recorded in ``streamberg_maintenance_runs``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from pyiceberg.exceptions import NoSuchTableError

from streamberg.common.catalog import shared_catalog, state_engine
from streamberg.common.config import MaintenanceConfig, TableTarget
from streamberg.common.jvm import java_message
from streamberg.common.log import get_logger
from streamberg.common.retry import BACKGROUND_MAX_BACKOFF_SECONDS, commit_retrying
from streamberg.common.times import iso_from_epoch
from streamberg.maintenance.changelog import ChangelogStep
from streamberg.maintenance.expire import ExpireStep
from streamberg.maintenance.manifests import ManifestsStep
from streamberg.maintenance.orphans import OrphansStep
from streamberg.maintenance.retention import RetentionStep
from streamberg.maintenance.side_tables import SideTablesStep
from streamberg.maintenance.step import SparkTable, Step, StepContext, StepResult, lost_commit_race
from streamberg.table_meta.maintenance_runs import record_run

# In execution order (module docstring).
# The steps an expiry between passes runs (maintenance.expire.check_seconds).
EXPIRY_STEPS = ("expire_snapshots", "changelog", "side_tables")
STEPS: tuple[type[Step], ...] = (RetentionStep, ExpireStep, ChangelogStep, SideTablesStep, OrphansStep, ManifestsStep)
# The keys of the run's JSON object, in their documented order.
_REPORTED = ("expire_snapshots", "orphan_files", "rewrite_manifests", "retention", "changelog", "side_tables")


class Maintainer:
    """Runs maintenance passes on one table with one SparkSession."""

    def __init__(self, settings: MaintenanceConfig, target: TableTarget, topic: str, spark: Any, *,
                 clock: Callable[[], float] = time.time, changelog: str | None = None,
                 dead_letter_table: str | None = None, key_state: str | None = None) -> None:
        """`settings`: the `maintenance` section; `target`: the catalog and table; `topic`: the
        Kafka topic whose committed offsets expiry must keep reachable."""
        self.settings = settings
        self.target = target
        self.identifier = target.identifier
        self.catalog = shared_catalog(target.catalog)
        self.context = StepContext(settings, target, topic, self.catalog, SparkTable(spark, target), clock, changelog,
                                   dead_letter_table, key_state)
        self.steps = [step(self.context) for step in STEPS]
        self.log = get_logger("maintenance", table=self.identifier)

    # -- one run ------------------------------------------------------------------------------

    def expiry_due(self) -> list[str]:
        """The tables holding a quarter more snapshots than maintenance.expire.max_snapshots
        (checked between passes: expiry paced by commits, not only by the pass interval)."""
        bound = self.settings.expire.max_snapshots * 1.25
        c = self.context
        due = []
        for identifier in (self.identifier, c.changelog, c.dead_letter_table, c.key_state):
            if identifier is None:
                continue
            try:
                if len(self.catalog.load_table(identifier).metadata.snapshots) > bound:
                    due.append(identifier)
            except NoSuchTableError:
                continue
        return due

    def run(self, *, dry_run: bool = False, stop: threading.Event | None = None,
            only: tuple[str, ...] | None = None, record: bool = True) -> dict[str, Any]:
        """One pass of every enabled step (`only`: of these steps alone); returns the run's
        JSON object, recorded unless `record` is false."""
        run_id = uuid.uuid4().hex
        started, t0 = time.time(), time.monotonic()
        before = self.context.load().current_snapshot()
        log = self.log.bind(run_id=run_id, dry_run=dry_run,
                            snapshot_id=before.snapshot_id if before is not None else None)
        log.info("maintenance run started")
        results: dict[str, StepResult] = {}
        status = "ok"
        for step in self.steps:
            if only is not None and step.key not in only:
                results[step.key] = StepResult(reason="not part of this run (an expiry between passes)")
                continue
            if stop is not None and stop.is_set():
                results[step.key] = StepResult(reason="stop requested before this step")
                status = "stopped" if status == "ok" else status
                continue
            try:
                results[step.key] = self._retrying(step, dry_run, log)
            except Exception as exc:  # noqa: BLE001 - one failed step must not stop the others
                message = java_message(exc)
                log.error("maintenance step failed", step=step.key, error=message)
                results[step.key] = StepResult(reason="failed", error=message)
                status = "failed"
        bytes_freed = sum(int(getattr(r, "bytes_freed", 0)) for r in results.values())
        finished = time.time()
        after = self.context.load().current_snapshot()
        result: dict[str, Any] = {
            "table": self.identifier, "dry_run": dry_run,
            **{key: results[key].as_json() for key in _REPORTED},
            "bytes_freed": bytes_freed,
            "duration_seconds": round(time.monotonic() - t0, 3),
            "status": status, "run_id": run_id,
            "started_at": iso_from_epoch(started), "finished_at": iso_from_epoch(finished),
            "snapshot_id_before": before.snapshot_id if before is not None else None,
            "snapshot_id_after": after.snapshot_id if after is not None else None,
        }
        try:
            if record:
                record_run(state_engine(self.target.catalog, self.catalog), self.target.catalog.name, result,
                           started_at=started,
                           finished_at=finished)
        except Exception as exc:  # noqa: BLE001 - the work is done; a missing record is reported, not fatal
            log.error("could not record the maintenance run", error=str(exc))
            result["status"] = "failed"
        log.info("maintenance run done", status=result["status"], bytes_freed=result["bytes_freed"],
                 duration_seconds=result["duration_seconds"], snapshot_id_after=result["snapshot_id_after"])
        return result

    def _retrying(self, step: Step, dry_run: bool, log: Any) -> StepResult:
        """Run a step; when its commit lost to concurrent commits even after Iceberg's own
        retries, plan and run it again (up to maintenance.commit_retries times, backing off)."""
        for attempt in commit_retrying(self.settings.commit_retries, lost_commit_race,
                                       max_backoff_seconds=BACKGROUND_MAX_BACKOFF_SECONDS, log=log.bind(step=step.key),
                                       event="step lost a commit race; retrying"):
            with attempt:
                out = step.run(dry_run, log)
                if attempt.retry_state.attempt_number > 1:
                    out.attempts = attempt.retry_state.attempt_number
                return out
        raise AssertionError("unreachable: the last attempt returns or raises")
