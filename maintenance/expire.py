"""Snapshot expiry: what may go, decided from metadata alone; Iceberg's procedure removes it.

Expiry is where maintenance can hurt the other two jobs, so its plan carries the snapshots
that must survive and why:

- **ingest position**: ingest resumes from ``streamberg.kafka-offsets.<topic>`` of the
  newest snapshot on the current lineage that has it (``table_meta/offsets.py``). The current
  snapshot and every ancestor back to and including that one are kept: ``retain_last`` is at
  least that depth + 1 and ``older_than`` is never after that snapshot's timestamp.
- **merge position** (a primary-key table, docs/cdc.md): the merge resumes after the
  change-log snapshot named by the newest snapshot carrying ``streamberg.changelog-applied``;
  it and every newer snapshot on the lineage are kept, as for the ingest position.
- **dead letters not yet applied**: the ingest names each interval's dead-letter file in its
  snapshot and appends it to the dead-letter table after (an outbox,
  ``table_meta/dead_letter_outbox.py``); until then that snapshot is the file's only record, so it
  and every newer snapshot are kept.
- **compactor pending files**: the compactor treats a live file as pending only while the
  snapshot that added it is an ``append`` it can still see; expiring that snapshot would
  make the file look optimized forever. The pending set is the one the compactor plans from
  (``table_meta/table_files.py``), and ``older_than`` / ``retain_last`` keep the oldest such
  snapshot and everything newer.

The configured retention is an age (``max_snapshot_age_seconds``) and a count
(``max_snapshots``: snapshots beyond the newest N go whatever their age, so a table committed
every few seconds keeps a bounded metadata JSON); the protections above only ever keep more.

Both bounds are applied (count and age), because Iceberg keeps an ancestor when either
holds and stops walking at the first that fails both: with clock skew between hosts a
timestamp bound alone could stop early. ``predict_expired`` mirrors Iceberg's
``RemoveSnapshots`` retention so a dry run can say what would go, and so a plan that would
still expire a protected snapshot (a branch with its own retention settings) is refused.

Execution: ``CALL <cat>.system.expire_snapshots(table, older_than, retain_last)``. Before it,
the files only the expired snapshots reference are listed (``reachability.py``): a dry run
reports them, and a file outside the table's location refuses the expiry.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Snapshot

from streamberg.common.config import ExpireConfig
from streamberg.common.errors import LocationRefused
from streamberg.common.redact import redact
from streamberg.common.times import iso_from_ms
from streamberg.maintenance.confine import outside_reason
from streamberg.maintenance.reachability import only_referenced_by, still_present
from streamberg.maintenance.step import Step, StepResult, detail
from streamberg.table_meta.changelog import is_merge
from streamberg.table_meta.dead_letter_outbox import outbox_chain
from streamberg.table_meta.offsets import ancestors, ancestry, committed_position
from streamberg.table_meta.summary_keys import kafka_offsets_key
from streamberg.table_meta.table_files import live_data_files, pending_files

# -- plan -------------------------------------------------------------------------------------


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


def merge_chain(table: Table) -> list[Snapshot]:
    """The current snapshot back to and including the newest merge of a change log (empty when
    the table has none: an append table)."""
    chain = []
    for snapshot in ancestry(table):
        chain.append(snapshot)
        if is_merge(snapshot):
            return chain
    return []


def pending_append_snapshots(table: Table) -> dict[int, int]:
    """Append snapshots that added a live file the compactor still has to rewrite: id -> timestamp.

    Uses the compactor's own notion of pending (table_meta/table_files.py), so the two can never
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


def plan_expire(table: Table, settings: ExpireConfig, topic: str, now_ms: int,
                outbox: list[Snapshot] | None = None) -> ExpirePlan:
    """`outbox`: the chain back to the oldest snapshot naming dead letters the dead-letter
    table lacks (table_meta/dead_letter_outbox.outbox_chain), kept whole."""
    current = table.current_snapshot()
    configured_older_than = now_ms - int(settings.max_snapshot_age_seconds * 1000)
    configured_retain = settings.min_snapshots_to_keep
    lineage = list(ancestry(table))
    if len(lineage) > settings.max_snapshots:
        # The count bound: everything older than the newest max_snapshots may go, whatever its age.
        configured_older_than = max(configured_older_than, lineage[settings.max_snapshots - 1].timestamp_ms)
    older_than, retain_last = configured_older_than, configured_retain
    protected: dict[int, ProtectedSnapshot] = {}
    depth_of = {s.snapshot_id: depth for depth, s in enumerate(lineage)}

    chain = ingest_chain(table, topic)
    if chain:
        position = chain[-1]
        retain_last = max(retain_last, len(chain))
        older_than = min(older_than, position.timestamp_ms)
        for snapshot in chain:
            reason = (f"ingest position: newest snapshot with {kafka_offsets_key(topic)}" if snapshot is position
                      else "on the lineage from the current snapshot back to the ingest position")
            protected[snapshot.snapshot_id] = ProtectedSnapshot(snapshot.snapshot_id, snapshot.timestamp_ms, reason)

    merged = merge_chain(table)
    if merged:
        position = merged[-1]
        retain_last = max(retain_last, len(merged))
        older_than = min(older_than, position.timestamp_ms)
        for snapshot in merged:
            reason = ("merge position: newest snapshot with the change-log snapshot applied" if snapshot is position
                      else "on the lineage from the current snapshot back to the merge position")
            protected.setdefault(snapshot.snapshot_id, ProtectedSnapshot(snapshot.snapshot_id, snapshot.timestamp_ms,
                                                                         reason))

    if outbox:
        oldest = outbox[-1]
        retain_last = max(retain_last, len(outbox))
        older_than = min(older_than, oldest.timestamp_ms)
        for snapshot in outbox:
            reason = ("names dead letters the dead-letter table does not hold yet" if snapshot is oldest
                      else "on the lineage back to a snapshot naming dead letters not yet applied")
            protected.setdefault(snapshot.snapshot_id, ProtectedSnapshot(snapshot.snapshot_id, snapshot.timestamp_ms,
                                                                         reason))

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


# -- execution --------------------------------------------------------------------------------

# Iceberg's expire_snapshots output columns, and reachability's file kinds, as result keys.
_DELETED_KEYS = {
    "deleted_data_files_count": "data", "deleted_position_delete_files_count": "delete_files",
    "deleted_equality_delete_files_count": "delete_files", "deleted_manifest_files_count": "manifests",
    "deleted_manifest_lists_count": "manifest_lists", "deleted_statistics_files_count": "statistics",
}
_KIND_KEYS = {"data": "data", "delete": "delete_files", "manifest": "manifests", "manifest-list": "manifest_lists"}


def by_kind(counts: dict[str, int]) -> dict[str, int]:
    """Deleted-file counts under one set of names, whether Iceberg's or reachability's."""
    out: dict[str, int] = {}
    for key, n in counts.items():
        if n:
            name = _DELETED_KEYS.get(key) or _KIND_KEYS.get(key, key)
            out[name] = out.get(name, 0) + n
    return out


def timestamp_literal(ms: int) -> str:
    moment = dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc)
    return f"TIMESTAMP '{moment.strftime('%Y-%m-%d %H:%M:%S.%f')}'"


@dataclass
class ExpireResult(StepResult):
    expired: int = 0
    kept: int = 0
    protected_snapshot_ids: list[int] = field(default_factory=list)
    protected: list[dict[str, Any]] | None = detail()
    held_back_snapshot_ids: list[int] | None = detail()
    older_than: str | None = detail()
    retain_last: int | None = detail()
    configured_older_than: str | None = detail()
    deleted_files: int = 0
    deleted_by_kind: dict[str, int] | None = detail()
    bytes_freed: int = 0


class ExpireStep(Step):
    key = "expire_snapshots"
    section = "expire"
    result_type = ExpireResult

    def _run(self, dry_run: bool, log: Any) -> ExpireResult:
        context = self.context
        table = context.load()
        outbox = outbox_chain(table, context.load_dead_letters(), context.target.identifier)
        plan = plan_expire(table, context.settings.expire, context.topic, context.now_ms(), outbox)
        log = log.bind(step=self.key, snapshot_id=plan.current_snapshot_id)
        out = ExpireResult(
            expired=len(plan.expired_ids), kept=len(plan.kept_ids), protected_snapshot_ids=plan.protected_ids,
            protected=[{"snapshot_id": p.snapshot_id, "committed_at": iso_from_ms(p.timestamp_ms), "reason": p.reason}
                       for p in plan.protected],
            held_back_snapshot_ids=list(plan.held_back_ids),
            older_than=iso_from_ms(plan.older_than_ms), retain_last=plan.retain_last,
            configured_older_than=iso_from_ms(plan.configured_older_than_ms),
        )
        log.info("expire plan", expired=out.expired, kept=out.kept, older_than=out.older_than,
                 retain_last=plan.retain_last, protected=out.protected, held_back=out.held_back_snapshot_ids)
        if plan.refusal:
            log.error("expiry refused", reason=plan.refusal)
            raise RuntimeError(plan.refusal)
        if not plan.expired_ids:
            out.reason = "no snapshot is past the age/count bounds"
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
            out.deleted_files = len(doomed)
            out.deleted_by_kind = by_kind({k: kinds.count(k) for k in set(kinds)})
            out.bytes_freed = sum(r.size_bytes for r in doomed.values())
            return out
        row = context.spark.call("expire_snapshots", older_than=timestamp_literal(plan.older_than_ms),
                                 retain_last=str(plan.retain_last))
        counts = {k: int(v or 0) for k, v in row.items()}
        after = context.load()
        remaining = {s.snapshot_id for s in after.metadata.snapshots}
        expired = [s for s in plan.expired_ids + plan.kept_ids if s not in remaining]
        gone = set(doomed) - still_present(after, doomed)
        out.ran, out.expired, out.kept = True, len(expired), len(remaining)
        out.deleted_files, out.deleted_by_kind = sum(counts.values()), by_kind(counts)
        out.bytes_freed = sum(doomed[p].size_bytes for p in gone)
        if sorted(expired) != sorted(plan.expired_ids):
            log.warning("expired snapshots differ from the plan (concurrent commit?)",
                        planned=len(plan.expired_ids), expired=len(expired))
        if lost := sorted(set(plan.protected_ids) - remaining):
            # Cannot happen with the bounds above; if it ever does, make it loud.
            log.critical("protected snapshots were expired", snapshot_ids=lost)
            raise RuntimeError(f"protected snapshots were expired: {lost}")
        log.info("snapshots expired", expired=out.expired, kept=out.kept, deleted_files=out.deleted_files,
                 deleted_by_kind=out.deleted_by_kind, bytes_freed=out.bytes_freed,
                 protected_snapshot_ids=plan.protected_ids)
        return out
