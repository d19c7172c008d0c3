"""The single committer: makes writers' files visible, one Iceberg snapshot per interval.

Exactly-once rests on what it checks before every commit:
- Chain: for every Kafka partition, the units it commits start exactly where the table's
  recorded offsets end, in order, with no gap and no overlap.
- Fence: the offsets recorded in the table are still the ones this committer last saw.
  If they moved, another instance committed, and this one refuses rather than duplicate.
- Optimistic concurrency: the append is validated against the snapshot it read (Iceberg's
  AssertRefSnapshotId); on a conflict (e.g. the compactor committed) it re-reads, re-checks
  the fence and retries with the same files.
- Fence first: the fence is checked before anything is written, and a commit's dead
  letters join their table only after its main commit (ingest/dead_letters.py, an outbox),
  so neither a fenced instance nor a crash leaves a dead-letter row the table does not own.
- Kafka's own jumps: a unit may carry position skips (ingest.on_lost_offsets:
  skip-and-record); they are chained like ranges and recorded in the snapshot summary.
- Schema evolution (ingest.schema_evolution: add): records the writers held because they
  carry fields the table lacks are decoded here after the schema update, and their files
  join the same transaction as the update and the writers' files (ingest/evolution.py).
  With `off`, the fields not written are counted per path in every commit's summary.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction

from streamberg.common.catalog import shared_catalog
from streamberg.common.config import StreambergConfig
from streamberg.common.errors import CommitRetriesExhausted, FencedError, OffsetChainError
from streamberg.common.faults import EVOLUTION_COMMIT, pause_point
from streamberg.common.log import get_logger
from streamberg.common.retry import commit_retrying, is_instance
from streamberg.decode.envelopes import record_decoder
from streamberg.decode.records import RecordDecoder
from streamberg.ingest.dead_letters import (
    apply_dead_letter_files,
    dead_letter_rows,
    ensure_dead_letter_table,
    write_dead_letter_file,
)
from streamberg.ingest.evolution import EvolvedBatch, SchemaChanges, evolve_and_write
from streamberg.ingest.files import PartitionedFileWriter
from streamberg.ingest.run_folder import RunFolder
from streamberg.ingest.units import DeadLetter, FlushUnit, HeldRecord
from streamberg.table_meta.column_lifecycle import IGNORED_FIELDS_PROPERTY, ignored_fields
from streamberg.table_meta.field_sightings import (
    encode_added,
    encode_sightings,
    encode_widened,
    merge_sightings,
    sightings_of,
)
from streamberg.table_meta.offsets import (
    FENCED_MESSAGE,
    OffsetSkip,
    PartitionOffsets,
    committed_position,
    encode_offsets,
    encode_skips,
    summary_properties,
)
from streamberg.table_meta.summary_keys import SummaryKeys, kafka_offsets_key, kafka_skips_key
from streamberg.table_meta.table_files import target_file_size
from streamberg.table_meta.tail_segments import cache_folder, drop_committed


@dataclass
class CommitResult:
    snapshot_id: int
    files: int
    records: int
    dead_letters: int
    offsets: PartitionOffsets
    seconds: float
    attempts: int


@dataclass
class _Pending:
    units: list[FlushUnit] = field(default_factory=list)

    def writers(self) -> set[int]:
        return {u.writer for u in self.units}

    def epochs(self) -> set[int]:
        return {u.epoch for u in self.units}


def chain_offsets(expected: PartitionOffsets, units: list[FlushUnit]) -> PartitionOffsets:
    """The offsets after committing `units` on top of `expected`; raise if they don't chain.

    Per partition, units come in the order their writer emitted them (one writer owns a
    partition). Within a unit reading goes forward from its start, except where Kafka forced
    a jump (a declared skip, which may go back); the range ends no earlier than it reached.
    """
    result = dict(expected)
    by_partition: dict[int, list[tuple[tuple[int, int], list[OffsetSkip]]]] = {}
    for unit in sorted(units, key=lambda u: u.epoch):
        for p, rng in unit.ranges.items():
            by_partition.setdefault(p, []).append((rng, unit.skips.get(p, [])))
    for p, items in by_partition.items():
        for (start, end), skips in items:
            if p in result and start != result[p]:
                kind = "gap" if start > result[p] else "overlap"
                raise OffsetChainError(
                    f"partition {p}: a unit starts at offset {start} but the committed offset is {result[p]} ({kind})"
                )
            reached = start
            for skip in skips:
                if skip.from_offset < reached:
                    raise OffsetChainError(f"partition {p}: a skip from offset {skip.from_offset} lies before "
                                           f"offset {reached}, which the unit had already read")
                reached = skip.to_offset
            if end < reached:
                raise OffsetChainError(f"partition {p}: a unit's range ends at offset {end}, before offset "
                                       f"{reached} where it {'started' if not skips else 'went on after a skip'}")
            result[p] = end
    return result


class Committer:
    """One table's committer: its exactly-once chain, fence, dead-letter outbox and evolution,
    in that table's own snapshots. The job's one committer (ingest/committers.py) keeps one a
    table and marks the run drained when every table is."""

    def __init__(self, config: StreambergConfig, parallelism: int, run_id: str):
        self.config, self.parallelism, self.run_id = config, parallelism, run_id
        self.topic = config.kafka.topic
        self.log = get_logger("ingest.committer", job=config.ingest_target.job_id, table=config.table.identifier, run=run_id)
        self.pending = _Pending()
        self.finished_writers: set[int] = set()
        self.commit_seq = 0
        self.expected: PartitionOffsets = {}
        self.consumed_total = 0
        self.skipped_total = 0  # Debezium tombstones skipped by all commits (decode/envelopes/changes.py)
        self.previous_commit_ms: int | None = None  # how long the last commit took (a summary key)
        self.skips: tuple[OffsetSkip, ...] = ()  # recorded jumps, carried forward by every commit
        self.lost_total = 0
        self.sightings: dict = {}  # fields not written (schema_evolution: off), cumulative
        self._dead_letters_behind = False  # an add to the dead-letter table failed; retried at the next commit
        self.drained = False
        self._group_consumer = None
        self._waiting_since: float | None = None  # commit_min_bytes: since when small intervals wait

    # -- life cycle -------------------------------------------------------------------
    def open(self) -> None:
        self.catalog = shared_catalog(self.config.catalog)
        table = self.catalog.load_table(self.config.table.identifier)
        position = committed_position(table, self.topic)
        self.expected = dict(position.offsets)
        self.consumed_total = position.consumed_total
        self.skips, self.lost_total = position.skips, position.lost_total
        recorded = table.snapshot_by_id(position.snapshot_id) if position.snapshot_id is not None else None
        self.sightings = sightings_of(summary_properties(recorded)) if recorded is not None else {}
        self.skipped_total = int(summary_properties(recorded).get(SummaryKeys.SKIPPED_TOMBSTONES_TOTAL, 0)) \
            if recorded is not None else 0
        self.commit_seq = (position.commit_seq or 0) if position.job_id == self.config.ingest_target.job_id else 0
        ensure_dead_letter_table(self.catalog, self.config.ingest_target.dead_letter_table)
        self.log.info("committer opened", offsets=self.expected, snapshot=position.snapshot_id,
                      recorded_by=position.job_id)
        # Dead letters of a main commit whose committer stopped before adding them.
        self._apply_dead_letters()

    def close(self) -> None:
        if self._group_consumer is not None:
            self._group_consumer.close()
            self._group_consumer = None

    # -- receiving units ----------------------------------------------------------------
    @property
    def writers_finished(self) -> bool:
        """Every writer sent its final unit and everything was committed."""
        return len(self.finished_writers) == self.parallelism and not self.pending.units

    def offer(self, unit: FlushUnit) -> CommitResult | None:
        """Take a unit; commit when every active writer has reported for the interval."""
        self.pending.units.append(unit)
        if unit.final:
            self.finished_writers.add(unit.writer)
        if not self._ready() or self._waiting_for_more():
            return None
        units, later = self._complete_intervals()
        self.pending = _Pending(later)
        self._waiting_since = None
        return self.commit(units) if any(not u.empty for u in units) else None

    def _complete_intervals(self) -> tuple[list[FlushUnit], list[FlushUnit]]:
        """The pending units to commit now, and those of an interval some writers have not
        reported yet, kept for the next commit. Once a small interval waited (commit_min_bytes)
        and one writer's next unit made the commit ready, committing that unit too would leave
        the other writers' units of its interval for the commit after: the writers would stay
        an interval apart in every commit from then on, each row waiting two intervals. A
        writer that reports nothing (slow, or gone) is never waited for: its unit joins a
        later commit, as before."""
        units = self.pending.units
        if any(u.final or u.held for u in units):
            return units, []
        active = set(range(self.parallelism)) - self.finished_writers
        latest: dict[int, int] = {}
        for u in units:
            latest[u.writer] = max(latest.get(u.writer, u.epoch), u.epoch)
        if not active or not active <= set(latest):
            return units, []
        reached = min(latest[w] for w in active)  # every active writer reported up to this interval
        return [u for u in units if u.epoch <= reached], [u for u in units if u.epoch > reached]

    def _waiting_for_more(self) -> bool:
        """ingest.commit_min_bytes: a complete interval with little data (or none: a table of a
        field-routed topic that only moved past the others' records) waits for the next ones
        (they join one commit, their offsets chain), up to commit_max_wait_seconds. Never a
        writer's last unit, records held for a schema change (their writers wait on it), nor
        the first position of a partition (a restart must start there, not at a later end)."""
        ingest = self.config.ingest
        units = self.pending.units
        if not ingest.commit_min_bytes or all(u.empty for u in units) \
                or any(u.final or u.held or u.new_fields or u.widen for u in units) \
                or any(p not in self.expected for u in units for p in u.ranges):
            return False
        if sum(f.size_bytes for u in units for f in u.files) >= ingest.commit_min_bytes:
            return False
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
        return now - self._waiting_since < ingest.commit_max_wait_seconds

    def _ready(self) -> bool:
        active = set(range(self.parallelism)) - (self.finished_writers - self.pending.writers())
        reported = self.pending.writers()
        # All writers reported for this interval, or someone is already past it (a slow
        # writer's unit will simply join the next commit; its offsets still chain).
        return active <= reported or len(self.pending.epochs()) > 1

    # -- committing ---------------------------------------------------------------------
    def _check_fence(self, table: Table) -> None:
        position = committed_position(table, self.topic)
        if position.offsets != self.expected:
            message = (
                f"table {self.config.table.identifier}: offsets for topic {self.topic} were moved by "
                f"job {position.job_id!r} (run {position.run_id}, snapshot {position.snapshot_id}); this committer "
                f"expected {self.expected} but found {position.offsets}. Refusing to commit: {FENCED_MESSAGE}."
            )
            self._fenced(message)

    def _check_writers_start(self, units: list[FlushUnit]) -> None:
        """Units that start before the offsets this committer opened with: fenced, not a chain bug.

        Writers and committer read the table's offsets when they open; within one run only
        this committer moves them, by chaining the writers' units. A unit starting before
        them means another instance committed between the writers' and the committer's open.
        """
        for unit in units:
            for p, (start, _end) in unit.ranges.items():
                if p in self.expected and start < self.expected[p]:
                    self._fenced(
                        f"table {self.config.table.identifier}: this run's writers started partition {p} at offset "
                        f"{start}, but the table's offsets had already moved to {self.expected[p]} when its committer "
                        f"opened. Refusing to commit: {FENCED_MESSAGE}.")

    def _fenced(self, message: str) -> None:
        # Tell the driver: a Flink restart would re-read the table and carry on beside the
        # other instance (ingesting twice for nothing, fenced again at random), so the
        # driver stops the whole run at once on this marker instead.
        RunFolder.of(self.config, self.run_id).mark_fenced(message)
        raise FencedError(message)

    def commit(self, units: list[FlushUnit]) -> CommitResult:
        started = time.monotonic()
        started_ms = int(time.time() * 1000)
        # Before the chain check: when another instance moved the offsets between this run's
        # writers and committer opening, the chain check would report an "overlap" instead
        # of the real cause (and Flink would restart the job beside the other instance).
        self._check_writers_start(units)
        new_offsets = chain_offsets(self.expected, units)
        files = [f for u in units for f in u.files]
        dead = [d for u in units for d in u.dead_letters]
        new_skips = [skip for u in units for p in sorted(u.skips) for skip in u.skips[p]]
        records = sum(f.record_count for f in files)
        consumed_total = self.consumed_total + sum(u.messages for u in units)
        lost_total = self.lost_total + sum(skip.lost for skip in new_skips)
        skips = self.skips + tuple(new_skips)
        self.commit_seq += 1
        properties = {
            kafka_offsets_key(self.topic): encode_offsets(new_offsets),
            SummaryKeys.JOB_ID: self.config.ingest_target.job_id,
            SummaryKeys.RUN_ID: self.run_id,
            SummaryKeys.COMMIT_SEQ: str(self.commit_seq),
            SummaryKeys.CONSUMED_TOTAL: str(consumed_total),
            SummaryKeys.COMMIT_STARTED_MS: str(started_ms),
            SummaryKeys.DEAD_LETTERS: str(len(dead)),
        }
        if self.previous_commit_ms is not None:
            properties[SummaryKeys.PREVIOUS_COMMIT_MS] = str(self.previous_commit_ms)
        skipped_total = self.skipped_total + sum(u.skipped for u in units)
        if skipped_total:
            properties[SummaryKeys.SKIPPED_TOMBSTONES_TOTAL] = str(skipped_total)
        if skips:
            properties[kafka_skips_key(self.topic)] = encode_skips(skips)
            properties[SummaryKeys.LOST_OFFSETS_TOTAL] = str(lost_total)
        sightings = copy.deepcopy(self.sightings)
        for u in units:
            merge_sightings(sightings, u.sightings)
        if sightings:
            properties[SummaryKeys.UNKNOWN_FIELDS] = encode_sightings(sightings)
        held = [h for u in units for h in u.held]
        candidates = SchemaChanges()
        for u in units:
            candidates.merge(SchemaChanges(u.new_fields, u.widen))
        try:
            snapshot_id, attempts, evolved = self._append(files, properties, dead, held, candidates)
        except (FencedError, CommitRetriesExhausted):
            # Certainly not committed: the dead-letter file belongs to no table. (Not after any
            # other error: a catalog that failed while answering may have taken the commit.)
            if SummaryKeys.DEAD_LETTER_FILE in properties:
                self._delete_quietly(properties[SummaryKeys.DEAD_LETTER_FILE])
            raise
        if evolved is not None:
            files, dead = files + evolved.files, dead + evolved.dead_letters
            records += evolved.records
            if evolved.added or evolved.widened:
                self.log.info("schema evolved in the same commit as the first files that need it",
                              snapshot=snapshot_id, added=[f"{path} {t}" for path, t in evolved.added],
                              widened=[f"{path} {old} -> {new}" for path, old, new in evolved.widened],
                              held_records=len(held), written=evolved.records, dead_letters=len(evolved.dead_letters))
        fresh = sorted(set(sightings) - set(self.sightings))
        if fresh:
            # Rare (a path's first sighting in this run): which are ignored on purpose is the table's.
            ignored = ignored_fields(self.catalog.load_table(self.config.table.identifier).properties)
            off = [p for p in fresh if p.split(".")[0] not in ignored]
            if off:
                self.log.warning("records carry fields the table lacks; not written (ingest.schema_evolution: off)",
                                 paths=off, snapshot=snapshot_id)
            if len(off) < len(fresh):
                self.log.info(f"records carry fields the table ignores; not written ({IGNORED_FIELDS_PROPERTY}: "
                              "columns dropped as unused)", paths=[p for p in fresh if p not in off],
                              snapshot=snapshot_id)
        dead_file = properties.get(SummaryKeys.DEAD_LETTER_FILE)
        self.expected, self.consumed_total, self.skipped_total = new_offsets, consumed_total, skipped_total
        self.skips, self.lost_total, self.sightings = skips, lost_total, sightings
        for skip in new_skips:
            self.log.warning("recorded a position jump Kafka forced", partition=skip.partition,
                             skip_from=skip.from_offset, skip_to=skip.to_offset, kind=skip.kind, lost=skip.lost,
                             snapshot=snapshot_id)
        result = CommitResult(snapshot_id=snapshot_id, files=len(files), records=records, dead_letters=len(dead),
                              offsets=new_offsets, seconds=time.monotonic() - started, attempts=attempts)
        self.previous_commit_ms = int(result.seconds * 1000)
        self.log.info("committed", snapshot=snapshot_id, files=result.files, records=records,
                      dead_letters=len(dead), offsets=new_offsets, commit_seq=self.commit_seq,
                      attempts=attempts, seconds=round(result.seconds, 3))
        if dead_file is not None or self._dead_letters_behind:
            self._apply_dead_letters()
        self._report_commit(snapshot_id)
        if self.config.ingest.keep_tail:  # the writers' kept tail this commit covers (ingest/tail_spool.py)
            drop_committed(cache_folder(self.config), new_offsets)
        if self.config.ingest.record_group_offsets:
            self._commit_group_offsets(new_offsets)
        return result

    def _report_commit(self, snapshot_id: int) -> None:
        """The commit as a commit report where the catalog collects them: the governor wakes
        on it instead of reading the table every round (table_meta/query_stats.py)."""
        folder = self.config.catalog.scan_reports_dir
        if not folder:
            return
        from streamberg.table_meta.query_stats import record_commit

        try:
            record_commit(folder, self.config.table.identifier, snapshot_id, "append")
        except OSError as exc:  # a commit never fails for its report
            self.log.warning("commit report not written", folder=str(folder), error=str(exc)[:200])

    def _append(self, files: list, properties: dict[str, str], dead: list[DeadLetter], held: list[HeldRecord],
                candidates: SchemaChanges) -> tuple[int, int, EvolvedBatch | None]:
        """One fast append with `properties`, re-read, re-fenced and retried on a lost race;
        returns (snapshot id, attempts, the held records' batch). The dead letters' file is
        written after the first fence check (a fenced instance writes nothing) and named in
        `properties`. Held records are decoded against the schema each attempt evolves, so
        their files and dead letters are made again after a lost race."""
        attempts = 0
        evolved: EvolvedBatch | None = None
        try:
            for attempt in commit_retrying(self.config.ingest.commit_retries, is_instance(CommitFailedException),
                                           log=self.log, event="commit conflict, retrying"):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    table = self.catalog.load_table(self.config.table.identifier)
                    self._check_fence(table)  # re-checked at every attempt: FencedError is never retried
                    tx = table.transaction()
                    if held:
                        if evolved is not None:  # the last attempt's, never committed
                            self._discard(table, evolved, properties)
                        evolved = self._evolve(tx, table, held, candidates, properties)
                    every_dead = dead + (evolved.dead_letters if evolved is not None else [])
                    properties[SummaryKeys.DEAD_LETTERS] = str(len(every_dead))
                    if every_dead and SummaryKeys.DEAD_LETTER_FILE not in properties:
                        properties[SummaryKeys.DEAD_LETTER_FILE] = self._write_dead_letters(every_dead)
                    with tx.update_snapshot(snapshot_properties=properties).merge_append() as append:
                        for f in files + (evolved.files if evolved is not None else []):
                            append.append_data_file(f.to_data_file())
                    if evolved is not None:
                        pause_point(EVOLUTION_COMMIT)  # crash tests kill -9 here (common/faults.py)
                    # The append asserted main was at the snapshot we read, so the new current one is ours.
                    return tx.commit_transaction().current_snapshot().snapshot_id, attempts, evolved
        except (CommitFailedException, FencedError) as exc:
            if evolved is not None:
                self._discard(self.catalog.load_table(self.config.table.identifier), evolved, {})
            if isinstance(exc, FencedError):
                raise
            raise CommitRetriesExhausted(
                f"commit to {self.config.table.identifier} failed {attempts} times; last: {exc}") from exc
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _evolve(self, tx: Transaction, table: Table, held: list[HeldRecord], candidates: SchemaChanges,
                properties: dict[str, str]) -> EvolvedBatch:
        """Schema update and the held records' files, in `tx` (ingest/evolution.py)."""
        config = self.config

        def decoder_for(schema: Schema) -> RecordDecoder:
            return record_decoder(config, schema)

        def files_for(schema: Schema) -> PartitionedFileWriter:
            return PartitionedFileWriter(
                io=table.io, location=table.location(), schema=schema, spec=tx.table_metadata.spec(),
                properties=table.properties,
                target_file_size=target_file_size(table, default=config.table.target_file_size_bytes),
                row_group_rows=config.ingest.row_group_rows,
                name_prefix=f"{self.run_id}-evolve-{self.commit_seq:06d}")

        evolved = evolve_and_write(tx, held, candidates, config.ingest.max_new_fields_per_commit, decoder_for, files_for)
        properties[SummaryKeys.EVOLVED_RECORDS] = str(evolved.records)
        for key, changed in ((SummaryKeys.SCHEMA_ADDED, encode_added(evolved.added) if evolved.added else None),
                             (SummaryKeys.SCHEMA_WIDENED, encode_widened(evolved.widened) if evolved.widened else None)):
            if changed is None:
                properties.pop(key, None)
            else:
                properties[key] = changed
        return evolved

    def _discard(self, table: Table, evolved: EvolvedBatch, properties: dict[str, str]) -> None:
        """Files of an attempt that did not commit: its held records' data and dead letters."""
        for f in evolved.files:
            try:
                table.io.delete(f.path)
            except Exception as exc:  # noqa: BLE001 - an orphan then; maintenance removes it after its safety age
                self.log.warning("could not delete an uncommitted data file", path=f.path, error=str(exc))
        if SummaryKeys.DEAD_LETTER_FILE in properties:
            self._delete_quietly(properties.pop(SummaryKeys.DEAD_LETTER_FILE))

    def _write_dead_letters(self, dead: list[DeadLetter]) -> str:
        dlq = self.catalog.load_table(self.config.ingest_target.dead_letter_table)
        rows = dead_letter_rows(dead, self.topic, self.config.ingest_target.job_id)
        return write_dead_letter_file(dlq, rows, name_prefix=f"dlq-{self.run_id}-{self.commit_seq:06d}")

    def _delete_quietly(self, path: str) -> None:
        try:
            self.catalog.load_table(self.config.ingest_target.dead_letter_table).io.delete(path)
        except Exception as exc:  # noqa: BLE001 - an orphan then; maintenance removes it after its safety age
            self.log.warning("could not delete an uncommitted dead-letter file", path=path, error=str(exc))

    def _apply_dead_letters(self) -> None:
        """Add the committed dead-letter files to their table. A failure here loses nothing
        (the main table names the files): it is logged and retried at the next commit and at
        the next open."""
        try:
            apply_dead_letter_files(self.catalog, self.config.table.identifier, self.config.ingest_target.dead_letter_table,
                                    self.config.ingest.commit_retries, self.run_id, self.log)
            self._dead_letters_behind = False
        except Exception as exc:  # noqa: BLE001 - see above; the next commit retries
            self._dead_letters_behind = True
            self.log.warning("dead letters not yet added to the dead-letter table; retrying at the next commit",
                             error=f"{type(exc).__name__}: {exc}")

    def _commit_group_offsets(self, offsets: PartitionOffsets) -> None:
        """Best effort: consumer-group offsets for lag dashboards; never used to resume."""
        from confluent_kafka import Consumer, TopicPartition

        from streamberg.common.kafka_settings import consumer_settings

        try:
            if self._group_consumer is None:
                self._group_consumer = Consumer(consumer_settings(self.config))
            self._group_consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in offsets.items()], asynchronous=True)
        except Exception as exc:  # noqa: BLE001 - monitoring only
            self.log.warning("consumer-group offset commit failed (monitoring only)", error=str(exc))
