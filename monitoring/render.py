"""The status screen: plain text, one fact per line, the verdict and its reasons first."""

from __future__ import annotations

from typing import Any

from streamberg.common.human import human_age, human_bytes
from streamberg.monitoring.model import Status

_WIDTH = 14


def _line(label: str, text: str) -> str:
    return f"{label:<{_WIDTH}}{text}"


def _ingest_lines(status: Status) -> list[str]:
    ingest = status.ingest
    last = ingest.last_commit
    if last is not None:
        latency = f", commit latency {last.commit_latency_seconds:.2f} s" if last.commit_latency_seconds is not None else ""
        commit = (f"{human_age(last.age_seconds)} ago: snapshot {last.snapshot_id}, {last.records:,} records, "
                  f"{last.files} files, {last.dead_letters} dead letters{latency} (job {last.job_id})")
    else:
        commit = "unknown (catalog or table unavailable)" if not status.table_exists else "never"
    lines = [_line("last commit", commit)]
    broker = "reachable" if ingest.broker.reachable else f"UNREACHABLE: {ingest.broker.error}"
    lines.append(_line("broker", broker))
    if ingest.topic_exists is False:
        lines.append(_line("lag", f"topic {ingest.topic} does not exist on the broker"))
    elif ingest.lag is None:
        lines.append(_line("lag", "unknown"))
    else:
        waited = f", the oldest waiting {ingest.lag.seconds:,.1f} s" if ingest.lag.seconds else ""
        lines.append(_line("lag", f"{ingest.lag.total:,} records behind (topic {ingest.topic}){waited}"))
        lines.append(f"{'':<{_WIDTH}}{'partition':>9} {'committed':>14} {'end':>14} {'lag':>12} {'watermark':>14}")
        for p, part in ingest.lag.partitions.items():
            committed = f"{part.committed:,}" if part.committed is not None else "-"
            lines.append(f"{'':<{_WIDTH}}{p:>9} {committed:>14} {part.end:>14,} {part.lag:>12,} {part.watermark:>14,}")
    if ingest.offset_skips:
        lines.append(_line("lost offsets", f"{ingest.lost_offsets:,} skipped in {len(ingest.offset_skips)} jump(s) "
                                           f"Kafka forced (skip-and-record)"))
        for skip in ingest.offset_skips:
            what = (f"[{skip.from_offset:,}, {skip.to_offset:,}) lost" if skip.kind == "lost"
                    else f"went back from {skip.from_offset:,} to {skip.to_offset:,}")
            lines.append(f"{'':<{_WIDTH}}partition {skip.partition}: {what} at {skip.at or '?'}")
    ignored = [u for u in ingest.unknown_fields if u.ignored]
    off = [u for u in ingest.unknown_fields if not u.ignored]
    for group, label, why in ((ignored, "ignored", "the table ignores (columns dropped as unused: its property "
                                                   "streamberg.ingest.ignored-fields; docs/governor.md for undo)"),
                              (off, "not written", "the records carry and the table lacks "
                                                   "(ingest.schema_evolution: off)")):
        if not group:
            continue
        lines.append(_line(label, f"{len(group)} field(s) {why}"))
        for unknown in group[:_LISTED]:
            where = ", ".join(f"p{p} {unknown.first[p]:,}..{unknown.last.get(p, unknown.first[p]):,}" for p in unknown.first)
            lines.append(f"{'':<{_WIDTH}}{unknown.path}: {unknown.records:,} records ({where})")
    if ingest.schema_additions:
        lines.append(_line("fields added", f"{ingest.fields_added:,} by the ingest (ingest.schema_evolution: add); "
                                           f"latest at {ingest.schema_additions[0].at}"))
        for addition in ingest.schema_additions:
            lines.append(f"{'':<{_WIDTH}}snapshot {addition.snapshot_id}: {', '.join(addition.fields[:_LISTED])}"
                         + (f" and {len(addition.fields) - _LISTED} more" if len(addition.fields) > _LISTED else ""))
    return lines


_LISTED = 10  # fields listed per line; the JSON output has them all


def _table_lines(status: Status) -> list[str]:
    lines = []
    files = status.files
    if files is not None:
        lines.append(_line("files", f"{files.data_files:,} data files, {files.records:,} records, {human_bytes(files.bytes)}; "
                                    f"{files.small_files:,} small (< {human_bytes(files.small_file_threshold_bytes)}): "
                                    f"{files.small_file_ratio:.0%}"))
    compactor = status.compactor
    if compactor is not None:
        oldest = f", oldest {human_age(compactor.oldest_pending_age_seconds)}" if compactor.pending_files else ""
        lines.append(_line("compactor", f"{compactor.pending_files:,} files waiting ({human_bytes(compactor.pending_bytes)}, "
                                        f"{compactor.due_files:,} due now){oldest}"))
        opt = compactor.last_optimize
        text = "never" if opt is None else (
            f"{human_age(opt.age_seconds)} ago: snapshot {opt.snapshot_id}, {opt.strategy} ({opt.mode}), "
            f"{opt.files_in} -> {opt.files_out} files"
            + (f", {opt.duration_seconds:.1f} s" if opt.duration_seconds is not None else ""))
        lines.append(_line("last optimize", text))
    clustering = status.clustering
    if clustering is not None:
        per_column = ", ".join(f"{c} {h['files_per_point']:.1f} (depth {h['overlap_depth']})"
                               for c, h in clustering.columns.items())
        lines.append(_line("clustering", f"files per point query: {per_column}; {clustering.runs:,} runs in "
                                         f"{clustering.partitions:,} partitions, {clustering.sealed_partitions:,} sealed"))
    snaps = status.snapshots
    if snaps is not None:
        lines.append(_line("snapshots", f"{snaps.count:,} (oldest {human_age(snaps.oldest_age_seconds)}), metadata "
                                        f"{human_bytes(snaps.metadata_bytes)} in the metadata file "
                                        f"({human_bytes(snaps.metadata_file_bytes)}), manifest list "
                                        f"and {snaps.manifests} manifests"))
        if snaps.commit_seconds_p95 is not None:
            trend = f", trend {snaps.commit_seconds_trend:g}x" if snaps.commit_seconds_trend is not None else ""
            lines.append(_line("commit time", f"p50 {snaps.commit_seconds_p50:g} s, p95 {snaps.commit_seconds_p95:g} s "
                                              f"over the last {snaps.commit_samples} ingest commits{trend}"))
    merge = status.merge
    if merge is not None:
        if not merge.changelog_exists:
            lines.append(_line("merge", f"change log {merge.changelog} does not exist yet"))
        else:
            behind = "up to date" if not merge.pending_records else (
                f"{merge.pending_records:,} changes in {merge.pending_snapshots} change-log snapshot(s) to merge, "
                f"oldest {human_age(merge.oldest_pending_age_seconds)}")
            last = "never" if merge.last_merge_age_seconds is None else (
                f"last {human_age(merge.last_merge_age_seconds)} ago ({merge.last_merge_changes or 0:,} changes)")
            lines.append(_line("merge", f"{behind}; {last}; from {merge.changelog}"))
        lines.append(_line("deletes", f"{merge.delete_files:,} delete files, {merge.deleted_rows:,} rows deleted "
                                      f"({merge.deleted_row_ratio:.1%} of the data files' rows); "
                                      f"{merge.partitions_due_for_deletes} partition(s) due for delete compaction"))
    dead = status.dead_letters
    if dead is not None:
        lines.append(_line("dead letters", f"{dead.records:,} in {dead.table}" + ("" if dead.exists else " (no table yet)")))
    return lines


def _maintenance_line(maintenance: dict[str, Any]) -> str:
    if maintenance.get("error"):
        return _line("maintenance", f"unknown: {maintenance['error']}")
    run = maintenance.get("last_run")
    if not run:
        return _line("maintenance", "never")
    if isinstance(run, dict) and {"age_seconds", "status", "bytes_freed"} <= set(run):
        return _line("maintenance", f"last run {human_age(run['age_seconds'])} ago: {run['status']}, "
                                    f"{human_bytes(run['bytes_freed'])} freed (run {run.get('run_id')})")
    if isinstance(run, dict):
        shown = ", ".join(f"{k} {v}" for k, v in run.items() if isinstance(v, (str, int, float, bool)))
        return _line("maintenance", f"last run: {shown}")
    return _line("maintenance", f"last run: {run}")


def render_screen(status: Status) -> str:
    health = status.health
    verdict = health.verdict.upper() if health else "NOT JUDGED"
    lines = [f"streamberg status  {status.table}  at {status.checked_at}", "", _line("health", verdict)]
    for reason in health.reasons if health else []:
        lines.append(f"{'':<{_WIDTH}}- {reason}")
    catalog = "reachable" if status.catalog.reachable else f"UNREACHABLE: {status.catalog.error}"
    if status.catalog.reachable and status.table_exists is False:
        catalog += f"; table {status.table} does not exist"
    lines += ["", _line("catalog", catalog), *_ingest_lines(status), *_table_lines(status),
              _maintenance_line(status.maintenance), *_governor_lines(status)]
    return "\n".join(lines)


def _governor_lines(status: Status) -> list[str]:
    """What `streamberg govern` last recorded for the table, and its policy's bad values."""
    lines = [_line("policy", f"ignored: {problem}") for problem in status.policy_problems]
    kept = status.tail_cache
    if kept is not None:
        past = kept.get("past_kept_records")
        keeper = "the ingest" if kept.get("kept_by") == "ingest" else "keeper"
        lines.append(_line("tail kept", f"{keeper} {'alive' if kept['alive'] else 'NOT running'}: "
                           f"{kept['kept_records']:,} records in {kept['segments']} segments "
                           f"({kept['bytes'] / 1e6:.1f} MB)"
                           + (f", {past:,} past them" if past is not None else "")
                           + (f" ({kept['behind_seconds']:g} s behind)" if kept.get("behind_seconds") else "")))
    queries = status.queries
    if queries is not None:
        filtered = ", ".join(f"{c} {s:g}" for c, s in list((queries.get("filtered") or {}).items())[:5]) or "none"
        skipped = queries.get("files_skipped_share")
        lines.append(_line("queries", f"{queries.get('scans_total', 0)} scans reported, files skipped "
                           f"{'-' if skipped is None else f'{skipped:.0%}'}; filtered: {filtered}; clustered by "
                           f"{', '.join(queries.get('cluster_columns') or []) or '-'}"))
        if queries.get("unused_columns"):
            lines.append(_line("", f"unused for {queries.get('unused_after_days'):g} days: "
                               f"{', '.join(queries['unused_columns'][:20])}"))
    governor = status.governor
    if governor is None:
        return lines
    parts = []
    for action in governor.get("actions", []):
        state = (f"waiting {human_age(action['waiting_seconds'])}" if action.get("waiting_seconds") is not None
                 else f"last run {human_age(action['last_run_age_seconds'])} ago"
                 if action.get("last_run_age_seconds") is not None else "not run")
        if action.get("failures"):
            state += f", failed {action['failures']}x: {action.get('last_error')}"
        parts.append(f"{action['action']} {state}")
    seen = f"state {human_age(governor.get('written_age_seconds', 0))} old"
    return [*lines, _line("governor", "; ".join(parts) + f" ({seen})" if parts else f"nothing recorded ({seen})")]
