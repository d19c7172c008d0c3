"""A mistyped catalog path or table name creates nothing.

`streamberg table` (and --evolve, compact, maintain) used to open the catalog the writers'
way, which creates the SQLite file, its folder, the catalog tables and the warehouse folder:
a typo then looked like an empty, healthy table. Now each says what is missing, exits 1,
and the folder is exactly as before. Real processes, real SQLite catalog.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.table_meta.declared import ensure_table
from tests.compactor.helpers import write_config

COMMANDS = [("table",), ("table", "--json"), ("table", "--evolve"), ("compact", "--once"), ("compact", "--dry-run"),
            ("maintain", "--once")]


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _run(work: Path, *args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "streamberg"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMBERG_")}
    env["STREAMBERG_LOG_FORMAT"] = "json"
    return subprocess.run([str(exe), args[0], "--config", str(work / "streamberg.yaml"), *args[1:]],
                          capture_output=True, text=True, timeout=300, cwd=work, env=env, stdin=subprocess.DEVNULL)


def _human_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("{")]


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(a) for a in COMMANDS])
def test_missing_catalog_database_creates_nothing(tmp_path: Path, args: tuple[str, ...]) -> None:
    work = tmp_path / "work"
    path = write_config(work)
    document = yaml.safe_load(path.read_text())
    document["catalog"]["uri"] = "sqlite:///catlog.db"  # the typo: catalog.db exists nowhere either
    path.write_text(yaml.safe_dump(document))
    before = _tree(work)
    proc = _run(work, *args)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = _human_lines(proc.stderr)
    assert len(lines) == 1 and "catlog.db does not exist" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert _tree(work) == before


@pytest.mark.slow  # 9-12 s alone on 2 cores (make test-fast --durations, 2026-11-29)
def test_missing_table_in_an_existing_catalog_creates_nothing(tmp_path: Path) -> None:
    work = tmp_path / "work"
    config = load_config(write_config(work))
    # A catalog with another table in it: the catalog is fine, the identifier is wrong.
    other = config.table.model_copy(update={"identifier": "db.other"})
    ensure_table(load_catalog(config.catalog), other)
    before = _tree(work)
    catalog_rows = _namespaces_and_tables(config)
    for args in COMMANDS:
        proc = _run(work, *args)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        assert "db.events does not exist" in proc.stdout + proc.stderr, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        if args == ("table", "--json"):
            assert json.loads(proc.stdout) == {"table": "db.events", "exists": False}
        else:
            assert len(_human_lines(proc.stderr)) == 1, (args, proc.stderr)
    # SQLite's WAL side files come and go with connections; the catalog itself is unchanged.
    assert [p for p in _tree(work) if not p.endswith(("-wal", "-shm"))] == \
           [p for p in before if not p.endswith(("-wal", "-shm"))]
    assert _namespaces_and_tables(config) == catalog_rows


def _namespaces_and_tables(config) -> tuple[list, list]:
    catalog = load_catalog(config.catalog)
    return sorted(catalog.list_namespaces()), sorted(catalog.list_tables("db"))
