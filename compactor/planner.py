"""Planner: which data files are rewritten, in which groups, and why (pure pyiceberg, no Spark).

Which files are pending and which partitions the rules select is common/pending.py (shared
with maintenance and monitoring). The planner turns the selected partitions into file
groups: a partition larger than ``max_group_bytes`` is split into several groups, oldest
files first. A pass that crashed halfway, or a replayed streaming batch, re-plans exactly
the files that were not rewritten yet: nothing is skipped and nothing is rewritten twice.
The plan remembers the snapshot it was made from; every commit of its groups is validated
against that snapshot.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.table import Table

from streamberg.common.pending import DataFileInfo, ManifestCache, Mode, PlanningRules, select_partitions


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

    incremental: pending files, only partitions a rule selects; `up_to_sequence_number`
      leaves out files committed after that point (a streaming batch plans the snapshots it
      covers; later ones belong to the next batch).
    full: every live data file, every partition, no rules (an explicit re-cluster).
    """
    selected = select_partitions(table, rules, mode=mode, now_ms=now_ms,
                                 up_to_sequence_number=up_to_sequence_number, cache=cache)
    name = ".".join(table.name())
    if selected.snapshot_id is None:
        return Plan(table=name, mode=mode, starting_snapshot_id=None, starting_sequence_number=None, groups=())
    groups: list[FileGroup] = []
    deferred: list[DeferredPartition] = []
    for part in selected.partitions:
        if not part.reasons:
            deferred.append(DeferredPartition(part.spec_id, part.path, len(part.files), part.size_bytes,
                                              part.oldest_age_seconds))
            continue
        for chunk in _split(list(part.files), rules.max_group_bytes):
            groups.append(FileGroup(index=len(groups), spec_id=part.spec_id, partition=part.partition,
                                    partition_path=part.path, files=tuple(chunk), reasons=part.reasons))
    return Plan(
        table=name, mode=mode, starting_snapshot_id=selected.snapshot_id,
        starting_sequence_number=selected.sequence_number, groups=tuple(groups), deferred=tuple(deferred),
        pending_snapshots=selected.pending_snapshots, live_data_files=selected.live_data_files,
        has_delete_files=selected.has_delete_files, planned_at_ms=selected.now_ms,
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
