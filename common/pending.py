"""Live and pending data files of a table, and which partitions the compaction rules select.

Shared by the compactor (its planner groups what is selected here), maintenance (never
expire the snapshots that added a pending file) and monitoring (the compactor's backlog),
so the three can never disagree on what is pending.

Pending files are derived from the table itself, never from a side ledger: a live data file
is *pending* when the snapshot that added it is an ``append`` (ingest). Files added by
``replace`` snapshots (the compactor, or any other rewrite) are optimized and an incremental
pass never touches them again. (A file whose adding snapshot has been expired cannot be
classified and is treated as optimized.)
"""

from __future__ import annotations

import bisect
import json
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestFile
from pyiceberg.table import Table

from streamberg.common.config import CompactorConfig
from streamberg.common.summary_keys import TablePropertyKeys

Mode = Literal["incremental", "full"]
APPEND = "append"
TARGET_SIZE_PROPERTY = "write.target-file-size-bytes"


def target_file_size(table: Table, configured: int | None, default: int) -> int:
    """Size of the files a rewrite writes: `configured` (compactor.target_file_size_bytes),
    else the table's write.target-file-size-bytes, else `default`
    (table.target_file_size_bytes). (Also what `streamberg status` measures small files against.)"""
    if configured is not None:
        return configured
    prop = table.properties.get(TARGET_SIZE_PROPERTY)
    return int(prop) if prop else default


@dataclass(frozen=True)
class DataFileInfo:
    """One live data file."""

    path: str
    size_bytes: int
    record_count: int
    spec_id: int
    partition: tuple[Any, ...]
    snapshot_id: int  # the snapshot that added it
    sequence_number: int  # its data sequence number (a rewrite's files keep the plan's)
    added_at_ms: int | None  # that snapshot's commit time (None when it has been expired)
    # Serialized per-column min/max from the manifest (field id -> bytes; absent: unknown).
    lower_bounds: dict[int, bytes] = field(default_factory=dict, compare=False, hash=False, repr=False)
    upper_bounds: dict[int, bytes] = field(default_factory=dict, compare=False, hash=False, repr=False)


class ManifestCache:
    """Parsed live entries per manifest file. Manifests are immutable, so a long-running
    process reads each one once and later listings only read the manifests that are new."""

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
                dict(data_file.lower_bounds or {}), dict(data_file.upper_bounds or {}),
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
        for path, size, records, spec_id, part, snapshot_id, seq, lower, upper in rows:
            added = by_id.get(snapshot_id)
            files.append(DataFileInfo(
                path=path, size_bytes=size, record_count=records, spec_id=spec_id, partition=part,
                snapshot_id=snapshot_id, sequence_number=seq if seq is not None else 0,
                added_at_ms=added.timestamp_ms if added is not None else None,
                lower_bounds=lower, upper_bounds=upper,
            ))
    return files, has_deletes


def pending_files(table: Table, files: list[DataFileInfo]) -> list[DataFileInfo]:
    """The files among `files` that an append snapshot added: not optimized yet."""
    ops = {s.snapshot_id: (s.summary.operation.value if s.summary else None) for s in table.metadata.snapshots}
    return [f for f in files if ops.get(f.snapshot_id) == APPEND]


def partition_path(table: Table, spec_id: int, partition: tuple[Any, ...]) -> str:
    """Human-readable partition, e.g. ``ts_day=19723/user_id_bucket=2`` (``<unpartitioned>``)."""
    spec = table.specs()[spec_id]
    if not spec.fields:
        return "<unpartitioned>"
    return "/".join(f"{f.name}={v}" for f, v in zip(spec.fields, partition))


@dataclass(frozen=True)
class PlanningRules:
    """When a partition's pending files are rewritten (any enabled rule suffices)."""

    min_files: int | None = 10
    min_bytes: int | None = None
    max_delay_seconds: float | None = 600.0
    every_n_snapshots: int | None = 5
    max_group_bytes: int = 2 * 1024**3
    # Runs (compactor/planner.py): merged when `merge_factor` runs share a size tier; a
    # partition without new data for `seal_after_commits` ingest commits or
    # `seal_after_seconds` is finished into one sealed run (None: that rule is off).
    merge_factor: int = 2
    seal_after_commits: int | None = 10
    seal_after_seconds: float | None = 3600.0

    @classmethod
    def from_config(cls, config: CompactorConfig) -> PlanningRules:
        return cls(
            min_files=config.min_files, min_bytes=config.min_bytes, max_delay_seconds=config.max_delay_seconds,
            every_n_snapshots=config.every_n_snapshots, max_group_bytes=config.max_group_bytes,
            merge_factor=config.merge_factor, seal_after_commits=config.seal_after_commits,
            seal_after_seconds=config.seal_after_seconds,
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
class CandidatePartition:
    """One partition's candidate files, and why the rules select it (no reasons: deferred);
    in incremental mode also its runs and how long it has gone without new data."""

    spec_id: int
    partition: tuple[Any, ...]
    path: str
    files: tuple[DataFileInfo, ...]
    reasons: tuple[str, ...]
    oldest_age_seconds: float | None
    runs: tuple[Run, ...] = ()
    # Ingest (append) commits to the table since this partition's newest data, and the time
    # since then (None: that snapshot was expired). A partition idle long enough is finished.
    appends_since: int = 0
    idle_seconds: float | None = None
    sealed_sequence_number: int | None = None

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    @property
    def key(self) -> str:
        return sealed_key(self.spec_id, self.path)


def sealed_key(spec_id: int, path: str) -> str:
    return f"{spec_id}|{path}"


def sealed_sequence_numbers(table: Table) -> dict[str, int]:
    """The table's record of sealed runs: partition key -> data sequence number sealed up to."""
    text = table.properties.get(TablePropertyKeys.COMPACTOR_SEALED)
    if not text:
        return {}
    try:
        data = json.loads(text)
        return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (ValueError, TypeError):
        return {}  # unreadable: nothing is treated as sealed (more rewriting, never less data)


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


def select_partitions(table: Table, rules: PlanningRules, *, mode: Mode = "incremental", now_ms: int | None = None,
                      up_to_sequence_number: int | None = None, cache: ManifestCache | None = None) -> Candidates:
    """Candidate files per partition as of the table's current snapshot, with the rules applied.

    incremental: pending files; a partition is selected when any enabled rule fires.
      `up_to_sequence_number` leaves out files committed after that point.
    full: every live data file, every partition selected ("full").
    """
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    snapshot = table.current_snapshot()
    if snapshot is None:
        return Candidates(None, None, (), 0, 0, False, now_ms)
    files, has_deletes = live_data_files(table, cache)
    all_pending = pending_files(table, files)
    if mode == "full":
        candidates = files
    else:
        candidates = all_pending
        if up_to_sequence_number is not None:
            candidates = [f for f in candidates if f.sequence_number <= up_to_sequence_number]

    by_partition: dict[tuple[int, tuple[Any, ...]], list[DataFileInfo]] = defaultdict(list)
    for f in candidates:
        by_partition[(f.spec_id, f.partition)].append(f)
    layout = _RunLayout(table, files, all_pending) if mode == "incremental" else None
    if layout is not None:
        for key in layout.partitions:
            by_partition.setdefault(key, [])
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
        else:
            reasons = list(table_wide)
            if rules.min_files is not None and len(part_files) >= rules.min_files:
                reasons.append(f"min_files: {len(part_files)} >= {rules.min_files}")
            if rules.min_bytes is not None and size >= rules.min_bytes:
                reasons.append(f"min_bytes: {size} >= {rules.min_bytes}")
            if rules.max_delay_seconds is not None and oldest is not None and oldest >= rules.max_delay_seconds:
                reasons.append(f"max_delay_seconds: {oldest:.0f} >= {rules.max_delay_seconds:g}")
        path = partition_path(table, spec_id, part)
        if layout is None:
            partitions.append(CandidatePartition(spec_id, part, path, tuple(part_files), tuple(reasons), oldest))
        else:
            partitions.append(layout.candidate(spec_id, part, path, tuple(part_files) if part_files else (),
                                               tuple(reasons) if part_files else (), oldest, now_ms))
    return Candidates(snapshot.snapshot_id, snapshot.sequence_number, tuple(partitions), pending_snapshots,
                      len(files), has_deletes, now_ms)


class _RunLayout:
    """The runs of each partition and how long each partition has gone without new data."""

    def __init__(self, table: Table, files: list[DataFileInfo], pending: list[DataFileInfo]):
        pending_paths = {f.path for f in pending}
        self.sealed = sealed_sequence_numbers(table)
        self.table = table
        runs: dict[tuple[int, tuple[Any, ...]], dict[int, list[DataFileInfo]]] = defaultdict(lambda: defaultdict(list))
        newest: dict[tuple[int, tuple[Any, ...]], int] = {}
        for f in files:
            key = (f.spec_id, f.partition)
            newest[key] = max(newest.get(key, 0), f.sequence_number)
            if f.path not in pending_paths:
                runs[key][f.snapshot_id].append(f)
        self.runs, self.newest = runs, newest
        self.partitions = list(runs)
        snapshots = table.metadata.snapshots
        self.append_sequences = sorted(s.sequence_number or 0 for s in snapshots
                                       if s.summary is not None and s.summary.operation.value == APPEND)
        self.time_of_sequence = {s.sequence_number or 0: s.timestamp_ms for s in snapshots}

    def candidate(self, spec_id: int, part: tuple[Any, ...], path: str, files: tuple[DataFileInfo, ...],
                  reasons: tuple[str, ...], oldest: float | None, now_ms: int) -> CandidatePartition:
        key = (spec_id, part)
        sealed_up_to = self.sealed.get(sealed_key(spec_id, path))
        runs = tuple(
            Run(snapshot_id, tuple(run_files),
                sealed=sealed_up_to is not None and max(f.sequence_number for f in run_files) <= sealed_up_to)
            for snapshot_id, run_files in sorted(self.runs.get(key, {}).items(),
                                                 key=lambda kv: min(f.sequence_number for f in kv[1])))
        newest = self.newest.get(key, 0)
        appends_since = len(self.append_sequences) - bisect.bisect_right(self.append_sequences, newest)
        at = self.time_of_sequence.get(newest)
        idle = (now_ms - at) / 1000 if at is not None else None
        return CandidatePartition(spec_id, part, path, files, reasons, oldest, runs=runs, appends_since=appends_since,
                                  idle_seconds=idle, sealed_sequence_number=sealed_up_to)
