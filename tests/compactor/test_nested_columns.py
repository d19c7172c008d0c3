"""Nested fields through the compactor: a table partitioned by a field inside a struct, laid out
on nested clustering columns, rewritten by a real pass; Spark and pyiceberg read the same rows."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.common.errors import ConfigError
from streamberg.common.spark import register_catalog
from streamberg.compactor.app import CompactOptions, run_compact
from streamberg.table_meta.declared import ensure_table
from tests.compactor.helpers import live_files

pytestmark = pytest.mark.spark

SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "customer", "type": "struct", "fields": [
        {"name": "id", "type": "long"},
        {"name": "geo", "type": "struct<country:string,lat:double>"},
    ]},
    {"name": "tags", "type": "list<string>"},
]


def _config(tmp_path: Path, strategy: str, columns: list[str]):
    document = {
        "kafka": {"topic": "orders"},
        "catalog": {"name": f"c{uuid.uuid4().hex[:10]}", "uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "table": {"identifier": "shop.orders", "schema": SCHEMA,
                  "partition_spec": [{"source": "customer.geo.country"}]},
        "compactor": {"strategy": strategy, "columns": columns, "min_files": 1, "max_delay_seconds": None,
                      "every_n_snapshots": None, "checkpoint_dir": "checkpoint", "seal_after_commits": None,
                      "seal_after_seconds": None},
    }
    path = tmp_path / "streamberg.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_config(path)


def _rows(spark, name: str) -> list[tuple]:
    return sorted(tuple(r) for r in spark.sql(
        f"SELECT id, customer.id, customer.geo.country, customer.geo.lat, tags FROM {name}").collect())


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["zorder", "hilbert"])
def test_a_pass_lays_out_nested_columns_and_keeps_every_row(spark, tmp_path, strategy) -> None:
    config = _config(tmp_path, strategy, ["customer.id", "customer.geo.lat"])
    ensure_table(load_catalog(config.catalog), config.table)
    name = f"{register_catalog(spark, config.catalog)}.{config.table.identifier}"
    for batch in range(4):  # four appends, two partitions each
        values = ", ".join(
            f"({batch * 100 + i}, named_struct('id', {(i * 37 + batch) % 50}, 'geo', "
            f"named_struct('country', '{'NO' if i % 2 else 'SE'}', 'lat', {(i * 13 % 90) + 0.5})), "
            f"array('t{i % 3}', 'x'))"
            for i in range(100))
        spark.sql(f"INSERT INTO {name} VALUES {values}")
    before = _rows(spark, name)
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert len(live_files(table)) == 8

    out = run_compact(config, CompactOptions(once=True), spark=spark)

    after = load_catalog(config.catalog).load_table(config.table.identifier)
    assert out["files_in"] == 8 and out["files_out"] == 2 and len(live_files(after)) == 2
    assert _rows(spark, name) == before
    mine = sorted((r["id"], r["customer"]["id"], r["customer"]["geo"]["country"], r["customer"]["geo"]["lat"], r["tags"])
                  for r in after.scan().to_arrow().to_pylist())
    assert [tuple(r[:4]) for r in mine] == [r[:4] for r in before]
    assert [list(r[4]) for r in mine] == [list(r[4]) for r in before]
    # The pass clustered on the nested columns, and read their bounds from the manifests to
    # measure the partitions it rewrote (files a point query reads, per column).
    record = after.current_snapshot().summary.additional_properties
    assert record["streamberg.compactor.columns"] == "customer.id,customer.geo.lat"
    assert set(json.loads(record["streamberg.compactor.files-per-point"])) == {"customer.id", "customer.geo.lat"}
    # `streamberg status` and `metrics` name the nested columns by their paths.
    from streamberg.monitoring.collect import collect_status
    from streamberg.monitoring.metrics import status_metrics

    status = collect_status(config)
    assert set(status.clustering.columns) == {"customer.id", "customer.geo.lat"}
    labelled = {s.labels.get("column") for family in status_metrics(status, 0.0) for s in family.samples}
    assert {"customer.id", "customer.geo.lat"} <= labelled


@pytest.mark.parametrize(("columns", "refusal"), [
    (["customer.geo"], "'customer.geo' in table shop.orders: it is struct<.*only orderable scalars"),
    (["customer.zip"], r"\['customer.zip'\] not in table"),
    (["tags"], "'tags' in table shop.orders: it is list<string>"),
])
def test_clustering_columns_must_be_scalars_reached_through_structs(spark, tmp_path, columns, refusal) -> None:
    """Refused from the table's schema before Spark starts or the lease is taken."""
    config = _config(tmp_path, "zorder", columns)
    ensure_table(load_catalog(config.catalog), config.table)
    with pytest.raises(ConfigError, match=refusal):
        run_compact(config, CompactOptions(once=True), spark=spark)
