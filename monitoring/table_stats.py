"""Facts read from one Iceberg table's metadata: pure reads, no Spark, no writes.

Each function reads what it reports from the table and nothing else; where another
module already knows how (pending files: compactor/planner.py; committed offsets:
table_meta/offsets.py; optimize records: compactor/record.py), it is asked instead of
re-deriving the answer.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from streamberg.common.config import StreambergConfig
from streamberg.common.times import iso_from_ms
from streamberg.monitoring.model import (
    ClusteringFacts,
    CompactorFacts,
    FileFacts,
    LastCommit,
    LastOptimize,
    MergeFacts,
    SnapshotFacts,
)
from streamberg.table_meta.changelog import last_merge, merge_position
from streamberg.table_meta.clustering import health, health_by_partition
from streamberg.table_meta.offsets import CommittedPosition, ancestry, summary_properties
from streamberg.table_meta.pending import DueRules, delete_stats, select_partitions
from streamberg.table_meta.summary_keys import SummaryKeys, is_compactor_summary
from streamberg.table_meta.table_files import (
    DataFileInfo,
    ManifestCache,
    live_data_files,
    partition_path,
    pending_files,
    sealed_sequence_numbers,
    target_file_size,
)


def _age(now_ms: int, then_ms: int) -> float:
    return round(max(0.0, (now_ms - then_ms) / 1000), 3)


def _int(props: dict[str, str], key: str) -> int:
    value = props.get(key)
    return int(value) if value not in (None, "") else 0


def last_commit(table: Table, position: CommittedPosition, now_ms: int) -> LastCommit | None:
    """The ingest commit that recorded the current offsets (what `committed_position` found)."""
    if position.snapshot_id is None:
        return None
    snapshot = table.snapshot_by_id(position.snapshot_id)
    if snapshot is None:
        return None
    props = summary_properties(snapshot)
    started = props.get(SummaryKeys.COMMIT_STARTED_MS)
    latency = round(max(0.0, (snapshot.timestamp_ms - int(started)) / 1000), 3) if started else None
    return LastCommit(
        snapshot_id=snapshot.snapshot_id, committed_at=iso_from_ms(snapshot.timestamp_ms),
        age_seconds=_age(now_ms, snapshot.timestamp_ms),
        records=_int(props, "added-records"), files=_int(props, "added-data-files"),
        dead_letters=_int(props, SummaryKeys.DEAD_LETTERS), job_id=position.job_id, run_id=position.run_id,
        consumed_total=position.consumed_total, commit_latency_seconds=latency,
    )


def file_facts(config: StreambergConfig, table: Table, files: list[DataFileInfo]) -> FileFacts:
    target = target_file_size(table, config.compactor.target_file_size_bytes, config.table.target_file_size_bytes)
    threshold = int(target * config.monitoring.small_file_fraction)
    small = sum(1 for f in files if f.size_bytes < threshold)
    return FileFacts(
        data_files=len(files), records=sum(f.record_count for f in files), bytes=sum(f.size_bytes for f in files),
        small_files=small, small_file_ratio=round(small / len(files), 4) if files else 0.0,
        small_file_threshold_bytes=threshold, target_file_size_bytes=target,
    )


def _last_optimize(table: Table, now_ms: int) -> LastOptimize | None:
    for snapshot in ancestry(table):
        props = summary_properties(snapshot)
        if not is_compactor_summary(props):
            continue
        duration = props.get(SummaryKeys.COMPACTOR_DURATION_MS)
        return LastOptimize(
            snapshot_id=snapshot.snapshot_id, committed_at=iso_from_ms(snapshot.timestamp_ms),
            age_seconds=_age(now_ms, snapshot.timestamp_ms), strategy=props.get(SummaryKeys.COMPACTOR_STRATEGY), mode=props.get(SummaryKeys.COMPACTOR_MODE),
            files_in=_int(props, SummaryKeys.COMPACTOR_FILES_IN), files_out=_int(props, SummaryKeys.COMPACTOR_FILES_OUT),
            bytes_in=_int(props, SummaryKeys.COMPACTOR_BYTES_IN), bytes_out=_int(props, SummaryKeys.COMPACTOR_BYTES_OUT), records=_int(props, SummaryKeys.COMPACTOR_RECORDS),
            duration_seconds=int(duration) / 1000 if duration else None,
        )
    return None


def compactor_facts(config: StreambergConfig, table: Table, cache: ManifestCache, now_ms: int) -> CompactorFacts:
    """Pending files exactly as the compactor's planner sees them (table_meta/pending.py): the
    files its rules select now (due) plus those they still defer."""
    selected = select_partitions(table, DueRules.from_config(config.compactor), now_ms=now_ms, cache=cache)
    ages = [p.oldest_age_seconds for p in selected.partitions if p.oldest_age_seconds is not None]
    return CompactorFacts(
        pending_files=sum(len(p.files) for p in selected.partitions),
        pending_bytes=sum(p.size_bytes for p in selected.partitions),
        pending_snapshots=selected.pending_snapshots,
        due_files=sum(len(p.files) for p in selected.partitions if p.reasons),
        oldest_pending_age_seconds=round(max(ages), 3) if ages else None,
        last_optimize=_last_optimize(table, now_ms),
    )


def _file_size(table: Table, location: str) -> int:
    return len(table.io.new_input(location))


def _metadata_sizes(table: Table) -> tuple[int, int, int, int]:
    """(metadata file, manifest list, manifests, their bytes): what a reader loads to plan."""
    metadata_file = _file_size(table, table.metadata_location)
    current = table.current_snapshot()
    manifest_list = manifests = manifest_bytes = 0
    if current is not None:
        if current.manifest_list:
            manifest_list = _file_size(table, current.manifest_list)
        listed = current.manifests(table.io)
        manifests, manifest_bytes = len(listed), sum(m.manifest_length for m in listed)
    return metadata_file, manifest_list, manifests, manifest_bytes


def snapshot_facts(table: Table, now_ms: int, cache: ManifestCache | None = None) -> SnapshotFacts:
    """Snapshot count and what a reader loads to plan a scan: the metadata file, the
    current manifest list and its manifests (older manifest lists are not counted). With a
    cache, the sizes are read once a metadata file (they are immutable)."""
    snapshots: list[Snapshot] = table.metadata.snapshots
    metadata_file, manifest_list, manifests, manifest_bytes = _metadata_sizes(table) if cache is None else \
        cache.latest(f"metadata sizes|{table.metadata.table_uuid}", table.metadata_location,
                     lambda: _metadata_sizes(table))
    oldest = min((s.timestamp_ms for s in snapshots), default=None)
    timing = commit_timing(snapshots)
    return SnapshotFacts(
        count=len(snapshots), metadata_bytes=metadata_file + manifest_list + manifest_bytes,
        metadata_file_bytes=metadata_file, manifest_list_bytes=manifest_list, manifests=manifests,
        manifest_bytes=manifest_bytes, oldest_age_seconds=_age(now_ms, oldest) if oldest is not None else None,
        **timing,
    )


# The newest ingest commits the commit-time trend reads.
COMMIT_SAMPLES = 400


def commit_timing(snapshots: list[Snapshot]) -> dict[str, Any]:
    """p50, p95 and trend of the ingest's commit times recorded in the snapshots kept."""
    recorded = []
    for snapshot in sorted(snapshots, key=lambda s: s.timestamp_ms):
        value = summary_properties(snapshot).get(SummaryKeys.PREVIOUS_COMMIT_MS)
        if value is not None and value.isdigit():
            recorded.append(int(value) / 1000)
    recorded = recorded[-COMMIT_SAMPLES:]
    if not recorded:
        return {}
    ordered = sorted(recorded)
    quarter = len(recorded) // 4
    trend = None
    if len(recorded) >= 20:
        old, new = sorted(recorded[:quarter]), sorted(recorded[-quarter:])
        if old[len(old) // 2] > 0:
            trend = round(new[len(new) // 2] / old[len(old) // 2], 2)
    return {"commit_seconds_p50": round(ordered[len(ordered) // 2], 3),
            "commit_seconds_p95": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 3),
            "commit_seconds_trend": trend, "commit_samples": len(recorded)}


def clustering_facts(config: StreambergConfig, table: Table, files: list[DataFileInfo]) -> ClusteringFacts | None:
    """Files per point query and overlap depth per clustering column, table-wide and for the
    worst partitions; runs and sealed partitions. None without clustering columns."""
    columns = list(config.compactor.columns)
    if not columns:
        return None
    schema = table.schema()
    table_wide = health(files, schema, columns)
    by_partition = health_by_partition(files, schema, columns)
    pending = {f.path for f in pending_files(table, files)}
    runs = {(f.snapshot_id, f.spec_id, f.partition) for f in files if f.path not in pending}
    worst = sorted(by_partition.items(), key=lambda kv: -kv[1][columns[0]].files_per_point)[:5]
    return ClusteringFacts(
        columns={c: h.as_dict() for c, h in table_wide.items()}, partitions=len(by_partition), runs=len(runs),
        sealed_partitions=len(sealed_sequence_numbers(table)),
        worst_partitions=[{"partition": partition_path(table, spec_id, part),
                           **{c: round(h.files_per_point, 3) for c, h in cols.items()}}
                          for (spec_id, part), cols in worst],
    )


def merge_facts(config: StreambergConfig, changelog: Table | None, changelog_name: str, table: Table,
                cache: ManifestCache, now_ms: int) -> MergeFacts:
    """The merge lag (change-log snapshots and records not applied, and their age), the last
    merge, and the table's deletes against its rows."""
    position = merge_position(changelog, table) if changelog is not None else None
    last = last_merge(table)
    files, has_deletes = live_data_files(table, cache)
    stats = delete_stats(table, files, cache) if has_deletes else {}
    rules = DueRules.from_config(config.compactor)
    return MergeFacts(
        changelog=changelog_name, changelog_exists=changelog is not None,
        applied_snapshot_id=position.applied_snapshot_id if position is not None else None,
        pending_snapshots=position.pending_snapshots if position is not None else 0,
        pending_records=position.pending_records if position is not None else 0,
        oldest_pending_age_seconds=_age(now_ms, position.oldest_pending_ms)
        if position is not None and position.oldest_pending_ms is not None else None,
        last_merge_at=iso_from_ms(last.timestamp_ms) if last is not None else None,
        last_merge_age_seconds=_age(now_ms, last.timestamp_ms) if last is not None else None,
        last_merge_changes=_int(summary_properties(last), SummaryKeys.MERGE_CHANGES) if last is not None else None,
        delete_files=sum(s.files for s in stats.values()), deleted_rows=sum(s.deleted_rows for s in stats.values()),
        deleted_row_ratio=round(sum(s.deleted_rows for s in stats.values()) / max(1, sum(f.record_count for f in files)), 4),
        partitions_due_for_deletes=sum(1 for s in stats.values() if rules.delete_reasons(s)),
        **_epochs(changelog),
    )


def _epochs(changelog: Table | None) -> dict[str, Any]:
    """The change log's source epochs and any regression not yet resolved (source_epochs.py)."""
    from streamberg.table_meta.source_epochs import read_epochs, read_regression

    if changelog is None:
        return {}
    epochs, unreadable = read_epochs(changelog.properties)
    regression = read_regression(changelog.properties)
    found = None
    if unreadable is not None:
        found = {"changes": 0, "since": {}, "first_seen": "", "problem": unreadable}
    elif regression is not None:
        found = {"changes": regression.changes, "since": {str(p): o for p, o in sorted(regression.since.items())},
                 "first_seen": regression.first_seen}
    return {"source_regression": found, "source_epoch": epochs.latest}
