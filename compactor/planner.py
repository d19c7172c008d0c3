"""Planner: which data files are rewritten, in which groups, and why (pure pyiceberg, no Spark).

Pending files are derived from the table itself, never from a side ledger: a live data file
is *pending* when the snapshot that added it is an ``append`` (ingest). Files added by
``replace`` snapshots (this compactor, or any other rewrite) are optimized and the
incremental pass never touches them again. So a pass that crashed halfway, or a replayed
streaming batch, re-plans exactly the files that were not rewritten yet: nothing is skipped
and nothing is rewritten twice. (A file whose adding snapshot has been expired cannot be
classified and is treated as optimized; ``--full`` rewrites everything regardless.)

Pending files are grouped per partition (spec id + partition tuple). A partition is acted
on when any enabled rule fires (see ``PlanningRules``); otherwise it is deferred and
re-evaluated on the next trigger. A partition larger than ``max_group_bytes`` is split into
several groups, oldest files first. The plan remembers the snapshot it was made from; every
commit of its groups is validated against that snapshot.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestFile
from pyiceberg.table import Table

from streamberg.common.config import CompactorConfig, StreambergConfig

Mode = Literal["incremental", "full"]
APPEND = "append"
TARGET_SIZE_PROPERTY = "write.target-file-size-bytes"


def target_file_size(config: StreambergConfig, table: Table) -> int:
    """Size of the files a rewrite writes: compactor.target_file_size_bytes, else the table's
    write.target-file-size-bytes, else table.target_file_size_bytes. (Also what
    `streamberg status` measures small files against.)"""
    configured = config.compactor.target_file_size_bytes
    if configured is not None:
        return configured
    prop = table.properties.get(TARGET_SIZE_PROPERTY)
    return int(prop) if prop else config.table.target_file_size_bytes


@dataclass(frozen=True)
class PlanningRules:
    """When a partition's pending files are rewritten (any enabled rule suffices)."""

    min_files: int | None = 10
    min_bytes: int | None = None
    max_delay_seconds: float | None = 600.0
    every_n_snapshots: int | None = 5
    max_group_bytes: int = 2 * 1024**3

    @classmethod
    def from_config(cls, config: CompactorConfig) -> PlanningRules:
        return cls(
            min_files=config.min_files, min_bytes=config.min_bytes, max_delay_seconds=config.max_delay_seconds,
            every_n_snapshots=config.every_n_snapshots, max_group_bytes=config.max_group_bytes,
        )


@dataclass(frozen=True)
class DataFileInfo:
    """One live data file as the planner sees it."""

    path: str
    size_bytes: int
    record_count: int
    spec_id: int
    partition: tuple[Any, ...]
    snapshot_id: int  # the snapshot that added it
    sequence_number: int
    added_at_ms: int | None  # that snapshot's commit time (None when it has been expired)


@dataclass(frozen=True)
class FileGroup:
    """Files of one partition rewritten together by one Spark job."""

    index: int
    spec_id: int
    partition: tuple[Any, ...]
    partition_path: str
    files: tuple[DataFileInfo, ...]
    reasons: tuple[str, ...]

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    @property
    def record_count(self) -> int:
        return sum(f.record_count for f in self.files)

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(f.path for f in self.files)

    @property
    def snapshot_ids(self) -> tuple[int, ...]:
        """The ingest snapshots whose files this group covers, oldest first."""
        seen = sorted({(f.sequence_number, f.snapshot_id) for f in self.files})
        return tuple(s for _, s in seen)

    def expected_output_files(self, target_file_size_bytes: int) -> int:
        return max(1, math.ceil(self.size_bytes / target_file_size_bytes))


@dataclass(frozen=True)
class DeferredPartition:
    """A partition with pending files that no rule selected yet (reported, not rewritten)."""

    spec_id: int
    partition_path: str
    files: int
    size_bytes: int
    oldest_age_seconds: float | None


@dataclass(frozen=True)
class Plan:
    table: str
    mode: Mode
    starting_snapshot_id: int | None
    starting_sequence_number: int | None
    groups: tuple[FileGroup, ...]
    deferred: tuple[DeferredPartition, ...] = ()
    pending_snapshots: int = 0
    live_data_files: int = 0
    has_delete_files: bool = False
    planned_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    @property
    def files(self) -> int:
        return sum(len(g.files) for g in self.groups)

    @property
    def size_bytes(self) -> int:
        return sum(g.size_bytes for g in self.groups)

    def commit_batches(self, max_commits: int) -> list[tuple[FileGroup, ...]]:
        """Groups split into at most `max_commits` consecutive batches (partial progress)."""
        if not self.groups:
            return []
        per_commit = math.ceil(len(self.groups) / max_commits)
        return [self.groups[i : i + per_commit] for i in range(0, len(self.groups), per_commit)]


def partition_path(table: Table, spec_id: int, partition: tuple[Any, ...]) -> str:
    """Human-readable partition, e.g. ``ts_day=19723/user_id_bucket=2`` (``<unpartitioned>``)."""
    spec = table.specs()[spec_id]
    if not spec.fields:
        return "<unpartitioned>"
    return "/".join(f"{f.name}={v}" for f, v in zip(spec.fields, partition))


class ManifestCache:
    """Parsed live entries per manifest file. Manifests are immutable, so a long-running
    compactor reads each one once and later plans only read the manifests that are new."""

    def __init__(self, max_manifests: int = 4096) -> None:
        self._entries: dict[str, list[tuple[Any, ...]]] = {}
        self._max = max_manifests

    def entries(self, table: Table, manifest: ManifestFile) -> list[tuple[Any, ...]]:
        cached = self._entries.get(manifest.manifest_path)
        if cached is not None:
            return cached
        rows = []
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            data_file = entry.data_file
            if data_file.content != DataFileContent.DATA:
                continue
            rows.append((
                data_file.file_path, data_file.file_size_in_bytes, data_file.record_count,
                manifest.partition_spec_id, tuple(data_file.partition[i] for i in range(len(data_file.partition))),
                entry.snapshot_id, entry.sequence_number,
            ))
        if len(self._entries) >= self._max:
            self._entries.pop(next(iter(self._entries)))
        self._entries[manifest.manifest_path] = rows
        return rows


def live_data_files(table: Table, cache: ManifestCache | None = None) -> tuple[list[DataFileInfo], bool]:
    """All live data files of the current snapshot, and whether any delete files are live."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return [], False
    cache = cache or ManifestCache()
    manifests = list(snapshot.manifests(table.io))
    has_deletes = any(m.content == ManifestContent.DELETES and (m.added_files_count or m.existing_files_count)
                      for m in manifests)
    data_manifests = [m for m in manifests if m.content == ManifestContent.DATA]
    by_id = {s.snapshot_id: s for s in table.metadata.snapshots}
    with ThreadPoolExecutor(max_workers=8) as pool:
        chunks = list(pool.map(lambda m: cache.entries(table, m), data_manifests))
    files = []
    for rows in chunks:
        for path, size, records, spec_id, part, snapshot_id, seq in rows:
            added = by_id.get(snapshot_id)
            files.append(DataFileInfo(
                path=path, size_bytes=size, record_count=records, spec_id=spec_id, partition=part,
                snapshot_id=snapshot_id, sequence_number=seq if seq is not None else 0,
                added_at_ms=added.timestamp_ms if added is not None else None,
            ))
    return files, has_deletes


def _split(files: list[DataFileInfo], max_bytes: int) -> list[list[DataFileInfo]]:
    groups: list[list[DataFileInfo]] = [[]]
    size = 0
    for f in sorted(files, key=lambda f: (f.sequence_number, f.path)):
        if groups[-1] and size + f.size_bytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(f)
        size += f.size_bytes
    return groups


def plan_rewrite(table: Table, rules: PlanningRules, *, mode: Mode = "incremental", now_ms: int | None = None,
                 up_to_sequence_number: int | None = None, cache: ManifestCache | None = None) -> Plan:
    """Plan a pass over `table` as of its current snapshot.

    incremental: pending files (added by append snapshots), only partitions a rule selects;
      `up_to_sequence_number` leaves out files committed after that point (a streaming batch
      plans the snapshots it covers; later ones belong to the next batch).
    full: every live data file, every partition, no rules (an explicit re-cluster).
    """
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    snapshot = table.current_snapshot()
    name = ".".join(table.name())
    if snapshot is None:
        return Plan(table=name, mode=mode, starting_snapshot_id=None, starting_sequence_number=None, groups=())
    files, has_deletes = live_data_files(table, cache)
    ops = {s.snapshot_id: (s.summary.operation.value if s.summary else None) for s in table.metadata.snapshots}
    if mode == "full":
        candidates = files
    else:
        candidates = [f for f in files if ops.get(f.snapshot_id) == APPEND]
        if up_to_sequence_number is not None:
            candidates = [f for f in candidates if f.sequence_number <= up_to_sequence_number]

    by_partition: dict[tuple[int, tuple[Any, ...]], list[DataFileInfo]] = defaultdict(list)
    for f in candidates:
        by_partition[(f.spec_id, f.partition)].append(f)
    pending_snapshots = len({f.snapshot_id for f in candidates})
    table_wide = []
    if mode == "incremental" and rules.every_n_snapshots is not None and pending_snapshots >= rules.every_n_snapshots:
        table_wide.append(f"every_n_snapshots: {pending_snapshots} >= {rules.every_n_snapshots}")

    groups: list[FileGroup] = []
    deferred: list[DeferredPartition] = []
    for (spec_id, part), part_files in sorted(by_partition.items(), key=lambda kv: (kv[0][0], repr(kv[0][1]))):
        path = partition_path(table, spec_id, part)
        ages = [(now_ms - f.added_at_ms) / 1000 for f in part_files if f.added_at_ms is not None]
        oldest = max(ages) if ages else None
        size = sum(f.size_bytes for f in part_files)
        if mode == "full":
            reasons = ["full"]
        else:
            reasons = list(table_wide)
            if rules.min_files is not None and len(part_files) >= rules.min_files:
                reasons.append(f"min_files: {len(part_files)} >= {rules.min_files}")
            if rules.min_bytes is not None and size >= rules.min_bytes:
                reasons.append(f"min_bytes: {size} >= {rules.min_bytes}")
            if rules.max_delay_seconds is not None and oldest is not None and oldest >= rules.max_delay_seconds:
                reasons.append(f"max_delay_seconds: {oldest:.0f} >= {rules.max_delay_seconds:g}")
        if not reasons:
            deferred.append(DeferredPartition(spec_id, path, len(part_files), size, oldest))
            continue
        for chunk in _split(part_files, rules.max_group_bytes):
            groups.append(FileGroup(index=len(groups), spec_id=spec_id, partition=part, partition_path=path,
                                    files=tuple(chunk), reasons=tuple(reasons)))
    return Plan(
        table=name, mode=mode, starting_snapshot_id=snapshot.snapshot_id,
        starting_sequence_number=snapshot.sequence_number, groups=tuple(groups), deferred=tuple(deferred),
        pending_snapshots=pending_snapshots, live_data_files=len(files), has_delete_files=has_deletes,
        planned_at_ms=now_ms,
    )


def sequence_number_of(table: Table, snapshot_id: int | None) -> int | None:
    if snapshot_id is None:
        return None
    snapshot = table.snapshot_by_id(snapshot_id)
    return snapshot.sequence_number if snapshot is not None else None


def describe(plan: Plan) -> dict[str, Any]:
    """A compact, loggable summary of a plan."""
    return {
        "mode": plan.mode,
        "starting_snapshot_id": plan.starting_snapshot_id,
        "groups": len(plan.groups),
        "files": plan.files,
        "bytes": plan.size_bytes,
        "live_data_files": plan.live_data_files,
        "pending_snapshots": plan.pending_snapshots,
        "deferred_partitions": len(plan.deferred),
        "deferred_files": sum(d.files for d in plan.deferred),
    }
