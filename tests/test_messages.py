"""The messages a new user meets (issue 38, item 12): each one line, true, and as exact as the
mistake. Through the real command (`streamberg ...` as a subprocess or in process)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from streamberg.common.broker import free_port
from tests.helpers import streamberg
from tests.runbooks.inprocess import cli


def _write(path: Path, document: dict) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


TABLE = {"identifier": "a.b", "schema": [{"name": "id", "type": "long"}]}


def test_check_explains_a_secrets_key_and_never_masks_a_file_name(tmp_path: Path) -> None:
    bad = _write(tmp_path / "my-secret.yaml", {
        "kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": "t"},
        "catalog": {"type": "rest", "uri": "https://polaris.example/api", "warehouse": "w",
                    "credential": "nocolon-Hx81"},
        "table": TABLE})
    proc = cli("check", "--config", str(bad), check=False)
    assert proc.returncode == 2
    assert proc.stdout.startswith(f"{bad}: invalid"), proc.stdout
    assert "catalog.credential: must be client_id:client_secret" in proc.stdout and "nocolon-Hx81" not in proc.stdout
    good = _write(tmp_path / "my-secret-ok.yaml", {"kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": "t"},
                                                   "table": TABLE})
    assert cli("check", "--config", str(good)).stdout.startswith(f"{good}: valid")


def test_a_config_of_many_names_each_mistake_where_it_is_written(tmp_path: Path) -> None:
    both = _write(tmp_path / "both.yaml", {"kafka": {"bootstrap_servers": "127.0.0.1:1"}, "table": TABLE,
                                            "tables": [{"identifier": "x.y", "topics": ["t"], "schema": "infer"}]})
    proc = cli("check", "--config", str(both), check=False)
    assert proc.returncode == 2 and "table: a config of many tables (tables:) has no table section" in proc.stdout
    assert "defaults.table" in proc.stdout
    defaults = _write(tmp_path / "defaults.yaml", {
        "kafka": {"bootstrap_servers": "127.0.0.1:1"}, "defaults": {"table": {"partiton_spec": []}},
        "tables": [{"identifier": "x.y", "topics": ["t"], "schema": "infer"},
                   {"identifier": "x.z", "topics": ["u"], "schema": "infer"}]})
    proc = cli("check", "--config", str(defaults), check=False)
    assert proc.stdout.count("partiton_spec") == 1 and "defaults.table.partiton_spec" in proc.stdout, proc.stdout
    route = _write(tmp_path / "route.yaml", {"kafka": {"bootstrap_servers": "127.0.0.1:1"},
                                             "tables": [{"identifier": "x.y", "topcs": ["t"], "schema": "infer"}]})
    assert "tables.0.topcs" in cli("check", "--config", str(route), check=False).stdout


def test_a_rest_catalog_without_its_warehouse_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "rest.yaml", {"kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": "t"},
                                           "catalog": {"type": "rest", "uri": "https://polaris.example/api"},
                                           "table": TABLE})
    proc = cli("check", "--config", str(path), check=False)
    assert proc.returncode == 2 and "catalog.warehouse: a REST catalog serves named warehouses" in proc.stdout


@pytest.mark.slow
def test_a_dead_broker_a_bad_value_and_nothing_reachable_are_one_line_each(tmp_path: Path) -> None:
    closed = f"127.0.0.1:{free_port()}"
    path = _write(tmp_path / "c.yaml", {"kafka": {"bootstrap_servers": closed, "topic": "t"},
                                        "catalog": {"uri": "sqlite:///c.db", "warehouse": "wh"}, "table": TABLE})
    proc = streamberg("produce", "--config", str(path), "--count", "10", check=False, timeout=120)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert f"the broker at {closed} cannot be reached" in proc.stderr
    # A policy value the key refuses: a usage error (exit 2), saying what it must be.
    proc = cli("table", "--config", str(path), "--set", "streamberg.compact.min_files=abc", check=False)
    assert proc.returncode == 2 and "'abc' is not an integer" in proc.stderr, proc.stderr
    # metrics --once with the catalog and the broker both down: the scrape, and exit 1.
    proc = streamberg("metrics", "--config", str(path), "--once", check=False, timeout=120)
    assert proc.returncode == 1 and 'streamberg_up{source="broker",table="a.b"} 0.0' in proc.stdout
