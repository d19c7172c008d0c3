"""The one-compactor-per-table lease, config validation and the CLI's failure modes (no Spark)."""

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
from streamberg.common.errors import ConfigError, LeaseHeldError, LeaseLostError
from streamberg.compactor.layouts import CLUSTERING_STRATEGIES, resolve_layout
from streamberg.compactor.lease import TableLease, leases
from streamberg.table_meta.declared import ensure_table
from tests.compactor.helpers import DAY, FakeIngest, setup_table, write_config
from tests.helpers import JvmSentinel

STREAMBERG = str(Path(sys.executable).parent / "streamberg")


def _lease(config, ttl: float = 30.0) -> TableLease:
    return TableLease(load_catalog(config.catalog).engine, config.catalog.name, config.table.identifier, ttl)


def _run(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([STREAMBERG, *args], capture_output=True, text=True, timeout=timeout,
                          env={**(env or os.environ), "STREAMBERG_LOG_FORMAT": "json"})


def test_second_compactor_is_refused_while_the_lease_is_held(tmp_path) -> None:
    config, _ = setup_table(tmp_path)
    first, second = _lease(config), _lease(config)
    first.acquire()
    try:
        with pytest.raises(LeaseHeldError, match=first.owner):
            second.acquire(wait_seconds=0)
        first.check()  # still ours
    finally:
        first.release()
    second.acquire()  # free again after release
    second.release()


def test_waiting_compactor_gets_the_lease_when_it_expires(tmp_path) -> None:
    config, _ = setup_table(tmp_path)
    first = _lease(config, ttl=5)
    assert first.try_acquire() is None  # acquired without a heartbeat: it will expire
    second = _lease(config, ttl=5)
    started = time.monotonic()
    second.acquire(wait_seconds=20, poll_seconds=0.5)
    waited = time.monotonic() - started
    assert 2 < waited < 15
    with pytest.raises(LeaseLostError):
        first.check()
    second.release()


def test_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path) -> None:
    config, _ = setup_table(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = _lease(config, ttl=3600)
    stale.pid = dead_pid
    assert stale.try_acquire() is None
    fresh = _lease(config, ttl=30)
    assert fresh.try_acquire() is None
    with load_catalog(config.catalog).engine.connect() as conn:
        owners = [r.owner for r in conn.execute(leases.select())]
    assert owners == [fresh.owner]
    fresh.release()


def test_cli_second_compactor_exits_1_naming_the_holder(tmp_path) -> None:
    config, _ = setup_table(tmp_path)
    FakeIngest(config).append(10)
    holder = _lease(config)
    holder.acquire()
    try:
        proc = _run("compact", "--config", config.config_path, "--once")
    finally:
        holder.release()
    assert proc.returncode == 1, proc.stderr
    assert "is being compacted by" in proc.stderr and holder.owner in proc.stderr


def test_invalid_compactor_config_names_the_key(tmp_path) -> None:
    path = write_config(tmp_path, compactor={"min_files": 0, "strategy": "spiral"})
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "compactor.min_files" in str(info.value) and "compactor.strategy" in str(info.value)
    proc = _run("compact", "--config", str(path), "--once")
    assert proc.returncode == 2 and "compactor.min_files" in proc.stderr


def test_all_rules_off_is_rejected(tmp_path) -> None:
    path = write_config(tmp_path, compactor={"min_files": None})
    with pytest.raises(ConfigError, match="compactor: .*never act"):
        load_config(path)


def test_unknown_clustering_column_fails_before_spark_starts(tmp_path) -> None:
    config, _ = setup_table(tmp_path, compactor={"columns": ["user_id", "no_such_column"]})
    FakeIngest(config).append(10)
    jvm = JvmSentinel(tmp_path)
    proc = _run("compact", "--config", config.config_path, "--once", env=jvm.env)
    assert proc.returncode == 2, proc.stderr
    assert "compactor.columns" in proc.stderr and "no_such_column" in proc.stderr
    assert jvm.launched() == []  # refused before Spark's JVM started


def test_missing_table_is_an_operator_error(tmp_path) -> None:
    path = write_config(tmp_path)
    proc = _run("compact", "--config", str(path), "--once")
    # No catalog at all: said so, and none is created.
    assert proc.returncode == 1 and "catalog.db does not exist" in proc.stderr
    assert not (tmp_path / "catalog.db").exists()


def test_env_overrides_a_rule(tmp_path, monkeypatch) -> None:
    path = write_config(tmp_path)
    monkeypatch.setenv("STREAMBERG_COMPACTOR__MIN_FILES", "7")
    assert load_config(path).compactor.min_files == 7


def test_dry_run_prints_the_plan_without_changing_anything(tmp_path) -> None:
    config, _ = setup_table(tmp_path, partition_spec=DAY, compactor={"min_files": 3})
    ingest = FakeIngest(config)
    for _ in range(3):
        ingest.append(50, days=1)
    before = load_catalog(config.catalog).load_table(config.table.identifier).current_snapshot().snapshot_id
    proc = _run("compact", "--config", config.config_path, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["groups"] == 1 and out["files"] == 3 and out["groups_detail"][0]["reasons"] == ["min_files: 3 >= 3"]
    after = load_catalog(config.catalog).load_table(config.table.identifier).current_snapshot().snapshot_id
    assert after == before


def test_help_explains_modes_rules_and_layouts() -> None:
    proc = _run("compact", "--help")
    assert proc.returncode == 0
    for word in ("--once", "--full", "--dry-run", "min_files", "max_delay_seconds", "every_n_snapshots",
                 "hilbert", "zorder-iceberg", "lease", "checkpoint"):
        assert word in proc.stdout, word


def test_demo_config_is_valid_for_the_compactor(tmp_path) -> None:
    """The demo's layout resolves against a table made from the demo's own schema: a clustering
    strategy on columns the table has, not the bin-pack fallback."""
    root = Path(__file__).resolve().parents[2]
    demo = load_config(root / "examples" / "demo.yaml")
    catalog = demo.catalog.model_copy(update={"uri": f"sqlite:///{tmp_path / 'catalog.db'}",
                                              "warehouse": str(tmp_path / "warehouse")})
    config = demo.model_copy(update={"catalog": catalog})
    table = ensure_table(load_catalog(config.catalog), config.table)
    resolved = resolve_layout(config.compactor, None, None, table, config.table.identifier)
    strategy, columns = resolved.strategy, resolved.columns
    assert strategy in CLUSTERING_STRATEGIES and strategy == demo.compactor.strategy
    assert columns and set(columns) <= {f.name for f in table.schema().fields}
