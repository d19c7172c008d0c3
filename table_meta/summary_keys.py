"""Every `streamberg.*` key written into Iceberg table metadata (snapshot summaries, table
properties), in one registry.

Snapshot summaries are how the components talk through the table: the ingest records its
Kafka position there, the compactor its optimize record, replays their ranges, and
monitoring and maintenance read all of them back. So the keys are declared once, here, as
pyiceberg's `TableProperties` declares table property keys. What each key means is said
beside it; the modules that write them say why.
"""

from __future__ import annotations

from collections.abc import Mapping


class SummaryKeys:
    # -- ingest commits (ingest/committer.py) -----------------------------------------------
    # `<prefix><topic>` = JSON {"<partition>": <next offset>}: where the ingest resumes.
    KAFKA_OFFSETS_PREFIX = "streamberg.kafka-offsets."
    JOB_ID = "streamberg.job-id"
    RUN_ID = "streamberg.run-id"
    COMMIT_SEQ = "streamberg.commit-seq"
    # Kafka records (valid + dead-lettered) consumed by all ingest commits up to this one.
    CONSUMED_TOTAL = "streamberg.consumed-total"
    # Wall-clock ms when the committer started this commit: the snapshot's timestamp minus
    # this is the commit latency monitoring reports.
    COMMIT_STARTED_MS = "streamberg.commit-started-ms"
    # How long this committer's previous commit took, start to catalog swap (ms): the commit
    # latency trend status reads over the snapshots kept.
    PREVIOUS_COMMIT_MS = "streamberg.previous-commit-ms"
    # Dead letters the commit carries (its dead-letter file's rows).
    DEAD_LETTERS = "streamberg.dead-letters"
    # Records that are neither rows nor dead letters, by all ingest commits up to this one: the
    # tombstones Kafka sends after Debezium deletes (kafka.envelope debezium, decode/envelopes/changes.py).
    SKIPPED_TOMBSTONES_TOTAL = "streamberg.skipped-tombstones-total"
    # The Parquet file, in the dead-letter table's location, holding this commit's dead
    # letters. It joins the dead-letter table only after this snapshot committed (an outbox:
    # the main commit decides for both tables, ingest/dead_letters.py).
    DEAD_LETTER_FILE = "streamberg.dead-letter-file"
    # `<prefix><topic>` = JSON [[partition, from, to, at_ms], ...]: every jump of the ingest's
    # position that Kafka forced (records deleted before they were read, offsets that went
    # back), with ingest.on_lost_offsets=skip-and-record; carried forward by every commit.
    KAFKA_SKIPS_PREFIX = "streamberg.kafka-skips."
    # Offsets passed over because Kafka no longer had them, by all ingest commits up to this one.
    LOST_OFFSETS_TOTAL = "streamberg.lost-offsets-total"
    # JSON {"<path>": {"records": n, "first": {"<partition>": offset}, "last": {...}}}: fields
    # the records carried and the table lacks, not written (ingest.schema_evolution: off);
    # cumulative, carried forward by every ingest commit (table_meta/field_sightings.py).
    UNKNOWN_FIELDS = "streamberg.unknown-fields"
    # JSON [["<path>", "<type>"], ...]: the fields this commit added to the schema, in the
    # same commit as the first files that carry them (ingest.schema_evolution: add).
    SCHEMA_ADDED = "streamberg.schema-added"
    # JSON [["<path>", "<from>", "<to>"], ...]: columns this commit widened (int -> long, float
    # -> double, a decimal's precision) for values the narrower type refused, in the same commit.
    SCHEMA_WIDENED = "streamberg.schema-widened"
    # Records that carried fields the writers' schema lacked, decoded by the committer
    # against the evolved schema in this commit (ingest/evolution.py).
    EVOLVED_RECORDS = "streamberg.evolved-records"


    # -- replays (ingest/replay.py) ---------------------------------------------------------
    OPERATION = "streamberg.operation"
    # `<prefix><topic>` = the Kafka ranges a replay appended.
    REPLAY_RANGE_PREFIX = "streamberg.replay."
    # `<prefix><topic>` = the dead-letter offsets a dead-letter replay moved into the table.
    DLQ_REPLAYED_PREFIX = "streamberg.dlq-replayed."
    REPLAY_RECORDS = "streamberg.replay-records"

    # -- compactor commits (compactor/record.py) --------------------------------------------
    COMPACTOR_PREFIX = "streamberg.compactor."
    COMPACTOR_RUN_ID = COMPACTOR_PREFIX + "run-id"  # one compactor process run
    COMPACTOR_COMMIT_ID = COMPACTOR_PREFIX + "commit-id"  # recognises the commit after an unknown state
    COMPACTOR_MODE = COMPACTOR_PREFIX + "mode"  # incremental | full
    COMPACTOR_STRATEGY = COMPACTOR_PREFIX + "strategy"
    COMPACTOR_COLUMNS = COMPACTOR_PREFIX + "columns"  # comma separated
    COMPACTOR_GROUPS = COMPACTOR_PREFIX + "groups"  # file groups in this commit
    COMPACTOR_COMMIT = COMPACTOR_PREFIX + "commit"  # "k/n" of the plan's commits
    COMPACTOR_FILES_IN = COMPACTOR_PREFIX + "files-in"
    COMPACTOR_FILES_OUT = COMPACTOR_PREFIX + "files-out"
    COMPACTOR_BYTES_IN = COMPACTOR_PREFIX + "bytes-in"
    COMPACTOR_BYTES_OUT = COMPACTOR_PREFIX + "bytes-out"
    COMPACTOR_RECORDS = COMPACTOR_PREFIX + "records"
    COMPACTOR_DURATION_MS = COMPACTOR_PREFIX + "duration-ms"
    COMPACTOR_PLAN_SNAPSHOT_ID = COMPACTOR_PREFIX + "plan-snapshot-id"  # commits are validated against it
    COMPACTOR_COVERED_SNAPSHOTS = COMPACTOR_PREFIX + "covered-snapshots"  # ingest snapshots rewritten
    COMPACTOR_BATCH_ID = COMPACTOR_PREFIX + "batch-id"  # the streaming micro-batch (absent for --full)

    # -- merges of a change log into a primary-key table (merge/) ----------------------------
    # The change-log snapshot whose changes (and every older one's) this merge applied: the
    # next merge reads the change log after it, so none is applied twice (docs/cdc.md).
    CHANGELOG_APPLIED = "streamberg.changelog-applied"
    MERGE_RUN_ID = "streamberg.merge.run-id"
    MERGE_CHANGES = "streamberg.merge.changes"  # change-log rows this merge read
    MERGE_KEYS = "streamberg.merge.keys"  # distinct keys they touched (the last change of each applied)
    MERGE_DELETES = "streamberg.merge.deletes"  # keys whose last change is a delete
    # keys whose last change in the batch was older than the table's (a replay, a rewound
    # topic): not applied (merge/order.py)
    MERGE_STALE = "streamberg.merge.stale"
    # Changes whose source position went backwards with no epoch to explain it (not applied).
    MERGE_REGRESSED = "streamberg.merge.regressed"
    MERGE_CHANGELOG_SNAPSHOTS = "streamberg.merge.changelog-snapshots"  # change-log snapshots applied

    # -- benchmarks (bench/) ----------------------------------------------------------------
    BENCH_LAYOUT = "streamberg.bench.layout"

    # The clustering health of the rewritten partitions before the rewrite, JSON
    # {column: files per point} (table_meta/clustering.py).
    COMPACTOR_FILES_PER_POINT = COMPACTOR_PREFIX + "files-per-point"
    # What the pass did per group kind, e.g. "cluster:3,merge:1,finish:1", and how many runs
    # the merges consumed.
    COMPACTOR_GROUP_KINDS = COMPACTOR_PREFIX + "group-kinds"
    COMPACTOR_RUNS_IN = COMPACTOR_PREFIX + "runs-in"

    # Keys only an ingest commit may carry: the ingest finds its position by walking back to
    # the nearest snapshot that has them, so no other writer's snapshot may look like one.
    INGEST_ONLY = (JOB_ID, RUN_ID, COMMIT_SEQ, DEAD_LETTER_FILE)


class TablePropertyKeys:
    # JSON {"<spec id>|<partition path>": <data sequence number>}: in that partition every live
    # file with a data sequence number up to the recorded one belongs to a sealed run, which
    # the compactor never rewrites again (compactor/planner.py). Table metadata, not a snapshot
    # summary, so snapshot expiry cannot forget it.
    COMPACTOR_SEALED = "streamberg.compactor.sealed"
    # On the dead-letter table, `<prefix><main table>` = the order (sequence number) of the
    # newest main-table snapshot whose dead-letter file the dead-letter table holds; files of
    # newer ingest snapshots are still to be added (ingest/dead_letters.py). A table property,
    # set in the same commit as the files, so no snapshot expiry can forget it.
    DLQ_APPLIED_PREFIX = "streamberg.dlq-applied."
    # On a change log: rows maintenance trimmed after the merge applied them, all trims
    # together (set in the trim's own commit; maintenance/changelog.py), so records + trimmed
    # + dead letters + skipped tombstones = consumed survives snapshot expiry.
    CHANGELOG_TRIMMED_RECORDS = "streamberg.changelog.trimmed-records"


def kafka_offsets_key(topic: str) -> str:
    return f"{SummaryKeys.KAFKA_OFFSETS_PREFIX}{topic}"


def kafka_skips_key(topic: str) -> str:
    return f"{SummaryKeys.KAFKA_SKIPS_PREFIX}{topic}"


def replay_range_key(topic: str) -> str:
    return f"{SummaryKeys.REPLAY_RANGE_PREFIX}{topic}"


def dlq_replayed_key(topic: str) -> str:
    return f"{SummaryKeys.DLQ_REPLAYED_PREFIX}{topic}"


def is_ingest_key(key: str) -> bool:
    return key.startswith((SummaryKeys.KAFKA_OFFSETS_PREFIX, SummaryKeys.KAFKA_SKIPS_PREFIX)) \
        or key in SummaryKeys.INGEST_ONLY


def is_compactor_summary(summary: Mapping[str, str]) -> bool:
    return SummaryKeys.COMPACTOR_RUN_ID in summary
