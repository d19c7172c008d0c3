"""What the change-data-capture tests share: a primary-key table's config, and the three
independent readers of the table the merge keeps (Spark, DuckDB's iceberg_scan, pyiceberg)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import yaml

from streamberg.common.catalog import load_catalog
from streamberg.common.config import StreambergConfig, load_config

USERS_SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string", "required": True},
    {"name": "score", "type": "int"},
    {"name": "city", "type": "string"},
]


def cdc_config(directory: Path, bootstrap: str, envelope: str, sections: dict | None = None,
               **kafka: Any) -> StreambergConfig:
    directory.mkdir(parents=True, exist_ok=True)
    document = {
        "kafka": {"bootstrap_servers": bootstrap, "topic": f"cdc-{uuid.uuid4().hex[:8]}", "envelope": envelope,
                  **kafka},
        "catalog": {"name": f"c{uuid.uuid4().hex[:8]}", "uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "table": {"identifier": "db.users", "schema": USERS_SCHEMA, "primary_key": ["id"]},
        "ingest": {"commit_interval_seconds": 1, "parallelism": 2, "state_dir": "state"},
        "merge": {"interval_seconds": 1},
        **(sections or {}),
    }
    path = directory / "streamberg.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_config(path)


def _by_key(rows: list[dict], reader: str) -> dict[int, dict]:
    """Rows by id, refusing a key held twice: a dict would collapse the duplicate and pass."""
    keyed = {r["id"]: r for r in rows}
    if len(keyed) != len(rows):
        ids = [r["id"] for r in rows]
        raise AssertionError(f"{reader}: {len(rows)} rows for {len(keyed)} keys; held twice: "
                             f"{sorted({i for i in ids if ids.count(i) > 1})[:10]}")
    return keyed


def rows_by_pyiceberg(config: StreambergConfig) -> dict[int, dict]:
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    return _by_key(table.scan().to_arrow().to_pylist(), "pyiceberg")


def rows_by_spark(spark: Any, config: StreambergConfig) -> dict[int, dict]:
    from streamberg.common.spark import register_catalog

    name = register_catalog(spark, config.catalog)
    return _by_key([r.asDict() for r in spark.table(f"{name}.{config.table.identifier}").collect()], "spark")


def rows_by_duckdb(config: StreambergConfig) -> dict[int, dict]:
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    location = load_catalog(config.catalog).load_table(config.table.identifier).metadata_location
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        con.execute(f"LOAD '{Path(module.__path__[0]) / 'extensions' / f'v{duckdb.__version__}' / f'{name}.duckdb_extension'}'")
    result = con.execute(f"SELECT * FROM iceberg_scan('{location.removeprefix('file://')}')")
    names = [d[0] for d in result.description]
    return _by_key([dict(zip(names, r)) for r in result.fetchall()], "duckdb")


def delete_files(config: StreambergConfig) -> int:
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    return sum(len(task.delete_files) for task in table.scan().plan_files())


def rows_of_each_reader(spark: Any, config: StreambergConfig) -> dict[str, list[dict]]:
    """The table's rows as each independent reader returns them (a list: duplicates stay)."""
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    from streamberg.common.spark import register_catalog

    table = load_catalog(config.catalog).load_table(config.table.identifier)
    out = {"pyiceberg": table.scan().to_arrow().to_pylist()}
    name = register_catalog(spark, config.catalog)
    out["spark"] = [r.asDict() for r in spark.table(f"{name}.{config.table.identifier}").collect()]
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    for module, ext in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        con.execute(f"LOAD '{Path(module.__path__[0]) / 'extensions' / f'v{duckdb.__version__}' / f'{ext}.duckdb_extension'}'")
    result = con.execute(f"SELECT * FROM iceberg_scan('{table.metadata_location.removeprefix('file://')}')")
    names = [d[0] for d in result.description]
    out["duckdb"] = [dict(zip(names, r)) for r in result.fetchall()]
    return out


def assert_table_holds(spark: Any, config: StreambergConfig, expected: dict[Any, dict], key: str = "id",
                       columns: list[str] | None = None) -> None:
    """Each reader sees exactly `expected` (key -> row): as many rows as keys, each key once
    (two rows of one key are a failure, not a collapse), and the same values. `columns`: the
    columns compared (all of the expected rows' by default)."""
    for reader, rows in rows_of_each_reader(spark, config).items():
        keys = [r[key] for r in rows]
        assert len(rows) == len(expected), f"{reader}: {len(rows)} rows, {len(expected)} keys expected"
        assert len(set(keys)) == len(keys), f"{reader}: keys held twice: {sorted({k for k in keys if keys.count(k) > 1})[:10]}"
        wanted = columns or sorted({c for row in expected.values() for c in row})
        got = {r[key]: {c: r.get(c) for c in wanted} for r in rows}
        assert got == {k: {c: v.get(c) for c in wanted} for k, v in expected.items()}, reader
