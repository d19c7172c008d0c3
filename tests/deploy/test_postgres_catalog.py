"""The catalog on a real PostgreSQL server, shared by pyiceberg (ingest) and Spark (compactor).

Each test gets a database of its own on the session's server (tests/fixtures/postgres.py),
with password authentication, so the URI mapping to JDBC (user, password) is exercised for
real. psycopg2 queries are the independent view of what the catalog holds.
"""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg2
import pyarrow.compute as pc
import pytest
import yaml
from pyiceberg.exceptions import CommitFailedException
from sqlalchemy.engine import make_url

from streamberg.common.catalog import load_catalog
from streamberg.common.config import StreambergConfig, load_config
from streamberg.common.errors import LeaseHeldError
from streamberg.compactor.app import CompactOptions, run_compact
from streamberg.compactor.lease import LEASE_TABLE, TableLease
from streamberg.table_meta.declared import ensure_table
from streamberg.table_meta.offsets import committed_position
from tests.compactor.helpers import (
    DAY,
    TOPIC,
    FakeIngest,
    compactor_snapshots,
    live_files,
    make_rows,
    reload,
    write_config,
)


def pg_config(directory: Path, uri: str, **kwargs) -> StreambergConfig:
    """The compactor tests' config with its catalog moved to the PostgreSQL database `uri`."""
    path = write_config(directory, **kwargs)
    document = yaml.safe_load(path.read_text())
    document["catalog"]["uri"] = uri
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_config(path)


def query(uri: str, sql: str, params: tuple = ()) -> list[tuple]:
    """Rows of `sql` on the database of `uri`, through psycopg2 (not the code under test)."""
    url = make_url(uri)
    conn = psycopg2.connect(host=url.host, port=url.port, user=url.username, password=url.password,
                            dbname=url.database)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()
    finally:
        conn.close()


def catalog_row(uri: str, config: StreambergConfig) -> tuple[str, str | None]:
    """(metadata_location, previous_metadata_location) of the table in iceberg_tables."""
    namespace, name = config.table.identifier.rsplit(".", 1)
    rows = query(uri, "SELECT metadata_location, previous_metadata_location FROM iceberg_tables "
                      "WHERE catalog_name = %s AND table_namespace = %s AND table_name = %s",
                 (config.catalog.name, namespace, name))
    assert len(rows) == 1, rows
    return rows[0]


def rows_as_tuples(arrow_table) -> list[tuple]:
    """Sorted rows with ts as epoch microseconds (time zones cannot blur the comparison)."""
    micros = pc.cast(arrow_table.column("ts"), "int64").to_pylist()
    columns = [arrow_table.column(c).to_pylist() for c in ("id", "user_id", "city", "amount")]
    return sorted(zip(columns[0], micros, *columns[1:]))


def spark_rows(spark, config: StreambergConfig, spark_catalog) -> list[tuple]:
    name = f"{spark_catalog(config)}.{config.table.identifier}"
    return sorted(tuple(r) for r in spark.sql(
        f"SELECT id, unix_micros(ts), user_id, city, amount FROM {name}").collect())


def test_pyiceberg_commits_are_compare_and_swap_on_postgres(postgres, tmp_path) -> None:
    uri = postgres.create_database()
    config = pg_config(tmp_path, uri)
    ensure_table(load_catalog(config.catalog), config.table)
    ingest = FakeIngest(config, seed=3)
    for _ in range(3):
        ingest.append(200)
    table = reload(config)
    location, previous = catalog_row(uri, config)
    assert location == table.metadata_location and previous is not None
    assert committed_position(table, TOPIC).offsets == {0: 600}
    assert table.scan().to_arrow().num_rows == 600

    # A writer holding the table as it was before someone else committed must lose cleanly.
    stale = reload(config)
    ingest.append(50)
    winner = catalog_row(uri, config)[0]
    with pytest.raises(CommitFailedException):
        stale.append(make_rows(stale, 10, 10_000, seed=9))
    assert catalog_row(uri, config)[0] == winner
    assert reload(config).scan().to_arrow().num_rows == 650


def test_compactor_lease_admits_one_holder_on_postgres(postgres, tmp_path) -> None:
    uri = postgres.create_database()
    config = pg_config(tmp_path, uri)
    engine = load_catalog(config.catalog).engine
    contenders = [TableLease(engine, config.catalog.name, config.table.identifier, 30.0) for _ in range(6)]
    start = threading.Barrier(len(contenders))
    outcomes: dict[int, object] = {}

    def race(i: int) -> None:
        start.wait()
        outcomes[i] = contenders[i].try_acquire()

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(contenders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    winners = [i for i, holder in outcomes.items() if holder is None]
    assert len(outcomes) == len(contenders) and len(winners) == 1, outcomes
    winner = contenders[winners[0]]
    assert all(holder.owner == winner.owner for holder in outcomes.values() if holder is not None)

    loser = contenders[(winners[0] + 1) % len(contenders)]
    with pytest.raises(LeaseHeldError, match=winner.owner):
        loser.acquire(wait_seconds=0)
    assert query(uri, f"SELECT owner FROM {LEASE_TABLE}") == [(winner.owner,)]
    winner.release()
    loser.acquire()
    loser.release()


@pytest.mark.spark
def test_spark_reads_and_compacts_a_pyiceberg_table_through_postgres(postgres, spark, spark_catalog,
                                                                     tmp_path) -> None:
    uri = postgres.create_database()
    config = pg_config(tmp_path, uri, partition_spec=DAY)
    ensure_table(load_catalog(config.catalog), config.table)
    ingest = FakeIngest(config, seed=5)
    for _ in range(4):
        ingest.append(250, days=2)
    before = reload(config)
    expected = rows_as_tuples(before.scan().to_arrow())
    assert len(live_files(before)) == 8  # 4 appends x 2 days

    # Spark's JdbcCatalog on the same database (jdbc:postgresql, user/password) sees pyiceberg's commits.
    assert spark_rows(spark, config, spark_catalog) == expected

    out = run_compact(config, CompactOptions(once=True), spark=spark)

    # ... and pyiceberg sees the replace Spark committed through the same PostgreSQL row.
    after = reload(config)
    assert catalog_row(uri, config)[0] == after.metadata_location != before.metadata_location
    snapshots = compactor_snapshots(after)
    assert snapshots and all(s.summary.operation.value == "replace" for s in snapshots)
    assert out["files_in"] == 8 and out["files_out"] == len(live_files(after)) == 2
    assert rows_as_tuples(after.scan().to_arrow()) == expected
    assert committed_position(after, TOPIC).offsets == {0: 1000}

    # Ingest goes on on top of Spark's commit, and Spark sees that too.
    ingest.append(100, days=2)
    final = reload(config)
    assert committed_position(final, TOPIC).offsets == {0: 1100}
    assert spark_rows(spark, config, spark_catalog) == rows_as_tuples(final.scan().to_arrow())
