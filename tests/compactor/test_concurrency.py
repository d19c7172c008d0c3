"""The compactor beside a live ingest job: no row lost or duplicated, conflicts handled and logged."""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

import pytest
from pyiceberg.expressions import EqualTo
from structlog.testing import capture_logs

from streamberg.common.jvm import java_message, load_table
from streamberg.compactor.app import CompactOptions, run_compact
from streamberg.compactor.commit import CommitManager
from streamberg.compactor.compactor import Compactor
from streamberg.compactor.iceberg_scan import partition_filter_json, plan_scan_tasks
from streamberg.compactor.layouts import layout_for
from streamberg.compactor.planner import plan_rewrite
from streamberg.compactor.runner import GroupRunner
from streamberg.compactor.runs import PlanningRules
from streamberg.table_meta.offsets import committed_position
from tests.compactor.helpers import TOPIC, CommitterIngest, FakeIngest, live_files, reload, row_multiset, setup_table

pytestmark = pytest.mark.spark


def _rewritten_but_not_committed(spark, config):
    """Plan and rewrite every pending file, stopping right before the commit."""
    compactor = Compactor(config.compactor, config.target, spark, strategy="zorder")
    table = reload(config)
    plan = plan_rewrite(table, PlanningRules(min_files=1, max_delay_seconds=None, every_n_snapshots=None))
    jtable = load_table(spark, compactor.spark_table)
    tasks = plan_scan_tasks(spark, jtable, plan.starting_snapshot_id,
                              [partition_filter_json(table, g.spec_id, g.partition) for g in plan.groups])
    runner = GroupRunner(spark, compactor.spark_table, jtable, layout_for("zorder", ("user_id", "city")), 1 << 27)
    results = [runner.rewrite(g, [tasks[f.path] for f in g.files]) for g in plan.groups]
    manager = CommitManager(spark, jtable, starting_snapshot_id=plan.starting_snapshot_id,
                            starting_sequence_number=plan.starting_sequence_number, retries=2)
    return plan, results, manager


def test_append_between_plan_and_commit_is_kept(spark, spark_catalog, tmp_path) -> None:
    config, _ = setup_table(tmp_path)
    spark_catalog(config)
    ingest = FakeIngest(config, seed=21)
    for _ in range(3):
        ingest.append(200, days=1)
    plan, results, manager = _rewritten_but_not_committed(spark, config)
    concurrent = ingest.append(120, days=1)  # ingest commits while the rewrite is in flight
    expected = row_multiset(reload(config))

    with capture_logs() as logs:
        outcome = manager.commit(results, {"streamberg.compactor.run-id": "test"})

    assert outcome.committed and outcome.rebased_over == [concurrent.snapshot_id]
    after = reload(config)
    assert row_multiset(after) == expected
    files = live_files(after)
    assert sum(1 for sid in files.values() if sid == concurrent.snapshot_id) == 1  # the new append is live
    assert not any(p in files for g in plan.groups for p in g.paths)  # the rewritten ones are gone
    assert committed_position(after, TOPIC).offsets == {0: 720}  # ingest still finds its offsets
    rebased = [e for e in logs if e["event"] == "commit rebased over concurrent commits"]
    assert rebased and rebased[0]["concurrent_snapshots"] == [concurrent.snapshot_id]


def test_removed_input_files_make_the_commit_give_up_cleanly(spark, spark_catalog, tmp_path) -> None:
    config, _ = setup_table(tmp_path)
    spark_catalog(config)
    ingest = FakeIngest(config, seed=22)
    for _ in range(3):
        ingest.append(200, days=1)
    plan, results, manager = _rewritten_but_not_committed(spark, config)
    new_paths = [p for r in results for p in r.new_paths]
    assert all(Path(p.removeprefix("file:")).exists() for p in new_paths)
    # A concurrent delete rewrites the files the compactor is replacing.
    reload(config).delete(EqualTo("id", 5))
    expected = row_multiset(reload(config))

    with capture_logs() as logs:
        outcome = manager.commit(results, {"streamberg.compactor.run-id": "test"})

    assert outcome.status == "conflict" and "Missing required files to delete" in (outcome.error or "")
    assert row_multiset(reload(config)) == expected and sum(expected.values()) == 599
    assert not any(Path(p.removeprefix("file:")).exists() for p in new_paths)  # no orphans left behind
    assert any(e["event"].startswith("commit conflicts with a concurrent change") for e in logs)


@pytest.mark.slow
def test_live_ingest_while_compacting_loses_and_duplicates_nothing(spark, tmp_path) -> None:
    config, _ = setup_table(tmp_path, compactor={"strategy": "hilbert", "trigger_interval_seconds": 1,
                                                 "max_commits": 3})
    ingest = CommitterIngest(config, seed=23)  # the product's committer retries its own conflicts
    ingest.append(100, days=1)
    stop_ingest, stop_compactor = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def keep_ingesting() -> None:
        try:
            while not stop_ingest.is_set():
                ingest.append(50, days=1)
                time.sleep(0.3)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    outcome: dict = {}

    def compact() -> None:
        try:
            outcome.update(run_compact(config, CompactOptions(), spark=spark, stop=stop_compactor))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    with capture_logs() as logs:
        writer = threading.Thread(target=keep_ingesting)
        compactor = threading.Thread(target=compact)
        compactor.start()
        writer.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not errors:
            committed = [e for e in logs if e["event"] == "optimize committed"]
            if len(committed) >= 3 and any(e.get("rebased_over") for e in committed):
                break
            time.sleep(0.5)
        stop_ingest.set()
        writer.join(timeout=60)
        stop_compactor.set()
        compactor.join(timeout=120)
        settle = run_compact(config, CompactOptions(once=True), spark=spark)

    assert not errors, [java_message(e) for e in errors]
    table = reload(config)
    ids = table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    assert sorted(ids) == list(range(ingest.next_id))  # every appended row exactly once
    assert collections.Counter(ids).most_common(1)[0][1] == 1
    committed = [e for e in logs if e["event"] == "optimize committed"]
    rebased = [e for e in logs if e["event"] == "commit rebased over concurrent commits"]
    assert outcome["commits"] >= 2 and len(committed) >= 3
    assert rebased, "no compactor commit overlapped an ingest commit"
    assert committed_position(table, TOPIC).offsets == {0: ingest.offset}
    ingest.close()
    failures = [e for e in logs if e["event"].startswith("group")  and e["log_level"] == "error"]
    assert settle["groups_failed"] == 0 and outcome["groups_failed"] == 0, [(e["event"], e.get("error")) for e in failures]


@pytest.mark.slow
def test_a_schema_evolution_between_plan_and_commit_is_kept_and_the_next_pass_reads_both_schemas(
        spark, spark_catalog, tmp_path) -> None:
    """The ingest's committer adds a field (records that carry it, held by a writer) while a
    rewrite is in flight: the rewrite, planned against the old schema, still commits over it,
    and the next pass rewrites files of both schemas into one, every value kept."""
    import json

    from streamberg.decode.records import RecordDecoder
    from streamberg.ingest.evolution import SchemaChanges, hold_back
    from streamberg.ingest.units import FlushUnit, HeldRecord

    config, _ = setup_table(tmp_path)
    spark_catalog(config)
    ingest = CommitterIngest(config, seed=23)
    try:
        for _ in range(3):
            ingest.append(200, days=1)
        plan, results, manager = _rewritten_but_not_committed(spark, config)
        schema = reload(config).schema()
        values = [json.dumps({"id": 10_000 + i, "ts": "2024-03-01T10:00:00Z", "user_id": f"user-{i % 7:05d}",
                              "city": "city-01", "device": {"os": "android", "version": i}}).encode() for i in range(50)]
        changes = SchemaChanges()
        split = hold_back(RecordDecoder(schema, 1 << 20, unknown="report").decode(values), schema, changes)
        unit = FlushUnit(run_id=ingest.committer.run_id, writer=0, epoch=ingest.commits + 1, topic=TOPIC,
                         ranges={0: (ingest.offset, ingest.offset + 50)}, messages=50,
                         held=[HeldRecord(0, ingest.offset + int(i), None, None, values[int(i)]) for i in split.held],
                         new_fields=changes.add)
        evolution = ingest.committer.commit([unit])
    finally:
        ingest.close()
    evolved = reload(config)
    assert evolved.schema().find_field("device.version") and evolution.records == 50
    def rows(table) -> collections.Counter:  # values nested in a struct: compared as JSON
        return collections.Counter(json.dumps(r, sort_keys=True, default=str) for r in table.scan().to_arrow().to_pylist())

    expected = rows(evolved)

    outcome = manager.commit(results, {"streamberg.compactor.run-id": "test"})

    assert outcome.committed and outcome.rebased_over == [evolution.snapshot_id]
    after = reload(config)
    assert rows(after) == expected
    assert after.schema() == evolved.schema()  # the rewrite's commit keeps the evolved schema
    # The next full pass reads old-schema files (rewritten) and the evolution's file together.
    run_compact(config, CompactOptions(full=True), spark=spark)
    final = reload(config)
    assert rows(final) == expected
    devices = {r["id"]: r["device"] for r in final.scan().to_arrow().to_pylist()}
    assert devices[10_007] == {"os": "android", "version": 7} and devices[0] is None
