"""Planner: what a maintenance run may remove, decided from table metadata alone (pyiceberg).

Each step is planned right before it runs, against the table as it is then (an earlier
step may have committed). Nothing here changes the table; ``runner.py`` executes.

Expiry is where maintenance can hurt the other two jobs, so its plan carries the
snapshots that must survive and why:

- **ingest position**: ingest resumes from ``streamberg.kafka-offsets.<topic>`` of the
  newest snapshot on the current lineage that has it (``common/offsets.py``). The current
  snapshot and every ancestor back to and including that one are kept: ``retain_last`` is at
  least that depth + 1 and ``older_than`` is never after that snapshot's timestamp.
- **compactor pending files**: the compactor treats a live file as pending only while the
  snapshot that added it is an ``append`` it can still see; expiring that snapshot would
  make the file look optimized forever. The pending set comes from the compactor's own
  planner (``plan_rewrite`` with every rule satisfied), and ``older_than`` / ``retain_last``
  keep the oldest such snapshot and everything newer.

Both bounds are applied (count and age), because Iceberg keeps an ancestor when either
holds and stops walking at the first that fails both: with clock skew between hosts a
timestamp bound alone could stop early. ``predict_expired`` mirrors Iceberg's
``RemoveSnapshots`` retention so a dry run can say what would go, and so a plan that would
still expire a protected snapshot (a branch with its own retention settings) is refused.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Literal

from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.types import DateType, TimestampType, TimestamptzType

from streamberg.common.config import ExpireConfig, ManifestsConfig, RetentionConfig
from streamberg.common.errors import RetentionColumnError
from streamberg.common.offsets import ancestors, ancestry, committed_position
from streamberg.common.summary_keys import kafka_offsets_key
from streamberg.common.table_files import live_data_files, pending_files


@dataclass(frozen=True)
class ProtectedSnapshot:
    snapshot_id: int
    timestamp_ms: int
    reason: str


@dataclass(frozen=True)
class ExpirePlan:
    current_snapshot_id: int | None
    # What is passed to expire_snapshots (safety bounds applied).
    older_than_ms: int
    retain_last: int
    # What the configuration alone asked for.
    configured_older_than_ms: int
    configured_retain_last: int
    protected: tuple[ProtectedSnapshot, ...]
    # Predicted by Iceberg's retention rules with the bounds above.
    expired_ids: tuple[int, ...]
    kept_ids: tuple[int, ...]
    # Snapshots the configuration alone would have expired but the safety rules keep.
    held_back_ids: tuple[int, ...]
    # Set when the plan must not run (a protected snapshot would still be expired).
    refusal: str | None = None

    @property
    def protected_ids(self) -> list[int]:
        return [p.snapshot_id for p in self.protected]


@dataclass(frozen=True)
class ManifestsPlan:
    snapshot_id: int | None
    count: int
    total_bytes: int
    run: bool
    reasons: tuple[str, ...]


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



# -- expire -----------------------------------------------------------------------------------


def ingest_chain(table: Table, topic: str) -> list[Snapshot]:
    """The current snapshot back to and including the newest one with the topic's offsets.

    Empty when no snapshot on the lineage records offsets (nothing to protect for ingest).
    """
    position = committed_position(table, topic)
    if position.snapshot_id is None:
        return []
    chain = []
    for snapshot in ancestry(table):
        chain.append(snapshot)
        if snapshot.snapshot_id == position.snapshot_id:
            return chain
    return []  # unreachable: committed_position walks the same ancestry


def pending_append_snapshots(table: Table) -> dict[int, int]:
    """Append snapshots that added a live file the compactor still has to rewrite: id -> timestamp.

    Uses the compactor's own notion of pending (common/table_files.py), so the two can never
    disagree on what is pending.
    """
    pending: dict[int, int] = {}
    for f in pending_files(table, live_data_files(table)[0]):
        if f.added_at_ms is not None:
            pending[f.snapshot_id] = f.added_at_ms
    return pending



def predict_expired(table: Table, older_than_ms: int, retain_last: int, now_ms: int) -> set[int]:
    """Snapshots Iceberg's expire_snapshots(older_than, retain_last) removes (RemoveSnapshots).

    Per branch: ancestors of its head are kept while fewer than min-snapshots-to-keep are kept
    or the snapshot is not older than the cutoff (the branch's own settings win over the
    call's); the walk stops at the first that fails both. Tag targets are kept. Snapshots on
    no branch or tag lineage are kept when not older than ``older_than``. (Ref expiry by
    max-ref-age is not modelled: streamberg tables only have ``main``.)
    """
    by_id = {s.snapshot_id: s for s in table.metadata.snapshots}
    retained: set[int] = set()
    referenced: set[int] = set()
    for ref in table.metadata.refs.values():
        retained.add(ref.snapshot_id)
        if ref.snapshot_ref_type != SnapshotRefType.BRANCH:
            referenced.add(ref.snapshot_id)
            continue
        keep = ref.min_snapshots_to_keep if ref.min_snapshots_to_keep is not None else retain_last
        cutoff = now_ms - ref.max_snapshot_age_ms if ref.max_snapshot_age_ms is not None else older_than_ms
        chain = ancestors(by_id.values(), ref.snapshot_id)
        referenced.update(s.snapshot_id for s in chain)
        kept = 0
        for snapshot in chain:
            if kept < keep or snapshot.timestamp_ms >= cutoff:
                retained.add(snapshot.snapshot_id)
                kept += 1
            else:
                break
    for snapshot in table.metadata.snapshots:
        if snapshot.snapshot_id not in referenced and snapshot.timestamp_ms >= older_than_ms:
            retained.add(snapshot.snapshot_id)
    return set(by_id) - retained


def plan_expire(table: Table, settings: ExpireConfig, topic: str, now_ms: int) -> ExpirePlan:
    current = table.current_snapshot()
    configured_older_than = now_ms - int(settings.max_snapshot_age_seconds * 1000)
    configured_retain = settings.min_snapshots_to_keep
    older_than, retain_last = configured_older_than, configured_retain
    protected: dict[int, ProtectedSnapshot] = {}
    depth_of = {s.snapshot_id: depth for depth, s in enumerate(ancestry(table))}

    chain = ingest_chain(table, topic)
    if chain:
        position = chain[-1]
        retain_last = max(retain_last, len(chain))
        older_than = min(older_than, position.timestamp_ms)
        for snapshot in chain:
            reason = (f"ingest position: newest snapshot with {kafka_offsets_key(topic)}" if snapshot is position
                      else "on the lineage from the current snapshot back to the ingest position")
            protected[snapshot.snapshot_id] = ProtectedSnapshot(snapshot.snapshot_id, snapshot.timestamp_ms, reason)

    if settings.keep_pending_for_compactor:
        pending = pending_append_snapshots(table)
        if pending:
            oldest_ms = min(pending.values())
            older_than = min(older_than, oldest_ms)
            depths = [depth_of[sid] for sid in pending if sid in depth_of]
            if depths:
                retain_last = max(retain_last, max(depths) + 1)
            for sid, ts in pending.items():
                protected.setdefault(sid, ProtectedSnapshot(sid, ts, "append that added files the compactor has not rewritten yet"))

    expired = predict_expired(table, older_than, retain_last, now_ms)
    configured = predict_expired(table, configured_older_than, configured_retain, now_ms)
    refusal = None
    if still := sorted(expired & set(protected)):
        refusal = (f"a branch's own retention settings would still expire protected snapshots {still}; "
                   "expiry skipped (clear min-snapshots-to-keep / max-snapshot-age-ms on the branch)")
    all_ids = [s.snapshot_id for s in table.metadata.snapshots]
    return ExpirePlan(
        current_snapshot_id=current.snapshot_id if current is not None else None,
        older_than_ms=older_than, retain_last=retain_last,
        configured_older_than_ms=configured_older_than, configured_retain_last=configured_retain,
        protected=tuple(sorted(protected.values(), key=lambda p: -p.timestamp_ms)),
        expired_ids=tuple(s for s in all_ids if s in expired),
        kept_ids=tuple(s for s in all_ids if s not in expired),
        held_back_ids=tuple(s for s in all_ids if s in configured and s not in expired),
        refusal=refusal,
    )


# -- manifests --------------------------------------------------------------------------------


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
    for snapshot in sorted(table.metadata.snapshots, key=lambda s: -s.sequence_number):
        if snapshot.snapshot_id in known_ids or snapshot.summary is None:
            continue
        if snapshot.summary.operation.value == "replace" and "manifests-replaced" in snapshot.summary.additional_properties:
            return snapshot
    return None


# -- retention --------------------------------------------------------------------------------

_KINDS: dict[type, ColumnKind] = {DateType: "date", TimestampType: "timestamp", TimestamptzType: "timestamptz"}
# Partition transforms a cutoff can be rounded down to so whole partitions (files) go.
_ALIGNABLE = {"hour": dt.timedelta(hours=1), "day": dt.timedelta(days=1)}




def column_kind(table: Table, column: str) -> ColumnKind:
    try:
        field = table.schema().find_field(column)
    except ValueError:
        names = ", ".join(f.name for f in table.schema().fields)
        raise RetentionColumnError(f"{column!r} is not a column of the table (columns: {names})") from None
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
