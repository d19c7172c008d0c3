"""Maintenance config validation, the run record and the CLI's failure modes (no Spark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.common.errors import ConfigError
from streamberg.maintenance.app import check_config
from streamberg.table_meta.maintenance_runs import last_maintenance_run, record_run
from tests.compactor.helpers import write_config
from tests.helpers import JvmSentinel
from tests.maintenance.helpers import setup_maintained, write_maintained_config

STREAMBERG = str(Path(sys.executable).parent / "streamberg")


def _run(*args: str, env: dict | None = None, base_env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([STREAMBERG, *args], capture_output=True, text=True, timeout=120,
                          env={**(base_env or os.environ), "STREAMBERG_LOG_FORMAT": "json", **(env or {})})


def test_existing_configs_load_with_maintenance_defaults_on(tmp_path) -> None:
    config = load_config(write_config(tmp_path))
    m = config.maintenance
    assert m.expire.enabled and m.orphan.enabled and m.manifests.enabled
    assert m.expire.max_snapshot_age_seconds == 7 * 86400 and m.orphan.safety_age_seconds == 3 * 86400
    assert m.expire.keep_pending_for_compactor and m.retention.days is None
    demo = Path(__file__).resolve().parents[2] / "examples" / "demo.yaml"
    assert load_config(demo).maintenance == m


@pytest.mark.parametrize(("maintenance", "key", "words"), [
    ({"interval_seconds": 0}, "maintenance.interval_seconds", "must be a number > 0"),
    ({"orphan": {"safety_age_seconds": 600}}, "maintenance.orphan.safety_age_seconds", "allow_short_safety_age"),
    ({"retention": {"days": 30}}, "maintenance.retention.column", "required when retention.days is set"),
    ({"retention": {"column": "ts", "days": -1}}, "maintenance.retention.days", "must be a number > 0"),
    ({"manifests": {"min_count": None, "min_total_bytes": None}}, "maintenance.manifests", "enabled: false"),
    ({"expire": {"min_snapshots_to_keep": 0}}, "maintenance.expire.min_snapshots_to_keep", "must be an integer between 1"),
    ({"expire": {"max_age": 5}}, "maintenance.expire.max_age", "Extra inputs"),
])
def test_invalid_maintenance_config_names_the_key(tmp_path, maintenance, key, words) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write_maintained_config(tmp_path, maintenance))
    assert f"{key}:" in str(err.value) and words in str(err.value)


def test_short_orphan_safety_age_needs_the_explicit_override(tmp_path) -> None:
    config = load_config(write_maintained_config(tmp_path, {"orphan": {"safety_age_seconds": 60,
                                                                 "allow_short_safety_age": True}}))
    assert config.maintenance.orphan.safety_age_seconds == 60


def test_env_overrides_a_nested_maintenance_key(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("STREAMBERG_MAINTENANCE__EXPIRE__MIN_SNAPSHOTS_TO_KEEP", "7")
    assert load_config(write_config(tmp_path)).maintenance.expire.min_snapshots_to_keep == 7


@pytest.mark.parametrize(("column", "words"), [("nope", "is not in table.schema"), ("city", "is string")])
def test_retention_column_is_checked_against_the_schema(tmp_path, column, words) -> None:
    config = load_config(write_maintained_config(tmp_path, {"retention": {"column": column, "days": 3}}))
    with pytest.raises(ConfigError, match=f"maintenance.retention.column: '{column}' {words}"):
        check_config(config)


def test_cli_invalid_config_exits_2_naming_the_key(tmp_path) -> None:
    path = write_maintained_config(tmp_path, {"orphan": {"safety_age_seconds": 60}})
    proc = _run("maintain", "--config", str(path), "--once")
    assert proc.returncode == 2, proc.stderr
    assert "maintenance.orphan.safety_age_seconds: 60 is below 3600" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_retention_column_error_exits_2_before_spark(tmp_path) -> None:
    config, _ = setup_maintained(tmp_path, {"retention": {"column": "amount", "days": 1}})
    jvm = JvmSentinel(tmp_path)
    proc = _run("maintain", "--config", config.config_path, "--once", base_env=jvm.env)
    assert proc.returncode == 2 and "maintenance.retention.column: 'amount' is double" in proc.stderr
    assert jvm.launched() == []  # refused before Spark's JVM started


def test_cli_missing_table_exits_1(tmp_path) -> None:
    proc = _run("maintain", "--config", str(write_config(tmp_path)), "--once", "--json")
    assert proc.returncode == 1
    # No catalog at all: said so, and none is created (tests/security covers a missing table
    # in an existing catalog).
    assert "catalog.db does not exist" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "catalog.db").exists()


def test_help_describes_steps_safety_and_keys() -> None:
    proc = _run("maintain", "--help")
    assert proc.returncode == 0
    for words in ("--dry-run", "--once", "--json", "ingest's Kafka", "safety_age_seconds", "min_count",
                  "retention.days", "compactor's lease", "streamberg_maintenance_runs"):
        assert words in proc.stdout, words


def test_last_run_is_the_newest_real_run_of_this_table(tmp_path) -> None:
    config, _ = setup_maintained(tmp_path)
    assert last_maintenance_run(config) is None  # nothing recorded, nothing created
    engine = load_catalog(config.catalog).engine
    now = time.time()

    def result(run_id: str, dry_run: bool, table: str = config.table.identifier) -> dict:
        return {"run_id": run_id, "table": table, "dry_run": dry_run, "status": "ok", "bytes_freed": len(run_id)}

    record_run(engine, config.catalog.name, result("older", False), started_at=now - 100, finished_at=now - 90)
    record_run(engine, config.catalog.name, result("newer", False), started_at=now - 50, finished_at=now - 40)
    record_run(engine, config.catalog.name, result("dry", True), started_at=now - 20, finished_at=now - 10)
    record_run(engine, config.catalog.name, result("other-table", False, "db.other"), started_at=now - 5,
               finished_at=now - 1)
    last = last_maintenance_run(config, now=now)
    assert last["run_id"] == "newer" and last["result"]["bytes_freed"] == len("newer")
    assert last["age_seconds"] == 40 and last["duration_seconds"] == 10 and last["dry_run"] is False
    assert last_maintenance_run(config, include_dry_runs=True)["run_id"] == "dry"
    json.dumps(last)  # what status prints must be JSON-serialisable
