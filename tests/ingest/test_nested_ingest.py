"""Nested JSON end to end: the orders shape (maps at the top and inside a struct too) through the real `streamberg ingest` (PyFlink) into a
table partitioned by a field inside a struct; Spark and pyiceberg read back the values produced,
and records that break a rule at depth are dead-lettered with the field's path. The records
also carry a nested field the declared schema lacks (`customer.geo.unknown`): the ingest adds
it (ingest.schema_evolution: add, the default) and its values land too."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from streamberg.common.catalog import load_catalog
from streamberg.common.spark import register_catalog
from tests.helpers import config_at, dead_letters, streamberg, write_config
from tests.runbooks.inprocess import produce_values

pytestmark = [pytest.mark.flink, pytest.mark.spark]

ORDERS = [
    {"name": "id", "type": "long", "required": True},
    {"name": "ts", "type": "timestamptz", "required": True},
    {"name": "customer", "type": "struct", "fields": [
        {"name": "cid", "type": "long", "required": True},
        {"name": "since", "type": "timestamptz", "unit": "s"},
        {"name": "geo", "type": "struct<country:string,lat:double>"},
        {"name": "labels", "type": "map<string,string>"},
    ]},
    {"name": "attrs", "type": "map", "key": "string", "value": "long"},
    {"name": "tags", "type": "list<string>"},
    {"name": "items", "type": "list", "element": {"type": "struct", "fields": [
        {"name": "sku", "type": "string", "required": True},
        {"name": "qty", "type": "int"},
        {"name": "price", "type": "decimal(10,2)"},
    ]}},
]
COUNTRIES = ["NO", "SE", "DK"]


def order(i: int) -> dict:
    return {
        "id": i, "ts": f"2026-11-25T10:{i % 60:02d}:00Z",
        "customer": None if i % 10 == 9 else {
            "cid": i % 37, "since": 1_700_000_000 + i,
            "geo": {"country": COUNTRIES[i % 3], "lat": 50 + i / 100, "unknown": {"deep": [1, 2]}},
            "labels": {f"l{k}": f"v{i}-{k}" for k in range(i % 3)}},
        "attrs": None if i % 7 == 6 else {f"a{k}": i * k for k in range(i % 5)},
        "tags": [f"t{i % 4}", "x"] if i % 5 else None,
        # Null lists of structs stay null in the files (Spark reads them as null).
        "items": None if i % 11 == 10 else [{"sku": f"s{i}-{k}", "qty": k + 1, "price": f"{k}.{i % 100:02d}"}
                                            for k in range(i % 4)],
    }


BAD = {
    1000: ({"id": 1000, "ts": "2026-11-25T10:00:00Z", "customer": {"since": 5}}, "missing required field 'customer.cid'"),
    1002: ({"id": 1002, "ts": "2026-11-25T10:00:00Z", "items": [{"qty": 1}]}, "missing required field 'items.sku'"),
    1003: ({"id": 1003, "ts": "2026-11-25T10:00:00Z", "customer": {"cid": 1, "geo": {"lat": "north"}}},
           "Column(/customer/geo/lat) changed from number to string"),
    1004: ({"id": 1004, "ts": "2026-11-25T10:00:00Z", "attrs": {"a": "many"}}, "Column(/attrs) changed"),
}


def test_nested_orders_land_as_nested_columns_read_alike_by_spark_and_pyiceberg(tmp_path: Path, broker: str,
                                                                               spark) -> None:
    path = write_config(tmp_path, broker, ingest={"parallelism": 2})
    document = yaml.safe_load(path.read_text())
    document["table"]["schema"] = ORDERS
    document["table"]["partition_spec"] = [{"source": "customer.geo.country"}]
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    config = config_at(path)
    # The last order has a quantity past int inside the list's elements: the ingest widens
    # items.qty to long (ingest.schema_evolution: add).
    good = [order(i) for i in range(400)] + [{**order(400), "items": [{"sku": "a", "qty": 2 ** 40, "price": "1.00"}]}]
    values = [json.dumps(o).encode() for o in good] + [json.dumps(v).encode() for v, _ in BAD.values()]
    produce_values(config, values, partition=0, partitions=2)
    streamberg("ingest", "--config", str(path), "--max-records", str(len(values)), "--quiet")

    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert table.spec().fields[0].name == "customer_geo_country"
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(401))
    assert str(table.schema().find_type("items.element.qty")) == "long"
    for got, want in zip(rows, good):
        assert got["ts"] == dt.datetime.fromisoformat(want["ts"].replace("Z", "+00:00"))
        if want["customer"] is None:
            assert got["customer"] is None
        else:
            assert got["customer"]["cid"] == want["customer"]["cid"]
            assert got["customer"]["since"] == dt.datetime.fromtimestamp(want["customer"]["since"], dt.timezone.utc)
            assert got["customer"]["geo"] == want["customer"]["geo"]  # the added field's values too
            assert got["customer"]["labels"] == list(want["customer"]["labels"].items())
        assert got["attrs"] == (None if want["attrs"] is None else list(want["attrs"].items()))
        assert got["tags"] == want["tags"]
        if want["items"] is None:
            # The file holds null (Spark reads it below); pyiceberg 0.8.1's scan turns a null
            # list of structs into [] on read.
            assert got["items"] in (None, [])
        else:
            assert got["items"] == [{"sku": it["sku"], "qty": it["qty"], "price": Decimal(it["price"])}
                                    for it in want["items"]]
    # Partitioned by the nested field: each file holds one country.
    for task in table.scan().plan_files():
        assert task.file.partition[0] in COUNTRIES or task.file.partition[0] is None
    # Spark, an independent reader, sees the same nested values.
    name = f"{register_catalog(spark, config.catalog)}.{config.table.identifier}"
    # The field the records added, in the commit that first carried it.
    assert str(table.schema().find_type("customer.geo.unknown.deep")) == "list<long>"
    added = [s for s in table.snapshots() if "streamberg.schema-added" in (s.summary.additional_properties or {})]
    assert len(added) == 1 and "customer.geo.unknown" in added[0].summary.additional_properties["streamberg.schema-added"]
    assert added[0].schema_id == table.schema().schema_id
    spark_deep = spark.sql(f"SELECT id, customer.geo.unknown.deep AS deep FROM "
                           f"{register_catalog(spark, config.catalog)}.{config.table.identifier}").collect()
    assert sorted((r["id"], r["deep"]) for r in spark_deep) == sorted(
        (o["id"], [1, 2] if o["customer"] else None) for o in good)
    spark_rows = spark.sql(f"SELECT id, customer.cid, customer.geo.country, size(items) AS n, "
                           f"aggregate(items, CAST(0 AS BIGINT), (acc, it) -> acc + it.qty) AS qty, tags, attrs['a1'] AS a1, "
                           f"map_keys(customer.labels) AS labels FROM {name}").collect()
    assert sorted((r["id"], r["cid"], r["country"], r["n"], r["qty"], r["tags"], r["a1"], r["labels"])
                  for r in spark_rows) == sorted(
        (o["id"], o["customer"]["cid"] if o["customer"] else None,
         o["customer"]["geo"]["country"] if o["customer"] else None,
         len(o["items"]) if o["items"] is not None else -1, sum(it["qty"] for it in o["items"] or []) if o["items"] is not None else None, o["tags"],
         (o["attrs"] or {}).get("a1"), list(o["customer"]["labels"]) if o["customer"] else None) for o in good)
    # The records that break a rule at depth are dead letters with the field's path.
    dead = {json.loads(d["value"])["id"]: d["reason"] for d in dead_letters(config).to_pylist()}
    assert set(dead) == set(BAD)
    for key, (_, reason) in BAD.items():
        assert reason in dead[key]
