"""Fresh from a table's first second: the ingest records where it begins each partition before
its first commit (table_meta/offsets.record_starts), so a fresh read is exact from the first record,
and a restart before the first commit begins where the first run began (not at a later
"latest"). Real broker, the real writer and committer in-process, a crash before any commit."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import yaml

from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.fresh import read
from streamberg.ingest.dead_letters import open_tables
from streamberg.table_meta.offsets import START_OFFSETS_PREFIX, committed_position
from tests.helpers import config_at, table_ids, write_config
from tests.runbooks.inprocess import event, ingest_until, ingest_while, produce_values


def test_a_fresh_read_is_exact_before_the_first_commit_and_a_restart_begins_there(tmp_path: Path,
                                                                                   broker: str) -> None:
    path = write_config(tmp_path, broker, ingest={"parallelism": 1, "commit_interval_seconds": 3600})
    document = yaml.safe_load(path.read_text())
    document["kafka"]["start_offset"] = "latest"
    path.write_text(yaml.safe_dump(document))
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 2)
    open_tables(config)
    produce_values(config, [event(i) for i in range(1000, 1030)], 0, 2)  # before the ingest: "latest" skips them
    stop, crashed = threading.Event(), []

    def crash_before_committing(_writer) -> bool:
        if stop.is_set():
            raise RuntimeError("killed before its first commit")
        return False

    def run() -> None:
        try:
            ingest_while(config, crash_before_committing)
        except RuntimeError as exc:
            crashed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    catalog = load_catalog(config.catalog)
    try:
        deadline = time.monotonic() + 60
        while START_OFFSETS_PREFIX + config.kafka.topic not in catalog.load_table(config.table.identifier).properties:
            assert time.monotonic() < deadline and thread.is_alive(), "no start offsets recorded"
            time.sleep(0.05)
        produce_values(config, [event(i) for i in range(0, 50)], 0, 2)
        produce_values(config, [event(i) for i in range(50, 80)], 1, 2)
        seen: list[int] = []
        while not set(range(80)) <= set(seen):
            seen = sorted(read(path).rows.column("id").to_pylist())
            assert len(set(seen)) == len(seen), seen
            assert time.monotonic() < deadline + 30, seen
            time.sleep(0.1)
        # (tansu lists a partition's last batch's start as its end, so "latest" may begin inside
        # the batch produced before the ingest: the read holds what the ingest will commit.)
        table = catalog.load_table(config.table.identifier)
        assert committed_position(table, config.kafka.topic).offsets == {}  # no commit yet
        assert read(path, fresh=False).rows.num_rows == 0
    finally:
        stop.set()
        thread.join(60)
    assert crashed, "the ingest did not stop"
    produce_values(config, [event(i) for i in range(80, 90)], 0, 2)
    ingest_until(config, {0: 90, 1: 30})  # a restart: from where the first run began, not "latest" now
    assert table_ids(config) == sorted(set(seen) | set(range(80, 90)))


def test_a_table_the_ingest_makes_is_read_fresh_before_any_lane_opens(tmp_path: Path, broker: str) -> None:
    """kafka.start_offset earliest: the commit that makes the table records where each partition
    begins (ingest/routes._starts_at_creation), so a fresh read is exact from the table's first
    second, before a writer has opened; the writers then begin there."""
    from streamberg.ingest.routes import ensure_route_table

    path = write_config(tmp_path, broker, ingest={"parallelism": 1, "commit_interval_seconds": 3600})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 2)
    produce_values(config, [event(i) for i in range(0, 40)], 0, 2)
    produce_values(config, [event(i) for i in range(40, 55)], 1, 2)
    ensure_route_table(config, config.kafka.topic, infer=False)  # what the ingest does first
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert START_OFFSETS_PREFIX + config.kafka.topic in table.properties and table.current_snapshot() is None
    result = read(path)
    ids = result.rows.column("id").to_pylist()
    assert sorted(ids) == list(range(55)) and result.bounds.watermarks == {0: 40, 1: 15}
    ingest_until(config, {0: 40, 1: 15})  # the writers begin where the table says
    assert table_ids(config) == list(range(55))
