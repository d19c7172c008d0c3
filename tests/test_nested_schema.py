"""Nested types in `table.schema` (struct, list, map; tree and short forms), the Iceberg table
made from them with a real SQLite catalog, and the differences and evolution at every depth."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from pydantic import ValidationError
from pyiceberg.types import ListType, MapType, StructType

from streamberg.common.catalog import load_catalog
from streamberg.common.config import TableConfig, load_config
from streamberg.common.errors import ConfigError, SchemaMismatchError
from streamberg.common.schema import describe_schema_differences, schema_from_config
from streamberg.table_meta.declared import ensure_table, evolve_table

ORDERS_TREE = [
    {"name": "id", "type": "long", "required": True},
    {"name": "ts", "type": "timestamptz"},
    {"name": "customer", "type": "struct", "fields": [
        {"name": "id", "type": "long", "required": True},
        {"name": "geo", "type": "struct", "fields": [{"name": "city", "type": "string"}, {"name": "lat", "type": "double"}]},
    ]},
    {"name": "tags", "type": "list", "element": "string"},
    {"name": "attrs", "type": "map", "key": "string", "value": "long"},
    {"name": "items", "type": "list", "element": {"type": "struct", "fields": [
        {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}},
]
ORDERS_SHORT = [
    {"name": "id", "type": "long", "required": True},
    {"name": "ts", "type": "timestamptz"},
    {"name": "customer", "type": "struct", "fields": [
        {"name": "id", "type": "long", "required": True},
        {"name": "geo", "type": "struct<city:string, lat:double>"},
    ]},
    {"name": "tags", "type": "list<string>"},
    {"name": "attrs", "type": "MAP<string,long>"},
    {"name": "items", "type": "list<struct<sku:string,qty:int>>"},
]


def _table(schema: list, **extra) -> TableConfig:
    return TableConfig(identifier="shop.orders", schema=schema, **extra)


def _errors(schema: list, **extra) -> str:
    with pytest.raises(ValidationError) as caught:
        _table(schema, **extra)
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in caught.value.errors())


def test_tree_and_short_forms_declare_the_same_iceberg_schema() -> None:
    tree, short = schema_from_config(_table(ORDERS_TREE)), schema_from_config(_table(ORDERS_SHORT))
    assert tree == short
    customer = tree.find_field("customer.geo.city")
    assert str(customer.field_type) == "string" and not customer.required
    assert tree.find_field("customer.id").required
    assert isinstance(tree.find_field("items").field_type, ListType)
    assert isinstance(tree.find_field("items").field_type.element_type, StructType)
    attrs = tree.find_field("attrs").field_type
    assert isinstance(attrs, MapType) and str(attrs.key_type) == "string" and str(attrs.value_type) == "long"
    ids = [f.field_id for f in tree.find_field("customer").field_type.fields]
    every_id = list(tree._lazy_id_to_field)
    assert len(every_id) == len(set(every_id)) == 16  # 6 columns, 4 in customer, 1 in tags, 2 in attrs, 3 in items
    assert [f.field_id for f in tree.fields] == [1, 2, 3, 4, 5, 6] and min(ids) > 6


@pytest.mark.parametrize(("schema", "expected"), [
    ([{"name": "x", "type": "list"}], "element: a list needs its element type"),
    ([{"name": "x", "type": "map", "key": "string"}], "key, value: a map needs both"),
    ([{"name": "x", "type": "struct", "fields": []}], "fields: List should have at least 1 item"),
    ([{"name": "x", "type": "string", "fields": [{"name": "a", "type": "long"}]}], "fields: not a part of a string type"),
    ([{"name": "x", "type": "list<string>", "element": "long"}], "element: not a part of a list<string> type"),
    ([{"name": "x", "type": "list", "element": "long", "key": "string"}], "key: not a part of a list type"),
    ([{"name": "x", "type": "long", "element_required": True}], "element_required: only a list has elements"),
    ([{"name": "x", "type": "map<list<string>,long>"}], "a map's key must be a primitive type"),
    ([{"name": "x", "type": "map", "key": "list<string>", "value": "long"}], "a map's key must be a primitive type"),
    ([{"name": "x", "type": "struct<a:long,a:string>"}], "field 'a' twice in one struct"),
    ([{"name": "x", "type": "struct", "fields": [{"name": "a", "type": "long"}, {"name": "a", "type": "int"}]}],
     "duplicate field names ['a']"),
    ([{"name": "x", "type": "list<decimal(50,2)>"}], "precision must be 1 to 38"),
    ([{"name": "x", "type": "list<strin>"}], "unknown type 'strin'"),
    ([{"name": "x", "type": "list<string"}], "ends early"),
    ([{"name": "x", "type": "list<string>>"}], "unexpected '>' after the type"),
    ([{"name": "x", "type": "struct<1a:long>"}], "unexpected"),
    ([{"name": "x", "type": "list<" * 17 + "long" + ">" * 17}], "nested more than 16 levels deep"),
    ([{"name": "x", "type": "struct", "fields": [{"name": "a", "type": "long", "required": "yes"}]}],
     "schema.0.fields.0.required: Value error, must be true or false"),
    ([{"name": "x", "type": "list<timestamp>", "unit": "ms"}], "an epoch unit only applies to timestamp/timestamptz"),
    ([{"name": "x", "type": "struct", "fields": [{"name": "bad name", "type": "long"}]}], "must be an ASCII identifier"),
])
def test_each_bad_nested_type_is_named(schema: list, expected: str) -> None:
    assert expected in _errors(schema)


def test_a_schema_past_the_field_bound_is_refused_with_the_map_hint() -> None:
    wide = [{"name": f"s{i}", "type": "struct", "fields": [{"name": f"f{j}", "type": "long"} for j in range(100)]}
            for i in range(100)]
    message = _errors(wide)
    assert "10100 fields at all depths; at most 10000" in message and "as a map" in message


def test_nested_partition_sources_follow_structs_only() -> None:
    table = _table(ORDERS_TREE, partition_spec=[{"source": "customer.geo.city"}, {"source": "ts", "transform": "day"}])
    assert [p.source for p in table.partition_spec] == ["customer.geo.city", "ts"]
    assert "'items.sku' is inside a list or map" in _errors(ORDERS_TREE, partition_spec=[{"source": "items.sku"}])
    assert "'customer.geo' is a struct" in _errors(ORDERS_TREE, partition_spec=[{"source": "customer.geo"}])
    assert "'customer.zip' is not a schema field" in _errors(ORDERS_TREE, partition_spec=[{"source": "customer.zip"}])
    assert "day needs a date/timestamp field" in _errors(
        ORDERS_TREE, partition_spec=[{"source": "customer.geo.city", "transform": "day"}])
    assert "dotted path" in _errors(ORDERS_TREE, partition_spec=[{"source": "customer..city"}])


def _config(tmp_path: Path, schema: list, **table_extra):
    document = {
        "kafka": {"topic": "orders"},
        "catalog": {"uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "table": {"identifier": "shop.orders", "schema": schema, **table_extra},
    }
    path = tmp_path / "streamberg.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_config(path)


def test_a_nested_partition_source_names_the_field_by_its_path(tmp_path: Path) -> None:
    config = _config(tmp_path, ORDERS_SHORT, partition_spec=[{"source": "customer.geo.city"}])
    table = ensure_table(load_catalog(config.catalog), config.table)
    assert table.spec().fields[0].name == "customer_geo_city"
    assert table.spec().fields[0].source_id == table.schema().find_field("customer.geo.city").field_id


def test_the_catalog_creates_nested_columns_and_reads_back_the_same_values(tmp_path: Path) -> None:
    config = _config(tmp_path, ORDERS_SHORT)
    table = ensure_table(load_catalog(config.catalog), config.table)
    assert describe_schema_differences(schema_from_config(config.table), table.schema()) == []
    rows = [{"id": 1, "ts": None, "customer": {"id": 7, "geo": {"city": "Oslo", "lat": 59.9}}, "tags": ["a", "b"],
             "attrs": [("k", 3)], "items": [{"sku": "x1", "qty": 2}, {"sku": "x2", "qty": None}]},
            # (items not null: pyiceberg 0.8.1's own append writes a null list of structs as [];
            # the ingest writes Parquet itself, ingest/files.py)
            {"id": 2, "ts": None, "customer": None, "tags": None, "attrs": [], "items": [{"sku": None, "qty": 1}]}]
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    table.append(pa.Table.from_pylist(rows, schema=schema_to_pyarrow(table.schema())))
    back = load_catalog(config.catalog).load_table("shop.orders").scan().to_arrow().sort_by("id").to_pylist()
    assert back == rows
    # The same config again finds the table as it is.
    assert ensure_table(load_catalog(config.catalog), config.table).schema() == table.schema()


def test_differences_and_evolution_reach_every_depth(tmp_path: Path) -> None:
    config = _config(tmp_path, ORDERS_TREE)
    catalog = load_catalog(config.catalog)
    ensure_table(catalog, config.table)
    grown = [dict(f) for f in ORDERS_TREE]
    grown[2] = {**grown[2], "fields": [*grown[2]["fields"], {"name": "tier", "type": "string"}]}
    grown[5] = {"name": "items", "type": "list<struct<sku:string,qty:int,price:decimal(10,2)>>"}
    grown.append({"name": "shipping", "type": "struct<carrier:string,eta:date>"})
    wider = _config(tmp_path, grown)
    with pytest.raises(SchemaMismatchError) as refused:
        ensure_table(catalog, wider.table)
    for path in ("'customer.tier'", "'items.price'", "'shipping'"):
        assert f"column {path}" in str(refused.value)
    plan = evolve_table(catalog, wider.table)
    assert sorted(change.split(" (")[0] for change in plan.changes) == [
        "add optional column 'customer.tier'", "add optional column 'items.price'", "add optional column 'shipping'"]
    evolved = catalog.load_table("shop.orders").schema()
    assert str(evolved.find_field("customer.tier").field_type) == "string"
    assert str(evolved.find_field("items.element.price").field_type) == "decimal(10, 2)"
    assert str(evolved.find_field("shipping.eta").field_type) == "date"
    every_id = list(evolved._lazy_id_to_field)
    assert len(every_id) == len(set(every_id))
    assert ensure_table(catalog, wider.table).schema() == evolved  # now it matches
    # Changes --evolve does not make are refused with their paths, changing nothing.
    narrowed = [dict(f) for f in grown]
    narrowed[2] = {**narrowed[2], "fields": [{"name": "id", "type": "int", "required": True}, *narrowed[2]["fields"][1:]]}
    narrowed[3] = {"name": "tags", "type": "list", "element": "string", "element_required": True}
    with pytest.raises(SchemaMismatchError) as typed:
        evolve_table(catalog, _config(tmp_path, narrowed).table)
    assert "column 'customer.id' is long in the table but int in the config" in str(typed.value)
    assert "the elements of column 'tags'" not in str(typed.value)  # required in the config only: fine
    assert catalog.load_table("shop.orders").schema() == evolved


def test_nested_retention_column_must_be_a_time_field_outside_lists(tmp_path: Path) -> None:
    from streamberg.maintenance.app import check_config

    schema = [*ORDERS_TREE, {"name": "audit", "type": "struct<created:timestamptz,by:string>"},
              {"name": "events", "type": "list<struct<at:timestamptz>>"}]
    base = _config(tmp_path, schema)

    def with_column(column: str):
        return base.model_copy(update={"maintenance": base.maintenance.model_copy(update={
            "retention": base.maintenance.retention.model_copy(update={"column": column, "days": 30})})})

    check_config(with_column("audit.created"))
    with pytest.raises(ConfigError, match="'audit.by' is string"):
        check_config(with_column("audit.by"))
    with pytest.raises(ConfigError, match="'events.at' is inside a list or map"):
        check_config(with_column("events.at"))
    with pytest.raises(ConfigError, match="'audit.when' is not in table.schema"):
        check_config(with_column("audit.when"))


def test_sample_events_follow_the_nested_shapes() -> None:
    """`streamberg produce` writes what the schema declares at every depth."""
    import random

    from streamberg.cli.sample_events import _value_maker

    table = _table(ORDERS_SHORT)
    rng = random.Random(3)
    events = [{f.name: _value_maker(f, rng)(i, 1.7e9) for f in table.schema_} for i in range(50)]
    for event in events:
        assert set(event["customer"]) == {"id", "geo"} and set(event["customer"]["geo"]) == {"city", "lat"}
        assert isinstance(event["tags"], list) and all(isinstance(t, str) for t in event["tags"])
        assert all(isinstance(k, str) and isinstance(v, int) for k, v in event["attrs"].items())
        assert all(set(item) == {"sku", "qty"} and isinstance(item["qty"], int) for item in event["items"])
    assert any(event["items"] for event in events) and any(event["attrs"] for event in events)
