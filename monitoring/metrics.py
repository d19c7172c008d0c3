"""Prometheus metrics computed from the same facts as `streamberg status`.

The exporter collects every table's status in the background and renders these families once
a refresh (monitoring/watch.py): a scrape serves that, never calling the catalog itself. The
facts are the table's own, so nothing can drift from the table: totals (records consumed, dead letters)
are the running totals Iceberg and the ingest committer record in snapshot summaries, and
they survive restarts of every process involved. Every metric carries `table`; the table
of metrics, their sources and meaning is in docs/monitoring.md.

A fact that is unknown (catalog or broker down) is left out of the scrape rather than
reported as 0; `streamberg_up` and `streamberg_health` say why.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from streamberg.common.config import StreambergConfig
from streamberg.monitoring.collect import collect_status
from streamberg.monitoring.fleet import FleetStatus
from streamberg.monitoring.health import with_health
from streamberg.monitoring.model import SEVERITY, Status
from streamberg.table_meta.table_files import ManifestCache


def _gauge(name: str, doc: str, table: str, value: float | None, unit: str = "") -> Iterator[Metric]:
    if value is not None:
        family = GaugeMetricFamily(name, doc, labels=["table"], unit=unit)
        family.add_metric([table], float(value))
        yield family


def _counter(name: str, doc: str, table: str, value: float | None) -> Iterator[Metric]:
    if value is not None:
        family = CounterMetricFamily(name, doc, labels=["table"])
        family.add_metric([table], float(value))
        yield family


def status_metrics(status: Status, collect_seconds: float) -> Iterator[Metric]:
    """The metric families for one collected (and judged) status."""
    t = status.table
    up = GaugeMetricFamily("streamberg_up", "1 when the source answered the last status check, else 0",
                           labels=["table", "source"])
    up.add_metric([t, "catalog"], float(status.catalog.reachable))
    up.add_metric([t, "broker"], float(status.ingest.broker.reachable))
    yield up
    if status.health is not None:
        yield from _gauge("streamberg_health", "health verdict: 0 ok, 1 warn, 2 critical (streamberg status)",
                          t, SEVERITY[status.health.verdict])
    yield from _gauge("streamberg_status_collect_seconds", "time to collect the facts of this scrape", t,
                      collect_seconds)
    yield from _last_commit_metrics(status)
    yield from _lost_offset_metrics(status)
    yield from _schema_metrics(status)
    yield from _lag_metrics(status)
    yield from _table_file_metrics(status)
    yield from _compactor_metrics(status)
    yield from _clustering_metrics(status)
    yield from _snapshot_metrics(status)
    yield from _merge_metrics(status)
    yield from _governor_metrics(status)
    yield from _query_metrics(status)
    yield from _tail_metrics(status)


def _tail_metrics(status: Status) -> Iterator[Metric]:
    """The tail `streamberg tail` keeps for fresh reads."""
    kept = status.tail_cache
    if kept is None:
        return
    t = status.table
    yield from _gauge("streamberg_tail_keeper_alive", "1 while this table's tail is kept (streamberg tail, or the ingest under ingest.keep_tail)", t,
                      1 if kept["alive"] else 0)
    yield from _gauge("streamberg_tail_kept_records", "records past the committed offsets kept decoded", t,
                      kept["kept_records"])
    if kept.get("past_kept_records") is not None:
        yield from _gauge("streamberg_tail_past_kept_records", "records past the kept tail: a fresh read reads "
                          "them from Kafka", t, kept["past_kept_records"])
    if kept.get("behind_seconds") is not None:
        yield from _gauge("streamberg_tail_behind_seconds", "how long the kept tail has not held Kafka's last "
                          "records (0 while it holds them all)", t, kept["behind_seconds"])


def _query_metrics(status: Status) -> Iterator[Metric]:
    """What reported scans of the table read (catalog.scan_reports_dir)."""
    queries = status.queries
    if queries is None:
        return
    t = status.table
    yield from _gauge("streamberg_table_scans_reported", "scans of the table reported (since collection began)", t,
                      queries.get("scans_total", 0))
    if queries.get("files_skipped_share") is not None:
        yield from _gauge("streamberg_table_scan_files_skipped_ratio",
                          "share of data files reported scans skipped (decayed, 7-day half-life)", t,
                          queries["files_skipped_share"])
    if queries.get("unused_columns") is not None:
        yield from _gauge("streamberg_table_unused_columns", "columns no reported scan read within "
                          "streamberg.columns.unused_after_days", t, len(queries["unused_columns"]))


def _governor_metrics(status: Status) -> Iterator[Metric]:
    """The table's policy problems and what `streamberg govern` recorded, per action."""
    t = status.table
    yield from _gauge("streamberg_table_policy_problems", "streamberg.* table properties ignored as invalid", t,
                      len(status.policy_problems))
    actions = (status.governor or {}).get("actions", [])
    labels = ["table", "action"]
    families = {
        "streamberg_governor_waiting_seconds": ("how long this due action has waited for the governor", "waiting_seconds"),
        "streamberg_governor_last_run_age_seconds": ("seconds since the governor last ran this action",
                                                     "last_run_age_seconds"),
        "streamberg_governor_failures": ("failures in a row of this action (it backs off)", "failures"),
    }
    for name, (doc, key) in families.items():
        family = GaugeMetricFamily(name, doc, labels=labels)
        for action in actions:
            if action.get(key) is not None:
                family.add_metric([t, str(action["action"])], float(action[key]))
        yield family


def _merge_metrics(status: Status) -> Iterator[Metric]:
    """A primary-key table: the merge lag and the deletes waiting for compaction."""
    t, merge = status.table, status.merge
    if merge is None or not merge.changelog_exists:
        return
    yield from _gauge("streamberg_merge_pending_records", "change-log records the merge has not applied yet", t,
                      merge.pending_records)
    yield from _gauge("streamberg_merge_pending_snapshots", "change-log snapshots the merge has not applied yet", t,
                      merge.pending_snapshots)
    yield from _gauge("streamberg_merge_oldest_pending_age_seconds",
                      "seconds since the oldest change-log snapshot not yet merged was committed (0: none)", t,
                      merge.oldest_pending_age_seconds or 0.0)
    yield from _gauge("streamberg_merge_last_age_seconds", "seconds since the last merge", t,
                      merge.last_merge_age_seconds)
    yield from _gauge("streamberg_table_delete_files", "live delete files of the table", t, merge.delete_files)
    yield from _gauge("streamberg_table_deleted_row_ratio", "rows deleted by live delete files, over the data files' rows",
                      t, merge.deleted_row_ratio)


def _last_commit_metrics(status: Status) -> Iterator[Metric]:
    """The ingest's last commit."""
    t = status.table
    last = status.ingest.last_commit
    if last is not None:
        yield from _counter("streamberg_ingest_records_consumed",
                            "Kafka records read by all ingest commits (valid + dead-lettered): records in",
                            t, last.consumed_total)
        yield from _gauge("streamberg_ingest_last_commit_age_seconds", "seconds since the last ingest commit",
                          t, last.age_seconds)
        yield from _gauge("streamberg_ingest_last_commit_latency_seconds",
                          "duration of the last ingest commit (dead letters, fence check, retries, append)",
                          t, last.commit_latency_seconds)
        yield from _gauge("streamberg_ingest_last_commit_records", "records added by the last ingest commit",
                          t, last.records)
        yield from _gauge("streamberg_ingest_last_commit_files", "data files added by the last ingest commit",
                          t, last.files)
        yield from _gauge("streamberg_ingest_last_commit_dead_letters",
                          "records dead-lettered by the last ingest commit", t, last.dead_letters)


def _lost_offset_metrics(status: Status) -> Iterator[Metric]:
    """Positions Kafka lost, recorded in the table."""
    t = status.table
    if status.table_exists:
        yield from _counter("streamberg_ingest_lost_offsets",
                            "Kafka offsets the ingest skipped because the broker no longer had them "
                            "(ingest.on_lost_offsets: skip-and-record)", t, status.ingest.lost_offsets)
        skips = GaugeMetricFamily("streamberg_ingest_offset_skips",
                                  "position jumps Kafka forced, recorded in the table, per partition and kind",
                                  labels=["table", "topic", "partition", "kind"])
        counted: dict[tuple[str, str], int] = {}
        for skip in status.ingest.offset_skips:
            key = (str(skip.partition), skip.kind)
            counted[key] = counted.get(key, 0) + 1
        for (partition, kind), n in sorted(counted.items()):
            skips.add_metric([t, status.ingest.topic, partition, kind], float(n))
        yield skips


def _schema_metrics(status: Status) -> Iterator[Metric]:
    """Fields the records carry and the table lacks: not written (off) and added (add)."""
    t = status.table
    if not status.table_exists:
        return
    yield from _counter("streamberg_ingest_fields_added",
                        "fields the ingest added to the table's schema from the records (ingest.schema_evolution: add)",
                        t, status.ingest.fields_added)
    unknown = GaugeMetricFamily("streamberg_ingest_unknown_field_records",
                                "records that carried a field the table lacks, not written (ingest.schema_evolution: "
                                "off, or reason=ignored: the table's streamberg.ingest.ignored-fields), per field "
                                "path; cumulative", labels=["table", "path", "reason"])
    for field in status.ingest.unknown_fields:
        unknown.add_metric([t, field.path, "ignored" if field.ignored else "schema_evolution_off"], float(field.records))
    yield unknown


def _lag_metrics(status: Status) -> Iterator[Metric]:
    """Lag and offsets per partition."""
    t = status.table
    lag = status.ingest.lag
    if lag is not None:
        labels = ["table", "topic", "partition"]
        per_partition = {
            "streamberg_ingest_lag_records": ("records in the partition not yet in the table", "lag"),
            "streamberg_ingest_committed_offset": ("next offset recorded in the table", "committed"),
            "streamberg_kafka_end_offset": ("one past the partition's last record (the high watermark unless "
                                            "monitoring.read_last_batch found more)", "end"),
            "streamberg_kafka_high_watermark": ("the broker's high watermark as reported", "watermark"),
        }
        for name, (doc, attr) in per_partition.items():
            family = GaugeMetricFamily(name, doc, labels=labels)
            for p, part in lag.partitions.items():
                value = getattr(part, attr)
                if value is not None:
                    family.add_metric([t, status.ingest.topic, p], float(value))
            yield family
        if lag.seconds is not None:
            yield from _gauge("streamberg_ingest_lag_seconds", "how long the oldest record not yet in the table has "
                              "waited (its Kafka timestamp to the check; 0 with no lag)", t, lag.seconds)


def _table_file_metrics(status: Status) -> Iterator[Metric]:
    """The table's live data files."""
    t = status.table
    files = status.files
    if files is not None:
        yield from _gauge("streamberg_table_records", "records in the table's live data files: records out", t,
                          files.records)
        yield from _gauge("streamberg_table_data_files", "live data files", t, files.data_files)
        yield from _gauge("streamberg_table_bytes", "size of the live data files", t, files.bytes)
        yield from _gauge("streamberg_table_small_files", "live data files below the small-file threshold", t,
                          files.small_files)


def _compactor_metrics(status: Status) -> Iterator[Metric]:
    """The compactor's backlog and last optimize."""
    t = status.table
    compactor = status.compactor
    if compactor is not None:
        yield from _gauge("streamberg_compactor_pending_files", "files added by ingest and not yet optimized", t,
                          compactor.pending_files)
        yield from _gauge("streamberg_compactor_pending_bytes", "size of the pending files", t,
                          compactor.pending_bytes)
        yield from _gauge("streamberg_compactor_oldest_pending_age_seconds",
                          "age of the oldest pending file's commit", t, compactor.oldest_pending_age_seconds)
        opt = compactor.last_optimize
        if opt is not None:
            yield from _gauge("streamberg_compactor_last_optimize_duration_seconds",
                              "rewrite time of the last optimize commit", t, opt.duration_seconds)
            yield from _gauge("streamberg_compactor_last_optimize_age_seconds", "seconds since the last optimize",
                              t, opt.age_seconds)
            yield from _gauge("streamberg_compactor_last_optimize_files_in", "files replaced by the last optimize",
                              t, opt.files_in)
            yield from _gauge("streamberg_compactor_last_optimize_files_out", "files written by the last optimize",
                              t, opt.files_out)


def _clustering_metrics(status: Status) -> Iterator[Metric]:
    """Clustering health, runs and sealed partitions."""
    t = status.table
    clustering = status.clustering
    if clustering is not None:
        for name, key, doc in (
                ("streamberg_clustering_files_per_point", "files_per_point",
                 "mean data files a point query on the column plans to read, from manifest bounds"),
                ("streamberg_clustering_overlap_depth", "overlap_depth",
                 "most data files whose ranges on the column share one value")):
            family = GaugeMetricFamily(name, doc, labels=["table", "column"])
            for column, facts in clustering.columns.items():
                family.add_metric([t, column], facts[key])
            yield family
        yield from _gauge("streamberg_compactor_runs", "runs the compactor wrote that are still live", t, clustering.runs)
        yield from _gauge("streamberg_compactor_sealed_partitions", "partitions finished into a sealed run", t,
                          clustering.sealed_partitions)


def _snapshot_metrics(status: Status) -> Iterator[Metric]:
    """Snapshots, dead letters and the last maintenance run."""
    t = status.table
    snapshots = status.snapshots
    if snapshots is not None:
        yield from _gauge("streamberg_table_snapshots", "snapshots kept in the table metadata", t, snapshots.count)
        yield from _gauge("streamberg_table_metadata_bytes",
                          "metadata file + current manifest list + its manifests", t, snapshots.metadata_bytes)
        yield from _gauge("streamberg_table_metadata_file_bytes", "the metadata JSON every commit reads and writes",
                          t, snapshots.metadata_file_bytes)
        if snapshots.commit_seconds_p95 is not None:
            yield from _gauge("streamberg_ingest_commit_seconds_p95",
                              "p95 of the ingest's commit times over the snapshots kept", t, snapshots.commit_seconds_p95)

    dead = status.dead_letters
    if dead is not None:
        yield from _counter("streamberg_dead_letters", "records in the dead-letter table", t, dead.records)

    last_run = status.maintenance.get("last_run")
    if isinstance(last_run, dict):
        yield from _gauge("streamberg_maintenance_last_run_age_seconds", "seconds since the last maintenance run "
                          "finished", t, last_run.get("age_seconds"))
        yield from _gauge("streamberg_maintenance_last_run_bytes_freed", "bytes the last maintenance run freed", t,
                          last_run.get("bytes_freed"))


def table_families(fleet: FleetStatus, seconds: float) -> Iterator[Metric]:
    """A config of one table: its status's families."""
    for _topic, status in fleet.tables:
        yield from status_metrics(status, seconds)


def fleet_families(fleet: FleetStatus, seconds: float) -> Iterator[Metric]:
    """A config of many tables: every table's metrics, each family once with a sample per
    table (`table` label), plus which tables the ingest paused and which topics it refused
    (monitoring/fleet.py)."""
    merged: dict[str, Metric] = {}
    for _topic, status in fleet.tables:
        for family in status_metrics(status, seconds):
            if family.name in merged:
                merged[family.name].samples.extend(family.samples)
            else:
                merged[family.name] = family
    paused = GaugeMetricFamily("streamberg_table_paused", "1 when the ingest paused the table after repeated "
                               "commit failures (it resumes at the next start)", labels=["table"])
    for _topic, status in fleet.tables:
        paused.add_metric([status.table], float(status.table in fleet.paused))
    tables = GaugeMetricFamily("streamberg_fleet_tables", "tables of the config the status found")
    tables.add_metric([], float(len(fleet.tables)))
    refused = GaugeMetricFamily("streamberg_fleet_refused_topics", "topics a route takes that no table can "
                                "(their names collide with another topic's table)")
    refused.add_metric([], float(len(fleet.refused)))
    yield from [*merged.values(), paused, tables, refused]


def table_status(config: StreambergConfig, cache: ManifestCache) -> FleetStatus:
    """A config of one table collected as a fleet of one (what the exporter's model keeps)."""
    return FleetStatus(tables=[(config.kafka.topic, with_health(collect_status(config, cache=cache), config))])


def exposition(config: StreambergConfig) -> str:
    """One scrape's output in the Prometheus text format, collected now (`metrics --once`)."""

    class Once(Collector):
        def collect(self) -> Iterator[Metric]:
            started = time.monotonic()
            fleet = table_status(config, ManifestCache())
            yield from table_families(fleet, round(time.monotonic() - started, 3))

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Once())
    return generate_latest(registry).decode()
