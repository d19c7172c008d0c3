"""Manual probe: Spark's Iceberg S3FileIO against a local S3 server, with streamberg's properties.

Not part of the test suite: it needs an AWS SDK v2 for Java, which no installable package here
ships unrelocated. The one found (``sagemaker-feature-store-pyspark==2.2.2``, 360 MB) carries a
complete Iceberg 1.9 Spark runtime and the AWS SDK v2 relocated under ``smfs.shaded.``; this
script runs Spark on that runtime (class names substituted) with exactly the catalog
properties ``common/spark.py`` generates for an s3:// warehouse, to check that those
properties (endpoint, keys, path style, client.region) are right for Iceberg's S3FileIO.

    cd /tmp && pip download --no-deps sagemaker-feature-store-pyspark==2.2.2
    unzip -o sagemaker_feature_store_pyspark-2.2.2-py3-none-any.whl \
        feature_store_pyspark/jars/sagemaker-feature-store-spark-sdk-3.5.jar
    cd /work/main && .venv/bin/python deploy/object-store/probe_spark_s3.py \
        /tmp/feature_store_pyspark/jars/sagemaker-feature-store-spark-sdk-3.5.jar

It writes a table with pyiceberg into a bucket, reads it with Spark, appends with Spark, and
reads the result back with pyiceberg.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests.*

from streamberg.common.broker import free_port, port_open
from streamberg.common.catalog import load_catalog
from streamberg.common.catalog_java import jdbc_catalog_properties
from streamberg.common.config import load_config
from streamberg.common.jars import sqlite_jdbc_jar
from streamberg.common.spark import base_spark_conf
from streamberg.table_meta.declared import ensure_table
from tests.compactor.helpers import FakeIngest, reload, write_config
from tests.fixtures.s3 import S3Server

RELOCATED = "smfs.shaded.org.apache.iceberg"


def main(jar: str) -> int:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not port_open("127.0.0.1", port):
            time.sleep(0.2)
        s3 = S3Server(f"http://127.0.0.1:{port}")
        bucket = s3.create_bucket()
        path = write_config(Path(tempfile.mkdtemp(prefix="s3-probe-")))
        document = yaml.safe_load(path.read_text())
        document["catalog"].update(warehouse=f"s3://{bucket}/wh", properties=s3.catalog_properties())
        path.write_text(yaml.safe_dump(document))
        config = load_config(path)
        ensure_table(load_catalog(config.catalog), config.table)
        ingest = FakeIngest(config, seed=1)
        ingest.append(500)
        ingest.append(500)
        written = reload(config).scan().to_arrow().num_rows

        from pyspark.sql import SparkSession

        conf = base_spark_conf([jar, str(sqlite_jdbc_jar())], "local[1]", "s3-probe")
        conf.update({"spark.sql.extensions": f"{RELOCATED}.spark.extensions.IcebergSparkSessionExtensions",
                     "spark.ui.enabled": "false"})
        props = jdbc_catalog_properties(config.catalog)
        # The same properties, pointed at the relocated classes of this runtime.
        props["catalog-impl"] = props["catalog-impl"].replace("org.apache.iceberg", RELOCATED)
        props["io-impl"] = props["io-impl"].replace("org.apache.iceberg", RELOCATED)
        name = config.catalog.name
        conf[f"spark.sql.catalog.{name}"] = f"{RELOCATED}.spark.SparkCatalog"
        conf.update({f"spark.sql.catalog.{name}.{key}": value for key, value in props.items()})
        builder = SparkSession.builder
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        table = f"{name}.{config.table.identifier}"
        read = spark.table(table).count()
        spark.sql(f"INSERT INTO {table} SELECT id + 1000000, ts, user_id, city, amount FROM {table} WHERE id < 10")
        after = reload(config)
        print(f"pyiceberg wrote {written} rows; Spark read {read}; after Spark's INSERT pyiceberg reads "
              f"{after.scan().to_arrow().num_rows} rows (last snapshot: {after.current_snapshot().summary.operation.value}); "
              f"{len(s3.keys(bucket))} objects in s3://{bucket}")
        spark.stop()
        return 0 if read == written and after.scan().to_arrow().num_rows == written + 10 else 1
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
