"""A position Kafka lost is never passed over in silence (ingest.on_lost_offsets).

Retention needs a broker whose low watermark moves: the session's tansu keeps every record,
so these tests use librdkafka's mock cluster (tests/fixtures/mock_kafka.py), which deletes a
partition's oldest segments as it grows. The writer and committer are the real ones, with a
real catalog and Parquet; the recreated-topic case runs the whole Flink job on tansu
(tests/ingest/test_lost_offsets_flink.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition

from streamberg.common.catalog import load_catalog
from streamberg.common.errors import LostOffsetsError
from streamberg.ingest.committer import Committer
from streamberg.ingest.dead_letters import open_tables
from streamberg.table_meta.offsets import committed_position
from streamberg.table_meta.table_facts import table_facts
from tests.helpers import config_at, streamberg, table_ids, write_config
from tests.ingest.one_table import OneTableWriter
from tests.ingest.test_committer import make_unit

# Fetch a few records at a time, so the writer's consumer has not read ahead when
# retention passes its position.
SMALL_FETCHES = {"queued.max.messages.kbytes": 1, "queued.min.messages": 1, "fetch.max.bytes": 1024,
                 "message.max.bytes": 1000,
                 "max.partition.fetch.bytes": 1024}


def _config(tmp_path: Path, bootstrap: str, policy: str, **kafka: object):
    path = write_config(tmp_path, bootstrap, ingest={"on_lost_offsets": policy, "commit_interval_seconds": 0.5,
                                                     "parallelism": 1},
                        extra={"monitoring": {"broker_timeout_seconds": 10}})
    if kafka:
        document = json.loads(json.dumps(__import__("yaml").safe_load(path.read_text())))
        document["kafka"].update(kafka)
        path.write_text(__import__("yaml").safe_dump(document))
    config = config_at(path)
    open_tables(config)
    return path, config


def _events(config, partition: int, ids: range) -> None:
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap_servers, "log_level": 0})
    for i in ids:
        producer.produce(config.kafka.topic, partition=partition, value=json.dumps(
            {"id": i, "ts": "2026-11-25T00:00:00Z", "user_id": f"u{i}", "amount": 1.0}).encode())
    producer.flush(30)


def _commit_first_ten(config) -> None:
    """The table holds offsets [0, 10) of partition 0, as an earlier ingest left it."""
    _events(config, 0, range(10))
    committer = Committer(config, parallelism=1, run_id="earlier")
    committer.open()
    committer.offer(replace(make_unit(config, 0, partition=0, start=0, end=10), messages=10, final=True))
    committer.close()


def _poll_units(writer: OneTableWriter, seconds: float = 20.0, until=lambda units: bool(units)) -> list:
    units, deadline = [], time.monotonic() + seconds
    while not until(units):
        assert time.monotonic() < deadline, f"no unit in {seconds} s; position {writer.position}"
        unit = writer.poll()
        if unit is not None and not unit.empty:
            units.append(unit)
    return units


def test_fail_names_the_partition_the_committed_offset_and_the_watermarks(tmp_path: Path, mock_kafka) -> None:
    _, config = _config(tmp_path, mock_kafka.bootstrap, "fail")
    _commit_first_ten(config)
    low = mock_kafka.produce_until_low_passes(config.kafka.topic, 10)
    writer = OneTableWriter(config, 0, 1, "after-retention")
    with pytest.raises(LostOffsetsError) as refused:
        writer.open()
    writer.close()
    message = str(refused.value)
    assert f"{config.kafka.topic}[0]: the table's committed offset 10 is below the low watermark" in message
    assert f"low {low}" in message and f"[10, {low})" in message and "skip-and-record" in message
    # Nothing moved in the table.
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert committed_position(table, config.kafka.topic).offsets == {0: 10}


def test_skip_and_record_reads_on_from_the_low_watermark_and_every_report_names_the_gap(
        tmp_path: Path, mock_kafka) -> None:
    path, config = _config(tmp_path, mock_kafka.bootstrap, "skip-and-record")
    _commit_first_ten(config)
    low = mock_kafka.produce_until_low_passes(config.kafka.topic, 10)
    _events(config, 0, range(1000, 1050))  # after the filler: valid records to land
    writer = OneTableWriter(config, 0, 1, "skipping")
    writer.open()
    assert writer.position[0] == low
    committer = Committer(config, parallelism=1, run_id="skipping")
    committer.open()
    try:
        units = _poll_units(writer, until=lambda got: sum(u.ranges.get(0, (0, 0))[1] for u in got[-1:]) > 0
                            and got[-1].ranges[0][1] >= writer.consumer.get_watermark_offsets(
                                TopicPartition(config.kafka.topic, 0), cached=False)[1])
        units.append(writer.finish())
        for unit in units:
            committer.offer(unit)
    finally:
        writer.close()
        committer.close()
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    position = committed_position(table, config.kafka.topic)
    assert [(s.partition, s.from_offset, s.to_offset, s.kind) for s in position.skips] == [(0, 10, low, "lost")]
    assert position.lost_total == low - 10
    assert set(range(1000, 1050)) <= set(table_ids(config))
    facts = table_facts(config)
    assert facts["counts_match"] and not facts["reconciles"] and facts["lost_offsets"] == low - 10
    text = streamberg("table", "--config", str(path)).stdout
    assert "reconciles       NO:" in text and f"offsets [10, {low:,}) lost ({low - 10:,})" in text
    status = json.loads(streamberg("status", "--config", str(path), "--json", check=False).stdout)
    assert status["ingest"]["lost_offsets"] == low - 10
    assert status["ingest"]["offset_skips"][0]["kind"] == "lost"
    assert any(f["check"] == "lost_offsets" for f in status["health"]["findings"])
    metrics = streamberg("metrics", "--config", str(path), "--once", check=False).stdout
    assert f"streamberg_ingest_lost_offsets_total{{table=\"{config.table.identifier}\"}} {float(low - 10)}" in metrics


@pytest.mark.parametrize("policy", ["fail", "skip-and-record"])
def test_retention_overtaking_a_running_writer_is_never_silent(tmp_path: Path, mock_kafka, policy: str) -> None:
    _, config = _config(tmp_path, mock_kafka.bootstrap, policy, consumer=SMALL_FETCHES)
    _events(config, 0, range(10))
    writer = OneTableWriter(config, 0, 1, "overtaken")
    writer.open()  # the table holds nothing: every partition starts at its low watermark
    units: list = []  # every unit the writer emits goes to the committer, in order

    def poll() -> None:
        unit = writer.poll()
        if unit is not None and not unit.empty:
            units.append(unit)

    def skips() -> list:
        return [s for u in units for s in u.skips.get(0, [])] + writer.skips.get(0, [])

    try:
        deadline = time.monotonic() + 10
        while writer.position[0] == 0:  # read a little, then stop polling
            assert time.monotonic() < deadline
            poll()
        reached = writer.position[0]
        low = mock_kafka.produce_until_low_passes(config.kafka.topic, reached + 50)
        # librdkafka's fetcher runs in the background and a fetch returns whole record batches
        # (thousands of records here), so on a busy machine it could have fetched ahead while
        # retention ran. Positioned again where the writer stands (as after a reconnect), its
        # next fetch is one retention has passed.
        writer.reposition()
        if policy == "fail":
            with pytest.raises(LostOffsetsError, match=r"below the low watermark"):
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    poll()
            return
        deadline = time.monotonic() + 20
        while not skips():  # (a unit may close meanwhile and carry it)
            assert time.monotonic() < deadline, f"no skip recorded; position {writer.position}"
            poll()
        (skip,) = skips()
        assert skip.from_offset == reached and skip.to_offset >= low and skip.kind == "lost"
        units.append(writer.finish())
        committer = Committer(config, parallelism=1, run_id="overtaken")
        committer.open()
        for unit in units:
            committer.offer(unit)
        committer.close()
        position = committed_position(load_catalog(config.catalog).load_table(config.table.identifier),
                                      config.kafka.topic)
        assert position.skips[0].from_offset == skip.from_offset and position.lost_total == skip.lost
        assert position.offsets[0] >= skip.to_offset
    finally:
        writer.close()


def test_a_partition_first_seen_with_latest_is_recorded_where_it_was_first_seen(tmp_path: Path, mock_kafka) -> None:
    _, config = _config(tmp_path, mock_kafka.bootstrap, "fail", start_offset="latest")
    _events(config, 0, range(5))  # before the ingest: "latest" leaves them out
    writer = OneTableWriter(config, 0, 1, "first")
    writer.open()
    start = dict(writer.position)
    committer = Committer(config, parallelism=1, run_id="first")
    committer.open()
    # Records arrive, but the run ends (here: cleanly, nothing read yet) before reading them.
    unit = writer.finish()
    assert set(unit.ranges) == set(start) and all(a == b for a, b in unit.ranges.values())
    committer.offer(unit)
    writer.close()
    committer.close()
    _events(config, 0, range(100, 110))
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert committed_position(table, config.kafka.topic).offsets == start
    # The restart starts where the partition was first seen, not at a later "latest".
    again = OneTableWriter(config, 0, 1, "again")
    again.open()
    try:
        assert again.position == start
    finally:
        again.close()


def test_a_partition_new_to_a_started_table_is_read_from_its_start_even_with_latest(tmp_path: Path,
                                                                                     mock_kafka) -> None:
    """`latest` is where a topic's ingest begins. A partition the table does not know yet but
    whose topic it already ingests (added while the ingest ran) is read from its start:
    its records were produced while the table was being fed."""
    _, config = _config(tmp_path, mock_kafka.bootstrap, "fail", start_offset="latest")
    for partition in range(4):
        _events(config, partition, range(5))  # before the first start: "latest" leaves them out
    # The first run covers only some partitions (writer 0 of 2), as a topic that had fewer.
    first = OneTableWriter(config, 0, 2, "first")
    first.open()
    known = dict(first.position)
    committer = Committer(config, parallelism=1, run_id="first")
    committer.open()
    committer.offer(first.finish())
    first.close()
    committer.close()
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert committed_position(table, config.kafka.topic).offsets == known and all(o == 5 for o in known.values())
    # Later the ingest sees every partition: the ones it knew resume, the new ones start at 0.
    again = OneTableWriter(config, 0, 1, "again")
    again.open()
    try:
        new = set(again.position) - set(known)
        assert new and all(again.position[p] == 0 for p in new), again.position
        assert all(again.position[p] == known[p] for p in known)
    finally:
        again.close()
