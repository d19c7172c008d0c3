"""A warehouse on S3-compatible object storage (a local S3 server, tests/fixtures/s3.py).

pyiceberg (ingest, CLI) reads and writes s3:// through pyarrow's S3FileSystem with the
`catalog.properties` keys. boto3 listing the bucket is the independent view of what landed.
Spark is checked only for failing fast: Iceberg's S3FileIO needs the AWS SDK v2 jars, which
nothing installable here ships (deploy/object-store/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from streamberg.cli.sample_events import produce_events
from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.common.catalog_java import S3_FILE_IO_IMPL, jdbc_catalog_properties
from streamberg.common.config import StreambergConfig, load_config
from streamberg.common.errors import MissingJarError, SparkCatalogError
from streamberg.common.jars import SPARK_S3_JARS_ENV
from streamberg.common.spark import register_catalog, spark_jars
from streamberg.table_meta.declared import ensure_table
from streamberg.table_meta.offsets import committed_position
from tests.compactor.helpers import DAY, TOPIC, FakeIngest, live_files, reload
from tests.compactor.helpers import write_config as compactor_config
from tests.helpers import dead_letters, duplicates, streamberg, table_ids
from tests.helpers import write_config as ingest_config


def on_s3(path: Path, warehouse: str, properties: dict[str, str], uri: str | None = None) -> StreambergConfig:
    """Move a test config's warehouse (and optionally its catalog) elsewhere; returns it loaded."""
    document = yaml.safe_load(path.read_text())
    document["catalog"]["warehouse"] = warehouse
    document["catalog"]["properties"] = properties
    if uri is not None:
        document["catalog"]["uri"] = uri
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_config(path)


def bucket_key(bucket: str, path: str) -> str:
    prefix = f"s3://{bucket}/"
    assert path.startswith(prefix), path
    return path.removeprefix(prefix)


def test_pyiceberg_table_lives_in_the_bucket(s3, tmp_path) -> None:
    bucket = s3.create_bucket()
    path = compactor_config(tmp_path, partition_spec=DAY)
    config = on_s3(path, f"s3://{bucket}/warehouse", s3.catalog_properties())
    ensure_table(load_catalog(config.catalog), config.table)
    ingest = FakeIngest(config, seed=11)
    for _ in range(3):
        ingest.append(300, days=2)

    table = reload(config)
    objects = s3.keys(bucket)
    assert bucket_key(bucket, table.metadata_location) in objects
    files = live_files(table)
    assert len(files) == 6  # 3 appends x 2 days
    sizes = {f.file.file_path: f.file.file_size_in_bytes for f in table.scan().plan_files()}
    for file_path, size in sizes.items():
        assert objects[bucket_key(bucket, file_path)] == size
    assert table.scan().to_arrow().num_rows == 900
    assert committed_position(table, TOPIC).offsets == {0: 900}

    # The CLI reads the same table from the config alone (endpoint, keys from catalog.properties).
    facts = json.loads(streamberg("table", "--config", str(path), "--json").stdout)
    assert facts["records"] == 900 and facts["data_files"] == 6


def test_compactor_on_s3_without_the_spark_s3_jars_exits_1_naming_them(s3, tmp_path) -> None:
    bucket = s3.create_bucket()
    path = compactor_config(tmp_path)
    config = on_s3(path, f"s3://{bucket}/warehouse", s3.catalog_properties())
    ensure_table(load_catalog(config.catalog), config.table)
    FakeIngest(config).append(50)
    proc = streamberg("compact", "--config", str(path), "--once", check=False, env={SPARK_S3_JARS_ENV: ""})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert SPARK_S3_JARS_ENV in proc.stderr and "Traceback" not in proc.stderr


def test_spark_s3_jars_come_from_the_environment_or_fail_naming_it(s3, tmp_path, monkeypatch) -> None:
    config = on_s3(compactor_config(tmp_path), "s3://some-bucket/wh", s3.catalog_properties())
    props = jdbc_catalog_properties(config.catalog)
    assert props["io-impl"] == S3_FILE_IO_IMPL
    assert props["client.region"] == props["s3.region"] and props["s3.endpoint"] == s3.endpoint
    monkeypatch.delenv(SPARK_S3_JARS_ENV, raising=False)
    with pytest.raises(MissingJarError, match=SPARK_S3_JARS_ENV):
        spark_jars(config.catalog)
    missing = tmp_path / "iceberg-aws-bundle-1.10.2.jar"
    monkeypatch.setenv(SPARK_S3_JARS_ENV, str(missing))
    with pytest.raises(MissingJarError, match="not a file"):
        spark_jars(config.catalog)
    missing.write_bytes(b"")
    assert spark_jars(config.catalog)[-1] == str(missing)


@pytest.mark.spark
def test_spark_session_without_the_aws_sdk_refuses_an_s3_catalog(s3, spark, tmp_path) -> None:
    config = on_s3(compactor_config(tmp_path), "s3://some-bucket/wh", s3.catalog_properties())
    with pytest.raises(SparkCatalogError, match=SPARK_S3_JARS_ENV):
        register_catalog(spark, config.catalog)
    assert spark.conf.get(f"spark.sql.catalog.{config.catalog.name}", None) is None


@pytest.mark.flink
def test_pyflink_ingest_into_postgres_catalog_and_s3_warehouse(broker, postgres, s3, tmp_path) -> None:
    """The production-like pairing: the committer's compare-and-swap on PostgreSQL, files on S3."""
    records = 6000
    bucket = s3.create_bucket()
    path = ingest_config(tmp_path, broker, ingest={"parallelism": 2, "commit_interval_seconds": 2})
    config = on_s3(path, f"s3://{bucket}/warehouse", s3.catalog_properties(), uri=postgres.create_database())
    ensure_topic(broker, config.kafka.topic, 2)
    produced = produce_events(config, records, bad_fraction=0.01)

    run = streamberg("ingest", "--config", str(path), "--max-records", str(records), "--quiet")

    assert json.loads(run.stdout.strip().splitlines()[-1])["consumed"] == records
    ids = table_ids(config)
    assert not duplicates(ids) and ids == sorted(produced.valid_ids)
    assert dead_letters(config).num_rows == sum(produced.bad.values()) > 0
    table = reload(config)
    assert table.metadata_location.startswith(f"s3://{bucket}/")
    objects = s3.keys(bucket)
    data_files = [t.file.file_path for t in table.scan().plan_files()]
    assert data_files and all(bucket_key(bucket, p) in objects for p in data_files)
    # The commits' independent count of records read reconciles with table + dead letters.
    facts = json.loads(streamberg("table", "--config", str(path), "--json").stdout)
    assert facts["records"] + facts["dead_letters"] == records and facts["reconciles"] is True
