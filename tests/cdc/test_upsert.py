"""The upsert envelope: the value is the row, a tombstone deletes its key's row.

Records go through the real writer and committer in process (tests/runbooks/inprocess.py:
the same decode, files and commits as the Flink job, which tests/cdc/test_debezium.py runs)
into the change log; the merge stage runs on the shared Spark session. The table is read
back by Spark, DuckDB's iceberg_scan and pyiceberg, each compared with the state this test
computes itself.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from streamberg.common.catalog import load_catalog
from streamberg.compactor.app import CompactOptions, run_compact
from streamberg.maintenance.app import MaintainOptions, run_maintain
from streamberg.merge.app import MergeOptions, run_merge
from streamberg.monitoring.collect import collect_status
from streamberg.monitoring.health import with_health
from streamberg.monitoring.metrics import status_metrics
from streamberg.monitoring.render import render_screen
from streamberg.table_meta.changelog import applied_snapshot_id, ingest_config, merge_position
from streamberg.table_meta.offsets import summary_properties
from streamberg.table_meta.pending import DueRules, select_partitions
from streamberg.table_meta.summary_keys import SummaryKeys
from tests.cdc.helpers import cdc_config, delete_files, rows_by_duckdb, rows_by_pyiceberg, rows_by_spark
from tests.helpers import dead_letters
from tests.runbooks.inprocess import cli, ingest_until

PARTITIONS = 3


def _changes(rng: random.Random, keys: int, count: int, state: dict[int, dict]) -> list[list[tuple[bytes, bytes | None]]]:
    """Upserts and tombstones over `keys` keys, per partition (a key lives in one); `state`
    is updated to the last state of each key."""
    out: list[list[tuple[bytes, bytes | None]]] = [[] for _ in range(PARTITIONS)]
    for n in range(count):
        key = rng.randrange(keys)
        if key in state and rng.random() < 0.15:
            state.pop(key)
            value = None
        else:
            row = {"id": key, "name": f"n{key}-{n}", "score": rng.randrange(-1000, 1000),
                   "city": rng.choice(["ams", "bcn", None])}
            state[key] = row
            value = json.dumps(row).encode()
        out[key % PARTITIONS].append((json.dumps({"id": key}).encode(), value))
    return out


def _produce(config, batches) -> None:
    from confluent_kafka import Producer

    from streamberg.common.broker import ensure_topic

    ensure_topic(config.kafka.bootstrap_servers, config.kafka.topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap_servers, "linger.ms": 5})
    for p, batch in enumerate(batches):
        for key, value in batch:
            producer.produce(config.kafka.topic, key=key, value=value, partition=p)
    assert producer.flush(30) == 0


@pytest.mark.slow  # 9-12 s alone on 2 cores (make test-fast --durations, 2026-11-29)
def test_upsert_envelope_with_tombstones_read_alike_by_three_readers(tmp_path: Path, broker: str, spark) -> None:
    config = cdc_config(tmp_path, broker, "upsert", {"maintenance": {"changelog": {"keep_applied_seconds": 0},
                                                                     "orphan": {"enabled": False}}},
                        key_format="value")
    rng = random.Random(21)
    state: dict[int, dict] = {}
    ends = [0] * PARTITIONS
    for round_ in range(2):
        batches = _changes(rng, 300, 3000, state)
        if round_ == 1:  # hostile records: each a dead letter with its reason, none lost
            batches[0] += [(b'{"id": 1}', b'{"id": "one", "name": "x"}'), (None, None), (b'[1, 2]', None),
                           (b'{"nope": 1}', None), (b'{"id": 2}', b'{"name": "no key"}')]
        _produce(config, batches)
        ends = [e + len(b) for e, b in zip(ends, batches)]
        ingest_until(ingest_config(config), dict(enumerate(ends)))
        if round_ == 0:  # before the first merge: no table yet, the ingest's facts all the same
            early = with_health(collect_status(config), config)
            assert early.table_exists is False and early.ingest.last_commit is not None
            assert early.ingest.last_commit.records == 3000 and early.ingest.lag is not None
            assert any("the merge stage creates it" in r for r in early.health.reasons), early.health.reasons
        if round_ == 1:  # status tells the merge lag, and reads the ingest's facts from the change log
            waiting = with_health(collect_status(config), config)
            assert waiting.merge is not None and waiting.merge.pending_records == 3000
            assert waiting.merge.pending_snapshots == 1 and waiting.merge.oldest_pending_age_seconds is not None
            assert waiting.ingest.lag is not None and waiting.ingest.lag.total == 0
            assert waiting.ingest.last_commit is not None and waiting.ingest.last_commit.dead_letters == 5
            assert "3,000 changes in 1 change-log snapshot(s) to merge" in render_screen(waiting)
        summary = run_merge(config, MergeOptions(once=True), spark=spark)
        assert summary["merges"] == 1 and summary["changes"] == sum(len(b) for b in batches) - 5 * round_

    expected = {k: {**v} for k, v in state.items()}
    assert rows_by_pyiceberg(config) == expected
    assert rows_by_spark(spark, config) == expected
    assert rows_by_duckdb(config) == expected
    assert delete_files(config) > 0  # the second merge updated and deleted by position deletes
    catalog = load_catalog(config.catalog)
    changelog_name = f"{config.table.identifier}_changelog"
    changelog = catalog.load_table(changelog_name)
    target = catalog.load_table(config.table.identifier)
    assert applied_snapshot_id(target) == changelog.current_snapshot().snapshot_id
    assert merge_position(changelog, target).up_to_date
    merged = with_health(collect_status(config), config)
    assert merged.merge is not None and merged.merge.pending_records == 0 and merged.merge.last_merge_changes == 3000
    assert merged.merge.delete_files == delete_files(config) and merged.merge.deleted_rows > 0
    assert not [f for f in merged.health.findings if f["check"] == "merge"]
    names = {m.name for m in status_metrics(merged, 0.1)}
    assert {"streamberg_merge_pending_records", "streamberg_table_delete_files"} <= names
    reasons = sorted(d["reason"] for d in dead_letters(config).to_pylist())
    assert len(reasons) == 5, reasons
    assert any("field 'id'" in r for r in reasons) and any("without a key" in r for r in reasons)
    assert any("lacks the key column(s) id" in r for r in reasons) and any("JSON list" in r for r in reasons)
    assert any("missing required field 'id'" in r for r in reasons)
    # Nothing more to apply: a rerun commits nothing.
    assert run_merge(config, MergeOptions(once=True), spark=spark)["merges"] == 0
    assert catalog.load_table(config.table.identifier).current_snapshot().snapshot_id == target.current_snapshot().snapshot_id

    # Delete compaction: the deleted-row ratio is past compactor.deleted_ratio_threshold, so
    # the compactor rewrites the partition whole, its deletes folded in; none is left live.
    stats = select_partitions(target, DueRules()).partitions[0]
    assert stats.delete_reasons and stats.deletes.ratio >= 0.1, stats.deletes
    summary = run_compact(config, CompactOptions(once=True), spark=spark)
    assert summary["commits"] >= 1, summary
    rewritten = catalog.load_table(config.table.identifier)
    kinds = [summary_properties(s).get(SummaryKeys.COMPACTOR_GROUP_KINDS, "") for s in rewritten.snapshots()]
    assert any("deletes" in k for k in kinds), kinds
    assert delete_files(config) == 0
    assert rows_by_pyiceberg(config) == expected
    assert rows_by_spark(spark, config) == expected
    assert rows_by_duckdb(config) == expected

    # Maintenance trims the change log of what the merge applied (kept 0 s here) and expires
    # its older snapshots; the table keeps its merge position.
    run = run_maintain(config, MaintainOptions(once=True), spark=spark).last
    assert run is not None and run["status"] == "ok", run
    assert run["changelog"]["files_removed"] == 2 and run["changelog"]["rows_removed"] == 6000, run["changelog"]
    changelog = catalog.load_table(f"{config.table.identifier}_changelog")
    assert changelog.scan().to_arrow().num_rows == 0
    shown = json.loads(cli("table", "--config", str(config.config_path), "--json").stdout)
    assert shown["table"] == changelog_name and shown["trimmed_records"] == 6000 and shown["reconciles"], shown
    assert applied_snapshot_id(catalog.load_table(config.table.identifier)) is not None
    # The merge and the ingest go on over the trimmed change log and the rewritten files; a
    # producer adds a nested field: the change log evolves, then the table, with its value.
    batches = _changes(rng, 300, 500, state)
    state[7] = {"id": 7, "name": "seven", "score": 1, "city": None, "prefs": {"lang": "nl"}}
    batches[7 % PARTITIONS].append((b'{"id": 7}', json.dumps(state[7]).encode()))
    _produce(config, batches)
    ends = [e + len(b) for e, b in zip(ends, batches)]
    ingest_until(ingest_config(config), dict(enumerate(ends)))
    assert run_merge(config, MergeOptions(once=True), spark=spark)["changes"] == 501
    evolved = {k: {"prefs": None, **v} for k, v in state.items()}
    assert rows_by_pyiceberg(config) == evolved
    assert rows_by_duckdb(config) == evolved
