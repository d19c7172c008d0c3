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


def test_a_compaction_during_the_read_changes_nothing(tmp_path: Path, broker: str, spark, spark_catalog) -> None:
    """The snapshot is pinned before the compactor replaces its files: the read finishes on
    the pinned snapshot's files, exact; the next read, on the compacted snapshot, too."""
    from streamberg.compactor.compactor import Compactor
    from streamberg.fresh.read import plan_read

    path = write_config(tmp_path, broker, ingest={"parallelism": 1})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 2)
    open_tables(config)
    ends = {0: 0, 1: 0}
    for batch in range(4):  # four commits: four files to compact
        first = batch * 100
        produce_values(config, [event(i) for i in range(first, first + 50)], 0, 2)
        produce_values(config, [event(i) for i in range(first + 50, first + 100)], 1, 2)
        ends = {0: ends[0] + 50, 1: ends[1] + 50}
        ingest_until(config, ends)
    produce_values(config, [event(i) for i in range(400, 430)], 1, 2)  # the tail

    spark_catalog(config)
    plan = plan_read(path)  # pinned before the compaction
    report = Compactor(config.compactor, config.target, spark).run_pass(mode="full")
    assert report.committed, report
    table = plan.table
    rows = table.scan(snapshot_id=plan.bounds.snapshot_id, selected_fields=("id",)).to_arrow()
    tail = plan.tail(30)
    ids = sorted(rows.column("id").to_pylist() + tail.rows.column("id").to_pylist())
    assert ids == list(range(0, 430))
    after = read(path)  # on the compacted snapshot: its offsets found below it in the lineage
    assert after.bounds.snapshot_id != plan.bounds.snapshot_id
    assert sorted(after.rows.column("id").to_pylist()) == list(range(0, 430))
    assert after.bounds.committed == {0: 200, 1: 200}
