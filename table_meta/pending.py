"""Which partitions are due for the compactor: its trigger rules over the pending files.

Shared by the compactor (its planner, compactor/planner.py, builds groups from what is
selected here; its runs and sealing are in compactor/runs.py) and monitoring (the backlog
and what is due now), so the two can never disagree on what is due.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Literal

from pyiceberg.table import Table

from streamberg.common.config import CompactorConfig
from streamberg.table_meta.table_files import (
    DataFileInfo,
    ManifestCache,
    live_data_files,
    live_delete_files,
    partition_path,
    pending_files,
    sealed_key,
)

Mode = Literal["incremental", "full"]


@dataclass(frozen=True)
class DueRules:
    """When a partition's pending files are rewritten (any enabled rule suffices)."""

    min_files: int | None = 10
    min_bytes: int | None = None
    max_delay_seconds: float | None = 600.0
    every_n_snapshots: int | None = 5
    # A partition with this many live delete files, or this share of deleted rows, is due
    # whole (its deletes folded), new files or not.
    delete_files_threshold: int | None = 8
    deleted_ratio_threshold: float | None = 0.1

    @classmethod
    def from_config(cls, config: CompactorConfig) -> DueRules:
        return cls(min_files=config.min_files, min_bytes=config.min_bytes,
                   max_delay_seconds=config.max_delay_seconds, every_n_snapshots=config.every_n_snapshots,
                   delete_files_threshold=config.delete_files_threshold,
                   deleted_ratio_threshold=config.deleted_ratio_threshold)

    def delete_reasons(self, deletes: DeleteStats) -> tuple[str, ...]:
        """Why a partition's deletes make it due (empty: they do not)."""
        reasons = []
        if self.delete_files_threshold is not None and deletes.files >= self.delete_files_threshold:
            reasons.append(f"delete_files: {deletes.files} >= {self.delete_files_threshold}")
        if self.deleted_ratio_threshold is not None and deletes.files and deletes.ratio >= self.deleted_ratio_threshold:
            reasons.append(f"deleted_ratio: {deletes.ratio:.3f} >= {self.deleted_ratio_threshold:g}")
        return tuple(reasons)


@dataclass(frozen=True)
class DeleteStats:
    """A partition's live delete files against its rows."""

    files: int = 0
    deleted_rows: int = 0  # deletes they hold (position deletes: rows)
    rows: int = 0  # rows of its live data files, deleted ones included

    @property
    def ratio(self) -> float:
        return self.deleted_rows / self.rows if self.rows else 0.0


@dataclass(frozen=True)
class CandidatePartition:
    """One partition's candidate files, and why the rules select it (no reasons: deferred)."""

    spec_id: int
    partition: tuple[Any, ...]
    path: str
    files: tuple[DataFileInfo, ...]
    reasons: tuple[str, ...]
    oldest_age_seconds: float | None
    # Its deletes, and why they make it due: then every live file of it is rewritten.
    deletes: DeleteStats = DeleteStats()
    delete_reasons: tuple[str, ...] = ()

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    @property
    def key(self) -> str:
        return sealed_key(self.spec_id, self.path)


@dataclass(frozen=True)
class Candidates:
    """What a pass over the table's current snapshot would consider."""

    snapshot_id: int | None
    sequence_number: int | None
    partitions: tuple[CandidatePartition, ...]
    pending_snapshots: int  # distinct append snapshots among the candidates
    live_data_files: int
    has_delete_files: bool
    now_ms: int
    # Every live file and the paths of all pending ones (the compactor's runs are made of
    # the others).
    live_files: tuple[DataFileInfo, ...] = ()
    pending_paths: frozenset[str] = frozenset()


def select_partitions(table: Table, rules: DueRules, *, mode: Mode = "incremental", now_ms: int | None = None,
                      up_to_sequence_number: int | None = None, cache: ManifestCache | None = None) -> Candidates:
    """Candidate files per partition as of the table's current snapshot, with the rules applied.

    incremental: pending files; a partition is selected when any enabled rule fires.
      `up_to_sequence_number` leaves out files committed after that point. Partitions with
      live optimized files but nothing pending are listed too, without files (the compactor
      may finish them).
    full: every live data file, every partition selected ("full").
    """
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    snapshot = table.current_snapshot()
    if snapshot is None:
        return Candidates(None, None, (), 0, 0, False, now_ms)
    files, has_deletes = live_data_files(table, cache)
    deletes = delete_stats(table, files, cache) if has_deletes else {}
    all_pending = pending_files(table, files)
    pending_paths = frozenset(f.path for f in all_pending)
    if mode == "full":
        candidates = files
    else:
        candidates = all_pending
        if up_to_sequence_number is not None:
            candidates = [f for f in candidates if f.sequence_number <= up_to_sequence_number]

    by_partition: dict[tuple[int, tuple[Any, ...]], list[DataFileInfo]] = defaultdict(list)
    for f in candidates:
        by_partition[(f.spec_id, f.partition)].append(f)
    if mode == "incremental":
        for f in files:
            if f.path not in pending_paths:
                by_partition.setdefault((f.spec_id, f.partition), [])
    pending_snapshots = len({f.snapshot_id for f in candidates})
    table_wide = []
    if mode == "incremental" and rules.every_n_snapshots is not None and pending_snapshots >= rules.every_n_snapshots:
        table_wide.append(f"every_n_snapshots: {pending_snapshots} >= {rules.every_n_snapshots}")

    partitions = []
    for (spec_id, part), part_files in sorted(by_partition.items(), key=lambda kv: (kv[0][0], repr(kv[0][1]))):
        ages = [(now_ms - f.added_at_ms) / 1000 for f in part_files if f.added_at_ms is not None]
        oldest = max(ages) if ages else None
        size = sum(f.size_bytes for f in part_files)
        if mode == "full":
            reasons = ["full"]
        elif not part_files:
            reasons = []
        else:
            reasons = list(table_wide)
            if rules.min_files is not None and len(part_files) >= rules.min_files:
                reasons.append(f"min_files: {len(part_files)} >= {rules.min_files}")
            if rules.min_bytes is not None and size >= rules.min_bytes:
                reasons.append(f"min_bytes: {size} >= {rules.min_bytes}")
            if rules.max_delay_seconds is not None and oldest is not None and oldest >= rules.max_delay_seconds:
                reasons.append(f"max_delay_seconds: {oldest:.0f} >= {rules.max_delay_seconds:g}")
        stats = deletes.get((spec_id, part), DeleteStats())
        partitions.append(CandidatePartition(spec_id, part, partition_path(table, spec_id, part), tuple(part_files),
                                             tuple(reasons), oldest, stats,
                                             rules.delete_reasons(stats) if mode == "incremental" else ()))
    return Candidates(snapshot.snapshot_id, snapshot.sequence_number, tuple(partitions), pending_snapshots,
                      len(files), has_deletes, now_ms, tuple(files), pending_paths)


def delete_stats(table: Table, files: list[DataFileInfo],
                 cache: ManifestCache | None = None) -> dict[tuple[int, tuple[Any, ...]], DeleteStats]:
    """Per partition (spec id, values): its live delete files, their deletes and its rows."""
    rows: dict[tuple[int, tuple[Any, ...]], int] = defaultdict(int)
    for f in files:
        rows[(f.spec_id, f.partition)] += f.record_count
    counts: dict[tuple[int, tuple[Any, ...]], list[int]] = defaultdict(lambda: [0, 0])
    for d in live_delete_files(table, cache):
        counts[(d.spec_id, d.partition)][0] += 1
        counts[(d.spec_id, d.partition)][1] += d.record_count
    return {key: DeleteStats(n, deleted, rows.get(key, 0)) for key, (n, deleted) in counts.items()}
