"""The compactor's runs: what earlier rewrites laid out together, their size tiers and sealing.

A *run* is one partition's files added by one non-append snapshot (a rewrite): their ranges
are disjoint in the layout's order, while different runs overlap. The planner
(compactor/planner.py) merges runs of a size tier when `merge_factor` of them share it, and
finishes (seals) a partition that got no new data for `seal_after_commits` ingest commits or
`seal_after_seconds`. This module finds each partition's runs and how long it has gone
without new data; the rules of when a partition is due at all are shared with monitoring
(table_meta/pending.py).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, fields
from typing import Any

from pyiceberg.table import Table

from streamberg.common.config import CompactorConfig
from streamberg.table_meta.pending import CandidatePartition, Candidates, DueRules
from streamberg.table_meta.table_files import DataFileInfo, adds_new_data, sealed_key, sealed_sequence_numbers


@dataclass(frozen=True)
class PlanningRules(DueRules):
    """The compactor's rules: when a partition is due (DueRules), how much one group takes,
    and when runs merge and partitions are finished (None: that rule is off)."""

    max_group_bytes: int = 2 * 1024**3
    merge_factor: int = 2
    seal_after_commits: int | None = 10
    seal_after_seconds: float | None = 3600.0
    relayout_max_bytes: int | None = 1024**3

    @classmethod
    def from_config(cls, config: CompactorConfig) -> PlanningRules:
        return cls(
            min_files=config.min_files, min_bytes=config.min_bytes, max_delay_seconds=config.max_delay_seconds,
            every_n_snapshots=config.every_n_snapshots, max_group_bytes=config.max_group_bytes,
            merge_factor=config.merge_factor, seal_after_commits=config.seal_after_commits,
            seal_after_seconds=config.seal_after_seconds, delete_files_threshold=config.delete_files_threshold,
            relayout_max_bytes=config.relayout_max_bytes,
            deleted_ratio_threshold=config.deleted_ratio_threshold,
        )


@dataclass(frozen=True)
class Run:
    """Files a rewrite laid out together: one partition's files added by one non-append
    snapshot. Their ranges are disjoint in the layout's order; different runs overlap."""

    snapshot_id: int
    files: tuple[DataFileInfo, ...]
    sealed: bool  # a finished partition's run: never rewritten again

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


@dataclass(frozen=True)
class RunCandidate(CandidatePartition):
    """A candidate partition with its runs and how long it has gone without new data: ingest
    (append) commits since its newest data, and the time since then (None: that snapshot was
    expired)."""

    runs: tuple[Run, ...] = ()
    appends_since: int = 0
    idle_seconds: float | None = None
    sealed_sequence_number: int | None = None


def without_runs(part: CandidatePartition) -> RunCandidate:
    """A full pass ignores runs: the partition as it is."""
    return RunCandidate(**_fields(part))


def _fields(part: CandidatePartition) -> dict[str, Any]:
    return {f.name: getattr(part, f.name) for f in fields(CandidatePartition)}


class RunLayout:
    """The runs of each partition and how long each partition has gone without new data."""

    def __init__(self, table: Table, selected: Candidates):
        self.sealed = sealed_sequence_numbers(table)
        runs: dict[tuple[int, tuple[Any, ...]], dict[int, list[DataFileInfo]]] = defaultdict(lambda: defaultdict(list))
        newest: dict[tuple[int, tuple[Any, ...]], int] = {}
        for f in selected.live_files:
            key = (f.spec_id, f.partition)
            newest[key] = max(newest.get(key, 0), f.sequence_number)
            if f.path not in selected.pending_paths:
                runs[key][f.snapshot_id].append(f)
        self.runs, self.newest = runs, newest
        snapshots = table.metadata.snapshots
        self.append_sequences = sorted(s.sequence_number or 0 for s in snapshots if adds_new_data(s))
        self.time_of_sequence = {s.sequence_number or 0: s.timestamp_ms for s in snapshots}

    def candidate(self, part: CandidatePartition, now_ms: int) -> RunCandidate:
        key = (part.spec_id, part.partition)
        sealed_up_to = self.sealed.get(sealed_key(part.spec_id, part.path))
        runs = tuple(
            Run(snapshot_id, tuple(run_files),
                sealed=sealed_up_to is not None and max(f.sequence_number for f in run_files) <= sealed_up_to)
            for snapshot_id, run_files in sorted(self.runs.get(key, {}).items(),
                                                 key=lambda kv: min(f.sequence_number for f in kv[1])))
        newest = self.newest.get(key, 0)
        appends_since = len(self.append_sequences) - bisect.bisect_right(self.append_sequences, newest)
        at = self.time_of_sequence.get(newest)
        idle = (now_ms - at) / 1000 if at is not None else None
        return RunCandidate(**_fields(part), runs=runs, appends_since=appends_since, idle_seconds=idle,
                            sealed_sequence_number=sealed_up_to)
