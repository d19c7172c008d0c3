"""Columns nobody reads are dropped only where a table declared it, never a protected one,
and the ingest then ignores their fields knowingly: counted, not added back, no dead letter
(table_meta/column_lifecycle.py, maintenance/columns.py). Real broker, the real ingest code
in-process, a real catalog; the scan statistics are the product's own reads' reports, aged
by the test (it states when each column was last read)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.fresh import read
from streamberg.ingest.dead_letters import open_tables
from streamberg.maintenance.columns import DropColumnsExecutor
from streamberg.table_meta.column_lifecycle import IGNORED_FIELDS_PROPERTY
from streamberg.table_meta.field_sightings import sightings_of
from streamberg.table_meta.offsets import summary_properties
from streamberg.table_meta.query_stats import STATS_FILE, fold
from streamberg.table_meta.table_runtime import TableRuntime
from tests.helpers import config_at, dead_letters, table_ids, write_config
from tests.runbooks.inprocess import event, ingest_until, produce_values

DAY = 86400.0


def _age(folder: Path, identifier: str, last_used: dict[str, float], since: float, table=None) -> None:
    """The statistics as if reports had been collected since `since`, each column last read then
    (and, given the table, its fields first seen then too: present for the whole window)."""
    stats = json.loads((folder / STATS_FILE).read_text())
    entry = stats["tables"][identifier]
    entry["since"] = since
    for column, at in last_used.items():
        entry.setdefault("columns", {}).setdefault(column, {})["last_used"] = at
    if table is not None:
        from pyiceberg.schema import index_by_id

        entry["uuid"] = str(table.metadata.table_uuid)
        entry["fields"] = {str(i): since for i in index_by_id(table.schema())}
    (folder / STATS_FILE).write_text(json.dumps(stats))


def test_unused_columns_dropped_where_declared_and_ignored_by_the_ingest(tmp_path: Path, broker: str) -> None:
    path = write_config(tmp_path, broker, ingest={"parallelism": 1, "schema_evolution": "add"},
                        extra={"compactor": {"columns": ["city"]}, "maintenance": {"retention": {"column": "ts"}}},
                        catalog={"scan_reports_dir": "reports"})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 1)
    open_tables(config)
    produce_values(config, [event(i, amount=float(i)) for i in range(50)], 0, 1)
    ingest_until(config, {0: 50})
    catalog = load_catalog(config.catalog)
    table = catalog.load_table(config.table.identifier)
    executor = DropColumnsExecutor()

    # What queries read: id and city (the product's own reads report it).
    for _ in range(3):
        read(config, fresh=False, columns=["id"], row_filter="city = 'c'")
    folder = Path(config.catalog.scan_reports_dir)
    assert fold(folder, config.catalog.name)
    now = time.time()
    _age(folder, config.table.identifier, {"id": now, "city": now, "ts": now - 40 * DAY}, since=now - 40 * DAY,
         table=table)

    # Not declared on the table: nothing is dropped, whatever the statistics say.
    assert not executor.enabled(TableRuntime.of(config, table))
    with table.transaction() as tx:
        tx.set_properties({"streamberg.columns.drop_unused": "true"})
    table = catalog.load_table(config.table.identifier)
    # Declared but not acknowledged (which engines read it, each reporting): still nothing, and said.
    kept = TableRuntime.of(config, table)
    assert not executor.enabled(kept) and any("reporting_engines" in p for p in kept.problems), kept.problems
    assert DropColumnsExecutor().due(kept, catalog, None) is None
    with table.transaction() as tx:
        tx.set_properties({"streamberg.columns.reporting_engines": "streamberg"})
    table = catalog.load_table(config.table.identifier)
    kept = TableRuntime.of(config, table)
    assert kept.policy.problems == [] and executor.enabled(kept)
    due = executor.due(kept, catalog, None)
    assert due is not None and due.action == "drop-columns", due
    assert "user_id, amount" in due.why and "ts (the retention column)" in due.why, due.why

    outcome = executor.run(kept, None)
    assert outcome["dropped"] == ["user_id", "amount"]
    table = catalog.load_table(config.table.identifier)
    assert [f.name for f in table.schema().fields] == ["id", "ts", "city"]  # ts, id, city kept
    assert json.loads(table.properties[IGNORED_FIELDS_PROPERTY]) == ["amount", "user_id"]
    assert executor.due(kept.refreshed(table), catalog, None) is None  # nothing left to drop

    # The ingest goes on: the fields are ignored knowingly, not added back, not dead letters.
    produce_values(config, [event(i, amount=float(i)) for i in range(50, 80)], 0, 1)
    ingest_until(config, {0: 80})
    table = catalog.load_table(config.table.identifier)
    assert [f.name for f in table.schema().fields] == ["id", "ts", "city"]
    assert table_ids(config) == list(range(80))
    assert dead_letters(config).num_rows == 0
    seen = sightings_of(summary_properties(table.current_snapshot()))
    assert seen["user_id"].records == 30 and seen["amount"].records == 30, seen


def test_a_hostile_ignored_fields_property_ignores_nothing() -> None:
    from streamberg.table_meta.column_lifecycle import ignored_fields

    for text in ("", "not json", "{}", "[1, 2]", '"a"', "[" * 10000, json.dumps(["ok", 3, None, ""])):
        found = ignored_fields({IGNORED_FIELDS_PROPERTY: text})
        assert found <= {"ok"}
    assert ignored_fields({IGNORED_FIELDS_PROPERTY: json.dumps([f"c{i}" for i in range(10_000)])}).__len__() == 500


def test_keys_partition_sources_and_named_columns_are_never_dropped(tmp_path: Path) -> None:
    """Even when no query read any column: the key, the partition source, the clustering, the
    and sequence columns stay; the rest may go; never the whole table."""
    from streamberg.common.config import StreambergConfig
    from streamberg.table_meta.column_lifecycle import droppable
    from streamberg.table_meta.declared import ensure_table

    config = StreambergConfig.model_validate({
        "kafka": {"bootstrap_servers": "127.0.0.1:9", "topic": "t", "envelope": "upsert", "key_format": "value"},
        "catalog": {"uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": str(tmp_path / "w")},
        "table": {"identifier": "db.users", "primary_key": ["id"], "sequence_field": "version",
                  "partition_spec": [{"source": "ts", "transform": "day"}],
                  "schema": [{"name": "id", "type": "long", "required": True},
                             {"name": "version", "type": "long", "required": True},
                             {"name": "ts", "type": "timestamptz", "required": True},
                             {"name": "city", "type": "string"}, {"name": "note", "type": "string"},
                             {"name": "extra", "type": "string"}]},
        "compactor": {"columns": ["city"]}})
    table = ensure_table(load_catalog(config.catalog), config.table)
    everything = [f.name for f in table.schema().fields]
    drop, kept = droppable(config, table, everything)
    assert drop == ["note", "extra"]
    assert kept == {"id": "a primary-key column", "version": "the sequence column", "ts": "a partition source",
                    "city": "a clustering column"}
    assert droppable(config, table, ["note"]) == (["note"], {})
