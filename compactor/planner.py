"""Planner: which data files are rewritten, in which groups, and why (pure pyiceberg, no Spark).

Which files are pending is table_meta/table_files.py (shared with maintenance and monitoring),
which partitions the rules make due is table_meta/pending.py (shared with monitoring), and each
partition's runs and idle time are compactor/runs.py. The planner turns each partition into
at most one group,
whose output is one new *run* (files laid out together, disjoint in the layout's order):

- **finish**: a partition that got no new data for ``seal_after_commits`` ingest commits or
  ``seal_after_seconds`` is merged whole (new files and every unsealed run) into one run,
  recorded as sealed in the table (``TablePropertyKeys.COMPACTOR_SEALED``) and never
  rewritten again; a finished partition that already is one unsealed run is only sealed.
- **merge**: new files selected by the rules, plus the runs of the lowest size tiers when
  ``merge_factor`` runs (the new one counted) share a tier, cascading upward (size-tiered,
  as in LSM trees): k runs cost about k^(1/3) more files per point query than one, and
  each byte is rewritten about once per tier. Runs whose value ranges do not overlap on any
  clustering column (data arriving in the clustering order) are not merged: it would buy
  nothing. Runs of ``max_group_bytes`` or more are full and not merged further.
- **cluster**: the new files alone, when no merge is due.
- **relayout**: a partition with no other group whose runs were clustered by other columns
  than the current ones (`streamberg.cluster.columns` changed, by hand or by `auto`): its runs
  and new files rewritten into one run of the current layout, the partitions whose stale runs
  are oldest first, at most ``relayout_max_bytes`` a pass (the governor's budget); a sealed
  partition stays sealed. A run whose rewrite snapshot was expired has no known columns and
  is left as it is.

Full mode (``--full``) ignores runs: every live file, every partition, split by size. A pass
that crashed halfway, or a replayed streaming batch, re-plans from the table: nothing is
skipped and nothing is rewritten twice. The plan remembers the snapshot it was made from;
every commit of its groups is validated against that snapshot.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pyiceberg.schema import Schema
from pyiceberg.table import Table

from streamberg.common.config import CompactorConfig, TableTarget
from streamberg.compactor.runs import PlanningRules, Run, RunCandidate, RunLayout, without_runs
from streamberg.table_meta.clustering import column_intervals, health, overlap_depth
from streamberg.table_meta.pending import Mode, select_partitions
from streamberg.table_meta.summary_keys import SummaryKeys
from streamberg.table_meta.table_files import DataFileInfo, ManifestCache, target_file_size

# deletes: a partition whose deletes passed a threshold, rewritten whole (docs/cdc.md)
GroupKind = Literal["cluster", "merge", "finish", "full", "deletes", "relayout"]
# Size tiers start at one output file, but at most at this size: with large target files
# (128 MiB) every run of a partition would otherwise sit in tier 0, and the new files of
# each pass would be merged into the partition's whole data, pass after pass.
TIER_BASE_MAX_BYTES = 1024**2


@dataclass(frozen=True)
class FileGroup:
    """Files of one partition rewritten together by one Spark job."""

    index: int
    spec_id: int
    partition: tuple[Any, ...]
    partition_path: str
    files: tuple[DataFileInfo, ...]
    reasons: tuple[str, ...]
    kind: GroupKind = "cluster"
    merged_runs: tuple[int, ...] = ()  # snapshot ids of the runs merged in
    seal: bool = False  # the output run is sealed (finish)
    sealed_key: str = ""  # the partition's key in the sealed-runs property
    # Clustering health of the whole partition before the rewrite: column -> files per point.
    files_per_point_before: dict[str, float] = field(default_factory=dict, compare=False, hash=False)

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
        """The ingest snapshots whose new files this group covers, oldest first."""
        seen = sorted({(f.sequence_number, f.snapshot_id) for f in self.files if f.snapshot_id not in self.merged_runs})
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
    # Finished partitions that already are one unsealed run: sealed without a rewrite.
    seal_only: tuple[str, ...] = ()
    # Every partition key with live files (the sealed-runs record keeps only these).
    live_partition_keys: tuple[str, ...] = ()

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


def _files_per_point(part: RunCandidate, schema: Schema, columns: Sequence[str]) -> dict[str, float]:
    """Clustering health of a whole partition (new files and runs) before its rewrite; only
    computed for partitions that get a group (it reads every file's bounds)."""
    files = list(part.files) + [f for r in part.runs for f in r.files]
    return {c: h.files_per_point for c, h in health(files, schema, columns).items()}


def plan_rewrite(table: Table, rules: PlanningRules, *, mode: Mode = "incremental", now_ms: int | None = None,
                 up_to_sequence_number: int | None = None, cache: ManifestCache | None = None,
                 columns: Sequence[str] = (), target_file_size_bytes: int | None = None) -> Plan:
    """Plan a pass over `table` as of its current snapshot (see the module doc).

    `up_to_sequence_number` leaves out new files committed after that point (a streaming
    batch plans the snapshots it covers; later ones belong to the next batch). `columns`:
    the clustering columns (run overlap and the health recorded with each group).
    `target_file_size_bytes`: the size of one output file, the unit of run size tiers (at
    most TIER_BASE_MAX_BYTES).
    """
    selected = select_partitions(table, rules, mode=mode, now_ms=now_ms,
                                 up_to_sequence_number=up_to_sequence_number, cache=cache)
    name = ".".join(table.name())
    if selected.snapshot_id is None:
        return Plan(table=name, mode=mode, starting_snapshot_id=None, starting_sequence_number=None, groups=())
    target = target_file_size(table, target_file_size_bytes)
    base = max(1, min(target, TIER_BASE_MAX_BYTES))
    groups: list[FileGroup] = []
    deferred: list[DeferredPartition] = []
    seal_only: list[str] = []
    schema = table.schema()
    layout = RunLayout(table, selected) if mode == "incremental" else None
    parts = [layout.candidate(p, selected.now_ms) if layout is not None else without_runs(p)
             for p in selected.partitions]
    for part in parts:
        if mode == "full":
            before = _files_per_point(part, schema, columns)
            for chunk in _split(list(part.files), rules.max_group_bytes):
                groups.append(FileGroup(index=len(groups), spec_id=part.spec_id, partition=part.partition,
                                        partition_path=part.path, files=tuple(chunk), reasons=part.reasons,
                                        kind="full", files_per_point_before=before))
            continue
        if part.delete_reasons:  # fold the deletes: every live file of the partition, runs and all
            before = _files_per_point(part, schema, columns)
            every = list(part.files) + [f for r in part.runs for f in r.files]
            for chunk in _split(every, rules.max_group_bytes):
                groups.append(FileGroup(index=len(groups), spec_id=part.spec_id, partition=part.partition,
                                        partition_path=part.path, files=tuple(chunk),
                                        reasons=part.reasons + part.delete_reasons, kind="deletes",
                                        merged_runs=tuple(r.snapshot_id for r in part.runs),
                                        files_per_point_before=before))
            continue
        unsealed = [r for r in part.runs if not r.sealed]
        if _finished(part, rules):
            if part.files or len(unsealed) > 1:
                groups.append(FileGroup(
                    index=len(groups), spec_id=part.spec_id, partition=part.partition, partition_path=part.path,
                    files=tuple(part.files) + tuple(f for r in unsealed for f in r.files),
                    reasons=(_finish_reason(part, rules),), kind="finish",
                    merged_runs=tuple(r.snapshot_id for r in unsealed), seal=True, sealed_key=part.key,
                    files_per_point_before=_files_per_point(part, schema, columns)))
            elif unsealed:
                seal_only.append(part.key)
            continue
        if not part.files:
            continue
        if not part.reasons:
            deferred.append(DeferredPartition(part.spec_id, part.path, len(part.files), part.size_bytes,
                                              part.oldest_age_seconds))
            continue
        pending_bytes = part.size_bytes
        if pending_bytes > rules.max_group_bytes:  # more new data than one job takes: several runs
            before = _files_per_point(part, schema, columns)
            for chunk in _split(list(part.files), rules.max_group_bytes):
                groups.append(FileGroup(index=len(groups), spec_id=part.spec_id, partition=part.partition,
                                        partition_path=part.path, files=tuple(chunk), reasons=part.reasons,
                                        files_per_point_before=before))
            continue
        runs = tiered_merge(unsealed, pending_bytes, base=base, factor=rules.merge_factor,
                            max_bytes=rules.max_group_bytes)
        if runs and not runs_overlap(part.files, runs, schema, columns):
            runs = []
        groups.append(FileGroup(
            index=len(groups), spec_id=part.spec_id, partition=part.partition, partition_path=part.path,
            files=tuple(part.files) + tuple(f for r in runs for f in r.files),
            reasons=part.reasons + ((f"merge: {len(runs)} run(s), merge_factor {rules.merge_factor}",) if runs else ()),
            kind="merge" if runs else "cluster", merged_runs=tuple(r.snapshot_id for r in runs),
            files_per_point_before=_files_per_point(part, schema, columns)))
    if layout is not None and columns and rules.relayout_max_bytes:
        groups += _relayouts(table, parts, {(g.spec_id, g.partition) for g in groups}, tuple(columns), rules,
                             first_index=len(groups))
    return Plan(
        table=name, mode=mode, starting_snapshot_id=selected.snapshot_id,
        starting_sequence_number=selected.sequence_number, groups=tuple(groups), deferred=tuple(deferred),
        pending_snapshots=selected.pending_snapshots, live_data_files=selected.live_data_files,
        has_delete_files=selected.has_delete_files, planned_at_ms=selected.now_ms, seal_only=tuple(seal_only),
        live_partition_keys=tuple(p.key for p in parts if p.files or p.runs),
    )


def _run_columns(table: Table, snapshot_id: int) -> tuple[str, ...] | None:
    """The clustering columns the rewrite that made a run recorded (None: unknown)."""
    snapshot = table.snapshot_by_id(snapshot_id)
    if snapshot is None or snapshot.summary is None:
        return None
    text = snapshot.summary.additional_properties.get(SummaryKeys.COMPACTOR_COLUMNS)
    return None if text is None else tuple(c.strip() for c in text.split(",") if c.strip())


def _relayouts(table: Table, parts: Sequence[RunCandidate], grouped: set[tuple[int, tuple[Any, ...]]],
               columns: tuple[str, ...], rules: PlanningRules, first_index: int) -> list[FileGroup]:
    """Relayout groups (module doc): oldest stale runs first, within the pass's budget."""
    stale: list[tuple[int, RunCandidate, tuple[str, ...]]] = []
    for part in parts:
        if (part.spec_id, part.partition) in grouped or not part.runs:
            continue
        olds = [(r, cols) for r in part.runs
                if (cols := _run_columns(table, r.snapshot_id)) is not None and cols != columns]
        if olds:
            oldest = min(f.sequence_number for r, _ in olds for f in r.files)
            stale.append((oldest, part, olds[0][1]))
    groups: list[FileGroup] = []
    budget = rules.relayout_max_bytes or 0
    schema = table.schema()
    for _, part, old in sorted(stale, key=lambda item: item[0]):
        files = list(part.files) + [f for r in part.runs for f in r.files]
        size = sum(f.size_bytes for f in files)
        if size > budget and groups:  # the budget spent (one partition a pass at least)
            break
        budget -= size
        sealed = not part.files and all(r.sealed for r in part.runs)
        chunks = _split(files, rules.max_group_bytes)
        reason = f"relayout: clustered by {', '.join(old) or 'nothing'}, now by {', '.join(columns)}"
        for chunk in chunks:
            groups.append(FileGroup(
                index=first_index + len(groups), spec_id=part.spec_id, partition=part.partition,
                partition_path=part.path, files=tuple(chunk), reasons=(reason,), kind="relayout",
                merged_runs=tuple(r.snapshot_id for r in part.runs), seal=sealed and len(chunks) == 1,
                sealed_key=part.key if sealed and len(chunks) == 1 else "",
                files_per_point_before=_files_per_point(part, schema, columns)))
    return groups


class PassPlanner:
    """How every pass of one compactor plans: its rules, clustering columns, target file
    size and manifest cache, built once from the settings (a dry run plans through it too,
    so it shows what a pass would do)."""

    def __init__(self, settings: CompactorConfig, target: TableTarget, columns: Sequence[str],
                 cache: ManifestCache | None = None) -> None:
        self.rules = PlanningRules.from_config(settings)
        self.columns = tuple(columns)
        self.configured_target = settings.target_file_size_bytes
        self.default_target = target.table.target_file_size_bytes
        # `cache`: one a keeper of many tables shares (manifests are immutable: each is read
        # once, and an unchanged table's files are listed once a metadata file).
        self.cache = cache if cache is not None else ManifestCache()

    def target_file_size(self, table: Table) -> int:
        """The size of one rewritten file (table_meta/table_files.py's rule)."""
        return target_file_size(table, self.configured_target, self.default_target)

    def plan(self, table: Table, mode: Mode = "incremental", *, up_to_snapshot_id: int | None = None) -> Plan:
        bound = sequence_number_of(table, up_to_snapshot_id) if mode == "incremental" else None
        return plan_rewrite(table, self.rules, mode=mode, up_to_sequence_number=bound, cache=self.cache,
                            columns=self.columns, target_file_size_bytes=self.target_file_size(table))


def _finished(part: RunCandidate, rules: PlanningRules) -> bool:
    """No new data in the partition for seal_after_commits ingest commits or seal_after_seconds."""
    if not part.files and not any(not r.sealed for r in part.runs):
        return False  # nothing to finish
    by_commits = rules.seal_after_commits is not None and part.appends_since >= rules.seal_after_commits
    by_time = (rules.seal_after_seconds is not None and part.idle_seconds is not None
               and part.idle_seconds >= rules.seal_after_seconds)
    return by_commits or by_time


def _finish_reason(part: RunCandidate, rules: PlanningRules) -> str:
    idle = "unknown" if part.idle_seconds is None else f"{part.idle_seconds:.0f} s"
    return (f"finished: no new data for {part.appends_since} ingest commits / {idle} "
            f"(seal_after_commits {rules.seal_after_commits}, seal_after_seconds {rules.seal_after_seconds})")


def run_tier(size_bytes: int, base: int, factor: int) -> int:
    """Size tier of a run: 0 up to `base` x factor, then one more per factor."""
    return int(math.floor(math.log(max(size_bytes, base) / base, factor) + 1e-9))


def tiered_merge(runs: Sequence[Run], new_bytes: int, *, base: int, factor: int, max_bytes: int) -> list[Run]:
    """The runs to merge with `new_bytes` of new files (size-tiered, cascading).

    The new files count as a run. While some tier holds `factor` runs or more, every run of
    that tier and below joins the merge, whose result then sits in a higher tier. Runs of
    `max_bytes` or more are full: never merged.
    """
    open_runs = [r for r in runs if r.size_bytes < max_bytes]
    chosen: list[Run] = []
    while True:
        merged = new_bytes + sum(r.size_bytes for r in chosen)
        rest = [r for r in open_runs if r not in chosen]
        tiers = [run_tier(merged, base, factor)] + [run_tier(r.size_bytes, base, factor) for r in rest]
        due = next((t for t in sorted(set(tiers)) if tiers.count(t) >= factor), None)
        if due is None:
            return chosen
        more = [r for r in rest if run_tier(r.size_bytes, base, factor) <= due]
        if not more or merged + sum(r.size_bytes for r in more) > max_bytes:
            return chosen
        chosen += more


def runs_overlap(new_files: Sequence[DataFileInfo], runs: Sequence[Run], schema: object,
                 columns: Sequence[str]) -> bool:
    """Whether the runs (and the new files, as one more) overlap on some clustering column.

    Each run counts as the one interval its files span; runs whose spans are disjoint on every
    clustering column (data that arrives in clustering order) gain nothing from a merge.
    Without clustering columns there is nothing to measure: merge.
    """
    if not columns:
        return True
    sets = [list(new_files)] + [list(r.files) for r in runs]
    for column in columns:
        spans = []
        for files in sets:
            intervals = column_intervals(files, schema, column)  # type: ignore[arg-type]
            if not intervals or any(i is None for i in intervals):
                return True  # unknown bounds: assume overlap
            spans.append((min(i[0] for i in intervals), max(i[1] for i in intervals)))  # type: ignore[index]
        if overlap_depth(spans) > 1:
            return True
    return False


def sequence_number_of(table: Table, snapshot_id: int | None) -> int | None:
    if snapshot_id is None:
        return None
    snapshot = table.snapshot_by_id(snapshot_id)
    return snapshot.sequence_number if snapshot is not None else None


def describe(plan: Plan) -> dict[str, Any]:
    """A compact, loggable summary of a plan."""
    kinds: dict[str, int] = {}
    for g in plan.groups:
        kinds[g.kind] = kinds.get(g.kind, 0) + 1
    return {
        "group_kinds": kinds,
        "runs_merged": sum(len(g.merged_runs) for g in plan.groups),
        "seal_only": len(plan.seal_only),
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
