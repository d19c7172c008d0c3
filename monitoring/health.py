"""The health verdict: a pure function of the collected facts and the configured thresholds.

Every rule that fires adds one finding (check name, severity, a sentence with the measured
value and the threshold it crossed); the verdict is the worst severity, `ok` when nothing
fired. The thresholds live in the config's `monitoring:` section (docs/monitoring.md
lists every rule). No I/O here, so the rules are tested on facts read from real tables.
"""

from __future__ import annotations

import dataclasses

from streamberg.common.config import StreambergConfig
from streamberg.monitoring.model import SEVERITY, Health, Status, Verdict
from streamberg.table_meta.changelog import has_changelog


def _grade(value: float, warn: float | None, critical: float | None) -> Verdict | None:
    if critical is not None and value >= critical:
        return "critical"
    if warn is not None and value >= warn:
        return "warn"
    return None


def _threshold(severity: Verdict, warn: float | None, critical: float | None) -> str:
    return f"{'critical' if severity == 'critical' else 'warn'} at {critical if severity == 'critical' else warn:g}"


class _Findings:
    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []

    def add(self, check: str, severity: Verdict | None, reason: str) -> None:
        if severity is not None and severity != "ok":
            self.items.append({"check": check, "severity": severity, "reason": reason})


def _reachability(status: Status, config: StreambergConfig, out: _Findings) -> None:
    if not status.catalog.reachable:
        out.add("catalog", "critical", f"catalog unreachable: {status.catalog.error}")
    elif status.table_exists is False:
        made_by = ("the merge stage creates it on its first start (is `streamberg merge` running?)"
                   if has_changelog(config) else "no ingest has created it yet")
        out.add("table", "critical", f"table {status.table} does not exist in catalog {config.catalog.name} "
                                     f"({made_by}, or the config points at the wrong catalog)")
    for error in status.errors:
        out.add("table", "critical", error)
    ingest = status.ingest
    if not ingest.broker.reachable:
        out.add("broker", "critical", f"broker unreachable: {ingest.broker.error}")
    elif ingest.topic_exists is False:
        recorded = ingest.last_commit is not None
        out.add("topic", "critical" if recorded else "warn",
                f"topic {ingest.topic} does not exist on broker {config.kafka.bootstrap_servers}"
                + (" although the table recorded offsets for it (topic deleted or broker data lost)" if recorded
                   else " (nothing has been produced yet?)"))


def _ingest(status: Status, config: StreambergConfig, out: _Findings) -> None:
    thresholds, ingest = config.monitoring, status.ingest
    if ingest.offset_skips:
        parts = sorted({str(s.partition) for s in ingest.offset_skips})
        out.add("lost_offsets", "warn", f"Kafka lost positions before the ingest read them: {ingest.lost_offsets:,} "
                f"offsets skipped, {len(ingest.offset_skips)} jump(s) on partition(s) {', '.join(parts)} "
                f"(ingest.on_lost_offsets: skip-and-record; docs/runbooks/lost-offsets.md)")
    off = [u for u in ingest.unknown_fields if not u.ignored]
    if off:  # fields ignored on purpose (the table's streamberg.ingest.ignored-fields) are no finding
        records = sum(u.records for u in off)
        out.add("unknown_fields", "warn", f"records carry {len(off)} field(s) the table lacks, not "
                f"written (ingest.schema_evolution: off): {records:,} records, e.g. "
                f"{', '.join(u.path for u in off[:3])}; add them (streamberg table --evolve, or "
                f"schema_evolution: add) and replay the ranges (docs/runbooks/poison-or-schema-change.md)")
    lag = ingest.lag
    if lag is None:
        return
    if lag.behind_low_partitions:
        out.add("lost_offsets", "critical", f"the table's recorded offsets are below the broker's low watermark on "
                f"partition(s) {', '.join(lag.behind_low_partitions)}: retention deleted records before they were "
                f"ingested (docs/runbooks/lost-offsets.md)")
    severity = _grade(lag.total, thresholds.lag_warn_records, thresholds.lag_critical_records)
    if severity:
        out.add("lag", severity, f"ingest lag is {lag.total:,} records behind the broker "
                f"({_threshold(severity, thresholds.lag_warn_records, thresholds.lag_critical_records)})")
    if lag.ahead_partitions:
        out.add("lag", "warn", f"the table's recorded offsets are past the broker's end on partition(s) "
                f"{', '.join(lag.ahead_partitions)}: the topic was recreated, the broker lost data, "
                f"or (embedded tansu) its watermark lags by a batch")
    if lag.total == 0:
        return  # nothing waits: an old last commit only means there was nothing to commit
    last, interval = ingest.last_commit, config.ingest.commit_interval_seconds
    if config.ingest.commit_min_bytes:  # small intervals wait for more, up to this long
        interval = max(interval, config.ingest.commit_max_wait_seconds)
    if last is None:
        out.add("commit_age", "warn", f"{lag.total:,} records wait in Kafka but the table has no ingest commit "
                                      f"for topic {ingest.topic} yet (is `streamberg ingest` running?)")
        return
    intervals = last.age_seconds / interval
    severity = _grade(intervals, thresholds.commit_age_warn_intervals, thresholds.commit_age_critical_intervals)
    if severity:
        out.add("commit_age", severity,
                f"last ingest commit was {last.age_seconds:.0f} s ago ({intervals:.1f} commit intervals of "
                f"{interval:g} s; {_threshold(severity, thresholds.commit_age_warn_intervals, thresholds.commit_age_critical_intervals)}) "
                f"while {lag.total:,} records wait in Kafka: ingest is stalled or not running")


def _table(status: Status, config: StreambergConfig, out: _Findings) -> None:
    thresholds = config.monitoring
    compactor, max_delay = status.compactor, config.compactor.max_delay_seconds
    if compactor is not None and compactor.oldest_pending_age_seconds is not None and max_delay is not None:
        factor = compactor.oldest_pending_age_seconds / max_delay
        severity = _grade(factor, thresholds.pending_age_warn_factor, thresholds.pending_age_critical_factor)
        if severity:
            out.add("compactor", severity,
                    f"the oldest of {compactor.pending_files:,} files waiting for the compactor was committed "
                    f"{compactor.oldest_pending_age_seconds:.0f} s ago ({factor:.1f} x compactor.max_delay_seconds "
                    f"{max_delay:g}; {_threshold(severity, thresholds.pending_age_warn_factor, thresholds.pending_age_critical_factor)}): "
                    f"the compactor is behind or not running")
    files = status.files
    if (files is not None and thresholds.small_file_ratio_warn is not None
            and files.data_files >= thresholds.small_file_min_files
            and files.small_file_ratio >= thresholds.small_file_ratio_warn):
        out.add("small_files", "warn",
                f"{files.small_files:,} of {files.data_files:,} data files ({files.small_file_ratio:.0%}) are smaller "
                f"than {files.small_file_threshold_bytes:,} bytes (warn at {thresholds.small_file_ratio_warn:.0%})")
    snapshots = status.snapshots
    if snapshots is not None:
        severity = _grade(snapshots.count, thresholds.snapshots_warn, thresholds.snapshots_critical)
        if severity:
            out.add("snapshots", severity,
                    f"the table keeps {snapshots.count:,} snapshots "
                    f"({_threshold(severity, thresholds.snapshots_warn, thresholds.snapshots_critical)}): "
                    f"run `streamberg maintain` to expire old ones")
    if snapshots is not None:
        severity = _grade(snapshots.metadata_file_bytes, thresholds.metadata_file_warn_bytes,
                          thresholds.metadata_file_critical_bytes)
        if severity:
            out.add("metadata", severity,
                    f"the metadata file is {snapshots.metadata_file_bytes:,} bytes, read and written by every commit "
                    f"({_threshold(severity, thresholds.metadata_file_warn_bytes, thresholds.metadata_file_critical_bytes)}): "
                    "expire snapshots (maintenance.expire.max_snapshots) or shorten what they carry")
        interval = config.ingest.commit_interval_seconds
        if snapshots.commit_seconds_p95 is not None and interval > 0:
            share = snapshots.commit_seconds_p95 / interval
            severity = _grade(share, thresholds.commit_seconds_warn_intervals,
                              thresholds.commit_seconds_critical_intervals)
            if severity:
                trend = (f", {snapshots.commit_seconds_trend:g} x the oldest quarter's"
                         if snapshots.commit_seconds_trend is not None else "")
                out.add("commit_time", severity,
                        f"ingest commits take {snapshots.commit_seconds_p95:g} s at p95 over the last "
                        f"{snapshots.commit_samples} ({share:.2f} x ingest.commit_interval_seconds{trend}; "
                        f"{_threshold(severity, thresholds.commit_seconds_warn_intervals, thresholds.commit_seconds_critical_intervals)}): "
                        "the catalog or the metadata is slow (docs/runbooks/commit-failures.md)")
    dead = status.dead_letters
    if dead is not None and thresholds.dead_letters_warn is not None and dead.records >= thresholds.dead_letters_warn:
        out.add("dead_letters", "warn", f"{dead.records:,} records in {dead.table} "
                                        f"(warn at {thresholds.dead_letters_warn:,})")
    maintenance = status.maintenance
    if maintenance.get("error") and status.catalog.reachable:
        out.add("maintenance", "warn", f"the last maintenance run could not be read: {maintenance['error']}")
    last_run = maintenance.get("last_run")
    if isinstance(last_run, dict) and last_run.get("status") not in (None, "ok"):
        out.add("maintenance", "warn", f"the last maintenance run ({last_run.get('run_id')}, finished "
                                       f"{last_run.get('finished_at')}) ended {last_run.get('status')}")


def _merge(status: Status, config: StreambergConfig, out: _Findings) -> None:
    merge, thresholds = status.merge, config.monitoring
    if merge is None:
        return
    if not merge.changelog_exists:
        out.add("merge", "warn", f"the change log {merge.changelog} does not exist yet (is `streamberg ingest` running?)")
        return
    if (regression := merge.source_regression) is not None:
        out.add("merge", "critical", regression.get("problem") or
                f"{regression['changes']:,} change(s) went backwards in their source's positions (from offsets "
                f"{regression['since']}) with no source epoch to explain them: not applied, so the table misses them. "
                "If the source started over (RESET MASTER, a restore), declare it: `streamberg merge "
                "--new-source-epoch WHY` (docs/runbooks/cdc-source-regressed.md)")
    if merge.oldest_pending_age_seconds is None:
        return
    interval = max(config.merge.interval_seconds, config.ingest.commit_interval_seconds, 1.0)
    intervals = merge.oldest_pending_age_seconds / interval
    severity = _grade(intervals, thresholds.merge_lag_warn_intervals, thresholds.merge_lag_critical_intervals)
    if severity:
        out.add("merge", severity,
                f"{merge.pending_records:,} changes in {merge.pending_snapshots} change-log snapshot(s) wait for the "
                f"merge, the oldest committed {merge.oldest_pending_age_seconds:.0f} s ago ({intervals:.1f} merge "
                f"intervals of {interval:g} s; {_threshold(severity, thresholds.merge_lag_warn_intervals, thresholds.merge_lag_critical_intervals)}): "
                f"the merge stage is behind or not running (docs/runbooks/upsert-table-behind.md)")


def judge(status: Status, config: StreambergConfig) -> Health:
    """The verdict and its reasons, worst first."""
    out = _Findings()
    _reachability(status, config, out)
    _ingest(status, config, out)
    _table(status, config, out)
    _merge(status, config, out)
    _governed(status, out)
    findings = sorted(out.items, key=lambda f: -SEVERITY[f["severity"]])
    verdict: Verdict = max((f["severity"] for f in findings), key=SEVERITY.__getitem__, default="ok")  # type: ignore[assignment]
    return Health(verdict=verdict, reasons=[f["reason"] for f in findings], findings=findings)


def _governed(status: Status, out: _Findings) -> None:
    for problem in status.policy_problems:
        out.add("policy", "warn", f"table policy: {problem} (ignored)")
    for action in (status.governor or {}).get("actions", []):
        if action.get("failures"):
            out.add("governor", "warn", f"governor: {action['action']} failed {action['failures']} time(s) in a row: "
                                        f"{action.get('last_error')}")


def with_health(status: Status, config: StreambergConfig) -> Status:
    return dataclasses.replace(status, health=judge(status, config))
