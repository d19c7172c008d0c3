"""The sections of the compactor, monitoring, maintenance and the `run` loop."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from streamberg.common.config.bounds import (
    DAY_SECONDS,
    MAX_BYTES,
    MAX_COUNT,
    MAX_INT64,
    YEAR_SECONDS,
    Bool,
    FieldPath,
    OptionalFieldPath,
    Properties,
    TableIdentifier,
    Text,
    _float,
    _int,
    _Section,
)

# The compactor's row layouts (compactor/layouts.py has one class per name).
LayoutStrategy = Literal["zorder", "hilbert", "zorder-iceberg", "sort", "binpack"]
LAYOUT_STRATEGIES: tuple[str, ...] = get_args(LayoutStrategy)


class CompactorConfig(_Section):
    """Settings of the incremental optimize loop (compactor/). Owned by the compactor.

    Planning rules decide, per table partition, whether its pending files (files added by
    ingest appends and not yet optimized) are rewritten now. A partition is rewritten when ANY
    enabled rule fires; a rule set to null is off. See docs/compactor.md.
    """

    # The layout a pass writes: zorder, hilbert, sort or binpack (docs/compactor.md).
    strategy: LayoutStrategy = "zorder"
    # Columns the layout clusters on (nested fields by dotted path); empty: the compactor only bin-packs.
    columns: list[FieldPath] = Field(default_factory=list, max_length=32)
    # Spark's checkpoint of the streaming query (progress across restarts).
    checkpoint_dir: Text = ".streamberg/compactor-checkpoint"
    # The compactor's (and maintenance's) Spark: its master and extra Spark settings.
    spark_master: Text = "local[*]"
    spark_conf: Properties = Field(default_factory=dict)

    # -- planning rules (per partition unless said otherwise) --
    # At least this many pending files in a partition.
    min_files: Annotated[int | None, _int(1, MAX_COUNT, optional=True)] = 10
    # At least this many pending bytes in a partition (null: off; the target size is typical).
    min_bytes: Annotated[int | None, _int(1, MAX_BYTES, optional=True)] = None
    # The oldest pending file of a partition was committed at least this long ago.
    max_delay_seconds: Annotated[float | None, _float(0, YEAR_SECONDS, optional=True)] = 600.0
    # Table-wide: at least this many ingest snapshots have pending files (Tencent's "every 5").
    every_n_snapshots: Annotated[int | None, _int(1, MAX_COUNT, optional=True)] = 5

    # -- runs (docs/compactor.md, "Runs"): how the incremental layout converges --
    # A pass lays out a partition's new files as one run; when this many runs of a partition
    # share a size tier (tier k: about target size x factor^k), they are merged into one,
    # together with the new files. The main knob: higher rewrites less, reads more files;
    # 2 meets the read goals of an unpartitioned stream (docs/compactor.md, the curve).
    merge_factor: Annotated[int, _int(2, 64)] = 2
    # A partition that got no new data for this many ingest commits, or this long, is
    # finished: its runs and new files are merged into one sealed run, never rewritten again
    # (null: that rule is off; both null: partitions are never sealed).
    seal_after_commits: Annotated[int | None, _int(1, MAX_COUNT, optional=True)] = 10
    seal_after_seconds: Annotated[float | None, _float(0, YEAR_SECONDS, optional=True)] = 3600.0
    # When the clustering columns change (streamberg.cluster.columns, by hand or `auto`), runs
    # laid out by the old ones are rewritten by the new, at most this many bytes a pass, the
    # partitions whose stale runs are oldest first (null: older files keep their layout).
    relayout_max_bytes: Annotated[int | None, _int(1, MAX_BYTES, optional=True)] = 1024**3

    # -- deletes (primary-key tables, docs/cdc.md) --
    # A partition whose live delete files reach this count, or whose deleted rows reach this
    # share of its rows, is rewritten whole with the deletes folded into the new files, even
    # without new data (as Amoro's major optimizing at a 0.1 duplicate ratio); null: that rule
    # is off. Delete files left dangling by any rewrite are removed after it.
    delete_files_threshold: Annotated[int | None, _int(1, MAX_COUNT, optional=True)] = 8
    deleted_ratio_threshold: Annotated[float | None, _float(0, 1, optional=True)] = 0.1

    # -- rewriting --
    # Size of the files the rewrite writes; null: the table's write.target-file-size-bytes.
    target_file_size_bytes: Annotated[int | None, _int(1, MAX_BYTES, optional=True)] = None
    # A partition's pending files are split into groups of at most this many bytes; each
    # group is read, laid out and written by one Spark job.
    max_group_bytes: Annotated[int, _int(1, MAX_BYTES)] = 2 * 1024**3
    # Large plans commit in several steps so a crash loses at most one step's work; a plan
    # is committed in at most this many commits (1: one all-or-nothing commit).
    max_commits: Annotated[int, _int(1, 10_000)] = 10
    # Retries of a commit that still fails after Iceberg's own retries (CommitFailedException).
    commit_retries: Annotated[int, _int(0, 1000)] = 3
    # Rows sampled per group to find each column's rank boundaries (zorder, hilbert).
    sample_rows: Annotated[int, _int(100, MAX_COUNT)] = 20000
    # Bits of rank per column for zorder/hilbert: up to 2^bits distinct ranks per column.
    index_bits: Annotated[int, _int(1, 20)] = 10

    # -- running --
    # How often the streaming query looks for new snapshots (continuous mode).
    trigger_interval_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 30.0
    # One compactor per table: a lease row in the catalog database, renewed while running.
    lease_ttl_seconds: Annotated[float, _float(5, DAY_SECONDS, lo_open=False)] = 60.0
    # When another compactor holds the lease: 0 exits at once, >0 waits up to that long.
    lease_wait_seconds: Annotated[float, _float(0, DAY_SECONDS, lo_open=False)] = 0.0
    # Continuous mode started before the ingest's first commit: wait this long for the table
    # to appear (0 fails at once). --once/--full/--dry-run never wait.
    wait_for_table_seconds: Annotated[float, _float(0, DAY_SECONDS, lo_open=False)] = 300.0

    @field_validator("columns")
    @classmethod
    def _distinct_columns(cls, value: list[str]) -> list[str]:
        if dupes := sorted({c for c in value if value.count(c) > 1}):
            raise ValueError(f"columns listed twice: {dupes}")
        if any(not c.strip() for c in value):
            raise ValueError("column names must not be empty")
        return value

    @model_validator(mode="after")
    def _some_rule(self) -> CompactorConfig:
        rules = (self.min_files, self.min_bytes, self.max_delay_seconds, self.every_n_snapshots)
        if all(rule is None for rule in rules):
            raise ValueError("min_files, min_bytes, max_delay_seconds and every_n_snapshots are all null: "
                             "the incremental compactor would never act (use --full for one-off rewrites)")
        return self


class MonitoringConfig(_Section):
    """Thresholds of the health verdict of `streamberg status` and the metrics exporter
    (monitoring/). A threshold set to null turns its check off. See docs/monitoring.md."""

    # Seconds to wait for the broker (metadata, end offsets) before calling it unreachable.
    broker_timeout_seconds: Annotated[float, _float(0, 3600)] = 3.0
    # Find each partition's end by also reading its last record batch: the embedded tansu
    # broker's high watermark stops short of the end by the rest of that batch.
    read_last_batch: Bool = True
    # Ingest lag (records between the table's recorded offsets and the broker's end, all
    # partitions together) from which the verdict is warn / critical.
    lag_warn_records: Annotated[int | None, _int(1, MAX_INT64, optional=True)] = 10_000
    lag_critical_records: Annotated[int | None, _int(1, MAX_INT64, optional=True)] = 1_000_000
    # While records wait in Kafka, a last ingest commit older than this many
    # ingest.commit_interval_seconds means ingest is stalled (no records waiting: idle, fine).
    commit_age_warn_intervals: Annotated[float | None, _float(0, 1e6, optional=True)] = 3.0
    commit_age_critical_intervals: Annotated[float | None, _float(0, 1e6, optional=True)] = 30.0
    # The oldest file waiting for the compactor older than this many
    # compactor.max_delay_seconds means the compactor is behind (off when max_delay is null).
    pending_age_warn_factor: Annotated[float | None, _float(0, 1e6, optional=True)] = 2.0
    pending_age_critical_factor: Annotated[float | None, _float(0, 1e6, optional=True)] = 6.0
    # A data file is "small" below this fraction of the target file size (Iceberg's own
    # rewrite uses 0.75 for its min-file-size-bytes).
    small_file_fraction: Annotated[float, _float(0, 1)] = 0.75
    # Share of small data files from which the verdict is warn, checked only once the table
    # has at least small_file_min_files data files (a young table is all small files).
    small_file_ratio_warn: Annotated[float | None, _float(0, 1, optional=True)] = 0.8
    small_file_min_files: Annotated[int, _int(1, MAX_COUNT)] = 100
    # Snapshot count from which the verdict is warn / critical (maintenance expires them).
    snapshots_warn: Annotated[int | None, _int(1, MAX_COUNT, optional=True)] = 2000
    snapshots_critical: Annotated[int | None, _int(1, MAX_COUNT, optional=True)] = 20000
    # The metadata JSON every commit reads and writes, in bytes, from which the verdict is warn
    # / critical (it follows the snapshots kept: ~1.6 KB each for an ingest table).
    metadata_file_warn_bytes: Annotated[int | None, _int(1, MAX_BYTES, optional=True)] = 16 * 1024 * 1024
    metadata_file_critical_bytes: Annotated[int | None, _int(1, MAX_BYTES, optional=True)] = 64 * 1024 * 1024
    # The ingest's commits (p95 of the time each took, over the snapshots kept), in commit
    # intervals, from which the verdict is warn / critical: a commit that takes the interval
    # stalls every interval after it.
    commit_seconds_warn_intervals: Annotated[float | None, _float(0, 1e6, optional=True)] = 0.5
    commit_seconds_critical_intervals: Annotated[float | None, _float(0, 1e6, optional=True)] = 1.0
    # A primary-key table: the oldest change waiting for the merge stage, in merge intervals
    # (merge.interval_seconds), from which the verdict is warn / critical.
    merge_lag_warn_intervals: Annotated[float | None, _float(0, 1e6, optional=True)] = 4.0
    merge_lag_critical_intervals: Annotated[float | None, _float(0, 1e6, optional=True)] = 40.0
    # Dead letters from which the verdict is warn (null: off; bad producers are expected).
    dead_letters_warn: Annotated[int | None, _int(1, MAX_INT64, optional=True)] = None
    # Where `streamberg metrics` listens (Prometheus scrapes http://host:port/metrics).
    metrics_port: int = Field(default=9464, ge=1, le=65535)
    # Loopback unless configured: the exporter has no authentication (docs/security.md).
    metrics_address: str = "127.0.0.1"

    @model_validator(mode="after")
    def _warn_below_critical(self) -> MonitoringConfig:
        pairs = [("lag_warn_records", "lag_critical_records"),
                 ("commit_age_warn_intervals", "commit_age_critical_intervals"),
                 ("pending_age_warn_factor", "pending_age_critical_factor"),
                 ("snapshots_warn", "snapshots_critical"),
                 ("metadata_file_warn_bytes", "metadata_file_critical_bytes"),
                 ("commit_seconds_warn_intervals", "commit_seconds_critical_intervals"),
                 ("merge_lag_warn_intervals", "merge_lag_critical_intervals")]
        for warn, critical in pairs:
            low, high = getattr(self, warn), getattr(self, critical)
            if low is not None and high is not None and low > high:
                raise ValueError(f"{warn} ({low}) must not exceed {critical} ({high})")
        return self

    @field_validator("metrics_port", mode="before")
    @classmethod
    def _port_not_bool(cls, value: Any) -> Any:
        # pydantic's lax int takes `true` as port 1.
        if isinstance(value, (bool, float)):
            raise ValueError("must be an integer between 1 and 65535")
        return value


class ExpireConfig(_Section):
    """maintenance.expire: drop old snapshots (and the files only they reference)."""

    # Whether maintenance expires snapshots (of the table and the tables beside it).
    enabled: Bool = True
    # Snapshots older than this may be expired (ingest/compactor needs are always kept).
    max_snapshot_age_seconds: Annotated[float, _float(0, 10 * YEAR_SECONDS)] = 7 * 86400.0
    # The newest N snapshots of the main branch are always kept, whatever their age.
    min_snapshots_to_keep: Annotated[int, _int(1, MAX_COUNT)] = 1
    # At most this many snapshots are kept (beyond what ingest, merge, replay and the compactor
    # need), whatever their age: a commit every 5 s makes 17,280 a day, and every commit
    # reads and writes the metadata JSON that lists them all (~1.6 KB each). 500 is ~42
    # minutes of time travel at a 5 s interval. The same bound holds for the change log, the
    # dead-letter table and the key state.
    max_snapshots: Annotated[int, _int(1, MAX_COUNT)] = 500
    # Continuous maintenance looks this often, between its passes, whether a table holds a
    # quarter more snapshots than max_snapshots, and expires at once if so: expiry is paced
    # by commits, not only by maintenance.interval_seconds.
    check_seconds: Annotated[float, _float(1, DAY_SECONDS, lo_open=False)] = 30.0
    # Keep every append snapshot that added a file the compactor has not rewritten yet (the
    # compactor recognises pending files by their adding snapshot). Set false only when no
    # compactor runs on the table; otherwise expiry stops at the oldest uncompacted append.
    keep_pending_for_compactor: Bool = True


# Below this, a file still being written (ingest interval, a long compaction) could be
# taken for an orphan; going lower needs an explicit, named override.
ORPHAN_SAFETY_FLOOR_SECONDS = 3600.0


class OrphanConfig(_Section):
    """maintenance.orphan: delete files under the table location that no snapshot references."""

    # Whether maintenance removes orphan files.
    enabled: Bool = True
    # Only files older than this are candidates: in-flight writes must never be deleted.
    safety_age_seconds: Annotated[float, _float(0, 10 * YEAR_SECONDS)] = 3 * 86400.0
    # Allows safety_age_seconds below one hour (tests, or writers known to be idle).
    allow_short_safety_age: Bool = False

    @model_validator(mode="after")
    def _safe_age(self) -> OrphanConfig:
        if self.safety_age_seconds < ORPHAN_SAFETY_FLOOR_SECONDS and not self.allow_short_safety_age:
            raise ValueError(
                f"safety_age_seconds: {self.safety_age_seconds:g} is below {ORPHAN_SAFETY_FLOOR_SECONDS:g} s; files "
                "still being written by ingest or the compactor could be deleted. Set "
                "maintenance.orphan.allow_short_safety_age: true only if no write can take that long")
        return self


class ManifestsConfig(_Section):
    """maintenance.manifests: rewrite the manifests when there are too many or too much."""

    # Whether maintenance rewrites manifests.
    enabled: Bool = True
    # Rewrite when the current snapshot has at least this many manifests (null: no count rule).
    min_count: Annotated[int | None, _int(1, MAX_COUNT, optional=True)] = 100
    # ... or when its manifests total at least this many bytes (null: no size rule).
    min_total_bytes: Annotated[int | None, _int(1, MAX_BYTES, optional=True)] = 64 * 1024 * 1024

    @model_validator(mode="after")
    def _some_threshold(self) -> ManifestsConfig:
        if self.enabled and self.min_count is None and self.min_total_bytes is None:
            raise ValueError("min_count and min_total_bytes are both null, so the rewrite would never run; "
                             "set maintenance.manifests.enabled: false to turn it off")
        return self


class RetentionConfig(_Section):
    """maintenance.retention: delete rows older than `days` by a time column (off by default)."""

    # A date/timestamp/timestamptz column of table.schema, or a nested field by its dotted path
    # (checked by `streamberg maintain`).
    column: OptionalFieldPath = None
    # Rows whose column is older than now - days are deleted; null: retention off.
    days: Annotated[float | None, _float(0, 36600, optional=True)] = None

    @model_validator(mode="after")
    def _column_when_on(self) -> RetentionConfig:
        if self.days is not None and not self.column:
            raise ValueError("column: required when retention.days is set (the time column rows are aged by)")
        return self


class ChangelogTrimConfig(_Section):
    """maintenance.changelog: a primary-key table's change log (docs/cdc.md), trimmed of what
    the merge has applied."""

    # Whether maintenance trims a primary-key table's change log.
    enabled: Bool = True
    # Applied changes are kept this long after their ingest commit (to read back what was
    # merged, or replay it by hand); then their files leave the change log, and the change
    # log's snapshots older than the one the merge applied last are expired.
    keep_applied_seconds: Annotated[float, _float(0, 10 * YEAR_SECONDS, lo_open=False)] = 86400.0


class MaintenanceConfig(_Section):
    """Settings of `streamberg maintain` (maintenance/). See docs/maintenance.md."""

    # Continuous mode runs one maintenance pass every interval.
    interval_seconds: Annotated[float, _float(0, 30 * DAY_SECONDS)] = 3600.0
    # Continuous mode started before the ingest's first commit: wait this long for the table
    # to appear (0 fails at once). --once/--dry-run never wait.
    wait_for_table_seconds: Annotated[float, _float(0, DAY_SECONDS, lo_open=False)] = 300.0
    # Retries (with backoff) of a step whose commit still lost to concurrent commits after
    # Iceberg's own retries (CommitFailedException); the step is re-planned each time.
    commit_retries: Annotated[int, _int(0, 1000)] = 3
    expire: ExpireConfig = Field(default_factory=ExpireConfig)
    orphan: OrphanConfig = Field(default_factory=OrphanConfig)
    manifests: ManifestsConfig = Field(default_factory=ManifestsConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    changelog: ChangelogTrimConfig = Field(default_factory=ChangelogTrimConfig)
    # Orphan removal deletes unreferenced files under the table location: it refuses a table
    # located outside catalog.warehouse unless this is true (maintenance/confine.py).
    allow_location_outside_warehouse: Bool = False


class MergeConfig(_Section):
    """The merge stage (`streamberg merge`, merge/): applies the change log that the ingest
    appends (kafka.envelope debezium or upsert) to the primary-key table on Spark."""

    # Seconds between merges: with the ingest's commit interval, the table's freshness.
    interval_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 30.0
    # The change-log table; null: <table.identifier>_changelog.
    changelog_table: TableIdentifier | None = None
    # The merge's Spark: its master and extra Spark settings.
    spark_master: Text = "local[*]"
    spark_conf: Properties = Field(default_factory=dict)
    # Retries (with backoff) of a merge whose commit lost to a concurrent one (the compactor
    # rewrote files it deletes from, or another commit won); each retry re-reads the state.
    commit_retries: Annotated[int, _int(0, 1000)] = 5
    # The continuous merge waits this long for the ingest to create the change log.
    wait_for_table_seconds: Annotated[float, _float(0, DAY_SECONDS, lo_open=False)] = 300.0
    # The merge's key state (merge/key_state.py): per key, the sequence and Kafka position of
    # the last change applied, so an older change (a replay, a rewound topic) never overwrites
    # a newer one. null: <table.identifier>_merge_keys.
    key_state_table: TableIdentifier | None = None
    # How long a deleted key's last sequence is kept, so an older change replayed after the
    # delete does not bring the row back. Past it the key is forgotten: a change older than
    # the delete that arrives later than this is applied (docs/cdc.md#order).
    deleted_keys_keep_seconds: Annotated[float, _float(0, 366 * DAY_SECONDS, lo_open=False)] = 7 * DAY_SECONDS


Component = Literal["ingest", "compact", "maintain", "merge", "govern"]
# A table's own components, what `streamberg run` starts by default; `govern` keeps tables
# itself (one service instead of compact, maintain and merge).
COMPONENTS: tuple[Component, ...] = ("ingest", "compact", "maintain", "merge")
KEEPERS: tuple[Component, ...] = ("compact", "maintain", "merge")


class GovernConfig(_Section):
    """Settings of `streamberg govern` (governor/): one service keeps every table of a config
    by need. Per-table policy lives in the tables' properties (docs/governor.md)."""

    # Actions (a table's compaction, merge or maintenance) run at once on the one Spark
    # session, each on a different table; Spark shares the session's cores among them.
    max_concurrent: Annotated[int, _int(1, 64)] = 1
    # A due action waiting this long goes before every other (the starvation bound).
    max_wait_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 600.0
    # Pause after a round with nothing due.
    interval_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 10.0
    # A table unchanged since its last probe keeps that probe's compaction plan this long,
    # then plans again: time triggers (held-back files, idle partitions to finish) need no commit.
    replan_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 60.0
    # Also keep these namespaces' tables that carry streamberg.* properties, whoever writes them.
    namespaces: list[Text] = Field(default_factory=list, max_length=1000)
    # An action running longer is cancelled (its Spark jobs, its streaming query) and its table
    # backs off, so one long rewrite never holds every other table; null: no limit.
    action_timeout_seconds: Annotated[float | None, _float(1, 7 * DAY_SECONDS, optional=True)] = 3600.0
    # With catalog.scan_reports_dir, a probe reads a table from the catalog only after a commit
    # was reported for it (Java engines' commit reports, the ingest's own), and at least this
    # often for writers that report nothing (and for property changes, which are no commit).
    poll_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 300.0


class RunConfig(_Section):
    """Settings of `streamberg run`, the local supervisor of ingest + compactor + maintenance."""

    # Which components `streamberg run` starts (each is its own `streamberg <command>` process).
    components: list[Component] = Field(
        default_factory=lambda: list(COMPONENTS), min_length=1)
    # A component that exits unexpectedly is restarted after this delay, doubled after each
    # exit that follows a short run, up to restart_backoff_max_seconds.
    restart_backoff_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 2.0
    restart_backoff_max_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 60.0
    # A component that ran this long before exiting counts as healthy: the backoff starts over.
    healthy_after_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 60.0
    # On stop, each component gets this long to finish gracefully before SIGKILL.
    stop_timeout_seconds: Annotated[float, _float(0, DAY_SECONDS)] = 120.0
    # How often the status (line on a terminal, log line otherwise) is refreshed: one
    # catalog read and one broker read each time.
    status_interval_seconds: Annotated[float, _float(1, DAY_SECONDS, lo_open=False)] = 10.0

    @field_validator("components")
    @classmethod
    def _distinct_components(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"components listed twice: {value}")
        if "govern" in value and (both := [c for c in value if c in KEEPERS]):
            raise ValueError(f"govern keeps the tables itself: run it instead of {', '.join(both)}, not beside them "
                             "(two keepers of one table would fight over its lease)")
        return value
