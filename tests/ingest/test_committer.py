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

from streamberg.common.catalog import load_catalog, open_tables
from streamberg.common.errors import FencedError, OffsetChainError
from streamberg.common.offsets import committed_position
from streamberg.ingest.committer import Committer, chain_offsets
from streamberg.ingest.files import PartitionedFileWriter
from streamberg.ingest.units import DeadLetter, FlushUnit
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

    from streamberg.common.offsets import FENCED_MESSAGE, consumed_by_run
    from streamberg.ingest.committer import run_dir

    first, second = Committer(config, 1, "first"), Committer(config, 1, "second")
    first.open()
    second.open()
    first.offer(replace(make_unit(config, 0, partition=0, start=0, end=100), messages=100))
    with pytest.raises(FencedError):
        second.offer(replace(make_unit(config, 0, partition=0, start=0, end=100), messages=100))
    # The driver stops the run on this marker instead of letting Flink restart the committer.
    assert FENCED_MESSAGE in (run_dir(config, "second") / "fenced").read_text()
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


def test_dead_letters_are_not_duplicated_when_a_commit_is_replayed(config) -> None:
    committer = Committer(config, parallelism=1, run_id="dlq")
    committer.open()
    unit = make_unit(config, 0, partition=0, start=0, end=50, dead=(3, 17, 42))
    # Crash after the dead-letter commit but before the table commit...
    committer._commit_dead_letters(unit.dead_letters, {0: 50})
    # ...then the restarted job replays the same offsets, with differently cut units.
    replay = Committer(config, parallelism=1, run_id="dlq-replay")
    replay.open()
    replay.offer(make_unit(config, 0, partition=0, start=0, end=20, dead=(3, 17)))
    replay.offer(make_unit(config, 0, partition=0, start=20, end=60, dead=(42, 55)))
    dlq = load_catalog(config.catalog).load_table(config.dead_letter_table).scan().to_arrow()
    assert sorted(dlq.column("offset").to_pylist()) == [3, 17, 42, 55]
    assert set(dlq.column("reason").to_pylist()) == {"test reason"}
    assert table_ids(config) == [i for i in range(60) if i not in (3, 17, 42, 55)]
    committer.close()
    replay.close()
