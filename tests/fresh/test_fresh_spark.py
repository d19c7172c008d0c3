"""A fresh read in Spark (fresh/spark.py) gives the rows the Python read gives: Spark reads the
pinned snapshot through Iceberg's Spark runtime, the tail joins it. Real broker, real ingest
code, real Spark; the expected ids computed here."""

from __future__ import annotations

from pathlib import Path

from streamberg.common.broker import ensure_topic
from streamberg.fresh import read
from streamberg.fresh.spark import spark_read
from streamberg.ingest.dead_letters import open_tables
from tests.helpers import config_at, write_config
from tests.runbooks.inprocess import event, ingest_until, produce_values


def test_spark_reads_the_same_rows_as_python(tmp_path: Path, broker: str, spark) -> None:
    path = write_config(tmp_path, broker, ingest={"parallelism": 1})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 2)
    open_tables(config)
    produce_values(config, [event(i, city="ams" if i % 3 else "ber") for i in range(0, 60)], 0, 2)
    produce_values(config, [event(i) for i in range(500, 540)] + [b"\xff poison"], 1, 2)
    ingest_until(config, {0: 60, 1: 41})
    produce_values(config, [event(i, city="ams" if i % 3 else "ber") for i in range(60, 90)], 0, 2)
    produce_values(config, [b"{"] + [event(i) for i in range(540, 555)], 1, 2)

    python = read(path)
    frame, bounds = spark_read(spark, path)
    ids = sorted(r.id for r in frame.select("id").collect())
    assert ids == sorted(python.rows.column("id").to_pylist()) == list(range(0, 90)) + list(range(500, 555))
    assert bounds.watermarks == python.bounds.watermarks == {0: 90, 1: 57}
    assert frame.count() == frame.select("id").distinct().count() == 145

    filtered, _ = spark_read(spark, path, columns=["id"], row_filter="city = 'ber' and id < 80")
    assert filtered.columns == ["id"]
    assert sorted(r.id for r in filtered.collect()) == [i for i in range(0, 80) if i % 3 == 0]
    committed, _ = spark_read(spark, path, fresh=False)
    assert sorted(r.id for r in committed.select("id").collect()) == list(range(0, 60)) + list(range(500, 540))
