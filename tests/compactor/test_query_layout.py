"""The layout follows the queries: real Spark queries produce Iceberg scan reports (through
the writer common/report_jar.py builds), they are folded into per-table statistics
(table_meta/query_stats.py), and `streamberg.cluster.columns=auto` follows what queries filter:
stable under a few odd queries, moved by a real shift. A fresh read reports its filter too."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.monitoring.collect import collect_status
from streamberg.monitoring.render import render_screen
from streamberg.table_meta.column_usage import ColumnFacts
from streamberg.table_meta.declared import ensure_table
from streamberg.table_meta.policy import effective
from streamberg.table_meta.query_stats import AUTO_MIN_SCANS, filter_terms, fold, usage
from tests.compactor.helpers import FakeIngest, reload, write_config


def _config(tmp_path: Path):
    path = write_config(tmp_path)
    document = yaml.safe_load(path.read_text())
    document["catalog"]["scan_reports_dir"] = "reports"
    path.write_text(yaml.safe_dump(document))
    config = load_config(path)
    ensure_table(load_catalog(config.catalog), config.table)
    return config


@pytest.mark.slow  # 9-12 s alone on 2 cores (make test-fast --durations, 2026-11-29)
def test_clustering_columns_follow_what_queries_filter(tmp_path: Path, spark, spark_catalog) -> None:
    config = _config(tmp_path)
    reports = Path(config.catalog.scan_reports_dir)
    assert reports.is_absolute() and reports.parent == tmp_path
    ingest = FakeIngest(config, seed=3)
    for _ in range(4):
        ingest.append(300, days=2)
    name = f"{spark_catalog(config)}.{config.table.identifier}"

    def query(where: str, times: int) -> None:
        for _ in range(times):
            spark.sql(f"SELECT count(*), max(amount) FROM {name} WHERE {where}").collect()

    query("city = 'c3'", 25)
    query("id > 100", 3)  # noise
    stats = fold(reports, config.catalog.name)
    seen = usage(reports, config.table.identifier)
    assert seen is not None and seen["scans_total"] == 28, stats
    # Spark adds `city IS NOT NULL` to `city = 'c3'`: 25 point filters (1.0) and 25 null checks (0.1).
    assert list(seen["filtered"])[0] == "city" and seen["filtered"]["city"] == 27.5
    assert seen["filtered"]["id"] == 2.4  # three range filters (0.8); id is required: no null check
    assert not list(reports.glob("reports-*.jsonl")), "folded files are consumed"

    table = reload(config)
    with table.transaction() as tx:
        tx.set_properties({"streamberg.cluster.columns": "auto"})
    table = reload(config)
    chosen, problems = effective(config, table)
    assert problems == [] and chosen.compactor.columns == ["city"]

    query("user_id = 'u7'", 10)  # a few odd queries: the layout holds
    assert effective(config, reload(config))[0].compactor.columns == ["city"]
    query("user_id = 'u7'", AUTO_MIN_SCANS + 40)  # the queries really shifted
    # city (27.5) fell below 0.4x the new top (user_id, 77): it drops out; user_id leads.
    assert effective(config, reload(config))[0].compactor.columns == ["user_id"]
    evidence = usage(reports, config.table.identifier)["auto"]
    assert evidence["was"] == ["city"] and "user_id" in evidence["evidence"]
    status = collect_status(config)  # what an operator sees
    assert status.queries["cluster_columns"] == ["user_id"] and status.queries["scans_total"] == 98
    assert "queries" in render_screen(status) and "clustered by user_id" in render_screen(status)

    # The same channel carries a Java engine's commits: the governor wakes on them (governor/keeper.py).
    from streamberg.table_meta.query_stats import commits

    before = commits(reports, config.catalog.name).get(config.table.identifier, {}).get("total", 0)
    spark.sql(f"INSERT INTO {name} SELECT * FROM {name} LIMIT 1")
    after = commits(reports, config.catalog.name)[config.table.identifier]
    assert after["total"] == before + 1 and after["snapshot_id"] == reload(config).current_snapshot().snapshot_id


def test_auto_without_a_reports_folder_says_so(tmp_path: Path) -> None:
    from tests.compactor.helpers import setup_table

    config, table = setup_table(tmp_path)
    with table.transaction() as tx:
        tx.set_properties({"streamberg.cluster.columns": "auto"})
    chosen, problems = effective(config, reload(config))
    assert chosen.compactor.columns == ["user_id", "city"]
    assert problems and "needs catalog.scan_reports_dir" in problems[0]


def test_filter_terms_of_iceberg_json() -> None:
    expression = {"type": "and", "left": {"type": "eq", "term": "city", "value": "(hash)"},
                  "right": {"type": "or", "left": {"type": "gt-eq", "term": "id", "value": "(3-digit-int)"},
                            "right": {"type": "not", "child": {"type": "not-null", "term": "user_id"}}}}
    assert filter_terms(expression) == [("city", "point"), ("id", "range"), ("user_id", "null")]
    assert filter_terms("true") == [] and filter_terms({"type": "eq"}) == [] and filter_terms(None) == []
    assert filter_terms({"type": "in", "term": {"type": "transform", "transform": "day", "term": "ts"}}) == \
        [("ts", "point")]


def test_the_products_own_reads_report_their_filters(tmp_path: Path) -> None:
    from streamberg.fresh import read

    config = _config(tmp_path)
    FakeIngest(config, seed=5).append(100, days=1)
    for _ in range(3):
        assert read(config, fresh=False, columns=["id"], row_filter="city = 'c1' and amount > 3").rows.num_rows >= 0
    seen = usage(config.catalog.scan_reports_dir, config.table.identifier) if fold(
        config.catalog.scan_reports_dir, config.catalog.name) else None
    assert seen is not None and seen["scans_total"] == 3
    assert seen["filtered"] == {"city": 3.0, "amount": 2.4}
    assert seen["unused_columns"] is None  # not watched long enough to call a column unused
    facts = ColumnFacts.of_table(reload(config))
    names = list(facts.top.values())
    later = usage(config.catalog.scan_reports_dir, config.table.identifier, facts, 30, now=time.time() + 31 * 86400)
    assert later["unused_columns"] == names  # nothing read in the 30 days before then
    now = usage(config.catalog.scan_reports_dir, config.table.identifier, facts, 30,
                now=seen["reported_since"] + 30 * 86400)
    assert now["unused_columns"] == [c for c in names if c not in ("id", "city", "amount")]


def test_a_changed_choice_relays_older_runs_by_the_budget(tmp_path: Path, spark, spark_catalog) -> None:
    """Runs clustered by the old columns are rewritten by the new ones, the oldest first, at most
    relayout_max_bytes a pass; the rows are the same; a relaid partition is not planned again."""
    from streamberg.compactor.compactor import Compactor
    from streamberg.compactor.planner import PassPlanner
    from streamberg.table_meta.summary_keys import SummaryKeys
    from tests.compactor.helpers import row_multiset, setup_table

    config, _ = setup_table(tmp_path, partition_spec=[{"source": "ts", "transform": "day"}],
                            compactor={"columns": ["city"], "relayout_max_bytes": 1})
    spark_catalog(config)
    ingest = FakeIngest(config, seed=9)
    for _ in range(3):
        ingest.append(400, days=3)  # three day partitions
    Compactor(config.compactor, config.target, spark).run_pass(mode="incremental")
    table = reload(config)
    rows = row_multiset(table)
    assert rows and sum(rows.values()) == 1200

    with table.transaction() as tx:
        tx.set_properties({"streamberg.cluster.columns": "user_id"})
    table = reload(config)
    chosen = effective(config, table)[0]
    assert chosen.compactor.columns == ["user_id"]
    plan = PassPlanner(chosen.compactor, chosen.target, chosen.compactor.columns).plan(table)
    # A budget of one byte: one partition a pass, the oldest stale runs first.
    assert [g.kind for g in plan.groups] == ["relayout"] and "by city, now by user_id" in plan.groups[0].reasons[0]
    relaid = set()
    for _ in range(3):
        table = reload(config)
        plan = PassPlanner(chosen.compactor, chosen.target, chosen.compactor.columns).plan(table)
        assert len({g.partition for g in plan.groups}) == 1 and plan.groups[0].partition not in relaid
        relaid.add(plan.groups[0].partition)
        Compactor(chosen.compactor, chosen.target, spark).run_pass(mode="incremental")
    table = reload(config)
    assert len(relaid) == 3
    assert PassPlanner(chosen.compactor, chosen.target, chosen.compactor.columns).plan(table).groups == ()
    assert row_multiset(table) == rows  # the same rows, each once
    last = table.current_snapshot()
    assert last.summary.additional_properties[SummaryKeys.COMPACTOR_COLUMNS] == "user_id"
