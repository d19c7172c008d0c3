"""`table.schema` may be omitted once the table exists: the table's schema is the truth.

A config without a schema drives the real `streamberg ingest` (PyFlink, rebuilt in every
worker from the dumped config), `produce`, `table --evolve` and maintenance's checks against
a table created earlier; before the table exists it is refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.common.errors import ConfigError, SchemaMismatchError
from streamberg.maintenance.app import check_config
from streamberg.table_meta.declared import ensure_table
from tests.helpers import EVENT_SCHEMA, config_at, streamberg, table_ids, write_config
from tests.runbooks.inprocess import cli


def _without_schema(path: Path) -> Path:
    document = yaml.safe_load(path.read_text())
    del document["table"]["schema"]
    bare = path.with_name("no-schema.yaml")
    bare.write_text(yaml.safe_dump(document, sort_keys=False))
    return bare


def test_a_config_without_schema_ingests_into_the_existing_table(tmp_path: Path, broker: str) -> None:
    declared = write_config(tmp_path, broker, ingest={"parallelism": 1})
    bare = _without_schema(declared)
    config = config_at(bare)
    assert config.table.schema_ is None and config.table.field_specs == ()
    # Before the table exists: refused, naming what is missing.
    with pytest.raises(SchemaMismatchError, match="declares no table.schema to create it"):
        ensure_table(load_catalog(config.catalog), config.table)
    refused = cli("ingest", "--config", str(bare), "--max-records", "1", check=False)
    assert refused.returncode == 1 and "declares no table.schema" in refused.stderr

    ensure_table(load_catalog(config.catalog), config_at(declared).table)  # made from the declared schema
    produced = cli("produce", "--config", str(bare), "--count", "300")  # events shaped by the table's schema
    assert '"valid": 300' in produced.stdout
    streamberg("ingest", "--config", str(bare), "--max-records", "300", "--quiet")
    assert table_ids(config) == list(range(300))
    assert '"changes": []' in cli("table", "--config", str(bare), "--evolve", "--json").stdout


def test_maintenance_checks_the_retention_column_against_the_table(tmp_path: Path) -> None:
    document = {"kafka": {"topic": "t"}, "catalog": {"uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
                "table": {"identifier": "db.events", "schema": EVENT_SCHEMA}}
    (tmp_path / "declared.yaml").write_text(yaml.safe_dump(document))
    table = ensure_table(load_catalog(load_config(tmp_path / "declared.yaml").catalog),
                         load_config(tmp_path / "declared.yaml").table)
    del document["table"]["schema"]
    for column, ok in (("ts", True), ("city", False), ("nope", False)):
        document["maintenance"] = {"retention": {"column": column, "days": 7}}
        (tmp_path / "bare.yaml").write_text(yaml.safe_dump(document))
        bare = load_config(tmp_path / "bare.yaml")
        check_config(bare)  # nothing to check without a schema until the table is known
        if ok:
            check_config(bare, table)
        else:
            with pytest.raises(ConfigError, match="maintenance.retention.column"):
                check_config(bare, table)
