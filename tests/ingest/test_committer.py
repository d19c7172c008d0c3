"""The committer against a real SQLite catalog and real Parquet files (no Flink needed).

Covers what makes ingest exactly-once: offsets chain with no gap or overlap, a second
committer is fenced, commit conflicts (e.g. with the compactor) are retried without loss,
and dead letters are not duplicated when a commit is replayed after a crash.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow

from streamberg.common.catalog import load_catalog
from streamberg.common.errors import FencedError, OffsetChainError
from streamberg.ingest.committer import Committer, chain_offsets
from streamberg.ingest.dead_letters import open_tables
from streamberg.ingest.files import PartitionedFileWriter
from streamberg.ingest.units import DeadLetter, FlushUnit
from streamberg.table_meta.offsets import committed_position
from tests.helpers import config_at, duplicates, table_ids, write_config


@pytest.fixture
def config(tmp_path: Path, broker: str):
    cfg = config_at(write_config(tmp_path, broker, "orders", partition_spec=[{"source": "user_id", "transform": "bucket[4]"}]))
    open_tables(cfg)
    return cfg


def make_unit(config, writer: int, partition: int, start: int, end: int, epoch: int = 1,
              dead: tuple[int, ...] = ()) -> FlushUnit:
    """A unit holding real Parquet files with ids start..end-1 (minus dead-lettered offsets)."""
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    ids = [i for i in range(start, end) if i not in dead]
    rows = pa.Table.from_pylist(
        [{"id": i, "ts": dt.datetime(2026, 11, 21, tzinfo=dt.timezone.utc), "user_id": f"u{i % 13}",
          "city": None, "amount": 1.0} for i in ids],
        schema=schema_to_pyarrow(table.schema()),
    )
    files = PartitionedFileWriter(table.io, table.location(), table.schema(), table.spec(), table.properties,
                                  1 << 30, 1000, f"test-w{writer}")
    files.write(rows)
    return FlushUnit(run_id="test", writer=writer, epoch=epoch, topic=config.kafka.topic,
                     ranges={partition: (start, end)}, files=files.flush(),
                     dead_letters=[DeadLetter(partition, o, None, None, b"bad", "test reason") for o in dead])


def test_chain_rejects_gaps_and_overlaps() -> None:
    unit = FlushUnit(run_id="r", writer=0, epoch=1, topic="t", ranges={0: (10, 20)})
    assert chain_offsets({0: 10}, [unit]) == {0: 20}
    assert chain_offsets({}, [unit]) == {0: 20}  # first commit for a partition
    with pytest.raises(OffsetChainError, match="gap"):
        chain_offsets({0: 5}, [unit])
    with pytest.raises(OffsetChainError, match="overlap"):
        chain_offsets({0: 15}, [unit])


def test_chain_rejects_a_range_that_ends_before_it_starts() -> None:
    from streamberg.table_meta.offsets import OffsetSkip

    backwards = FlushUnit(run_id="r", writer=0, epoch=1, topic="t", ranges={0: (1000, 51)})
    with pytest.raises(OffsetChainError, match="ends at offset 51, before offset 1000"):
        chain_offsets({0: 1000}, [backwards])
    # A declared jump (skip-and-record) may go forward or back; the range then ends past it.
    lost = FlushUnit(run_id="r", writer=0, epoch=1, topic="t", ranges={0: (100, 900)},
                     skips={0: [OffsetSkip(0, 100, 800)]})
    assert chain_offsets({0: 100}, [lost]) == {0: 900}
    rewound = FlushUnit(run_id="r", writer=0, epoch=1, topic="t", ranges={0: (1000, 30)},
                        skips={0: [OffsetSkip(0, 1000, 0)]})
    assert chain_offsets({0: 1000}, [rewound]) == {0: 30}
    short = FlushUnit(run_id="r", writer=0, epoch=1, topic="t", ranges={0: (100, 700)},
                      skips={0: [OffsetSkip(0, 100, 800)]})
    with pytest.raises(OffsetChainError, match="after a skip"):
        chain_offsets({0: 100}, [short])
    early = FlushUnit(run_id="r", writer=0, epoch=1, topic="t", ranges={0: (100, 900)},
                      skips={0: [OffsetSkip(0, 50, 800)]})
    with pytest.raises(OffsetChainError, match="skip from offset 50"):
        chain_offsets({0: 100}, [early])
    # Units of one writer chain in the order it emitted them, also across a rewind.
    after = FlushUnit(run_id="r", writer=0, epoch=2, topic="t", ranges={0: (30, 60)})
    assert chain_offsets({0: 1000}, [after, rewound]) == {0: 60}


def test_commit_waits_for_every_writer_then_makes_one_snapshot(config) -> None:
    committer = Committer(config, parallelism=2, run_id="r1")
    committer.open()
    assert committer.offer(make_unit(config, writer=0, partition=0, start=0, end=100)) is None
    result = committer.offer(make_unit(config, writer=1, partition=1, start=0, end=50))
    assert result is not None and result.records == 150
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert len(table.metadata.snapshots) == 1
    assert committed_position(table, config.kafka.topic).offsets == {0: 100, 1: 50}
    committer.close()


def test_small_intervals_wait_for_commit_min_bytes_or_the_max_wait(tmp_path: Path, broker: str) -> None:
    """ingest.commit_min_bytes: intervals whose files are small join the next ones in one
    commit (offsets chained), until the bytes are there or commit_max_wait_seconds passed;
    a writer's last unit is committed at once."""
    import time

    cfg = config_at(write_config(tmp_path, broker, "quiet", ingest={"commit_min_bytes": 10_000_000,
                                                                     "commit_max_wait_seconds": 1.5}))
    open_tables(cfg)
    table_of = lambda: load_catalog(cfg.catalog).load_table(cfg.table.identifier)  # noqa: E731
    committer = Committer(cfg, parallelism=1, run_id="r1")
    committer.open()
    # A partition's first position is committed at once (a restart must start there).
    assert committer.offer(make_unit(cfg, writer=0, partition=0, start=0, end=10, epoch=1)).records == 10
    assert committer.offer(make_unit(cfg, writer=0, partition=0, start=10, end=20, epoch=2)) is None
    assert committer.offer(make_unit(cfg, writer=0, partition=0, start=20, end=30, epoch=3)) is None
    assert len(table_of().metadata.snapshots) == 1  # small: waiting for more
    time.sleep(1.6)
    result = committer.offer(make_unit(cfg, writer=0, partition=0, start=30, end=40, epoch=4))
    assert result is not None and result.records == 30  # three intervals, one commit
    assert len(table_of().metadata.snapshots) == 2
    assert committed_position(table_of(), "quiet").offsets == {0: 40}
    assert committer.offer(make_unit(cfg, writer=0, partition=0, start=40, end=45, epoch=5)) is None
    last = make_unit(cfg, writer=0, partition=0, start=45, end=50, epoch=6)
    last.final = True
    assert committer.offer(last).records == 10  # the writer's last unit: no waiting
    assert table_ids(cfg) == list(range(50)) and committer.writers_finished
    committer.close()


def test_a_waiting_interval_is_committed_without_the_next_interval_of_one_writer(tmp_path: Path,
                                                                                  broker: str) -> None:
    """Two writers, commit_min_bytes: when a small interval waited and one writer's next unit
    makes the commit due, the commit takes the complete interval and keeps that unit for the
    next one, with the other writer's unit of its interval (measured with bench-fleet: a
    commit of both made the writers an interval apart for good, each row waiting two)."""
    import time

    cfg = config_at(write_config(tmp_path, broker, "paired", ingest={"commit_min_bytes": 10_000_000,
                                                                      "commit_max_wait_seconds": 1.0}))
    open_tables(cfg)
    committer = Committer(cfg, parallelism=2, run_id="r1")
    committer.open()
    assert committer.offer(make_unit(cfg, writer=0, partition=0, start=0, end=10, epoch=1)) is None
    assert committer.offer(make_unit(cfg, writer=1, partition=1, start=0, end=10, epoch=1)).records == 20  # first positions
    assert committer.offer(make_unit(cfg, writer=0, partition=0, start=10, end=20, epoch=2)) is None
    assert committer.offer(make_unit(cfg, writer=1, partition=1, start=10, end=20, epoch=2)) is None  # small: waits
    time.sleep(1.1)
    result = committer.offer(make_unit(cfg, writer=0, partition=0, start=20, end=30, epoch=3))
    assert result is not None and result.records == 20  # interval 2 of both writers, not writer 0's interval 3
    assert committed_position(load_catalog(cfg.catalog).load_table(cfg.table.identifier), "paired").offsets == \
        {0: 20, 1: 20}
    for writer, partition in ((1, 1), (0, 0)):
        last = make_unit(cfg, writer=writer, partition=partition, start=30 if writer == 0 else 20,
                         end=40 if writer == 0 else 30, epoch=4 if writer == 0 else 3)
        last.final = True
        committer.offer(last)
    assert committer.writers_finished
    assert sorted(table_ids(cfg)) == sorted(list(range(40)) + list(range(30)))
    committer.close()


def test_second_committer_is_fenced_and_nothing_is_duplicated(config) -> None:
    first = Committer(config, parallelism=1, run_id="first")
    second = Committer(config, parallelism=1, run_id="second")
    first.open()
    second.open()  # both saw the same (empty) table
    first.offer(make_unit(config, 0, partition=0, start=0, end=100))
    with pytest.raises(FencedError, match="another ingest instance"):
        second.offer(make_unit(config, 0, partition=0, start=0, end=100))
    ids = table_ids(config)
    assert ids == list(range(100)) and not duplicates(ids)
    # The fenced instance, restarted, resumes where the table says and continues the chain.
    restarted = Committer(config, parallelism=1, run_id="restarted")
    restarted.open()
    restarted.offer(make_unit(config, 0, partition=0, start=100, end=150))
    assert table_ids(config) == list(range(150))
    for c in (first, second, restarted):
        c.close()


def test_fencing_leaves_a_marker_and_each_run_counts_only_its_own_commits(config) -> None:
    from dataclasses import replace

    from streamberg.ingest.run_folder import RunFolder
    from streamberg.table_meta.offsets import FENCED_MESSAGE, consumed_by_run

    first, second = Committer(config, 1, "first"), Committer(config, 1, "second")
    first.open()
    second.open()
    first.offer(replace(make_unit(config, 0, partition=0, start=0, end=100), messages=100))
    with pytest.raises(FencedError):
        second.offer(replace(make_unit(config, 0, partition=0, start=0, end=100), messages=100))
    # The driver stops the run on this marker instead of letting Flink restart the committer.
    assert FENCED_MESSAGE in (RunFolder.of(config, "second").fenced() or "")
    after_first = load_catalog(config.catalog).load_table(config.table.identifier).current_snapshot().snapshot_id
    # Writers that started before another instance's commit, with a committer opened after it:
    # fenced too (not a chain "overlap", which Flink would restart).
    late = Committer(config, 1, "late")
    late.open()
    with pytest.raises(FencedError, match="writers started partition 0 at offset 0"):
        late.offer(replace(make_unit(config, 0, partition=0, start=0, end=100), messages=100))
    third = Committer(config, 1, "third")
    third.open()
    third.offer(replace(make_unit(config, 0, partition=0, start=100, end=150), messages=50))
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    topic = config.kafka.topic
    assert [consumed_by_run(table, topic, run) for run in ("first", "second", "late", "third")] == [100, 0, 0, 50]
    assert consumed_by_run(table, topic, "first", since_snapshot_id=after_first) == 0  # older than the start
    assert committed_position(table, topic).consumed_total == 150
    for c in (first, second, late, third):
        c.close()


class _RacingCatalog:
    """The real catalog, except that right after the committer reads the table, another
    process (here: a compactor-like append without offsets) commits first."""

    def __init__(self, catalog, config, races: int):
        self._catalog, self._config, self.races = catalog, config, races

    def __getattr__(self, name):
        return getattr(self._catalog, name)

    def load_table(self, identifier):
        table = self._catalog.load_table(identifier)
        if self.races and identifier == self._config.table.identifier:
            self.races -= 1
            other = self._catalog.load_table(identifier)
            with other.transaction() as tx:  # a snapshot with no offsets, as the compactor makes
                with tx.update_snapshot(snapshot_properties={"streamberg.compactor": "simulated"}).fast_append():
                    pass
        return table


def test_commit_conflicts_are_retried_without_losing_files(config, caplog) -> None:
    committer = Committer(config, parallelism=1, run_id="racer")
    committer.open()
    committer.catalog = _RacingCatalog(committer.catalog, config, races=2)
    result = committer.offer(make_unit(config, 0, partition=0, start=0, end=80))
    assert result.attempts == 3  # two lost races, then success
    assert table_ids(config) == list(range(80))
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    # The offsets are found through the foreign snapshots on the lineage.
    assert committed_position(table, config.kafka.topic).offsets == {0: 80}
    committer.close()


def _dlq_rows(config) -> list[tuple[int, int, str]]:
    rows = load_catalog(config.catalog).load_table(config.ingest_target.dead_letter_table).scan().to_arrow()
    return sorted(zip(rows.column("partition").to_pylist(), rows.column("offset").to_pylist(),
                      rows.column("reason").to_pylist()))


def _files_under(path: str) -> set[str]:
    root = Path(path.removeprefix("file://"))
    return {str(p) for p in root.rglob("*.parquet")} if root.exists() else set()


class _CrashBeforeMainAppend(Committer):
    """Dies (as kill -9 would) right after writing its dead letters, before the main append."""

    def _write_dead_letters(self, dead):
        path = super()._write_dead_letters(dead)
        raise SystemExit(f"killed after writing {path}")


class _CrashAfterMainCommit(Committer):
    """Dies right after its main commit, before its dead letters join their table."""

    def _apply_dead_letters(self) -> None:
        if getattr(self, "opened", False):
            raise SystemExit("killed after the main commit")
        self.opened = True
        super()._apply_dead_letters()


def test_a_crash_before_the_main_append_leaves_no_dead_letter_row(config) -> None:
    # The runbook path that used to duplicate: crash between the two appends, raise the limit
    # (here: the record is valid on the re-read), restart, replay the dead letters.
    crashed = _CrashBeforeMainAppend(config, parallelism=1, run_id="crashed")
    crashed.open()
    with pytest.raises(SystemExit):
        crashed.offer(make_unit(config, 0, partition=0, start=0, end=50, dead=(3, 17, 42)))
    assert _dlq_rows(config) == []
    restarted = Committer(config, parallelism=1, run_id="restarted")
    restarted.open()
    restarted.offer(make_unit(config, 0, partition=0, start=0, end=20, dead=(17,)))  # 3 is valid now
    restarted.offer(make_unit(config, 0, partition=0, start=20, end=60, dead=(42, 55)))
    assert _dlq_rows(config) == [(0, 17, "test reason"), (0, 42, "test reason"), (0, 55, "test reason")]
    assert table_ids(config) == [i for i in range(60) if i not in (17, 42, 55)]
    from streamberg.ingest.replay import replay_dead_letters

    outcome = replay_dead_letters(config)  # the rows still do not decode (b"bad"): nothing lands twice
    assert outcome.records_added == 0 and not duplicates(table_ids(config))
    restarted.close()


def test_a_crash_after_the_main_commit_is_repaired_by_the_next_open(config, spark) -> None:
    crashed = _CrashAfterMainCommit(config, parallelism=1, run_id="crashed")
    crashed.open()
    with pytest.raises(SystemExit):
        crashed.offer(make_unit(config, 0, partition=0, start=0, end=50, dead=(3, 17)))
    assert table_ids(config) == [i for i in range(50) if i not in (3, 17)]
    assert _dlq_rows(config) == []  # named by the main commit, not yet in its table
    for run in ("next", "and-next"):  # the first open adds them; the second adds nothing again
        committer = Committer(config, parallelism=1, run_id=run)
        committer.open()
        committer.close()
        assert _dlq_rows(config) == [(0, 3, "test reason"), (0, 17, "test reason")]
    from tests.helpers import spark_table

    # An independent reader (Spark's own Iceberg catalog) sees the same rows.
    rows = spark_table(spark, config, config.ingest_target.dead_letter_table).select("offset").collect()
    assert sorted(r["offset"] for r in rows) == [3, 17]


def test_a_fenced_committer_writes_no_dead_letter_and_no_file(config) -> None:
    live, fenced = Committer(config, 1, "live"), Committer(config, 1, "fenced")
    live.open()
    fenced.open()  # both saw the same (empty) table
    dlq_location = load_catalog(config.catalog).load_table(config.ingest_target.dead_letter_table).location()
    # The live instance commits [0, 100) first; its decoder finds 5 and 7 bad.
    live.offer(make_unit(config, 0, partition=0, start=0, end=100, dead=(5, 7)))
    files_before = _files_under(dlq_location)
    # The fenced one judged the same range differently (another config): nothing of it may land.
    with pytest.raises(FencedError):
        fenced.offer(make_unit(config, 0, partition=0, start=0, end=100, dead=(5, 6, 7, 8)))
    assert _dlq_rows(config) == [(0, 5, "test reason"), (0, 7, "test reason")]
    assert _files_under(dlq_location) == files_before  # not even an orphan file
    # The live instance goes on: a later bad record is in the dead-letter table, once.
    live.offer(make_unit(config, 0, partition=0, start=100, end=150, dead=(120,)))
    assert [o for _, o, _ in _dlq_rows(config)] == [5, 7, 120]
    assert table_ids(config) == [i for i in range(150) if i not in (5, 7, 120)]
    live.close()
    fenced.close()


def test_a_committer_fenced_between_its_check_and_its_append_leaves_no_dead_letter(config) -> None:
    """The race the first fence check cannot see: another instance commits after it."""
    live = Committer(config, 1, "live")
    slow = Committer(config, 1, "slow")
    live.open()
    slow.open()
    dlq_location = load_catalog(config.catalog).load_table(config.ingest_target.dead_letter_table).location()
    write = slow._write_dead_letters

    def write_then_lose_the_race(dead):
        path = write(dead)
        live.offer(make_unit(config, 0, partition=0, start=0, end=40, dead=(1,)))
        return path

    slow._write_dead_letters = write_then_lose_the_race
    files_before = _files_under(dlq_location)
    with pytest.raises(FencedError):
        slow.offer(make_unit(config, 0, partition=0, start=0, end=40, dead=(1, 2, 3)))
    assert _dlq_rows(config) == [(0, 1, "test reason")]
    # Only the live instance's own file is left: the slow one deleted what it wrote.
    assert len(_files_under(dlq_location) - files_before) == 1
    live.close()
    slow.close()


def test_replay_of_dead_letters_takes_only_rows_below_the_committed_offsets(config) -> None:
    """A dead-letter row beyond the main table's offsets (a DLQ edited by hand, or written by an
    older version before the outbox) is the ingest's to read, not the replay's."""
    from streamberg.ingest.dead_letters import dead_letter_rows
    from streamberg.ingest.replay import replay_dead_letters

    committer = Committer(config, 1, "one")
    committer.open()
    committer.offer(make_unit(config, 0, partition=0, start=0, end=10, dead=(4,)))
    valid = b'{"id": 10, "ts": "2026-11-21T00:00:00Z", "user_id": "u1", "amount": 2.5}'
    dlq = load_catalog(config.catalog).load_table(config.ingest_target.dead_letter_table)
    dlq.append(dead_letter_rows([DeadLetter(0, 10, None, None, valid, "old version"),
                                 DeadLetter(1, 0, None, None, valid, "old version")], config.kafka.topic, "old"))
    outcome = replay_dead_letters(config)
    assert outcome.beyond_committed == 2 and outcome.records_added == 0
    assert table_ids(config) == [i for i in range(10) if i != 4]
    committer.close()
