"""Nothing is dropped that anyone reads (issue "Nothing dropped that anyone reads"): each case
a hostile review reproduced against the column lifecycle, as a test. Real catalog (SQLite),
real pyiceberg tables and schema changes, the real fold of report lines in Iceberg's JSON
form, the real ingest against the shared broker where records bring a field; the statistics'
clock is moved by the test (it states when each report came)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, ListType, LongType, MapType, NestedField, StringType, StructType

from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.common.errors import IgnoredFieldsRefused
from streamberg.governor.keeper import SharedCatalogs, TableKeeper
from streamberg.maintenance.columns import DropColumnsExecutor
from streamberg.table_meta.column_usage import ColumnFacts
from streamberg.table_meta.declared import ensure_table
from streamberg.table_meta.query_stats import MAX_COLUMNS_PER_TABLE, fold, usage
from tests.helpers import config_at, table_ids, write_config

DAY = 86400.0
ACK = {"streamberg.columns.drop_unused": "true", "streamberg.columns.reporting_engines": "spark,streamberg"}


def _report(folder: Path, identifier: str, projected: list[str] | None = None, filter_json=None,
            ids: list[int] | None = None, name: str = "reports-test.jsonl") -> None:
    report = {"table-name": f"spark_catalog.{identifier}", "filter": filter_json or True,
              "projected-field-names": projected or [], "metrics": {}}
    if ids is not None:
        report["projected-field-ids"] = ids
    with (folder / name).open("a") as out:
        out.write(json.dumps({"report-type": "scan-report", "report": report}) + "\n")


def _scan(folder: Path, identifier: str, at: float, **report) -> None:
    _report(folder, identifier, **report)
    fold(folder, "spark_catalog", now=at)


# 1. A new column is not unused before it has been there a whole window --------------------

def test_a_column_added_by_the_ingest_is_kept_and_written(tmp_path: Path, broker: str) -> None:
    from streamberg.ingest.dead_letters import open_tables
    from streamberg.table_meta.query_stats import observe
    from tests.runbooks.inprocess import event, ingest_until, produce_values

    path = write_config(tmp_path, broker, ingest={"parallelism": 1, "schema_evolution": "add"},
                        catalog={"scan_reports_dir": "reports"})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 1)
    open_tables(config)
    produce_values(config, [event(i) for i in range(20)], 0, 1)
    ingest_until(config, {0: 20})
    catalog = load_catalog(config.catalog)
    table = catalog.load_table(config.table.identifier)
    with table.transaction() as tx:
        tx.set_properties(ACK)
    folder = Path(config.catalog.scan_reports_dir)
    now = time.time()
    # Forty days of collection in which id, ts, city were read; user_id and amount never.
    _scan(folder, config.table.identifier, now - 40 * DAY, projected=["id", "ts", "city"])
    observe(folder, config.table.identifier, ColumnFacts.of_table(table), now=now - 40 * DAY)
    _scan(folder, config.table.identifier, now - 1 * DAY, projected=["id", "ts", "city"])

    # Records bring `coupon`: the ingest adds the column (today).
    produce_values(config, [event(i, coupon=f"k{i}") for i in range(20, 40)], 0, 1)
    ingest_until(config, {0: 40})
    table = catalog.load_table(config.table.identifier)
    assert "coupon" in [f.name for f in table.schema().fields]
    found = usage(folder, config.table.identifier, ColumnFacts.of_table(table), 30)
    assert found["unused_columns"] == ["user_id", "amount"], found  # never coupon: it is a day old

    keeper = TableKeeper(config, [DropColumnsExecutor()], None, SharedCatalogs())
    due, problems = keeper.probe()
    assert problems == [] and [d.action for d in due] == ["drop-columns"]
    assert "coupon" not in due[0].why and "user_id, amount" in due[0].why, due[0].why
    keeper.run("drop-columns")
    table = catalog.load_table(config.table.identifier)
    assert [f.name for f in table.schema().fields] == ["id", "ts", "city", "coupon"]
    dropped = json.loads(table.properties["streamberg.columns.dropped"])
    assert [(d["column"], d["why"].startswith("no scan reported by spark, streamberg")) for d in dropped] == \
        [("user_id", True), ("amount", True)]

    # The next records' coupon values are written (not ignored).
    produce_values(config, [event(i, coupon=f"k{i}") for i in range(40, 90)], 0, 1)
    ingest_until(config, {0: 90})
    table = catalog.load_table(config.table.identifier)
    rows = table.scan(selected_fields=("id", "coupon")).to_arrow().to_pylist()
    assert table_ids(config) == list(range(90))
    assert sorted(r["id"] for r in rows if r["coupon"] is not None) == list(range(20, 90))
    # Undo, as docs/governor.md says: the ignored name removed, the declared column added again.
    from streamberg.table_meta.declared import evolve_table

    with table.transaction() as tx:
        tx.set_properties({"streamberg.ingest.ignored-fields": json.dumps(["user_id"])})  # amount back
    evolve_table(catalog, config.table)
    produce_values(config, [event(i, amount=float(i)) for i in range(90, 100)], 0, 1)
    ingest_until(config, {0: 100})
    table = catalog.load_table(config.table.identifier)
    rows = table.scan(selected_fields=("id", "amount")).to_arrow().to_pylist()
    assert sorted(r["id"] for r in rows if r["amount"] is not None) == list(range(90, 100))


def test_a_column_added_or_renamed_with_alter_table_keeps_or_starts_its_window(tmp_path: Path) -> None:
    catalog, identifier, folder = _table(tmp_path)
    table = catalog.load_table(identifier)
    now = time.time()
    facts = ColumnFacts.of_table(table)
    _scan(folder, identifier, now - 60 * DAY, projected=["id"])
    usage(folder, identifier, facts, 30, now=now - 60 * DAY)  # first sight of its fields, 60 days ago
    _scan(folder, identifier, now - 10 * DAY, projected=["note"])  # `note` read 10 days ago
    with table.update_schema() as update:
        update.rename_column("note", "remark")  # same field id: its read stays its own
        update.add_column("extra", StringType())  # new: no window yet
    table = catalog.load_table(identifier)
    found = usage(folder, identifier, ColumnFacts.of_table(table), 30, now=now)
    assert "remark" not in found["unused_columns"] and "extra" not in found["unused_columns"], found
    assert "geo" in found["unused_columns"]
    later = usage(folder, identifier, ColumnFacts.of_table(table), 30, now=now + 31 * DAY)
    assert {"remark", "extra"} <= set(later["unused_columns"])  # a whole window, unread


def _table(tmp_path: Path, extra: list[NestedField] | None = None):
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path / 'w'}")
    catalog.create_namespace("db")
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "note", StringType()),
                    NestedField(3, "tags", ListType(4, StringType())),
                    NestedField(5, "attrs", MapType(6, StringType(), 7, StringType())),
                    NestedField(8, "geo", StructType(NestedField(9, "city", StringType()),
                                                     NestedField(10, "zip", IntegerType()))),
                    *(extra or []))
    catalog.create_table("db.t", schema=schema)
    folder = tmp_path / "reports"
    folder.mkdir()
    return catalog, "db.t", folder


def _collected_for_40_days(tmp_path: Path):
    """The test table, its reports collected and its fields seen since 40 days ago (id read then)."""
    catalog, identifier, folder = _table(tmp_path)
    facts = ColumnFacts.of_table(catalog.load_table(identifier))
    now = time.time()
    _scan(folder, identifier, now - 40 * DAY, projected=["id"])
    usage(folder, identifier, facts, 30, now=now - 40 * DAY)
    return identifier, folder, facts, now


# 2. Lists, maps and structs count as read through their leaves -----------------------------

def test_leaves_and_ids_count_for_their_top_level_column(tmp_path: Path) -> None:
    identifier, folder, facts, now = _collected_for_40_days(tmp_path)
    _scan(folder, identifier, now, projected=["id", "tags.element", "attrs.key"])
    _scan(folder, identifier, now, ids=[9], filter_json={"type": "eq", "term": "attrs.value", "value": "x"})
    found = usage(folder, identifier, facts, 30, now=now)
    assert found["unused_columns"] == ["note"], found  # tags, attrs (key and value), geo (by id 9) read


# 3. Statistics that no input can push real usage out of -----------------------------------

def test_a_forged_report_of_many_names_pushes_no_real_read_out(tmp_path: Path) -> None:
    identifier, folder, facts, now = _collected_for_40_days(tmp_path)
    _scan(folder, identifier, now - 39 * DAY, projected=[f"junk{i}" for i in range(MAX_COLUMNS_PER_TABLE)])
    for _ in range(50):
        _report(folder, identifier, projected=["id", "note"])
    fold(folder, "spark_catalog", now=now - 1 * DAY)
    found = usage(folder, identifier, facts, 30, now=now)
    assert set(found["unused_columns"]) == {"tags", "attrs", "geo"}, found
    # A single report past the cap, now: nothing can be called unused for a window.
    _scan(folder, identifier, now, projected=[f"x{i}" for i in range(5000)])
    found = usage(folder, identifier, facts, 30, now=now)
    assert found["unused_columns"] == [] and "not kept whole" in found["unused_why_none"]


# 4. `auto` clustering: the chosen columns are protected, and compaction is not refused -----

def test_auto_clustering_columns_are_protected_and_compacted_by_the_governor(tmp_path: Path) -> None:
    from streamberg.compactor.executor import CompactExecutor
    from tests.compactor.helpers import FakeIngest

    config = config_at(write_config(tmp_path, "127.0.0.1:9", catalog={"scan_reports_dir": "reports"},
                                    extra={"compactor": {"min_files": 2}}))
    catalog = load_catalog(config.catalog)
    ensure_table(catalog, config.table)
    folder = Path(config.catalog.scan_reports_dir)
    keeper = TableKeeper(config, [CompactExecutor(0.0), DropColumnsExecutor()], None, SharedCatalogs())
    table = catalog.load_table(config.table.identifier)
    with table.transaction() as tx:
        tx.set_properties({"streamberg.cluster.columns": "auto", **ACK})
    ingest = FakeIngest(config, seed=1)
    for _ in range(3):
        ingest.append(50, days=1)
    # No choice yet: compaction by the config's columns, never "['auto'] not in table".
    due, problems = keeper.probe()
    assert not [p for p in problems if "auto" in p], problems
    now = time.time()
    table = catalog.load_table(config.table.identifier)
    _scan(folder, config.table.identifier, now - 40 * DAY, projected=["id"],
          filter_json={"type": "eq", "term": "city", "value": "c"})
    usage(folder, config.table.identifier, ColumnFacts.of_table(table), 30, now=now - 40 * DAY)
    for _ in range(30):
        _report(folder, config.table.identifier, projected=["id"])
    fold(folder, "spark_catalog", now=now)
    due, problems = keeper.probe()
    assert keeper.effective.compactor.columns == ["city"], keeper.effective.compactor.columns
    drop = next(d for d in due if d.action == "drop-columns")
    assert "city" not in drop.why.split(":")[0] and "city (a clustering column)" in drop.why, drop.why
    assert any(d.action == "compact" for d in due), (due, problems)


# 6. The reports folder as untrusted input --------------------------------------------------

def test_hostile_files_in_the_reports_folder_cost_no_real_report(tmp_path: Path) -> None:
    import os

    folder = tmp_path / "reports"
    folder.mkdir()
    _report(folder, "db.t", projected=["id"], name="reports-a.jsonl")
    os.mkfifo(folder / "reports-fifo.jsonl")
    os.symlink("/dev/zero", folder / "reports-zero.jsonl")
    outside = tmp_path / "outside.txt"
    outside.write_text("keep\n")
    os.symlink(outside, folder / "reports-link.jsonl")
    deep = "[" * 100_000 + "]" * 100_000
    lines = [deep, '{"report-type": "scan-report", "report": {"table-name": "db.t", "projected-field-names": 5}}',
             '{"report-type": "scan-report", "report": {"table-name": "db.t", "metrics": {"result-data-files": '
             '{"value": "many"}}, "projected-field-names": ["note"]}}', "not json", "null", "5"]
    (folder / "reports-b.jsonl").write_text("\n".join(lines) + "\n")
    _report(folder, "db.t", projected=["geo.city"], name="reports-c.jsonl")
    started = time.monotonic()
    stats = fold(folder, "spark_catalog")
    assert time.monotonic() - started < 30  # no hang on the FIFO, no endless read of /dev/zero
    columns = stats["tables"]["db.t"]["columns"]
    assert set(columns) == {"id", "note", "geo.city"}, columns  # every good report kept, junk counted
    assert sum(stats["dropped"].values()) >= 5, stats["dropped"]
    assert sorted(p.name for p in folder.iterdir()) == [".fold.lock", "query-stats.json"]
    assert outside.read_text() == "keep\n"
    # A writer never follows a link planted at its file's name.
    from streamberg.table_meta.query_stats import record_read

    os.symlink(outside, folder / f"reports-python-{os.getpid()}.jsonl")
    with pytest.raises(OSError):
        record_read(folder, "db.t", True, ["id"])
    assert outside.read_text() == "keep\n"


def test_a_held_fold_lock_does_not_block_status_or_the_governor(tmp_path: Path) -> None:
    import fcntl

    from streamberg.table_meta.query_stats import auto_columns

    folder = tmp_path / "reports"
    folder.mkdir()
    _report(folder, "db.t", projected=["id"])
    fold(folder, "spark_catalog")
    with (folder / ".fold.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process stuck mid-fold
        started = time.monotonic()
        assert fold(folder, "spark_catalog")["tables"]["db.t"]["scans_total"] == 1  # the saved statistics
        assert auto_columns(folder, "spark_catalog", "db.t", {"id"})[0] == []
        assert time.monotonic() - started < 10


# 7. A forged ignored-fields entry naming a column the table has ----------------------------

def test_a_forged_ignored_fields_entry_is_refused_for_that_table(tmp_path: Path) -> None:
    config = config_at(write_config(tmp_path, "127.0.0.1:9"))
    catalog = load_catalog(config.catalog)
    table = ensure_table(catalog, config.table)
    with table.transaction() as tx:
        tx.set_properties({"streamberg.ingest.ignored-fields": json.dumps(["id", "gone"])})
    with pytest.raises(IgnoredFieldsRefused) as refused:
        ensure_table(catalog, config.table)
    message = str(refused.value)
    assert "streamberg.ingest.ignored-fields" in message and "names id" in message
    assert "missing from the config" not in message
