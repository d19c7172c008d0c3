"""The facts `streamberg status` reports, as plain frozen dataclasses.

Collecting them (collect.py), judging them (health.py), rendering them (render.py) and
exporting them as Prometheus metrics (metrics.py) all share these shapes. `Status.to_dict`
is the `--json` document; its keys are a contract other tools rely on (docs/monitoring.md).
A section is None when it could not be read (catalog down, table missing): unknown is
reported as unknown, never as zero.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Verdict = Literal["ok", "warn", "critical"]
SEVERITY: dict[str, int] = {"ok": 0, "warn": 1, "critical": 2}


@dataclass(frozen=True)
class Reachability:
    reachable: bool
    error: str | None = None


@dataclass(frozen=True)
class LastCommit:
    """The newest ingest commit on the table's lineage (the snapshot holding the offsets)."""

    snapshot_id: int
    committed_at: str  # ISO-8601 UTC
    age_seconds: float
    records: int  # records this commit added
    files: int  # data files this commit added
    dead_letters: int  # records this commit sent to the dead-letter table
    job_id: str | None
    run_id: str | None
    consumed_total: int  # Kafka records read by all ingest commits up to this one
    # Snapshot time minus the committer's start of this commit; None for commits that did
    # not record it (streamberg.commit-started-ms).
    commit_latency_seconds: float | None


@dataclass(frozen=True)
class PartitionLag:
    committed: int | None  # next offset recorded in the table; None: never committed
    end: int  # one past the partition's last record (monitoring.read_last_batch), else the watermark
    lag: int  # records not yet in the table (0 when committed is past the end)
    watermark: int  # the broker's high watermark as reported


@dataclass(frozen=True)
class Lag:
    total: int
    partitions: dict[str, PartitionLag]
    # Partitions whose recorded offset is past the broker's end: a broker that lost data,
    # a recreated topic (or, with read_last_batch off, tansu's watermark lagging by a batch).
    ahead_partitions: list[str] = field(default_factory=list)
    # Partitions whose recorded offset is below the broker's low watermark: retention deleted
    # records the ingest has not read (it stops or skips them: ingest.on_lost_offsets).
    behind_low_partitions: list[str] = field(default_factory=list)
    # How long the oldest record not yet in the table has waited: its Kafka timestamp to the
    # check (0 with no lag; None: lagging, but no record's timestamp could be read).
    seconds: float | None = None


@dataclass(frozen=True)
class OffsetSkipFact:
    """A position jump Kafka forced, recorded by an ingest commit (skip-and-record)."""

    partition: int
    from_offset: int
    to_offset: int
    kind: str  # lost | rewound
    lost: int  # offsets passed over (0 for a rewind)
    at: str | None  # ISO-8601 UTC, when the ingest saw it


@dataclass(frozen=True)
class UnknownFieldFact:
    """A field the records carry and the table lacks, not written: because of
    ingest.schema_evolution: off, or because the table ignores it (a column the governor
    dropped as unused, named in its streamberg.ingest.ignored-fields)."""

    path: str
    records: int
    first: dict[str, int]  # partition -> first offset seen
    last: dict[str, int]  # partition -> last offset seen
    ignored: bool = False  # named (its top-level field) in streamberg.ingest.ignored-fields


@dataclass(frozen=True)
class SchemaAdditionFact:
    """An ingest commit that added fields the records carried, or widened columns for their
    values (ingest.schema_evolution: add)."""

    snapshot_id: int
    at: str  # ISO-8601 UTC
    fields: list[str]  # "path type" added, "path from -> to" widened


@dataclass(frozen=True)
class IngestFacts:
    last_commit: LastCommit | None
    broker: Reachability
    topic: str
    topic_exists: bool | None  # None: the broker could not be asked
    lag: Lag | None
    # What the table records of positions Kafka lost (never read from the broker): every jump
    # and the offsets they passed over, all ingest commits together.
    offset_skips: list[OffsetSkipFact] = field(default_factory=list)
    lost_offsets: int = 0
    # Fields the records carry and the table lacks: counted when not written (off), and the
    # latest commits that added them (add), newest first, with the total fields added.
    unknown_fields: list[UnknownFieldFact] = field(default_factory=list)
    schema_additions: list[SchemaAdditionFact] = field(default_factory=list)
    fields_added: int = 0


@dataclass(frozen=True)
class FileFacts:
    data_files: int
    records: int
    bytes: int
    small_files: int
    small_file_ratio: float
    small_file_threshold_bytes: int
    target_file_size_bytes: int


@dataclass(frozen=True)
class LastOptimize:
    snapshot_id: int
    committed_at: str
    age_seconds: float
    strategy: str | None
    mode: str | None
    files_in: int
    files_out: int
    bytes_in: int
    bytes_out: int
    records: int
    duration_seconds: float | None


@dataclass(frozen=True)
class CompactorFacts:
    pending_files: int  # live files added by ingest appends, not yet rewritten
    pending_bytes: int
    pending_snapshots: int  # ingest snapshots those files came from
    due_files: int  # pending files whose partition a compactor rule already selects
    oldest_pending_age_seconds: float | None
    last_optimize: LastOptimize | None


@dataclass(frozen=True)
class ClusteringFacts:
    """How well the layout skips, from manifest bounds (table_meta/clustering.py)."""

    columns: dict[str, dict[str, Any]]  # table-wide per clustering column: files, files_per_point, overlap_depth
    partitions: int
    runs: int  # runs the compactor wrote that are still live
    sealed_partitions: int
    # The partitions that read the most files per point on the first clustering column.
    worst_partitions: list[dict[str, Any]]


@dataclass(frozen=True)
class SnapshotFacts:
    count: int
    metadata_bytes: int  # metadata file + current manifest list + its manifests
    metadata_file_bytes: int
    manifest_list_bytes: int
    manifests: int
    manifest_bytes: int
    oldest_age_seconds: float | None
    # The ingest's commits over the snapshots kept (streamberg.previous-commit-ms): p50 and p95
    # of the time each took, and the trend (median of the newest quarter over the oldest
    # quarter's; None under 20 samples). None: no commit recorded it.
    commit_seconds_p50: float | None = None
    commit_seconds_p95: float | None = None
    commit_seconds_trend: float | None = None
    commit_samples: int = 0


@dataclass(frozen=True)
class DeadLetterFacts:
    table: str
    exists: bool
    records: int
    recent: tuple[dict[str, Any], ...] = ()  # the newest, with their reasons (table_meta/table_facts.py)


@dataclass(frozen=True)
class MergeFacts:
    """A primary-key table kept from its change log by the merge stage (docs/cdc.md)."""

    changelog: str
    changelog_exists: bool
    applied_snapshot_id: int | None  # the change-log snapshot the newest merge applied
    pending_snapshots: int  # change-log snapshots with records not applied yet
    pending_records: int
    oldest_pending_age_seconds: float | None  # since the oldest of them was committed
    last_merge_at: str | None
    last_merge_age_seconds: float | None
    last_merge_changes: int | None
    delete_files: int  # live delete files of the table (the merges' position deletes)
    deleted_rows: int  # deletes they hold
    deleted_row_ratio: float  # of the rows in the data files
    partitions_due_for_deletes: int  # partitions the compactor will rewrite for their deletes
    # Source positions that went backwards with no epoch to explain them (table_meta/source_epochs.py):
    # {"changes", "since", "first_seen"}; None when there are none.
    source_regression: dict[str, Any] | None = None
    source_epoch: int = 0  # the newest source epoch the change log records


@dataclass(frozen=True)
class Health:
    verdict: Verdict
    reasons: list[str]
    # The same findings with the check that raised each (for alert routing).
    findings: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Status:
    table: str
    checked_at: str
    catalog: Reachability
    table_exists: bool | None  # None: the catalog could not be asked
    ingest: IngestFacts
    files: FileFacts | None
    compactor: CompactorFacts | None
    clustering: ClusteringFacts | None
    snapshots: SnapshotFacts | None
    dead_letters: DeadLetterFacts | None
    maintenance: dict[str, Any]
    # Parts of the table that could not be read although the catalog answered.
    errors: list[str] = field(default_factory=list)
    health: Health | None = None
    # A primary-key table's merge stage (kafka.envelope debezium or upsert); None otherwise.
    merge: MergeFacts | None = None
    # Bad streamberg.* policy values in the table's properties (table_meta/policy.py), and what
    # `streamberg govern` last recorded for this table (None: no governor state found).
    policy_problems: list[str] = field(default_factory=list)
    governor: dict[str, Any] | None = None
    # What engines' scans of the table filtered and skipped (catalog.scan_reports_dir,
    # table_meta/query_stats.usage) and the clustering columns it is kept with; None: not collected.
    queries: dict[str, Any] | None = None
    # The tail kept decoded for fresh reads (table_meta/tail_segments.py), by `streamberg tail` or
    # by the ingest (ingest.keep_tail; kept_by): alive, segments, bytes, records kept past the
    # committed offsets and records past those. None: it was never kept for this table.
    tail_cache: dict[str, Any] | None = None
    # Every policy key's effective value and where it came from (table property, config,
    # default), as the table's runtime parsed them (table_meta/table_runtime.py); None: not read.
    settings: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if data["ingest"]["lag"] is None:
            # Same shape whether known or not, so `["lag"]["total"]` never breaks a script.
            data["ingest"]["lag"] = {"total": None, "partitions": {}, "ahead_partitions": [],
                                     "behind_low_partitions": []}
        # Health first after the identity: it is what a reader looks for.
        ordered = {"table": data.pop("table"), "checked_at": data.pop("checked_at"), "health": data.pop("health")}
        return {**ordered, **data}
