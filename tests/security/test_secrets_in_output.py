"""No secret in anything streamberg prints or writes beside the table.

A PostgreSQL catalog with password authentication (tests/fixtures/postgres.py) and S3 keys in
catalog.properties, given through the environment as the README recommends. Every command an
operator points at the table runs as a real subprocess; its stdout and stderr (JSON logs at
debug level) and every file it left in its working folder are searched for the password and
the keys. The failure paths matter most (driver and Java exception text quotes connection
URLs), so wrong-password and unreachable-host URIs, in the userinfo and the `?password=`
forms, run through the same commands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamberg.common.broker import free_port
from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.table_meta.declared import ensure_table
from tests.compactor.helpers import FakeIngest, write_config
from tests.fixtures.postgres import PASSWORD, USER

S3_ACCESS_KEY = "AKIAOUTPUTTEST00001"
S3_SECRET_KEY = "s3-secret-Kx7-never-printed"
WRONG_PASSWORD = "wrong-pw-Hq3-never-printed"
PROPERTIES = json.dumps({"s3.access-key-id": S3_ACCESS_KEY, "s3.secret-access-key": S3_SECRET_KEY})
SECRETS = (PASSWORD, S3_ACCESS_KEY, S3_SECRET_KEY, WRONG_PASSWORD)


def _env(uri: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMBERG_")}
    # Debug level: the more the commands say, the more places a secret could slip through.
    env.update({"STREAMBERG_LOG_FORMAT": "json", "STREAMBERG_LOG_LEVEL": "debug",
                "STREAMBERG_CATALOG__URI": uri, "STREAMBERG_CATALOG__PROPERTIES": PROPERTIES})
    return env


def _run(work: Path, uri: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "streamberg"
    return subprocess.run([str(exe), args[0], "--config", str(work / "streamberg.yaml"), *args[1:]],
                          capture_output=True, text=True, timeout=timeout, cwd=work, env=_env(uri),
                          stdin=subprocess.DEVNULL)


def _assert_no_secret(proc: subprocess.CompletedProcess) -> None:
    for secret in SECRETS:
        for name, text in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            assert secret not in text, f"{secret!r} in the {name} of {' '.join(proc.args[1:2])}:\n{text[-3000:]}"
    # Debug logs may carry a (redacted) traceback as a JSON field; what a person reads may not.
    plain = [line for line in proc.stderr.splitlines() if not line.startswith("{")]
    assert not any("Traceback" in line for line in plain), proc.stderr[-3000:]


def _assert_no_secret_in_files(root: Path) -> int:
    """Searches every file under root (logs, checkpoints, metadata); returns how many it read."""
    read = 0
    for path in root.rglob("*"):
        if path.is_file() and path.stat().st_size < 50 * 1024 * 1024:
            data = path.read_bytes()
            read += 1
            for secret in SECRETS:
                assert secret.encode() not in data, f"{secret!r} in {path}"
    return read


def _table(tmp_path: Path, uri: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config without secrets in it and a table with two ingest commits, on the PostgreSQL catalog."""
    work = tmp_path / "work"
    write_config(work)
    for key, value in _env(uri).items():
        if key.startswith("STREAMBERG_CATALOG"):
            monkeypatch.setenv(key, value)
    config = load_config(work / "streamberg.yaml")
    ensure_table(load_catalog(config.catalog), config.table)
    ingest = FakeIngest(config)
    ingest.append(20)
    ingest.append(20)
    return work


@pytest.mark.slow
def test_secret_reaches_no_output_on_the_read_paths(postgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = postgres.create_database("sec")
    assert PASSWORD in uri  # the URI really carries the password the grep looks for
    work = _table(tmp_path, uri, monkeypatch)
    runs = {
        "status --json": _run(work, uri, "status", "--json"),
        "status": _run(work, uri, "status"),
        "metrics --once": _run(work, uri, "metrics", "--once"),
        "table": _run(work, uri, "table"),
        "table --json": _run(work, uri, "table", "--json"),
        "compact --dry-run": _run(work, uri, "compact", "--dry-run"),
    }
    for proc in runs.values():
        _assert_no_secret(proc)
    # The commands did their work (a clean output because nothing ran would prove nothing).
    status = json.loads(runs["status --json"].stdout)
    assert status["catalog"]["reachable"] is True and status["table_exists"] is True
    assert json.loads(runs["table --json"].stdout)["records"] == 40
    assert "streamberg_up" in runs["metrics --once"].stdout
    assert runs["compact --dry-run"].returncode == 0, runs["compact --dry-run"].stderr[-2000:]
    assert _assert_no_secret_in_files(work) > 0


@pytest.mark.slow
def test_secret_reaches_no_output_when_the_catalog_refuses_or_is_gone(postgres, tmp_path: Path) -> None:
    database = postgres.create_database("secbad").rsplit("/", 1)[1]
    closed = free_port()
    bad = {
        "wrong password": postgres.uri(database, password=WRONG_PASSWORD),
        "wrong password as a query parameter": f"postgresql+psycopg2://{USER}@127.0.0.1:{postgres.port}/{database}"
                                              f"?password={WRONG_PASSWORD}",
        "unreachable host": f"postgresql+psycopg2://{USER}:{PASSWORD}@127.0.0.1:{closed}/{database}",
    }
    work = tmp_path / "work"
    write_config(work)
    for case, uri in bad.items():
        for args in (("status", "--json"), ("metrics", "--once"), ("table",), ("compact", "--once"),
                     ("maintain", "--once")):
            proc = _run(work, uri, *args)
            _assert_no_secret(proc)
            if args[0] == "metrics":  # a scrape reports the catalog down (up 0) and succeeds
                assert 'streamberg_up{source="catalog",table="db.events"} 0.0' in proc.stdout, proc.stdout
            else:
                assert proc.returncode != 0, (case, args, proc.stdout)
                # The failure is explained, not just redacted away.
                assert "catalog" in proc.stderr or "catalog" in proc.stdout, (case, args, proc.stderr[-2000:])
        status = json.loads(_run(work, uri, "status", "--json").stdout)
        assert status["catalog"]["reachable"] is False and "***" in status["catalog"]["error"], status["catalog"]
    _assert_no_secret_in_files(work)


@pytest.mark.slow
@pytest.mark.spark
def test_secret_reaches_no_output_of_spark_commands(postgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = postgres.create_database("secspark")
    work = _table(tmp_path, uri, monkeypatch)
    compact = _run(work, uri, "compact", "--once", timeout=600)
    assert compact.returncode == 0, compact.stderr[-3000:]
    assert json.loads(compact.stdout.strip().splitlines()[-1])["files_in"] >= 2, compact.stdout
    maintain = _run(work, uri, "maintain", "--once", "--json", timeout=600)
    assert maintain.returncode == 0, maintain.stderr[-3000:]
    assert json.loads(maintain.stdout.strip().splitlines()[-1])["status"] == "ok", maintain.stdout
    for proc in (compact, maintain):
        _assert_no_secret(proc)
    # The compactor's streaming checkpoint and any Spark files beside the config.
    assert _assert_no_secret_in_files(work) > 0
