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


def rows_by_pyiceberg(config: StreambergConfig) -> dict[int, dict]:
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    return {r["id"]: r for r in table.scan().to_arrow().to_pylist()}


def rows_by_spark(spark: Any, config: StreambergConfig) -> dict[int, dict]:
    from streamberg.common.spark import register_catalog

    name = register_catalog(spark, config.catalog)
    return {r["id"]: r.asDict() for r in spark.table(f"{name}.{config.table.identifier}").collect()}


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
    return {r[0]: dict(zip(names, r)) for r in result.fetchall()}


def delete_files(config: StreambergConfig) -> int:
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    return sum(len(task.delete_files) for task in table.scan().plan_files())
