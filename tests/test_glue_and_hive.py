"""catalog.type glue and hive, as far as these machines allow.

- Glue: pyiceberg's GlueCatalog against moto's server (tests/fixtures/s3.py: the same process
  speaks S3 and Glue), the warehouse in its S3 bucket. The real ingest code (in process)
  commits exactly once into a table of that catalog; Glue's own API (boto3) names the table's
  current metadata file; `streamberg check --connect` and `status` reach it. Spark's side
  (Iceberg's GlueCatalog needs the AWS SDK v2 jars, not installable here) is checked for its
  properties and for failing fast.
- Hive: no metastore runs here. The configuration is checked, pyiceberg's HiveCatalog is made
  and refused in one line by a closed port, Spark's properties are checked.
Neither is tested against the real services (docs/catalogs.md).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from streamberg.common.catalog import load_catalog
from streamberg.common.catalog_java import S3_FILE_IO_IMPL
from streamberg.common.config import load_config
from streamberg.common.errors import CatalogUnreachable, ConfigError, MissingJarError
from streamberg.common.spark import spark_catalog_conf, spark_jars
from streamberg.table_meta.offsets import committed_position
from tests.fixtures.s3 import ACCESS_KEY, REGION, SECRET_KEY
from tests.helpers import EVENT_SCHEMA, dead_letters, duplicates, streamberg, table_ids
from tests.runbooks.inprocess import event, ingest_until, produce_values


def _write(path: Path, catalog: dict, bootstrap: str = "127.0.0.1:1", topic: str = "t") -> Path:
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": bootstrap, "topic": topic},
        "catalog": catalog,
        "table": {"identifier": "lake.events", "schema": EVENT_SCHEMA},
        "ingest": {"state_dir": str(path.parent / "state"), "commit_interval_seconds": 1, "parallelism": 1},
        "monitoring": {"broker_timeout_seconds": 5}}, sort_keys=False))
    return path


def test_metastore_catalog_configs_are_checked_at_load(tmp_path: Path) -> None:
    def refused(catalog: dict) -> str:
        with pytest.raises(ConfigError) as caught:
            load_config(_write(tmp_path / "c.yaml", catalog))
        return str(caught.value)

    assert "uri: not used by a Glue catalog" in refused({"type": "glue", "uri": "https://glue", "warehouse": "s3://b/w"})
    assert "warehouse:" in refused({"type": "glue", "warehouse": "relative/path"})
    assert "thrift://host:port" in refused({"type": "hive", "uri": "http://metastore:9083", "warehouse": "s3://b/w"})
    assert "keys of a REST catalog" in refused({"type": "hive", "uri": "thrift://m:9083", "warehouse": "s3://b/w",
                                                "token": "x"})
    hive = load_config(_write(tmp_path / "h.yaml", {"type": "hive", "name": "hv", "uri": "thrift://m:9083",
                                                    "warehouse": "hdfs://nn/warehouse"}))
    assert hive.catalog.warehouse == "hdfs://nn/warehouse" and hive.catalog.state_uri.startswith("sqlite:////")
    conf = spark_catalog_conf(hive.catalog)
    assert conf["spark.sql.catalog.hv.type"] == "hive" and conf["spark.sql.catalog.hv.uri"] == "thrift://m:9083"
    assert conf["spark.sql.catalog.hv.warehouse"] == "hdfs://nn/warehouse"


def test_a_hive_metastore_that_does_not_answer_is_one_clear_line(tmp_path: Path) -> None:
    from streamberg.common.broker import free_port

    path = _write(tmp_path / "hive.yaml", {"type": "hive", "name": "hv", "uri": f"thrift://127.0.0.1:{free_port()}",
                                           "warehouse": "file:///tmp/hive-wh"})
    with pytest.raises(CatalogUnreachable, match="hive catalog thrift://127.0.0.1:"):
        load_catalog(load_config(path).catalog)
    proc = streamberg("check", "--config", str(path), "--connect", check=False)
    assert proc.returncode == 1 and "catalog  FAILED  hive thrift://" in proc.stdout, proc.stdout


def test_glue_through_moto_exactly_once(tmp_path: Path, s3, broker: str, monkeypatch) -> None:
    bucket = s3.create_bucket("glue")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)  # how a real deployment gives them: the environment
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    topic = f"glue-{uuid.uuid4().hex[:8]}"
    catalog = {"type": "glue", "name": f"g{uuid.uuid4().hex[:6]}", "warehouse": f"s3://{bucket}/warehouse",
               "properties": {"glue.region": REGION, "glue.endpoint": s3.endpoint, **s3.catalog_properties()}}
    path = _write(tmp_path / "glue.yaml", catalog, broker, topic)
    config = load_config(path)

    from streamberg.common.broker import ensure_topic

    ensure_topic(broker, topic, 1)
    values = [event(i) for i in range(200)] + [b"{not json"] + [event(i) for i in range(200, 400)]
    produce_values(config, values, 0, 1)
    ingest_until(config, {0: len(values)})

    ids = table_ids(config)
    assert ids == list(range(400)) and not duplicates(ids)
    assert dead_letters(config).num_rows == 1
    table = load_catalog(config.catalog).load_table("lake.events")
    assert committed_position(table, topic).offsets == {0: len(values)}
    # Glue's own record of the table (boto3, not pyiceberg) points at the metadata file just committed.
    import boto3

    glue = boto3.client("glue", endpoint_url=s3.endpoint, region_name=REGION)
    stored = glue.get_table(DatabaseName="lake", Name="events")["Table"]["Parameters"]
    assert stored["metadata_location"] == table.metadata_location
    assert table.metadata_location.startswith(f"s3://{bucket}/warehouse/")

    report = json.loads(streamberg("check", "--config", str(path), "--connect", "--json").stdout)
    catalog_probe = next(p for p in report["probes"] if p["component"] == "catalog")
    assert catalog_probe["ok"] and catalog_probe["facts"]["tables"] == {"lake.events": True}
    status = json.loads(streamberg("status", "--config", str(path), "--json", check=False).stdout)
    assert status["ingest"]["last_commit"]["snapshot_id"] == table.current_snapshot().snapshot_id

    # Spark: Iceberg's GlueCatalog with the same keys, and the AWS SDK jars asked for by name.
    conf = spark_catalog_conf(config.catalog)
    prefix = f"spark.sql.catalog.{config.catalog.name}"
    assert conf[f"{prefix}.type"] == "glue" and conf[f"{prefix}.io-impl"] == S3_FILE_IO_IMPL
    assert conf[f"{prefix}.glue.endpoint"] == s3.endpoint and conf[f"{prefix}.client.region"] == REGION
    monkeypatch.delenv("STREAMBERG_SPARK_S3_JARS", raising=False)
    with pytest.raises(MissingJarError, match="AWS SDK v2"):
        spark_jars(config.catalog)
