"""Replay: put Kafka records into the table again, outside the ingest's offset chain.

Two sources, both decoded and written with the ingest's own code (RecordDecoder,
PartitionedFileWriter) and committed as ONE Iceberg append per run:

- a topic range ``[A, B)`` of one partition, for rows lost downstream (deleted by mistake,
  an over-eager TTL) or a range dead-lettered by a bug that is now fixed. Only ranges the
  ingest has already consumed (``B <= committed offset``) can be replayed: beyond that is
  the ingest's own job, and replaying it would duplicate what the ingest reads next.
- dead-lettered records, re-decoded against the table's *current* schema (after
  ``streamberg table --evolve`` or a raised ``ingest.max_record_bytes``).

A replay snapshot never carries the ingest offsets key, so the ingest position is never
moved (the committer finds its offsets on the nearest ancestor that has them). Instead it
records what it replayed, so nothing is replayed twice:

- ``streamberg.replay.<topic>`` = ``{"<partition>": [A, B]}`` for a range replay;
- ``streamberg.dlq-replayed.<topic>`` = ``{"<partition>": [offset, ...]}`` for dead-lettered
  records that now landed in the table. Those rows are then deleted from the dead-letter
  table, so ``records + dead letters = consumed`` (``streamberg table``'s ``reconciles``)
  still holds. A crash between the append and that delete is repaired by the next run,
  which deletes every dead letter the table's summaries say already landed.

These records live in snapshot summaries: once maintenance expires a replay snapshot, its
range is no longer checked for overlap (dead letters that landed are gone from the DLQ by
then, so they cannot be replayed twice either way).
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import reduce
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, TopicPartition
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.expressions import And, BooleanExpression, EqualTo, GreaterThanOrEqual, In, LessThan, Or
from pyiceberg.table import Table

from streamberg.common.catalog import shared_catalog
from streamberg.common.config import StreambergConfig
from streamberg.common.errors import ReplayRefused
from streamberg.common.kafka_read import KafkaReadFailed, PartitionReader
from streamberg.common.kafka_settings import consumer_settings
from streamberg.common.log import get_logger
from streamberg.common.retry import commit_retrying, is_instance
from streamberg.ingest.dead_letters import dead_letter_from_message, dead_letter_rows
from streamberg.ingest.files import WrittenFile
from streamberg.ingest.replay_batch import ReplayBatcher
from streamberg.ingest.units import DeadLetter
from streamberg.table_meta.changelog import ingest_config
from streamberg.table_meta.offsets import ancestry, committed_position, summary_properties
from streamberg.table_meta.summary_keys import SummaryKeys, dlq_replayed_key, replay_range_key

# How long Kafka may return nothing before a range read gives up (the records exist:
# the ingest already read them, so silence means they were deleted or compacted away).
READ_IDLE_TIMEOUT_SECONDS = 15.0
TOP_REASONS = 20


@dataclass
class ReplayOutcome:
    """What one replay run did (or, with dry_run, would do); printed as JSON."""

    table: str
    mode: str  # "range" | "dead-letters"
    topic: str
    dry_run: bool
    run_id: str
    read: int = 0  # Kafka records / dead letters considered
    records_added: int = 0  # rows appended to the table (or that would be)
    still_bad: int = 0  # records that still do not decode
    still_bad_by_reason: dict[str, int] = field(default_factory=dict)
    candidates_by_reason: dict[str, int] = field(default_factory=dict)  # dead-letters mode: reasons on file
    dead_letters_added: int = 0  # range mode: still-bad records the DLQ did not hold yet
    removed_from_dlq: int = 0  # dead letters that landed in the table and left the DLQ
    beyond_committed: int = 0  # dead-letters mode: rows at or beyond the ingest's offsets, left out
    fields_added: list[list[str]] = field(default_factory=list)  # [path, type] added for records that carry them
    snapshot_id: int | None = None
    files: int = 0
    seconds: float = 0.0
    request: dict[str, Any] = field(default_factory=dict)  # the range or the filters asked for

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- what earlier replays recorded --------------------------------------------------------
def _recorded(table: Table, key: str) -> Iterator[dict[int, Any]]:
    for snapshot in ancestry(table):
        text = summary_properties(snapshot).get(key)
        if text is not None:
            yield {int(p): v for p, v in json.loads(text).items()}


def replayed_ranges(table: Table, topic: str) -> dict[int, list[tuple[int, int]]]:
    """Ranges replayed into the table's current lineage, per partition."""
    ranges: dict[int, list[tuple[int, int]]] = {}
    for record in _recorded(table, replay_range_key(topic)):
        for p, (start, end) in record.items():
            ranges.setdefault(p, []).append((int(start), int(end)))
    return ranges


def replayed_dead_letters(table: Table, topic: str) -> dict[int, set[int]]:
    """Dead-lettered offsets that a replay already landed in the table, per partition."""
    landed: dict[int, set[int]] = {}
    for record in _recorded(table, dlq_replayed_key(topic)):
        for p, offsets in record.items():
            landed.setdefault(p, set()).update(int(o) for o in offsets)
    return landed


def _overlaps(ranges: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    return [(a, b) for a, b in ranges if a < end and start < b]


def _commit_append(catalog: Catalog, config: StreambergConfig, files: list[WrittenFile],
                   properties: dict[str, str], recheck: Callable[[Table], None]) -> int:
    """One fast append of `files`; on a lost race, re-read, re-check and retry.

    When it gives up or the re-check refuses, the files it wrote are deleted: they were
    never part of the table. (Not after any other error: a catalog that failed while
    answering a commit may have taken it, and deleting would then corrupt the table.)
    """
    try:
        return _append_with_retries(catalog, config, files, properties, recheck)
    except (ReplayRefused, CommitFailedException):
        io = catalog.load_table(config.table.identifier).io
        for f in files:
            try:
                io.delete(f.path)
            except OSError:
                pass  # an orphan; maintenance removes it after its safety age
        raise


def _append_with_retries(catalog: Catalog, config: StreambergConfig, files: list[WrittenFile],
                         properties: dict[str, str], recheck: Callable[[Table], None]) -> int:
    for attempt in commit_retrying(config.ingest.commit_retries, is_instance(CommitFailedException)):
        with attempt:
            table = catalog.load_table(config.table.identifier)
            recheck(table)  # another replay may have committed the same records meanwhile
            tx = table.transaction()
            with tx.update_snapshot(snapshot_properties=properties).merge_append() as append:
                for f in files:
                    append.append_data_file(f.to_data_file())
            # The append asserted main was at the snapshot we read, so the new current one is ours.
            return tx.commit_transaction().current_snapshot().snapshot_id
    raise AssertionError("unreachable: the last attempt returns or raises")


# -- the dead-letter table -----------------------------------------------------------------
def _load_dlq(catalog: Catalog, config: StreambergConfig) -> Table | None:
    try:
        return catalog.load_table(config.ingest_target.dead_letter_table)
    except NoSuchTableError:
        return None


def _pairs_filter(topic: str, offsets: dict[int, set[int]]) -> BooleanExpression:
    per_partition = [And(EqualTo("partition", p), In("offset", {int(o) for o in offs}))
                     for p, offs in sorted(offsets.items()) if offs]
    return And(EqualTo("topic", topic), reduce(Or, per_partition))


def remove_from_dead_letters(catalog: Catalog, config: StreambergConfig, landed: dict[int, set[int]],
                             run_id: str) -> int:
    """Delete the dead letters that landed in the table; return how many rows left the DLQ."""
    if not any(landed.values()):
        return 0
    # A lost race: the ingest appended dead letters meanwhile.
    for attempt in commit_retrying(config.ingest.commit_retries, is_instance(CommitFailedException)):
        with attempt:
            dlq = _load_dlq(catalog, config)
            if dlq is None:
                return 0
            where = _pairs_filter(config.kafka.topic, landed)
            present = dlq.scan(row_filter=where, selected_fields=("offset",)).to_arrow().num_rows
            if not present:
                return 0
            dlq.delete(where, snapshot_properties={SummaryKeys.OPERATION: "replay", SummaryKeys.RUN_ID: run_id})
            return present
    raise AssertionError("unreachable: the last attempt returns or raises")


def _append_dead_letters(catalog: Catalog, config: StreambergConfig, dead: list[DeadLetter], run_id: str) -> int:
    """Append dead letters the DLQ does not hold yet (no offsets key: the ingest's chain stays)."""
    if not dead:
        return 0
    dlq = _load_dlq(catalog, config)
    if dlq is None:
        return 0
    rows = dead_letter_rows(dead, config.kafka.topic, job_id=f"replay:{config.table.identifier}")
    dlq.append(rows, snapshot_properties={SummaryKeys.OPERATION: "replay", SummaryKeys.RUN_ID: run_id})
    return len(dead)


def _reasons(reasons: list[str]) -> dict[str, int]:
    return dict(Counter(reasons).most_common(TOP_REASONS))


# -- range replay -------------------------------------------------------------------------
def _position(message: Any) -> tuple[int, int, int | None]:
    kind, ts = message.timestamp()
    return message.partition(), message.offset(), ts if kind else None


def _read_range(config: StreambergConfig, partition: int, start: int, end: int) -> Iterator[list]:
    """Batches of Kafka messages of one partition with offsets in [start, end)."""
    topic = config.kafka.topic
    consumer = Consumer({**consumer_settings(config), "group.id": f"{config.ingest_target.consumer_group}-replay"})
    try:
        low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
        if start < low:
            raise ReplayRefused(
                f"partition {partition} of {topic} starts at offset {low} now: records before it were deleted "
                f"by Kafka's retention and cannot be replayed (asked from {start})")
        # Not ended at end-of-partition: a record missing below `end` is waited for, then reported.
        reader = PartitionReader(consumer, topic, {partition: start}, {partition: end}, until_eof=False)
        idle_since = time.monotonic()
        while not reader.done:
            try:
                batch = reader.read(config.ingest.max_poll_records, 1.0)
            except KafkaReadFailed as exc:
                raise RuntimeError(f"reading partition {partition} of {topic}: the Kafka client failed: {exc}") from None
            if partition in reader.failed:
                raise ReplayRefused(f"partition {partition} of {topic} from offset {reader.next_offset[partition]}: "
                                    f"{reader.failed[partition]}")
            if not batch:
                if time.monotonic() - idle_since > READ_IDLE_TIMEOUT_SECONDS:
                    raise RuntimeError(
                        f"Kafka returned partition {partition} of {topic} only up to offset "
                        f"{reader.next_offset[partition] - 1} within {READ_IDLE_TIMEOUT_SECONDS:.0f} s; asked up to {end - 1}")
                continue
            idle_since = time.monotonic()
            yield batch
    finally:
        consumer.close()


def _dead_letters_in_range(dlq: Table | None, topic: str, partition: int, start: int, end: int) -> set[int]:
    if dlq is None:
        return set()
    where = And(And(EqualTo("topic", topic), EqualTo("partition", partition)),
                And(GreaterThanOrEqual("offset", start), LessThan("offset", end)))
    return set(dlq.scan(row_filter=where, selected_fields=("offset",)).to_arrow().column("offset").to_pylist())


def _tally(outcome: ReplayOutcome, batcher: ReplayBatcher, files: list, still_bad: list[str]) -> None:
    """What a replay's batches came to: rows added, fields added, what is still bad and why."""
    outcome.records_added = batcher.added
    outcome.fields_added = [list(f) for f in batcher.fields_added]
    outcome.still_bad = len(still_bad)
    outcome.still_bad_by_reason = _reasons(still_bad)
    outcome.files = len(files)


def replay_range(config: StreambergConfig, partition: int, start: int, end: int, *,
                 force: bool = False, dry_run: bool = False) -> ReplayOutcome:
    """Re-ingest Kafka records [start, end) of one partition as one append."""
    config = ingest_config(config)  # a primary-key table: its change log (table_meta/changelog.py)
    started = time.monotonic()
    topic, run_id = config.kafka.topic, uuid.uuid4().hex[:12]
    log = get_logger("ingest.replay", table=config.table.identifier, topic=topic, partition=partition, run=run_id)
    if not 0 <= start < end:
        raise ReplayRefused(f"--from-offset {start} must be >= 0 and below --to-offset {end}")
    catalog = shared_catalog(config.catalog)
    try:
        table = catalog.load_table(config.table.identifier)
    except NoSuchTableError:
        raise ReplayRefused(f"table {config.table.identifier} does not exist; nothing was ever ingested") from None
    committed = committed_position(table, topic).offsets
    if partition not in committed:
        raise ReplayRefused(f"partition {partition} of {topic} has no committed ingest offset in "
                            f"{config.table.identifier}; reading it is the ingest's job, not a replay's")
    if end > committed[partition]:
        raise ReplayRefused(
            f"--to-offset {end} is beyond the ingest's committed offset {committed[partition]} for partition "
            f"{partition}: records from {committed[partition]} on are the ingest's to read (replaying them "
            f"would duplicate them); replay at most up to {committed[partition]}")

    def check_overlap(current: Table) -> None:
        if force:
            return
        clash = _overlaps(replayed_ranges(current, topic).get(partition, []), start, end)
        if clash:
            raise ReplayRefused(
                f"partition {partition} range [{start}, {end}) overlaps range(s) already replayed into "
                f"{config.table.identifier}: {', '.join(f'[{a}, {b})' for a, b in clash)}; "
                f"pass --force if those rows are gone again")

    check_overlap(table)
    outcome = ReplayOutcome(table=config.table.identifier, mode="range", topic=topic, dry_run=dry_run, run_id=run_id,
                            request={"partition": partition, "from_offset": start, "to_offset": end, "force": force})
    dlq = _load_dlq(catalog, config)
    in_dlq = _dead_letters_in_range(dlq, topic, partition, start, end)
    batcher = ReplayBatcher(config, table, run_id, dry_run)
    landed_from_dlq: set[int] = set()
    dead: list[DeadLetter] = []
    try:
        for messages in _read_range(config, partition, start, end):
            outcome.read += len(messages)
            kept, rejected = batcher.decode([m.value() for m in messages], [m.key() for m in messages],
                                            [_position(m) for m in messages])
            landed_from_dlq.update(messages[int(i)].offset() for i in kept if messages[int(i)].offset() in in_dlq)
            dead.extend(dead_letter_from_message(messages[i], reason) for i, reason in rejected)
        files, held_landed, held_dead = batcher.finish(catalog)
        landed_from_dlq.update(h.offset for h in held_landed if h.offset in in_dlq)
        dead.extend(held_dead)
    except BaseException:
        batcher.abort()
        raise
    _tally(outcome, batcher, files, [d.reason for d in dead])
    fresh_dead = [d for d in dead if d.offset not in in_dlq]
    if dry_run:
        outcome.dead_letters_added = len(fresh_dead)
        outcome.removed_from_dlq = len(landed_from_dlq)
    else:
        # Dead letters first, as the ingest committer does: a crash before the main append
        # leaves them recorded, and a re-run finds them in the DLQ and adds none twice.
        outcome.dead_letters_added = _append_dead_letters(catalog, config, fresh_dead, run_id)
        if files:
            properties = {replay_range_key(topic): json.dumps({str(partition): [start, end]}), SummaryKeys.OPERATION: "replay",
                          SummaryKeys.RUN_ID: run_id, SummaryKeys.REPLAY_RECORDS: str(outcome.records_added)}
            if landed_from_dlq:
                properties[dlq_replayed_key(topic)] = json.dumps({str(partition): sorted(landed_from_dlq)})
            outcome.snapshot_id = _commit_append(catalog, config, files, properties, check_overlap)
            outcome.removed_from_dlq = remove_from_dead_letters(catalog, config, {partition: landed_from_dlq}, run_id)
        log.info("range replayed", snapshot=outcome.snapshot_id, records=outcome.records_added, files=len(files),
                 start=start, end=end, still_bad=outcome.still_bad, removed_from_dlq=outcome.removed_from_dlq)
    outcome.seconds = round(time.monotonic() - started, 3)
    return outcome


# -- dead-letter replay ---------------------------------------------------------------------
def _select_dead_letters(dlq: Table, topic: str, reason_like: str | None, since: dt.datetime | None,
                         skip: dict[int, set[int]], committed: dict[int, int]) -> tuple[pa.Table, int]:
    """The dead letters to replay, and how many were left out for lying at or beyond the main
    table's committed offsets (the ingest has not committed that range: its records are the
    ingest's to read, and replaying them would duplicate them)."""
    rows = dlq.scan(row_filter=EqualTo("topic", topic)).to_arrow()
    if rows.num_rows:
        ends = np.array([committed.get(int(p), -1) for p in rows.column("partition").to_pylist()], dtype=np.int64)
        below = rows.column("offset").to_numpy() < ends
        beyond = int((~below).sum())
        rows = rows.filter(pa.array(below))
    else:
        beyond = 0
    if reason_like is not None:
        rows = rows.filter(pc.match_like(rows.column("reason"), reason_like))
    if since is not None:
        rows = rows.filter(pc.greater_equal(rows.column("dead_lettered_at"), pa.scalar(since, rows.schema.field("dead_lettered_at").type)))
    if rows.num_rows == 0:
        return rows, beyond
    # One row per (partition, offset): the committer never writes two, but a DLQ edited by
    # hand might, and replaying both would duplicate the record.
    rows = rows.sort_by([("partition", "ascending"), ("offset", "ascending")])
    parts, offs = rows.column("partition").to_numpy(), rows.column("offset").to_numpy()
    first = np.ones(len(offs), dtype=bool)
    first[1:] = (parts[1:] != parts[:-1]) | (offs[1:] != offs[:-1])
    done = np.array([int(o) in skip.get(int(p), ()) for p, o in zip(parts, offs)], dtype=bool)
    return rows.filter(pa.array(first & ~done)), beyond


def replay_dead_letters(config: StreambergConfig, *, reason_like: str | None = None,
                        since: dt.datetime | None = None, dry_run: bool = False) -> ReplayOutcome:
    """Re-decode dead letters against the table's current schema; append those that now decode."""
    config = ingest_config(config)  # a primary-key table: its change log (table_meta/changelog.py)
    started = time.monotonic()
    topic, run_id = config.kafka.topic, uuid.uuid4().hex[:12]
    log = get_logger("ingest.replay", table=config.table.identifier, topic=topic, run=run_id, mode="dead-letters")
    catalog = shared_catalog(config.catalog)
    try:
        table = catalog.load_table(config.table.identifier)
    except NoSuchTableError:
        raise ReplayRefused(f"table {config.table.identifier} does not exist; nothing was ever ingested") from None
    outcome = ReplayOutcome(table=config.table.identifier, mode="dead-letters", topic=topic, dry_run=dry_run,
                            run_id=run_id, request={"reason_like": reason_like,
                                                    "since": since.isoformat() if since else None})
    landed_before = replayed_dead_letters(table, topic)
    if not dry_run:  # repair an earlier run that crashed between its append and its DLQ delete
        outcome.removed_from_dlq = remove_from_dead_letters(catalog, config, landed_before, run_id)
    dlq = _load_dlq(catalog, config)
    if dlq is None:
        outcome.seconds = round(time.monotonic() - started, 3)
        return outcome
    rows, outcome.beyond_committed = _select_dead_letters(dlq, topic, reason_like, since, landed_before,
                                                          committed_position(table, topic).offsets)
    if outcome.beyond_committed:
        log.warning("dead letters at or beyond the ingest's committed offsets left out (the ingest's to read)",
                    count=outcome.beyond_committed)
    outcome.read = rows.num_rows
    outcome.candidates_by_reason = _reasons(rows.column("reason").to_pylist()) if rows.num_rows else {}
    batcher = ReplayBatcher(config, table, run_id, dry_run)
    landed: dict[int, set[int]] = {}
    still_bad: list[str] = []
    step = config.ingest.max_poll_records
    try:
        for lo in range(0, rows.num_rows, step):
            chunk = rows.slice(lo, step)
            parts, offs = chunk.column("partition").to_pylist(), chunk.column("offset").to_pylist()
            kept, rejected = batcher.decode(chunk.column("value").to_pylist(), chunk.column("key").to_pylist(),
                                            [(p, o, None) for p, o in zip(parts, offs)])
            for i in kept:
                landed.setdefault(parts[int(i)], set()).add(offs[int(i)])
            still_bad.extend(reason for _, reason in rejected)
        files, held_landed, held_dead = batcher.finish(catalog)
        for h in held_landed:
            landed.setdefault(h.partition, set()).add(h.offset)
        still_bad.extend(d.reason for d in held_dead)
    except BaseException:
        batcher.abort()
        raise
    _tally(outcome, batcher, files, still_bad)

    def check_not_landed(current: Table) -> None:
        already = replayed_dead_letters(current, topic)
        clash = sum(len(offs & already.get(p, set())) for p, offs in landed.items())
        if clash:
            raise ReplayRefused(f"{clash} of these dead letters were replayed by another run meanwhile; "
                                f"nothing was added, run the replay again")

    if files and not dry_run:
        properties = {dlq_replayed_key(topic): json.dumps({str(p): sorted(o) for p, o in sorted(landed.items())}),
                      SummaryKeys.OPERATION: "replay", SummaryKeys.RUN_ID: run_id, SummaryKeys.REPLAY_RECORDS: str(outcome.records_added)}
        outcome.snapshot_id = _commit_append(catalog, config, files, properties, check_not_landed)
        outcome.removed_from_dlq += remove_from_dead_letters(catalog, config, landed, run_id)
        log.info("dead letters replayed", snapshot=outcome.snapshot_id, records=outcome.records_added,
                 files=len(files), still_bad=outcome.still_bad, removed_from_dlq=outcome.removed_from_dlq)
    elif dry_run:
        outcome.removed_from_dlq = sum(len(o) for o in landed.values())
    outcome.seconds = round(time.monotonic() - started, 3)
    return outcome
