"""Manifest rewrite: when the current snapshot's manifests pass a count or size threshold,
``CALL <cat>.system.rewrite_manifests(table)`` packs them again (last step, over the final
file set)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from streamberg.common.config import ManifestsConfig
from streamberg.maintenance.step import Step, StepResult, detail


@dataclass(frozen=True)
class ManifestsPlan:
    snapshot_id: int | None
    count: int
    total_bytes: int
    run: bool
    reasons: tuple[str, ...]


def plan_manifests(table: Table, settings: ManifestsConfig) -> ManifestsPlan:
    """Rewrite when the current snapshot's manifests cross the count or the size threshold."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return ManifestsPlan(None, 0, 0, False, ())
    manifests = snapshot.manifests(table.io)
    count = len(manifests)
    total = sum(m.manifest_length for m in manifests)
    reasons = []
    if settings.min_count is not None and count >= settings.min_count:
        reasons.append(f"min_count: {count} >= {settings.min_count}")
    if settings.min_total_bytes is not None and total >= settings.min_total_bytes:
        reasons.append(f"min_total_bytes: {total} >= {settings.min_total_bytes}")
    # One manifest per content type is already as compact as a rewrite can make it.
    compact = count <= len({m.content for m in manifests})
    return ManifestsPlan(snapshot.snapshot_id, count, total, bool(reasons) and not compact, tuple(reasons))


def manifest_rewrite_snapshot(table: Table, known_ids: set[int]) -> Snapshot | None:
    """The newest snapshot not in `known_ids` made by rewrite_manifests (a replace whose
    summary has Iceberg's manifests-replaced count), or None."""
    for snapshot in sorted(table.metadata.snapshots, key=lambda s: -(s.sequence_number or 0)):
        if snapshot.snapshot_id in known_ids or snapshot.summary is None:
            continue
        if snapshot.summary.operation.value == "replace" and "manifests-replaced" in snapshot.summary.additional_properties:
            return snapshot
    return None


@dataclass
class ManifestsResult(StepResult):
    manifests_before: int | None = None
    manifests_after: int | None = None
    manifest_bytes_before: int | None = detail()
    reasons: list[str] | None = detail()
    would_run: bool | None = detail()
    manifest_bytes_after: int | None = detail()
    # The rewrite's snapshot; None until it ran.
    snapshot_id: int | None = None
    rewritten: int | None = detail()
    added: int | None = detail()


class ManifestsStep(Step):
    key = "rewrite_manifests"
    section = "manifests"
    result_type = ManifestsResult

    def _run(self, dry_run: bool, log: Any) -> ManifestsResult:
        context = self.context
        settings = context.settings.manifests
        table = context.load()
        plan = plan_manifests(table, settings)
        log = log.bind(step=self.key, snapshot_id=plan.snapshot_id)
        out = ManifestsResult(manifests_before=plan.count, manifests_after=plan.count,
                              manifest_bytes_before=plan.total_bytes, reasons=list(plan.reasons))
        if not plan.run:
            out.reason = (f"below thresholds (min_count {settings.min_count}, "
                          f"min_total_bytes {settings.min_total_bytes})" if not plan.reasons
                          else "already one manifest per content type")
            log.info("manifests left as they are", count=plan.count, bytes=plan.total_bytes, reason=out.reason)
            return out
        if dry_run:
            out.would_run, out.manifests_after = True, None
            log.info("manifests would be rewritten", count=plan.count, bytes=plan.total_bytes, reasons=plan.reasons)
            return out
        known = {s.snapshot_id for s in table.metadata.snapshots}
        counts = {k: int(v or 0) for k, v in context.spark.call("rewrite_manifests").items()}
        after = context.load()
        # The rewrite's own snapshot, not the current one: ingest may have appended since.
        snapshot = manifest_rewrite_snapshot(after, known)
        manifests = snapshot.manifests(after.io) if snapshot is not None else []
        out.ran, out.manifests_after = True, len(manifests)
        out.manifest_bytes_after = sum(m.manifest_length for m in manifests)
        out.snapshot_id = snapshot.snapshot_id if snapshot is not None else None
        out.rewritten = counts.get("rewritten_manifests_count", 0)
        out.added = counts.get("added_manifests_count", 0)
        log.info("manifests rewritten", manifests_before=plan.count, manifests_after=out.manifests_after,
                 new_snapshot_id=out.snapshot_id, reasons=plan.reasons)
        return out
