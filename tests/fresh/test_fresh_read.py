"""Fresh reads (fresh/): a table's pinned snapshot plus its Kafka tail, exact.

Against the real broker and the real ingest code (Writer -> Committers, in-process: commits
with the same offsets, files and dead letters a Flink run makes). Every read's rows are
compared with what the test itself produced: per partition, the records below the read's
watermark, dead letters excluded, each id once. DuckDB (`streamberg query`) counts the same.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from streamberg.common.broker import ensure_topic
from streamberg.common.errors import FreshReadRefused
from streamberg.fresh import read
from streamberg.fresh.tail import tail_identity
from streamberg.ingest.dead_letters import open_tables
from tests.helpers import config_at, wait_for, write_config
from tests.runbooks.inprocess import cli, event, ingest_until, ingest_while

POISON = b"{not json"


class Produced:
    """Every record produced, by (partition, offset), from the delivery reports."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
        self.at: dict[tuple[int, int], int | None] = {}  # (partition, offset) -> id (None: poison)
        self.lock = threading.Condition()

    def send(self, partition: int, ids: list[int | None], **fields) -> None:
        """Events with `ids` (None: a poison record) to `partition`; `fields` as tests' `event`."""
        for i in ids:
            def delivered(err, msg, i=i) -> None:
                assert err is None, err
                with self.lock:
                    self.at[(msg.partition(), msg.offset())] = i
                    self.lock.notify_all()
            self.producer.produce(self.topic, value=POISON if i is None else event(i, **fields), partition=partition,
                                  on_delivery=delivered)
            self.producer.poll(0)
        assert self.producer.flush(30) == 0

    def close(self) -> None:
        self.producer.flush(5)
        del self.producer  # librdkafka's threads stop with the handle, before the broker does

    def below(self, watermarks: dict[int, int]) -> list[int]:
        """The valid ids of every record below the watermarks (what an exact read returns),
        once the delivery report of each has come (a read may see a record before its
        producer heard it landed)."""
        with self.lock:
            reported = self.lock.wait_for(
                lambda: all(sum(1 for (q, o) in self.at if q == p and o < end) == end
                            for p, end in watermarks.items()), timeout=30)
            assert reported, f"delivery reports below {watermarks} did not all come"
            return sorted(i for (p, o), i in self.at.items() if i is not None and o < watermarks.get(p, 0))


def _ids(result) -> list[int]:
    return sorted(result.rows.column("id").to_pylist())


@pytest.fixture
def table(tmp_path: Path, broker: str):
    path = write_config(tmp_path, broker, ingest={"parallelism": 1})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 2)
    open_tables(config)
    produced = Produced(broker, config.kafka.topic)
    yield path, config, produced
    produced.close()


def test_fresh_read_is_the_snapshot_plus_the_tail(table) -> None:
    path, config, produced = table
    produced.send(0, [*range(0, 100), None, *range(100, 150)])
    produced.send(1, [*range(1000, 1080)])
    ingest_until(config, {0: 151, 1: 80})  # one commit: everything so far
    produced.send(0, [*range(150, 230), None, None, *range(230, 240)])
    produced.send(1, [*range(1080, 1100)])

    committed = read(path, fresh=False)
    assert _ids(committed) == list(range(0, 150)) + list(range(1000, 1080))
    fresh = read(path)
    assert fresh.bounds.watermarks == {0: 243, 1: 100}
    assert fresh.bounds.committed == {0: 151, 1: 80}
    ids = _ids(fresh)
    assert ids == produced.below(fresh.bounds.watermarks) == list(range(0, 240)) + list(range(1000, 1100))
    assert len(set(ids)) == len(ids) == 340
    assert fresh.snapshot_rows == 230 and fresh.tail.rows.num_rows == 110 and fresh.tail.rejected == 2
    # To the kept tail's end where no tail is kept: the full read, to Kafka's end.
    whole = read(path, until="kept")
    assert whole.until == "now" and _ids(whole) == ids
    # Filter and columns applied to both halves.
    some = read(path, columns=["id"], row_filter="id >= 140 and id < 1090")
    assert some.rows.column_names == ["id"]
    assert _ids(some) == list(range(140, 240)) + list(range(1000, 1090))
    # DuckDB over the same read: rows and distinct keys.
    sql = "SELECT count(*) AS n, count(DISTINCT id) AS d, min(id) AS lo, max(id) AS hi FROM db.events"
    out = json.loads(cli("query", "--config", str(path), "--fresh", "--json", sql).stdout)
    assert out == {"n": 340, "d": 340, "lo": 0, "hi": 1099}
    out = json.loads(cli("query", "--config", str(path), "--json", sql).stdout)
    assert out == {"n": 230, "d": 230, "lo": 0, "hi": 1079}


@pytest.mark.slow
def test_every_read_is_exact_while_the_ingest_commits(table) -> None:
    """Producers and commits race the reads: each read has, per partition, every record below
    its watermark once, whichever commit it pinned."""
    path, config, produced = table
    produced.send(0, list(range(0, 50)))
    produced.send(1, list(range(10_000_000, 10_000_050)))
    ingest_until(config, {0: 50, 1: 50})
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        n = 50
        try:
            while not stop.is_set():
                produced.send(0, [*range(n, n + 40), None])
                produced.send(1, list(range(10_000_000 + n, 10_000_000 + n + 40)))
                n += 40
                stop.wait(0.02)  # a steady stream, not a flood: every read then spans a few commits
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def commit() -> None:
        try:
            while not stop.is_set():
                with produced.lock:
                    ends: dict[int, int] = {}
                    for p, o in produced.at:
                        ends[p] = max(ends.get(p, 0), o + 1)
                ingest_until(config, ends)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=produce), threading.Thread(target=commit)]
    for thread in threads:
        thread.start()
    snapshots = set()
    try:
        deadline = time.monotonic() + 20
        reads = 0
        while time.monotonic() < deadline or len(snapshots) < 3:
            result = read(path)
            ids = _ids(result)
            assert ids == produced.below(result.bounds.watermarks), result.to_json()
            assert len(set(ids)) == len(ids)
            snapshots.add(result.bounds.snapshot_id)
            reads += 1
            assert time.monotonic() < deadline + 60, f"only {len(snapshots)} snapshots seen"
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not errors, errors
    assert reads >= 5 and len(snapshots) >= 3


def test_what_cannot_be_exact_is_refused(table, broker: str) -> None:
    path, config, produced = table
    produced.send(0, list(range(0, 20)))
    produced.send(1, list(range(20, 30)))
    # Nothing committed yet: where the ingest starts is its own rule, not guessed.
    with pytest.raises(FreshReadRefused, match="recorded no position"):
        read(path)
    assert _ids(read(path, fresh=False)) == []
    ingest_until(config, {0: 20, 1: 10})
    assert _ids(read(path)) == list(range(0, 30))
    # A filter on a column the table lacks, a column it lacks: one sentence each.
    with pytest.raises(FreshReadRefused, match="no column nope"):
        read(path, columns=["nope"])
    with pytest.raises(FreshReadRefused, match="does not parse"):
        read(path, row_filter="id >>> 3")
    refused = cli("query", "--config", str(path), "--fresh", "SELECT * FROM db.nothing", check=False)
    assert refused.returncode == 2 and "names none of the config's tables" in refused.stderr
    for sql in ("SELEC count(*) FROM db.events", "SELECT nope FROM db.events"):  # invalid input: exit 2
        refused = cli("query", "--config", str(path), sql, check=False)
        assert refused.returncode == 2 and "DuckDB:" in refused.stderr and "Traceback" not in refused.stderr, \
            refused.stderr
    # The query reads the tables and nothing else: no files, and no setting turns that back.
    for sql in ("SELECT count(*) FROM db.events, read_csv('/etc/hostname')",
                "SET enable_external_access=true; SELECT count(*) FROM db.events"):
        refused = cli("query", "--config", str(path), sql, check=False)
        assert refused.returncode == 1 and "DuckDB:" in refused.stderr and "Traceback" not in refused.stderr, \
            refused.stderr
    # The topic recreated: the table's offsets are of another log.
    admin = AdminClient({"bootstrap.servers": broker})
    admin.delete_topics([config.kafka.topic])[config.kafka.topic].result(30)
    wait_for(lambda: config.kafka.topic not in admin.list_topics(timeout=5).topics, 30, "the topic's deletion")
    ensure_topic(broker, config.kafka.topic, 2)
    Produced(broker, config.kafka.topic).send(0, [1, 2])
    with pytest.raises(FreshReadRefused, match="recreated or truncated"):
        read(path)
    refused = cli("query", "--config", str(path), "--fresh", "SELECT count(*) FROM db.events", check=False)
    assert refused.returncode == 1 and "recreated or truncated" in refused.stderr


_INGEST_LOOP = """
import sys
from streamberg.common.config import load_config
from streamberg.common.watermarks import read_topic_watermarks
from tests.runbooks.inprocess import ingest_until
config = load_config(sys.argv[1])
settings = {"bootstrap.servers": config.kafka.bootstrap_servers, "group.id": "fresh-kill-loop"}
while True:
    marks = read_topic_watermarks(settings, config.kafka.topic, 10, read_ends=True)
    ingest_until(config, {p: marks.end(p) for p in marks.partitions})
"""


def test_reads_stay_exact_across_kill_9_of_the_ingest(table) -> None:
    """The ingest (the real writer and committer in a process of their own) is killed with
    SIGKILL twice while records arrive; every read before, between and after is exact."""
    import os
    import signal
    import subprocess
    import sys

    from streamberg.common.catalog import load_catalog

    path, config, produced = table
    root = Path(__file__).resolve().parents[2]
    stop = threading.Event()

    def produce() -> None:
        n = 0
        while not stop.is_set():
            produced.send(n % 2, list(range(n, n + 25)))
            n += 25
            stop.wait(0.02)

    def snapshots() -> int:
        return len(load_catalog(config.catalog).load_table(config.table.identifier).snapshots())

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        for _ in range(2):
            before = snapshots()
            loop = subprocess.Popen([sys.executable, "-c", _INGEST_LOOP, str(path)], cwd=root,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 60
            while snapshots() < before + 3:  # a few commits landed: kill it in the middle of its work
                assert loop.poll() is None and time.monotonic() < deadline, "the ingest loop made no commits"
                if snapshots():  # before the first commit a fresh read is refused (test above)
                    result = read(path)
                    assert _ids(result) == produced.below(result.bounds.watermarks)
            os.kill(loop.pid, signal.SIGKILL)
            loop.wait(30)
            for _ in range(3):
                result = read(path)
                ids = _ids(result)
                assert ids == produced.below(result.bounds.watermarks), result.to_json()
                assert len(set(ids)) == len(ids) and result.snapshot_rows > 0 and result.tail.records > 0
    finally:
        stop.set()
        producer.join(30)


def test_the_kept_tail_serves_reads_exactly(table) -> None:
    """`streamberg tail`'s keeper (fresh/cache.py) decodes the tail ahead of the reads: a read
    takes its rows from the segments, Kafka only past them; exact with the keeper ahead,
    behind a commit, missing a segment, and stopped."""
    from streamberg.fresh.cache import TailKeeper, cache_folder, cached_rows, segments
    from streamberg.table_meta.offsets import committed_position

    path, config, produced = table
    produced.send(0, list(range(0, 100)))
    produced.send(1, list(range(1000, 1100)))
    ingest_until(config, {0: 100, 1: 100})
    produced.send(0, [*range(100, 300), None])
    produced.send(1, list(range(1100, 1250)))
    stop = threading.Event()
    keeper = TailKeeper(config, stop)
    thread = threading.Thread(target=keeper.run)
    thread.start()
    folder = cache_folder(config)

    def kept_up_to(ends: dict[int, int]) -> None:
        deadline = time.monotonic() + 30
        while True:
            table_now = read(path, fresh=False).bounds
            _, resume, _ = cached_rows(folder, tail_identity(config, load_table(config)), 0,
                                       dict(table_now.committed))
            if all(resume.get(p, 0) >= end for p, end in ends.items()):
                return
            assert time.monotonic() < deadline and thread.is_alive(), f"kept up to {resume}, not {ends}"
            time.sleep(0.05)

    try:
        kept_up_to({0: 301, 1: 250})
        result = read(path)
        assert _ids(result) == produced.below(result.bounds.watermarks) == list(range(0, 300)) + list(range(1000, 1250))
        assert result.tail.cached == 351 and result.tail.rejected == 0  # the poison was dropped when kept
        from streamberg.monitoring.collect import collect_status
        from streamberg.monitoring.render import render_screen

        status = collect_status(config)  # what an operator sees of the kept tail
        assert status.tail_cache["alive"] and status.tail_cache["kept_records"] == 351
        assert status.tail_cache["past_kept_records"] == 0 and "keeper alive: 351 records" in render_screen(status)
        # More records than kept: the segments, then Kafka past them.
        produced.send(1, list(range(1250, 1300)))
        result = read(path)
        assert _ids(result) == produced.below(result.bounds.watermarks)
        assert 351 <= result.tail.cached <= 401
        # A commit covers the kept tail (the in-process ingest reads all there is): its segments
        # go; a read starts at the new offsets.
        ingest_until(config, {0: 301, 1: 300})
        committed = committed_position(load_table(config), config.kafka.topic).offsets
        wait_for(lambda: not any(s.next <= committed[s.partition] for s in segments(folder)), 30,
                 "the covered segments to be dropped", every=0.05)
        result = read(path)
        assert _ids(result) == produced.below(result.bounds.watermarks) and result.tail.records == 0
        # A segment lost in the middle: the chain stops there, Kafka reads the rest.
        produced.send(1, list(range(1300, 1400)))
        kept_up_to({0: 301, 1: 400})
        result = read(path)
        assert _ids(result) == produced.below(result.bounds.watermarks) and result.tail.cached == 100
        chain = [s for s in segments(folder) if s.partition == 1]
        chain[0].path.unlink()
        result = read(path)
        assert _ids(result) == produced.below(result.bounds.watermarks) and result.tail.cached < 100
    finally:
        stop.set()
        thread.join(30)
    result = read(path)  # the keeper stopped: no heartbeat, Kafka alone
    assert _ids(result) == produced.below(result.bounds.watermarks) and result.tail.cached == 0
    from streamberg.monitoring.collect import collect_status

    assert collect_status(config).tail_cache["alive"] is False


def test_the_ingests_own_kept_tail_serves_reads_exactly(tmp_path: Path, broker: str) -> None:
    """ingest.keep_tail: the ingest's writer keeps the rows it decodes (ingest/tail_spool.py)
    and a read takes them instead of decoding Kafka; exact with the kept tail complete, behind
    new records, broken by records held for a schema change, and after commits (which delete
    what they cover)."""
    from streamberg.fresh.cache import cached_rows
    from streamberg.table_meta.tail_segments import cache_folder, segments

    path = write_config(tmp_path, broker, ingest={"parallelism": 1, "keep_tail": True,
                                                   "commit_interval_seconds": 3600})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 2)
    open_tables(config)
    produced = Produced(broker, config.kafka.topic)
    folder = cache_folder(config)
    produced.send(0, list(range(0, 100)))
    produced.send(1, list(range(1000, 1100)))
    ingest_until(config, {0: 100, 1: 100})
    assert not segments(folder)  # the commit covered everything kept

    stop, failed = threading.Event(), []

    def run() -> None:  # the real writer and committer, as a job runs them, until stopped
        try:
            ingest_while(config, lambda _writer: stop.is_set(), run_id="kept")
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            failed.append(exc)

    def kept_up_to(ends: dict[int, int]) -> dict[int, int]:
        deadline = time.monotonic() + 30
        while True:
            committed = dict(read(path, fresh=False).bounds.committed)
            table_now = load_table(config)
            _, resume, _ = cached_rows(folder, tail_identity(config, table_now), table_now.schema().schema_id,
                                       committed)
            if all(resume.get(p, 0) >= end for p, end in ends.items()):
                return committed
            assert time.monotonic() < deadline and not failed, f"kept up to {resume}, not {ends}: {failed}"
            time.sleep(0.05)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        produced.send(0, [*range(100, 300), None])
        produced.send(1, list(range(1100, 1250)))
        committed = kept_up_to({0: 301, 1: 250})
        assert committed == {0: 100, 1: 100}  # nothing committed since: the rows are the kept tail's
        result = read(path)
        assert _ids(result) == produced.below(result.bounds.watermarks) == list(range(0, 300)) + list(range(1000, 1250))
        assert result.tail.cached == 351 and result.tail.rejected == 0  # the poison dead-lettered as it was kept
        assert len(segments(folder)) < 10
        from streamberg.monitoring.collect import collect_status
        from streamberg.monitoring.render import render_screen

        status = collect_status(config)  # what an operator sees: who keeps it, how much
        assert status.tail_cache["kept_by"] == "ingest" and status.tail_cache["kept_records"] == 351
        assert "the ingest alive: 351 records" in render_screen(status)
        # To the kept tail's end, asking the broker nothing: exact to where it ends.
        kept = read(path, until="kept", row_filter="id >= 1000")
        assert kept.until == "kept" and kept.bounds.watermarks == {0: 301, 1: 250} and kept.tail.cached == 351
        assert _ids(kept) == [i for i in produced.below(kept.bounds.watermarks) if i >= 1000]
        counted = cli("query", "--config", str(path), "--fresh", "--until", "kept", "--json",
                      "SELECT count(*) AS n, count(DISTINCT id) AS d FROM db.events")  # DuckDB, the same read
        assert json.loads(counted.stdout.splitlines()[0]) == {"n": 550, "d": 550}
        # Records past the kept tail: Kafka serves them.
        produced.send(1, list(range(1250, 1260)))
        result = read(path)
        assert _ids(result) == produced.below(result.bounds.watermarks) and 351 <= result.tail.cached <= 361
        # A record with a field the table lacks is held for the committer's schema change: nothing
        # is kept for it, the chain of its partition breaks there and Kafka serves the rest.
        produced.send(1, [1260], device="d1")
        produced.send(1, list(range(1261, 1300)))
        produced.send(0, list(range(300, 320)))
        kept_up_to({0: 321})
        result = read(path)
        assert _ids(result) == produced.below(result.bounds.watermarks)
        assert result.tail.cached < result.tail.records
    finally:
        stop.set()
        thread.join(60)
        produced.close()
    assert not failed, failed
    # The final commit covered every kept row: nothing is left, and reads are the table's
    # (to the kept tail's end too: where nothing is kept, that is the snapshot's offsets).
    committed = dict(read(path, fresh=False).bounds.committed)
    assert committed == {0: 321, 1: 300}
    assert not [s for s in segments(folder) if s.next <= committed[s.partition]]
    result = read(path)
    assert _ids(result) == list(range(0, 320)) + list(range(1000, 1300)) and result.tail.records == 0
    assert _ids(read(path, until="kept")) == _ids(result)


def load_table(config):
    from streamberg.common.catalog import load_catalog

    return load_catalog(config.catalog).load_table(config.table.identifier)


def test_kept_segments_merge_by_size_tier(tmp_path: Path) -> None:
    """Eight contiguous segments of one size tier become one; a reader chains the same rows
    before and after (and while both exist)."""
    import pyarrow as pa

    from streamberg.fresh.cache import OFFSET_COLUMN, TailKeeper, cache_folder, cached_rows, segments
    from streamberg.table_meta.tail_segments import TailIdentity, beat, write_segment

    config = config_at(write_config(tmp_path, "127.0.0.1:9"))
    keeper = TailKeeper(config, threading.Event())
    identity = keeper.identity = TailIdentity("00000000-0000-0000-0000-000000000002", "events", "")
    folder = cache_folder(config)
    folder.mkdir(parents=True)
    beat(folder)
    for n in range(9):  # offsets 100..189, ten a segment
        first = 100 + 10 * n
        rows = pa.table({"id": list(range(first, first + 10)), OFFSET_COLUMN: pa.array(range(first, first + 10),
                                                                                            type=pa.int64())})
        write_segment(folder, identity, 0, 3, first, first + 10, rows)

    def chained(start: int) -> list[int]:
        parts, resume, covered = cached_rows(folder, identity, 0, {3: start})
        assert resume == {3: 190} and covered == 190 - start
        return sorted(i for part in parts for i in part.column("id").to_pylist())

    assert chained(105) == list(range(105, 190))
    assert keeper._merge(3, 0) and not keeper._merge(3, 0)  # one run of eight; the ninth waits
    assert [(s.first, s.next) for s in segments(folder)] == [(100, 180), (180, 190)]
    assert chained(105) == list(range(105, 190)) and chained(185) == list(range(185, 190))
