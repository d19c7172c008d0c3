"""A primary-key table read fresh is the source's state at the watermark (fresh/keyed.py).

A Debezium stream (inserts, updates, deletes with tombstones, re-inserts, key changes both
ways, hostile records) made by tests/cdc's Source, which computes the source's state itself.
The table is in three halves at the read: merged by the real merge (Spark), in the change
log and not merged, and in Kafka only (with old events produced again: a replay that must
not win, and records the ingest dead-letters). Python, DuckDB (`streamberg query --fresh`)
and Spark give the source's rows, each key once; then the real ingest and merge bring the
table itself to the same rows: the fresh read applied the merge's rules.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from streamberg.common.catalog import load_catalog
from streamberg.fresh import read
from streamberg.fresh.cache import TailKeeper
from streamberg.fresh.spark import spark_read
from streamberg.merge.app import MergeOptions, run_merge
from streamberg.merge.tables import ensure_target
from streamberg.table_meta.changelog import ingest_config, merge_position
from streamberg.table_meta.tail_segments import cache_folder
from tests.cdc.helpers import cdc_config, rows_by_pyiceberg
from tests.cdc.test_debezium import HOSTILE, PARTITIONS, Source, _produce
from tests.runbooks.inprocess import cli, ingest_until, ingest_while


def _by_key(rows: list[dict], what: str) -> dict[int, dict]:
    keyed = {r["id"]: r for r in rows}
    assert len(keyed) == len(rows), f"{what}: {len(rows)} rows for {len(keyed)} keys"
    return keyed


def _sequenced(batches: list[list[bytes | None]]) -> list[list[bytes | None]]:
    """The events with Debezium Postgres' `source.sequence` ([last commit LSN, LSN]), so a
    replayed old event is older by the source's own order wherever it lands in Kafka."""
    out: list[list[bytes | None]] = []
    for values in batches:
        made: list[bytes | None] = []
        for value in values:
            try:
                event = json.loads(value) if value is not None else None
            except ValueError:
                event = None
            body = event.get("payload", event) if isinstance(event, dict) else None
            if not isinstance(body, dict) or not isinstance(body.get("source"), dict):
                made.append(value)  # a tombstone or a hostile record, as it was
                continue
            lsn = body["source"]["lsn"]
            body["source"]["sequence"] = json.dumps([str(lsn - 1), str(lsn)])
            made.append(json.dumps(event).encode())
        out.append(made)
    return out


def _served_by_the_kept_tail(config: Any, running: Any, keeper: str) -> Any:
    """The first fresh read whose every tail record came from the kept tail, while `running()`."""
    deadline = time.monotonic() + 60
    while True:
        kept = read(config)
        assert kept.tail is not None
        if kept.tail.records and kept.tail.cached == kept.tail.records:
            return kept
        assert time.monotonic() < deadline and running(), \
            f"{keeper} kept {kept.tail.cached} of {kept.tail.records} tail records"
        time.sleep(0.1)


def _ends(produced: list[list[list[Any]]]) -> dict[int, int]:
    return {p: sum(len(batch[p]) for batch in produced) for p in range(PARTITIONS)}


def test_a_keyed_table_read_fresh_is_the_source_at_the_watermark(tmp_path: Path, broker: str, spark) -> None:
    config = cdc_config(tmp_path, broker, "debezium")
    path = str(config.config_path or tmp_path / "streamberg.yaml")
    view = ingest_config(config)
    source = Source(11)
    source.changes(1200)
    first = _sequenced(source.take())
    first[0] += HOSTILE
    _produce(config, first)
    produced = [first]
    ingest_until(view, _ends(produced))

    # Nothing merged yet (the merge made its table as it started): the change log holds every change.
    ensure_target(load_catalog(config.catalog), config.table)
    before_merge = read(config)
    assert before_merge.snapshot_rows == 0 and before_merge.tail is not None and before_merge.tail.records == 0
    assert _by_key(before_merge.rows.to_pylist(), "before the first merge") == source.expected()

    run_merge(config, MergeOptions(once=True), spark=spark)
    source.changes(700)
    second = _sequenced(source.take())
    _produce(config, second)
    produced.append(second)
    ingest_until(view, _ends(produced))  # in the change log, not merged
    source.changes(600)
    third = _sequenced(source.take())
    for p in range(PARTITIONS):  # the oldest events again, later in their partitions: a replay
        third[p] += [e for e in first[p][:40] if e is not None and e not in HOSTILE]
    third[1] += HOSTILE[:3]
    _produce(config, third)
    produced.append(third)

    catalog = load_catalog(config.catalog)
    pending = merge_position(catalog.load_table(view.table.identifier),
                             catalog.load_table(config.table.identifier)).pending_records
    assert pending > 0  # three halves: merged, in the change log, in Kafka only
    expected = source.expected()
    fresh = read(config)
    assert fresh.tail is not None and fresh.tail.rows.num_rows > 0 and fresh.snapshot_rows > 0
    assert fresh.tail.rejected == 3  # dead letters are not rows of a fresh read
    assert fresh.keyed is not None and fresh.keyed.stale > 0  # the replayed old events lost
    assert fresh.bounds.watermarks == _ends(produced)
    got = _by_key(fresh.rows.to_pylist(), "python")
    assert len(got) == len(expected) > 300
    assert got == expected

    # A filter and columns, applied after the merge's rule (a row may move into or out of it).
    ams = read(config, columns=["id", "city"], row_filter="city = 'ams'")
    assert ams.rows.column_names == ["id", "city"]
    assert _by_key(ams.rows.to_pylist(), "filtered") == {
        k: {"id": k, "city": "ams"} for k, row in expected.items() if row["city"] == "ams"}

    # DuckDB through `streamberg query --fresh`, and Spark: the same rows.
    out = cli("query", "--config", path, "--fresh", "--json",
              "SELECT count(*) AS n, count(DISTINCT id) AS keys, sum(score) AS total FROM db.users")
    counted = json.loads(out.stdout.strip())
    assert counted == {"n": len(expected), "keys": len(expected),
                       "total": sum(r["score"] for r in expected.values() if r["score"] is not None)}
    frame, bounds = spark_read(spark, path)
    assert bounds.watermarks == _ends(produced)
    assert _by_key([r.asDict() for r in frame.collect()], "spark") == expected

    # `streamberg tail` keeps a primary-key table's tail as its change log's change rows: the
    # read takes them from the keeper's segments (none from Kafka) and is the same state.
    stop = threading.Event()
    keeper = TailKeeper(ingest_config(config), stop)
    thread = threading.Thread(target=keeper.run)
    thread.start()
    try:
        kept = _served_by_the_kept_tail(config, lambda: thread.is_alive(), "the keeper")
        assert cache_folder(config) == cache_folder(view) and keeper.segments_written > 0
        assert kept.tail.rejected == 0  # the dead letters were dropped when kept
        assert kept.keyed is not None and kept.keyed.stale == fresh.keyed.stale
        assert _by_key(kept.rows.to_pylist(), "kept tail") == expected
    finally:
        stop.set()
        thread.join(30)

    # The ingest keeps the tail itself (ingest.keep_tail): its writer's change rows, as it
    # decoded them for the change log, serve the read: the same state. (An interval of a day:
    # nothing is committed while the test reads.)
    keeping = view.model_copy(update={"ingest": view.ingest.model_copy(update={"keep_tail": True,
                                                                               "commit_interval_seconds": 86400})})
    done, failed = threading.Event(), []

    def run() -> None:
        try:
            ingest_while(keeping, lambda _writer: done.is_set(), run_id="kept-by-ingest")
        except BaseException as exc:  # noqa: BLE001 - reported below
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        by_ingest = _served_by_the_kept_tail(config, lambda: not failed, "the ingest")
        assert by_ingest.keyed is not None and by_ingest.keyed.stale == fresh.keyed.stale
        assert _by_key(by_ingest.rows.to_pylist(), "the ingest's kept tail") == expected
    finally:
        done.set()
        thread.join(60)
    assert not failed, failed

    # The real ingest and merge bring the table itself to the rows read fresh.
    ingest_until(view, _ends(produced))
    run_merge(config, MergeOptions(once=True), spark=spark)
    assert rows_by_pyiceberg(config) == got
