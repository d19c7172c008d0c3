"""Spike for issue 21 (change-data capture): does the merge stage the design proposes work on
the engines streamberg ships, and do the other readers read its result?

It builds a primary-key table (format v2, merge-on-read deletes and updates) and a changelog
table on a fresh SQLite catalog, then applies the changelog with Spark's `MERGE INTO` (the
last change per key), twice (a rerun after a crash must change nothing), and reads the
result with Spark, DuckDB's Iceberg extension and pyiceberg. The first merge commits with a
snapshot summary property (Iceberg's CommitMetadata, called through py4j), the position a
merge stage would record. It prints what each reader found, the delete files the merges
wrote, and the time of each merge against a plain append of the same rows in the same run.
Run: `.venv/bin/python scripts/cdc_merge_spike.py [--keys N] [--changes N]`.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import pyarrow as pa


class _MergeCall:
    """A java.util.concurrent.Callable (py4j) that runs one SQL statement."""

    def __init__(self, spark, sql: str) -> None:
        self.spark, self.sql = spark, sql

    def call(self) -> None:
        self.spark.sql(self.sql)

    class Java:
        implements = ["java.util.concurrent.Callable"]


def merge_recording(spark, sql: str, properties: dict[str, str]) -> None:
    """Run `sql` with `properties` in the summary of the snapshot it commits: Iceberg's
    CommitMetadata holds them in a thread-local of the JVM thread that runs the statement;
    PySpark's pinned threads run the callback on that same thread."""
    jvm = spark._jvm
    props = jvm.java.util.HashMap()
    for key, value in properties.items():
        props.put(key, value)
    jvm.org.apache.iceberg.spark.CommitMetadata.withCommitProperties(
        props, _MergeCall(spark, sql), jvm.java.lang.Class.forName("java.lang.RuntimeException"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--changes", type=int, default=100_000)
    args = parser.parse_args()

    from streamberg.common.catalog import load_catalog
    from streamberg.common.config import CatalogConfig
    from streamberg.common.spark import build_spark_session, quiet_spark_logs

    directory = Path(tempfile.mkdtemp(prefix="cdc-spike-"))
    catalog_config = CatalogConfig(name="spike", uri=f"sqlite:///{directory}/catalog.db", warehouse=str(directory / "wh"))
    catalog = load_catalog(catalog_config)
    catalog.create_namespace("db")
    spark = build_spark_session(catalog_config, "local[2]", {}, app_name="cdc-spike")
    quiet_spark_logs(spark)
    spark.sql("CREATE TABLE spike.db.target (id BIGINT NOT NULL, name STRING, amount DOUBLE) USING iceberg "
              "TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read', "
              "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')")
    spark.sql("CREATE TABLE spike.db.appended (id BIGINT NOT NULL, name STRING, amount DOUBLE) USING iceberg")

    # A change log: inserts for every key, then updates and deletes (50 % / 10 %), in order.
    rng = random.Random(7)
    changes, state = [], {}
    for seq in range(args.changes):
        key = seq if seq < args.keys else rng.randrange(args.keys)
        op = "c" if key not in state else ("d" if rng.random() < 0.1 else "u")
        row = None if op == "d" else {"id": key, "name": f"n{seq}", "amount": seq / 2}
        changes.append({"seq": seq, "op": op, "id": key, "name": row and row["name"], "amount": row and row["amount"]})
        if op == "d":
            state.pop(key, None)
        else:
            state[key] = row
    spark.createDataFrame(pa.Table.from_pylist(changes).to_pandas()).createOrReplaceTempView("changelog")
    # The last change per key, in Kafka order.
    spark.sql("SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY id ORDER BY seq DESC) AS last "
              "FROM changelog) WHERE last = 1").createOrReplaceTempView("last_change")
    merge = ("MERGE INTO spike.db.target t USING last_change c ON t.id = c.id "
             "WHEN MATCHED AND c.op = 'd' THEN DELETE "
             "WHEN MATCHED THEN UPDATE SET t.name = c.name, t.amount = c.amount "
             "WHEN NOT MATCHED AND c.op != 'd' THEN INSERT (id, name, amount) VALUES (c.id, c.name, c.amount)")
    # Seed the target with the first half of the keys, so the merge updates and deletes too.
    spark.sql(f"INSERT INTO spike.db.target SELECT id, name, amount FROM changelog WHERE seq < {args.keys // 2}")
    timings = {}
    for attempt in ("first", "rerun"):
        started = time.monotonic()
        if attempt == "first":
            merge_recording(spark, merge, {"streamberg.changelog-applied": "42"})
        else:
            spark.sql(merge)
        timings[attempt] = time.monotonic() - started
        if attempt == "first":
            summary = catalog.load_table("db.target").current_snapshot().summary.additional_properties
            print(f"the merge's own snapshot records the change log it applied: "
                  f"streamberg.changelog-applied={summary.get('streamberg.changelog-applied')}")
    started = time.monotonic()
    spark.sql("INSERT INTO spike.db.appended SELECT id, name, amount FROM last_change WHERE op != 'd'")
    timings["append"] = time.monotonic() - started

    expected = sorted((k, v["name"], v["amount"]) for k, v in state.items())
    spark_rows = sorted(tuple(r) for r in spark.sql("SELECT id, name, amount FROM spike.db.target").collect())
    table = catalog.load_table("db.target")
    deletes = [f for f in spark.sql("SELECT content, record_count FROM spike.db.target.files").collect()
               if f.content == 1]
    py_rows = sorted(tuple(r.values()) for r in table.scan().to_arrow().to_pylist())
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    # DuckDB's Iceberg reader, loaded offline from its PyPI wheels (the avro one first).
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        con.execute(f"LOAD '{Path(module.__path__[0]) / 'extensions' / f'v{duckdb.__version__}' / f'{name}.duckdb_extension'}'")
    duck_rows = sorted(con.execute(f"SELECT id, name, amount FROM iceberg_scan('{table.metadata_location}')").fetchall())
    print(f"{args.changes:,} changes over {args.keys:,} keys; {len(expected):,} rows expected")
    print(f"position delete files after two merges: {len(deletes)} ({sum(f.record_count for f in deletes):,} deletes)")
    for name, rows in (("Spark", spark_rows), ("pyiceberg 0.8.1", py_rows), ("DuckDB iceberg_scan", duck_rows)):
        print(f"{name:22} {len(rows):>8,} rows  {'equal to the expected state' if rows == expected else 'DIFFERENT'}")
    print(f"merge {timings['first']:.1f}s, rerun {timings['rerun']:.1f}s (changes nothing), plain append of the "
          f"same rows {timings['append']:.1f}s: merge {timings['first'] / timings['append']:.1f}x the append")
    spark.stop()


if __name__ == "__main__":
    main()
