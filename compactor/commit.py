"""Commit manager: one atomic RewriteFiles per batch of rewritten groups.

Each commit replaces the groups' old files by their new files in one snapshot, validated
against the plan's starting snapshot (``validateFromSnapshot``) and with the starting data
sequence number, as Iceberg's own rewrite does:

- appends committed since the plan (a live ingest job) do not conflict: Iceberg re-applies
  the rewrite on top of them (its own retry on a lost compare-and-swap), so they are kept;
  we log how many concurrent commits the rewrite was rebased over;
- a change that removed any of the files being replaced (``ValidationException``) makes the
  batch give up cleanly: its new files are deleted, the old ones stay, and the next plan
  looks at them afresh;
- a commit still failing after Iceberg's retries (``CommitFailedException``) is retried here
  ``commit_retries`` times with backoff, each attempt logged;
- an unknown commit state (the catalog did not answer) is resolved by looking for this
  commit's id in the table's snapshots; new files are never deleted while it is unknown.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streamberg.common.jvm import IcebergFailure, iceberg_failure, iterate, java_class_name, java_message, java_set
from streamberg.common.log import get_logger
from streamberg.common.retry import BACKGROUND_MAX_BACKOFF_SECONDS, commit_retrying
from streamberg.compactor import record
from streamberg.compactor.runner import RewriteResult, delete_files
from streamberg.table_meta.summary_keys import SummaryKeys


@dataclass
class CommitOutcome:
    status: str  # committed | conflict | failed | unknown | lease-lost
    snapshot_id: int | None = None
    summary: dict[str, str] = field(default_factory=dict)
    attempts: int = 0
    rebased_over: list[int] = field(default_factory=list)  # concurrent snapshots since the plan
    error: str | None = None

    @property
    def committed(self) -> bool:
        return self.status == "committed"


class CommitManager:
    def __init__(self, spark: Any, jtable: Any, *, starting_snapshot_id: int, starting_sequence_number: int,
                 retries: int, lease_check: Callable[[], None] | None = None, table: str = "") -> None:
        self.spark = spark
        self.jtable = jtable
        self.starting_snapshot_id = starting_snapshot_id
        self.starting_sequence_number = starting_sequence_number
        self.retries = retries
        self.lease_check = lease_check
        # Snapshots this manager committed: a later batch of the same plan is not "rebased"
        # over its own earlier commits.
        self.own_snapshots: set[int] = set()
        self.log = get_logger("compactor.commit", table=table, plan_snapshot_id=starting_snapshot_id)

    def commit(self, results: list[RewriteResult], summary: Mapping[str, str]) -> CommitOutcome:
        """Commit all `results` as one snapshot carrying `summary`; never raises for conflicts."""
        commit_id = str(uuid.uuid4())
        props = record.check_summary({**summary, SummaryKeys.COMPACTOR_COMMIT_ID: commit_id})
        new_paths = [p for r in results for p in r.new_paths]
        attempts = 0
        try:
            for attempt in commit_retrying(self.retries, _lost_race, max_backoff_seconds=BACKGROUND_MAX_BACKOFF_SECONDS,
                                           log=self.log, event="commit failed after Iceberg's retries; retrying"):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    if self.lease_check is not None:
                        try:
                            self.lease_check()
                        except Exception as exc:  # noqa: BLE001 - any lease problem means: do not commit
                            delete_files(self.jtable, new_paths)
                            self.log.error("lease lost before commit; new files removed, nothing committed",
                                           error=str(exc))
                            return CommitOutcome("lease-lost", attempts=attempts, error=str(exc))
                    self._commit_once(results, props)
        except Exception as exc:  # noqa: BLE001 - classified below
            kind = iceberg_failure(exc)
            message = java_message(exc)
            if kind is IcebergFailure.VALIDATION:
                delete_files(self.jtable, new_paths)
                self.log.warning("commit conflicts with a concurrent change; batch given up, its files stay pending",
                                 error=message, attempt=attempts, commit_id=commit_id)
                return CommitOutcome("conflict", attempts=attempts, error=message)
            if kind is IcebergFailure.STATE_UNKNOWN:
                found = self._find_commit(commit_id)
                if found is not None:
                    self.log.warning("commit state was unknown; found it committed", snapshot_id=found,
                                     commit_id=commit_id)
                    return self._committed(found, props, attempts)
                self.log.error("commit state unknown and not found; new files kept (not deleted) in case "
                               "it lands; they are orphans otherwise", error=message, commit_id=commit_id)
                return CommitOutcome("unknown", attempts=attempts, error=message)
            delete_files(self.jtable, new_paths)
            self.log.error("commit failed; new files removed, old files stay pending", error=message,
                           error_class=java_class_name(exc) or type(exc).__name__, attempt=attempts)
            return CommitOutcome("failed", attempts=attempts, error=message)
        snapshot_id = int(self.jtable.currentSnapshot().snapshotId())
        return self._committed(snapshot_id, props, attempts)

    def _commit_once(self, results: list[RewriteResult], props: Mapping[str, str]) -> None:
        self.jtable.refresh()
        old = java_set(self.spark, (f for r in results for f in r.old_files))
        new = java_set(self.spark, (f for r in results for f in r.new_files))
        rewrite = (self.jtable.newRewrite()
                   .validateFromSnapshot(self.starting_snapshot_id)
                   .rewriteFiles(old, new, self.starting_sequence_number))
        for key, value in props.items():
            rewrite = rewrite.set(key, value)
        rewrite.commit()

    def _committed(self, snapshot_id: int, props: Mapping[str, str], attempts: int) -> CommitOutcome:
        self.own_snapshots.add(snapshot_id)
        rebased = [s for s in self._snapshots_between(snapshot_id) if s not in self.own_snapshots]
        if rebased:
            # Not an error: concurrent ingest appends since the plan were kept and validated against.
            self.log.info("commit rebased over concurrent commits", snapshot_id=snapshot_id,
                          concurrent_snapshots=rebased, count=len(rebased))
        return CommitOutcome("committed", snapshot_id=snapshot_id, summary=dict(props), attempts=attempts,
                             rebased_over=rebased)

    def _snapshots_between(self, snapshot_id: int) -> list[int]:
        """Snapshots committed by others between the plan's start and our snapshot, oldest first."""
        between = []
        snap = self.jtable.snapshot(snapshot_id)
        parent = snap.parentId() if snap is not None else None
        while parent is not None and int(parent) != self.starting_snapshot_id:
            between.append(int(parent))
            snap = self.jtable.snapshot(parent)
            parent = snap.parentId() if snap is not None else None
        return list(reversed(between))

    def _find_commit(self, commit_id: str) -> int | None:
        try:
            self.jtable.refresh()
        except Exception:  # noqa: BLE001 - still unknown
            return None
        for snap in iterate(self.jtable.snapshots()):
            summary = snap.summary()
            if summary is not None and summary.get(SummaryKeys.COMPACTOR_COMMIT_ID) == commit_id:
                return int(snap.snapshotId())
        return None


def _lost_race(exc: BaseException) -> bool:
    """Iceberg gave up after its own retries because other commits kept winning: worth
    another try (a conflict or an unknown state is not)."""
    return iceberg_failure(exc) is IcebergFailure.COMMIT_FAILED
