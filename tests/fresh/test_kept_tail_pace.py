"""The ingest's kept tail keeps up: under a steady stream every record a writer has read is in
the kept tail when its poll returns (ingest/tail_spool.py writes each decoded batch at once: no
size or age threshold holds rows back), so a read to the kept tail's end trails Kafka by one
poll at most. And a keeper that dies: reads fall back to Kafka and stay exact.

Real broker, the real writer and committer in-process (tests/runbooks/inprocess.py), a producer
thread sending while the writer polls; checked after every poll, not timed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from confluent_kafka import Producer

from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.fresh import read
from streamberg.fresh.cache import cached_rows
from streamberg.fresh.tail import tail_identity
from streamberg.ingest.dead_letters import open_tables
from streamberg.table_meta.offsets import committed_position, recorded_starts
from streamberg.table_meta.tail_segments import cache_folder
from tests.helpers import config_at, wait_for, write_config
from tests.runbooks.inprocess import event, ingest_while

PARTITIONS = 2
RECORDS = 6000


def test_the_kept_tail_holds_every_record_read_when_each_poll_returns(tmp_path: Path, broker: str) -> None:
    path = write_config(tmp_path, broker, ingest={"parallelism": 1, "keep_tail": True, "commit_interval_seconds": 3600,
                                                   "poll_timeout_seconds": 0.05, "max_poll_records": 500})
    config = config_at(path)
    topic = config.kafka.topic
    ensure_topic(broker, topic, PARTITIONS)
    open_tables(config)
    folder = cache_folder(config)
    sent = threading.Event()

    def stream() -> None:  # a steady stream: 100 records every 20 ms, both partitions
        producer = Producer({"bootstrap.servers": broker, "linger.ms": 1})
        for i in range(RECORDS):
            producer.produce(topic, value=event(i), partition=i % PARTITIONS)
            if i % 100 == 99:
                producer.poll(0)
                time.sleep(0.02)
        assert producer.flush(30) == 0
        sent.set()

    checked: list[dict[int, int]] = []  # after each poll that read records: the kept ends
    behind: list[tuple[dict[int, int], dict[int, int]]] = []
    catalog = load_catalog(config.catalog)
    state: dict = {}
    deadline = time.monotonic() + 120

    def after_each_poll(writer) -> bool:
        assert time.monotonic() < deadline, f"the writer read {writer.position}"
        position = {int(k.rsplit("/", 1)[1]): v for k, v in writer.position.items() if k.startswith(topic + "/")}
        if position and not state.get("starts"):  # recorded when the lane opened (before its first poll)
            table = catalog.load_table(config.table.identifier)
            state["identity"], state["schema"] = tail_identity(config, table), table.schema().schema_id
            state["starts"] = recorded_starts(table, topic)
            assert state["starts"] == {p: 0 for p in range(PARTITIONS)}
        if position and any(o > state["starts"].get(p, 0) for p, o in position.items()):
            _, kept_to, _ = cached_rows(folder, state["identity"], state["schema"], dict(state["starts"]))
            checked.append(kept_to)
            if any(kept_to.get(p, 0) < o for p, o in position.items()):
                behind.append((position, kept_to))
        return sent.is_set() and sum(position.values()) >= RECORDS

    producer = threading.Thread(target=stream)
    producer.start()
    try:
        ingest_while(config, after_each_poll, run_id="pace")
    finally:
        producer.join(60)
    assert len(checked) >= 10, f"only {len(checked)} polls read records: not a stream"
    assert not behind, f"{len(behind)} of {len(checked)} polls left records out of the kept tail: {behind[:3]}"
    assert checked[-1] == {p: RECORDS // PARTITIONS for p in range(PARTITIONS)}
    # The finished run committed what it read: an independent count of the table's rows.
    table = catalog.load_table(config.table.identifier)
    assert dict(committed_position(table, topic).offsets) == {p: RECORDS // PARTITIONS for p in range(PARTITIONS)}
    ids = read(path, fresh=False).rows.column("id").to_pylist()
    assert len(ids) == len(set(ids)) == RECORDS


def test_reads_while_the_keeper_has_died_fall_back_to_kafka_and_stay_exact(tmp_path: Path, broker: str) -> None:
    """A keeper killed with SIGKILL leaves its segments and its heartbeat behind: reads (to Kafka's
    end, and asked for the kept tail's end) take none of them and read Kafka, exact, not refused."""
    import os
    import signal
    import subprocess
    import sys

    from streamberg.table_meta.tail_segments import alive, segments
    from tests.runbooks.inprocess import ingest_until, produce_values

    path = write_config(tmp_path, broker, ingest={"parallelism": 1})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 1)
    open_tables(config)
    produce_values(config, [event(i) for i in range(100)], 0, 1)
    ingest_until(config, {0: 100})
    produce_values(config, [event(i) for i in range(100, 500)], 0, 1)
    folder = cache_folder(config)
    keeper = subprocess.Popen([sys.executable, "-m", "streamberg.cli.main", "tail", "--config", str(path)],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # The keeper serves the 400 records past the commit.
        wait_for(lambda: (k := read(path, until="kept")).until == "kept" and k.tail is not None and k.tail.cached == 400,
                 60, "the keeper to keep the 400 records past the commit", every=0.1, proc=keeper,
                 log=lambda: read(path, until="kept").to_json())
        os.kill(keeper.pid, signal.SIGKILL)
        keeper.wait(10)
        assert segments(folder) and not alive(folder)  # its files stay; its heartbeat is not trusted
        produce_values(config, [event(i) for i in range(500, 520)], 0, 1)
        for until in ("kept", "now"):
            result = read(path, until=until)  # type: ignore[arg-type]
            ids = result.rows.column("id").to_pylist()
            assert result.until == "now" and result.tail is not None and result.tail.cached == 0
            assert len(ids) == len(set(ids)) == sum(result.bounds.watermarks.values()) == 520
    finally:
        if keeper.poll() is None:
            keeper.kill()
