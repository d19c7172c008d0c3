"""Schema evolution from the records (ingest.schema_evolution), against a real SQLite catalog,
real Parquet files and, end to end, a real broker and writer; DuckDB reads what was written.

What must hold: a field the records carry and the table lacks, at any depth, becomes an
optional column in the same commit as the first files that carry it, and its values land;
a value that contradicts the table's type, or a field past a bound, is a dead letter with
the reason; with `off` the fields are counted per path in every commit's summary.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import duckdb
import yaml
from pyiceberg.types import DoubleType, ListType, LongType, NestedField, StringType, StructType

from streamberg.common.catalog import load_catalog
from streamberg.decode.json_decode import JsonDecoder
from streamberg.ingest.committer import Committer
from streamberg.ingest.dead_letters import open_tables
from streamberg.ingest.evolution import plan_additions
from streamberg.ingest.units import DeadLetter, FlushUnit, HeldRecord
from streamberg.monitoring.collect import collect_status
from streamberg.monitoring.health import with_health
from streamberg.monitoring.metrics import status_metrics
from streamberg.monitoring.render import render_screen
from streamberg.table_meta.field_sightings import added_fields_of, sightings_of
from streamberg.table_meta.offsets import summary_properties
from streamberg.table_meta.summary_keys import SummaryKeys
from tests.helpers import config_at, dead_letters, write_config

SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "customer", "type": "struct", "fields": [{"name": "cid", "type": "long"}]},
    {"name": "items", "type": "list", "element": {"type": "struct", "fields": [{"name": "sku", "type": "string"}]}},
    {"name": "attrs", "type": "map", "key": "string", "value": {"type": "struct", "fields": [{"name": "a", "type": "long"}]}},
]


def make_config(tmp_path: Path, broker: str, **ingest):
    path = write_config(tmp_path, broker, ingest={"parallelism": 1, **ingest})
    document = yaml.safe_load(path.read_text())
    document["table"]["schema"] = SCHEMA
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    config = config_at(path)
    open_tables(config)
    return config


def unit_of(config, records: list[dict], start: int = 0, epoch: int = 1) -> FlushUnit:
    """A writer's unit: its records decoded against the table's schema as the writer does."""
    from streamberg.decode.records import RecordDecoder
    from streamberg.ingest.evolution import SchemaChanges, hold_back
    from streamberg.ingest.files import PartitionedFileWriter

    table = load_catalog(config.catalog).load_table(config.table.identifier)
    values = [json.dumps(r).encode() for r in records]
    changes = SchemaChanges()
    split = hold_back(RecordDecoder(table.schema(), 1 << 20, unknown="report").decode(values), table.schema(), changes)
    files = PartitionedFileWriter(table.io, table.location(), table.schema(), table.spec(), table.properties,
                                  1 << 30, 1000, f"test-{start}")
    files.write(split.table)
    return FlushUnit(run_id="test", writer=0, epoch=epoch, topic=config.kafka.topic,
                     ranges={0: (start, start + len(records))}, files=files.flush(), messages=len(records),
                     held=[HeldRecord(0, start + int(i), None, None, values[int(i)]) for i in split.held],
                     dead_letters=[DeadLetter(0, start + i, None, None, values[i], r) for i, r in split.rejected],
                     new_fields=changes.add, widen=changes.widen)


@contextlib.contextmanager
def opened(config, run_id: str):
    committer = Committer(config, parallelism=1, run_id=run_id)
    committer.open()
    try:
        yield committer
    finally:
        committer.close()


def duck_rows(table, sql_columns: str) -> list[tuple]:
    con = duckdb.connect()
    arrow = table.scan().to_arrow()
    con.register("t", arrow)
    return con.execute(f"SELECT {sql_columns} FROM t ORDER BY id").fetchall()


def test_the_decoder_names_fields_the_schema_lacks_at_any_depth_with_inferred_types() -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import MapType

    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "customer", StructType(NestedField(3, "cid", LongType()))),
        NestedField(4, "items", ListType(5, StructType(NestedField(6, "sku", StringType())), element_required=False)),
        NestedField(7, "attrs", MapType(8, StringType(), 9, StructType(NestedField(10, "a", LongType())), value_required=False)),
    )
    decoder = JsonDecoder(schema, 1 << 20, unknown="report")
    result = decoder.decode([
        b'{"id": 1, "customer": {"cid": 1, "email": "a@b", "geo": {"lat": 1.5, "tags": ["x"]}}}',
        b'{"id": 2, "items": [{"sku": "s", "qty": 3}, {"sku": "t"}], "seen": "2026-11-25T10:00:00Z"}',
        b'{"id": 3, "attrs": {"k": {"a": 1, "note": "n"}}, "empty": [], "none": null, "obj": {}}',
        b'{"id": 4, "score": 1}',
        b'{"id": 5, "score": 2.5}',
        b'{"id": 6}',
        b'{"id": 7, "mixed": [1, "a"]}',
    ])
    found = {".".join(u.path): (u.type, u.rows.tolist()) for u in result.unknown}
    assert found == {
        "customer.email": (StringType(), [0]),
        "customer.geo": (StructType(NestedField(1, "lat", DoubleType()),
                                    NestedField(3, "tags", ListType(2, StringType(), element_required=False))), [0]),
        "items.element.qty": (LongType(), [1]),
        "seen": (StringType(), [1]),  # an ISO string stays a string: no guessing of timestamps
        "attrs.value.note": (StringType(), [2]),
        "score": (DoubleType(), [3, 4]),  # an integer and a fraction: double
    }
    # Records without such fields, and the ones with, decode their known fields as before.
    assert result.kept.tolist() == [0, 1, 2, 3, 4, 5]
    assert result.rejected == [(6, "field 'mixed': values of different JSON types in one record; a field the table "
                                   "lacks takes one type (declare it in table.schema to choose)")]
    # The default drops them, as a decoder that is not asked to report.
    assert JsonDecoder(schema, 1 << 20).decode([b'{"id": 1, "x": 1}']).unknown == []


def test_fields_are_added_in_the_same_commit_as_the_records_that_carry_them(tmp_path: Path, broker: str) -> None:
    config = make_config(tmp_path, broker)
    records = [
        {"id": 0, "customer": {"cid": 10}},
        {"id": 1, "customer": {"cid": 11, "email": "a@b", "geo": {"lat": 1.5}}},
        {"id": 2, "items": [{"sku": "s", "qty": 3}], "note": "hello"},
        {"id": 3, "attrs": {"k": {"a": 1, "label": "L"}}},
        {"id": 4, "score": 7},
        {"id": 5, "score": "high"},  # contradicts the type the commit gives `score`
    ]
    with opened(config, "r1") as committer:
        before = load_catalog(config.catalog).load_table(config.table.identifier)
        result = committer.offer(unit_of(config, records))
        assert result is not None and result.records == 5 and result.dead_letters == 1

        table = load_catalog(config.catalog).load_table(config.table.identifier)
        snapshot = table.current_snapshot()
        assert len(table.snapshots()) == len(before.snapshots()) + 1  # one commit: schema and data together
        assert snapshot.schema_id == table.schema().schema_id != before.schema().schema_id
        summary = summary_properties(snapshot)
        assert sorted(path for path, _ in added_fields_of(summary)) == [
            "attrs.value.label", "customer.email", "customer.geo", "items.element.qty", "note", "score"]
        assert summary[SummaryKeys.EVOLVED_RECORDS] == "4"
        for name in ("customer.email", "customer.geo.lat", "items.element.qty", "note", "attrs.value.label", "score"):
            assert not table.schema().find_field(name).required
        rows = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
        assert sorted(rows) == [0, 1, 2, 3, 4]
        assert rows[1]["customer"] == {"cid": 11, "email": "a@b", "geo": {"lat": 1.5}}
        assert rows[2]["items"] == [{"sku": "s", "qty": 3}] and rows[2]["note"] == "hello"
        assert rows[3]["attrs"] == [("k", {"a": 1, "label": "L"})]
        assert rows[4]["score"] == 7 and rows[0]["score"] is None
        # DuckDB, reading the same Arrow data through its own engine, agrees on the new columns.
        assert duck_rows(table, "id, customer.email, note, score") == [
            (0, None, None, None), (1, "a@b", None, None), (2, None, "hello", None), (3, None, None, None), (4, None, None, 7)]
        dead = dead_letters(config).to_pylist()
        assert [json.loads(d["value"])["id"] for d in dead] == [5]
        assert "field 'score': a JSON string where the table has long" in dead[0]["reason"]
    # Status and metrics tell what the ingest added.
    status = with_health(collect_status(config), config)
    assert status.ingest.fields_added == 6 and status.ingest.schema_additions[0].snapshot_id == snapshot.snapshot_id
    assert "customer.email string" in status.ingest.schema_additions[0].fields
    assert "fields added" in render_screen(status)
    exported = {s.name: s.value for family in status_metrics(status, 0.0) for s in family.samples}
    assert exported["streamberg_ingest_fields_added_total"] == 6


def test_a_record_past_the_bound_is_a_dead_letter_with_the_reason(tmp_path: Path, broker: str) -> None:
    config = make_config(tmp_path, broker, max_new_fields_per_commit=3)
    records = [{"id": 0, "a": 1, "b": 2}, {"id": 1, "c": {"x": 1, "y": 2}}, {"id": 2, "d": 1}]
    with opened(config, "r1") as committer:
        committer.offer(unit_of(config, records))
        table = load_catalog(config.catalog).load_table(config.table.identifier)
        assert [path for path, _ in added_fields_of(summary_properties(table.current_snapshot()))] == ["a", "b", "d"]
        assert sorted(r["id"] for r in table.scan().to_arrow().to_pylist()) == [0, 2]
        dead = dead_letters(config).to_pylist()
        assert [json.loads(d["value"])["id"] for d in dead] == [1]
        assert "more than 3 fields" in dead[0]["reason"] and "'c'" in dead[0]["reason"]


def test_the_plan_refuses_names_engines_confuse_and_depth_past_the_bound() -> None:
    from pyiceberg.schema import Schema

    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "Name", StringType()))
    deep: StructType | LongType = LongType()
    for _ in range(20):
        deep = StructType(NestedField(1, "n", deep))
    plan = plan_additions(schema, {("name",): StringType(), ("a.b",): LongType(), ("deep",): deep,
                                   ("ok",): LongType(), ("id",): LongType()}, max_new=100)
    assert plan.added == [(("ok",), LongType())]
    assert "differs only in case from 'Name'" in plan.refused[("name",)]
    assert "without '.'" in plan.refused[("a.b",)]
    assert "deeper than 16" in plan.refused[("deep",)]
    assert ("id",) not in plan.refused  # the table has it: nothing to add


def test_off_counts_the_fields_not_written_in_every_commit(tmp_path: Path, broker: str) -> None:
    config = make_config(tmp_path, broker, schema_evolution="off")
    from streamberg.table_meta.field_sightings import FieldSighting

    with opened(config, "r1") as committer:
        first = unit_of(config, [{"id": 0, "x": 1}, {"id": 1}])
        first.sightings, first.held, first.new_fields = {"x": FieldSighting(1, {0: 0}, {0: 0})}, [], {}
        committer.offer(first)
        second = FlushUnit(run_id="test", writer=0, epoch=2, topic=config.kafka.topic, ranges={0: (2, 4)}, messages=2,
                           sightings={"x": FieldSighting(2, {0: 2}, {0: 3}), "customer.y": FieldSighting(1, {0: 3}, {0: 3})})
        committer.offer(second)
        table = load_catalog(config.catalog).load_table(config.table.identifier)
        seen = sightings_of(summary_properties(table.current_snapshot()))
        assert seen["x"].records == 3 and seen["x"].first == {0: 0} and seen["x"].last == {0: 3}
        assert seen["customer.y"].records == 1
        assert table.schema().find_field("id") and "x" not in [f.name for f in table.schema().fields]
        # A new committer (a restart) carries the counts on.
    with opened(config, "r2") as again:
        assert again.sightings["x"].records == 3
    # Never silent: status warns and names them, metrics count them per path.
    status = with_health(collect_status(config), config)
    assert [(u.path, u.records, u.first, u.last) for u in status.ingest.unknown_fields] == [
        ("x", 3, {"0": 0}, {"0": 3}), ("customer.y", 1, {"0": 3}, {"0": 3})]
    finding = next(f for f in status.health.findings if f["check"] == "unknown_fields")
    assert finding["severity"] == "warn" and "x, customer.y" in finding["reason"]
    assert "x: 3 records (p0 0..3)" in render_screen(status)
    samples = [(s.labels.get("path"), s.value) for family in status_metrics(status, 0.0) for s in family.samples
               if s.name == "streamberg_ingest_unknown_field_records"]
    assert sorted(samples) == [("customer.y", 1.0), ("x", 3.0)]


def test_a_lost_race_replans_against_the_table_it_reads_again(tmp_path: Path, broker: str) -> None:
    """Another writer adds a field between the committer's read and its commit (as an operator's
    `table --evolve` or a replay could): the retry plans against the new schema, adds only what
    is still missing and the held records decode against the field the table now has."""
    from pyiceberg.table import Transaction

    config = make_config(tmp_path, broker)
    with opened(config, "r1") as committer:
        unit = unit_of(config, [{"id": 0, "note": "n", "extra": 5}])
        real_commit = Transaction.commit_transaction
        raced = []

        def racing_commit(self):
            if not raced:
                raced.append(True)
                other = load_catalog(config.catalog).load_table(config.table.identifier)
                with other.update_schema() as update:
                    update.add_column("note", StringType())
            return real_commit(self)

        Transaction.commit_transaction = racing_commit
        try:
            result = committer.offer(unit)
        finally:
            Transaction.commit_transaction = real_commit
        assert result is not None and result.attempts == 2
        table = load_catalog(config.catalog).load_table(config.table.identifier)
        assert [path for path, _ in added_fields_of(summary_properties(table.current_snapshot()))] == ["extra"]
        assert table.scan().to_arrow().to_pylist()[0]["note"] == "n"
        # The first attempt's file is gone: only the committed one is in the data folder.
        data = Path(table.location().removeprefix("file://")) / "data"
        committed = {t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()}
        assert {str(p) for p in data.rglob("*.parquet")} == committed


def test_a_running_writer_follows_the_evolved_schema_and_replay_adds_what_a_bound_refused(tmp_path: Path,
                                                                                        broker: str) -> None:
    """The real writer and committer on a real broker: the first records with a new field are
    held and land through the committer's commit; the writer then decodes against the evolved
    schema itself. A record refused by the bound lands by `replay --dead-letters` once the bound
    is raised, with its fields added."""
    import time

    from streamberg.ingest.replay import replay_dead_letters
    from tests.ingest.one_table import OneTableWriter
    from tests.runbooks.inprocess import produce_values

    config = make_config(tmp_path, broker, max_new_fields_per_commit=3, commit_interval_seconds=1)
    first = [{"id": i, "device": {"os": "x", "v": i}} for i in range(50)] + [{"id": 50, "a": 1, "b": 2, "c": 3}]
    produce_values(config, [json.dumps(r).encode() for r in first], partition=0, partitions=1)
    writer = OneTableWriter(config, 0, 1, "w1")
    writer.open()
    try:
        with opened(config, "w1") as committer:
            def run_until(offset: int) -> list:
                units, deadline = [], time.monotonic() + 60
                while writer.position.get(0, 0) < offset or not units or units[-1].ranges.get(0, (0, 0))[1] < offset:
                    assert time.monotonic() < deadline, writer.position
                    unit = writer.poll()
                    if unit is not None and not unit.empty:
                        units.append(unit)
                        committer.offer(unit)
                return units

            units = run_until(51)
            assert sum(len(u.held) for u in units) == 51  # every record carried a field the schema lacked
            table = load_catalog(config.catalog).load_table(config.table.identifier)
            assert str(table.schema().find_type("device")) .startswith("struct<")
            time.sleep(1.1)  # past the writer's schema re-check interval
            second = [{"id": 100 + i, "device": {"os": "y", "v": i}} for i in range(200)]
            produce_values(config, [json.dumps(r).encode() for r in second[:100]], partition=0, partitions=1)
            run_until(151)  # the batch that shows the writer its schema is stale is still held
            assert writer.lane.schema_id == table.schema().schema_id
            produce_values(config, [json.dumps(r).encode() for r in second[100:]], partition=0, partitions=1)
            later = run_until(251)
            assert sum(len(u.held) for u in later) == 0  # the writer writes them itself now
    finally:
        writer.close()
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    rows = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert sorted(rows) == list(range(50)) + list(range(100, 300))
    assert rows[7]["device"] == {"os": "x", "v": 7} and rows[150]["device"] == {"os": "y", "v": 50}
    dead = dead_letters(config).to_pylist()
    assert [json.loads(d["value"])["id"] for d in dead] == [50]
    assert "more than 3 fields" in dead[0]["reason"]
    # Held records count like any other: table rows + dead letters = records consumed.
    from tests.runbooks.inprocess import cli

    facts = json.loads(cli("table", "--config", str(tmp_path / "streamberg.yaml"), "--json").stdout)
    assert facts["reconciles"] is True and facts["consumed"] == 251

    raised = config.model_copy(update={"ingest": config.ingest.model_copy(update={"max_new_fields_per_commit": 10})})
    outcome = replay_dead_letters(raised)
    assert (outcome.read, outcome.records_added, outcome.still_bad) == (1, 1, 0)
    assert sorted(path for path, _ in outcome.fields_added) == ["a", "b", "c"]
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    landed = [r for r in table.scan().to_arrow().to_pylist() if r["id"] == 50]
    assert [(r["a"], r["b"], r["c"]) for r in landed] == [(1, 2, 3)]
    assert dead_letters(config).num_rows == 0


WIDE = [{"name": "id", "type": "long", "required": True}, {"name": "n", "type": "int"}, {"name": "f", "type": "float"},
        {"name": "d", "type": "decimal(5,2)"},
        {"name": "items", "type": "list", "element": {"type": "struct", "fields": [{"name": "q", "type": "int"}]}}]


def test_values_a_wider_type_takes_widen_the_column_in_the_same_commit(tmp_path: Path, broker: str) -> None:
    path = write_config(tmp_path, broker, ingest={"parallelism": 1})
    document = yaml.safe_load(path.read_text())
    document["table"]["schema"] = WIDE
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    config = config_at(path)
    open_tables(config)
    records = [{"id": 0, "n": 1, "f": 1.5, "d": "1.25"},
               {"id": 1, "n": 3_000_000_000},  # past int: long
               {"id": 2, "f": 1e300},  # past float: double
               {"id": 3, "d": "123456.78"},  # 8 digits: decimal(8,2)
               {"id": 4, "items": [{"q": 1}, {"q": -5_000_000_000}]},  # inside list elements
               {"id": 5, "d": "1.234"}]  # a third decimal place: a scale no widening changes
    with opened(config, "r1") as committer:
        committer.offer(unit_of(config, records))
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    schema = table.schema()
    assert [str(schema.find_type(name)) for name in ("n", "f", "d", "items.element.q")] == [
        "long", "double", "decimal(8, 2)", "long"]
    summary = summary_properties(table.current_snapshot())
    assert table.current_snapshot().schema_id == schema.schema_id
    assert sorted(json.loads(summary[SummaryKeys.SCHEMA_WIDENED])) == [
        ["d", "decimal(5, 2)", "decimal(8, 2)"], ["f", "float", "double"], ["items.element.q", "int", "long"],
        ["n", "int", "long"]]
    rows = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert sorted(rows) == [0, 1, 2, 3, 4]
    assert rows[1]["n"] == 3_000_000_000 and rows[2]["f"] == 1e300 and str(rows[3]["d"]) == "123456.78"
    assert rows[4]["items"] == [{"q": 1}, {"q": -5_000_000_000}] and rows[0]["f"] == 1.5
    dead = dead_letters(config).to_pylist()
    assert [json.loads(d["value"])["id"] for d in dead] == [5]
    status = collect_status(config)
    assert "n int -> long" in status.ingest.schema_additions[0].fields


def test_off_never_changes_the_schema_through_the_real_writer(tmp_path: Path, broker: str) -> None:
    import time

    from tests.ingest.one_table import OneTableWriter
    from tests.runbooks.inprocess import produce_values

    path = write_config(tmp_path, broker, ingest={"parallelism": 1, "schema_evolution": "off",
                                                   "commit_interval_seconds": 1})
    document = yaml.safe_load(path.read_text())
    document["table"]["schema"] = WIDE
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    config = config_at(path)
    open_tables(config)
    produce_values(config, [b'{"id": 1, "n": 3000000000}', b'{"id": 2, "n": 7, "extra": {"k": 1}}'],
                   partition=0, partitions=1)
    before = load_catalog(config.catalog).load_table(config.table.identifier).schema()
    writer = OneTableWriter(config, 0, 1, "w1")
    writer.open()
    try:
        with opened(config, "w1") as committer:
            deadline = time.monotonic() + 60
            while committer.expected.get(0, 0) < 2:
                assert time.monotonic() < deadline
                unit = writer.poll()
                if unit is not None:
                    committer.offer(unit)
    finally:
        writer.close()
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert table.schema() == before
    assert [r["id"] for r in table.scan().to_arrow().to_pylist()] == [2]
    assert [d["reason"] for d in dead_letters(config).to_pylist()] == ["field 'n': integer out of range for int"]
    seen = sightings_of(summary_properties(table.current_snapshot()))
    assert {p: (v.records, v.first, v.last) for p, v in seen.items()} == {"extra": (1, {0: 1}, {0: 1})}


MAPS_IN_LISTS = [
    {"name": "id", "type": "long", "required": True},
    {"name": "orders", "type": "list", "element": {"type": "struct", "fields": [
        {"name": "sku", "type": "string"}, {"name": "attrs", "type": "map<string,int>"}]}},
    {"name": "scores", "type": "list<int>"},
    {"name": "counts", "type": "map<string,int>"},
    {"name": "grid", "type": "list", "element": {"type": "map", "key": "string", "value": "long"}, "element_required": True},
]


def test_maps_inside_lists_are_read_and_evolve_like_any_column(tmp_path: Path, broker: str) -> None:
    """A list whose elements hold a map (list<struct<.., map>>, list<map>) is read from JSON
    with every rule; a field new inside such elements is added; a value past int inside a
    map's values or a list's elements widens that column, in the same commit."""
    path = write_config(tmp_path, broker, ingest={"parallelism": 1})
    document = yaml.safe_load(path.read_text())
    document["table"]["schema"] = MAPS_IN_LISTS
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    config = config_at(path)
    open_tables(config)
    records = [{"id": 0, "orders": [{"sku": "a", "attrs": {"x": 1}}, {"sku": "b"}], "grid": [{"r": 1}, {}]},
               {"id": 1, "orders": [{"sku": "c", "attrs": {"x": 5_000_000_000}}]},  # inside a map in a list: widen
               {"id": 2, "orders": [{"sku": "d", "gift": True}]},  # a new field inside the elements: add
               {"id": 3, "scores": [1, 6_000_000_000]},  # list<int>: widen its elements
               {"id": 4, "counts": {"k": 7_000_000_000}},  # map<string,int>: widen its values
               {"id": 5, "orders": {"sku": "not a list"}},  # a contradiction: dead letter
               {"id": 6, "grid": [None]}]  # a null element where they are required: dead letter
    with opened(config, "r1") as committer:
        committer.offer(unit_of(config, records))
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    schema = table.schema()
    assert [str(schema.find_type(p)) for p in ("orders.element.attrs.value", "orders.element.gift",
                                               "scores.element", "counts.value")] == ["long", "boolean", "long", "long"]
    assert table.current_snapshot().schema_id == schema.schema_id  # one commit: schema and rows
    rows = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert sorted(rows) == [0, 1, 2, 3, 4]
    assert rows[0]["orders"] == [{"sku": "a", "attrs": [("x", 1)], "gift": None}, {"sku": "b", "attrs": None, "gift": None}]
    assert rows[0]["grid"] == [[("r", 1)], []]
    assert rows[1]["orders"][0]["attrs"] == [("x", 5_000_000_000)] and rows[2]["orders"][0]["gift"] is True
    assert rows[3]["scores"] == [1, 6_000_000_000] and rows[4]["counts"] == [("k", 7_000_000_000)]
    # DuckDB reads the same nested values from the data files.
    files = [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]
    assert duckdb.connect().execute(
        f"SELECT sum(len(orders)), sum(len(grid)) FROM read_parquet({files!r}, union_by_name=true)").fetchone() == (4, 2)
    dead = {json.loads(d["value"])["id"]: d["reason"] for d in dead_letters(config).to_pylist()}
    assert dead[5] == "field 'orders': not a JSON array (a list is read from an array)"
    assert sorted(dead) == [5, 6] and "grid" in dead[6]
