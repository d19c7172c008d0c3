"""`streamberg run` supervision rules and the components' wait for the table, without a JVM.

The children are the real `streamberg compact` / `streamberg maintain` processes, failing
for real reasons (no table yet, a bad clustering column) before they would start Spark. The
live status line is drawn on a stand-in terminal.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from streamberg.supervisor.supervisor import Output, status_text
from tests.helpers import json_events, streamberg, write_config


def test_a_failing_component_is_restarted_with_growing_backoff(tmp_path: Path) -> None:
    path = write_config(tmp_path, "127.0.0.1:1", extra={
        "compactor": {"wait_for_table_seconds": 0},  # fails at once: no table, no ingest running
        "run": {"restart_backoff_seconds": 0.5, "restart_backoff_max_seconds": 1.5},
    })
    proc = streamberg("run", "--config", str(path), "--components", "compact", "--duration", "20", "--no-status",
                      timeout=120)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["exit_code"] == 0 and summary["stopped_because"] == "duration 20s elapsed"
    restarts = [e for e in json_events(proc.stderr) if e.get("event") == "component exited; restarting"]
    assert restarts and summary["components"]["compact"]["restarts"] == len(restarts)
    assert [e["restarts"] for e in restarts] == list(range(1, len(restarts) + 1))
    assert all(e["exit_code"] == 1 and e["process"] == "compact" for e in restarts)
    backoffs = [e["backoff_seconds"] for e in restarts]
    assert backoffs == [min(1.5, 0.5 * 2 ** i) for i in range(len(backoffs))]
    # The child's own message is relayed with its name, and it is a message, not a traceback.
    relayed = [e for e in json_events(proc.stderr) if e.get("process") == "compact" and e.get("component") != "supervisor"]
    assert any("does not exist" in str(e.get("event")) for e in relayed)  # no catalog database yet
    assert "Traceback" not in proc.stderr


def test_an_invalid_component_configuration_is_not_restarted(tmp_path: Path) -> None:
    path = write_config(tmp_path, "127.0.0.1:1", extra={"compactor": {"columns": ["no_such_column"]}})
    # The table must exist for the compactor to check its columns against it.
    from streamberg.ingest.dead_letters import open_tables
    from tests.helpers import config_at

    open_tables(config_at(path))
    proc = streamberg("run", "--config", str(path), "--components", "compact", "--no-status", check=False,
                      timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["components"]["compact"] == {"restarts": 0, "last_exit": 2}
    assert "compactor.columns" in proc.stderr and "invalid configuration" in proc.stderr


def test_invalid_run_section_fails_before_anything_starts(tmp_path: Path) -> None:
    path = write_config(tmp_path, "127.0.0.1:1", extra={"run": {"components": ["ingest", "spark"]}})
    proc = streamberg("run", "--config", str(path), check=False, timeout=60)
    assert proc.returncode == 2 and "run.components" in proc.stderr and "component started" not in proc.stderr


def test_govern_is_one_keeper_not_a_second_one(tmp_path: Path) -> None:
    """`govern` keeps tables itself: beside compact, maintain or merge two keepers would fight
    over one table's lease, so the pair is refused before anything starts (config and flag)."""
    path = write_config(tmp_path, "127.0.0.1:1", extra={"run": {"components": ["ingest", "govern", "compact"]}})
    proc = streamberg("run", "--config", str(path), check=False, timeout=60)
    assert proc.returncode == 2 and "govern keeps the tables itself" in proc.stderr and "compact" in proc.stderr
    path = write_config(tmp_path, "127.0.0.1:1")
    proc = streamberg("run", "--config", str(path), "--components", "ingest,govern,maintain", check=False, timeout=60)
    assert proc.returncode == 2 and "govern keeps the tables itself" in proc.stderr and "component started" not in proc.stderr


def test_continuous_compactor_and_maintenance_wait_for_the_table_then_fail(tmp_path: Path) -> None:
    path = write_config(tmp_path, "127.0.0.1:1", extra={"compactor": {"wait_for_table_seconds": 2},
                                                        "maintenance": {"wait_for_table_seconds": 2}})
    from streamberg.common.catalog import load_catalog
    from tests.helpers import config_at

    load_catalog(config_at(path).catalog)  # the catalog database exists; the table does not
    exe = Path(sys.executable).parent / "streamberg"
    procs = {name: subprocess.Popen([str(exe), name, "--config", str(path)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env={**os.environ, "STREAMBERG_LOG_FORMAT": "json"})
             for name in ("compact", "maintain")}
    for proc in procs.values():
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 1, stderr
        assert any("waiting for the table" in str(e.get("event")) for e in json_events(stderr)), stderr
        assert "does not exist yet" in stderr and "after waiting 2 s" in stderr and "Traceback" not in stderr


def test_waiting_ends_when_the_table_appears(tmp_path: Path) -> None:
    import threading

    from streamberg.common.catalog import load_catalog
    from streamberg.common.catalog_wait import wait_for_table
    from streamberg.ingest.dead_letters import open_tables
    from tests.helpers import config_at

    config = config_at(write_config(tmp_path, "127.0.0.1:1"))
    catalog = load_catalog(config.catalog)
    creator = threading.Timer(1.5, open_tables, args=(config,))
    creator.start()
    table = wait_for_table(catalog, config.table.identifier, 60, "test")
    creator.join()
    assert table is not None and table.name() == tuple(config.table.identifier.split("."))
    stop = threading.Event()
    stop.set()
    assert wait_for_table(catalog, "db.never", 60, "test", stop) is None


def test_continuous_compactor_waits_for_a_catalog_database_the_ingest_has_not_created(tmp_path: Path) -> None:
    path = write_config(tmp_path, "127.0.0.1:1", extra={"compactor": {"wait_for_table_seconds": 2}})
    exe = Path(sys.executable).parent / "streamberg"
    proc = subprocess.run([str(exe), "compact", "--config", str(path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "STREAMBERG_LOG_FORMAT": "json"})
    assert proc.returncode == 1, proc.stderr
    assert any(e.get("event") == "waiting for the catalog database" for e in json_events(proc.stderr)), proc.stderr
    assert "does not exist after waiting 2 s" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "catalog.db").exists()  # waiting never creates the catalog


# -- the live status line on a terminal (no children, no JVM) -----------------------------------

# What the supervisor's status loop passes to status_text: the keys cli/run.py's
# status_collector returns, plus the rate and restarts the loop adds.
FACTS = {"records": 1_234_567, "data_files": 42, "consumed_total": 1_250_000, "lag": 15_320, "pending_files": 7,
         "last_optimize_age_seconds": 12.4, "dead_letters": 12_500, "health": "warn",
         "health_reasons": ["lag 15320 >= 10000"], "rate": 987.6, "restarts": {"ingest": 0, "compact": 1, "maintain": 0}}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _screen(text: str) -> list[str]:
    """The lines a terminal shows after `text`: "\\r" returns to column 0, later characters overwrite."""
    lines, column = [[]], 0
    for char in text:
        if char == "\r":
            column = 0
        elif char == "\n":
            lines.append([])
            column = 0
        else:
            row = lines[-1]
            row[column:column + 1] = [char]
            column += 1
    return ["".join(row).rstrip() for row in lines]


def test_status_text_shows_records_rate_lag_pending_files_last_optimize_and_health() -> None:
    assert status_text(FACTS) == ("committed 1,234,567 rec (988/s) | lag 15,320 | pending files 7 | "
                                  "last optimize 12s ago | dead letters 12,500 | restarts 1 | health warn")
    # Before the first commit and the first optimize (the loop just started, nothing restarted).
    start = {**FACTS, "records": None, "rate": None, "lag": None, "pending_files": None,
             "last_optimize_age_seconds": None, "dead_letters": None, "health": "ok", "restarts": {"ingest": 0}}
    assert status_text(start) == "no commit yet | last optimize never | health ok"
    assert status_text({"error": "catalog database locked"}) == "status unavailable: catalog database locked"


def test_status_line_stays_below_the_component_lines_on_a_terminal() -> None:
    terminal = _Terminal()
    output = Output(terminal, json_lines=False, status_line=True)
    assert output.bar is not None  # a terminal gets the live line
    first = status_text(FACTS)
    output.status(first)
    output.line("ingest", "committed interval 3: 5000 records\n")
    output.line("compact", "optimize committed")
    second = status_text({**FACTS, "records": 1_240_000, "pending_files": 0})
    output.status(second)
    output.line("maintain", "expired 3 snapshots")
    screen = _screen(terminal.getvalue())
    # Every component line whole, on a line of its own, in order; the status line last, current.
    assert screen == ["ingest  | committed interval 3: 5000 records", "compact | optimize committed",
                      "maintain| expired 3 snapshots", second]
    output.close()
    assert _screen(terminal.getvalue())[:-1] == screen[:-1] and _screen(terminal.getvalue())[-1] == ""  # line gone


def test_relayed_child_lines_are_redacted(tmp_path: Path) -> None:
    """What a child prints outside structlog (a JVM line, a traceback) passes the supervisor's
    redaction: here a child that fails printing the catalog URI with its password."""
    from streamberg.common.redact import register_secret
    from streamberg.supervisor.supervisor import Supervisor

    register_secret("child-secret-42")
    lines: list[tuple[str, str]] = []

    class _Output:
        def line(self, name: str, text: str) -> None:
            lines.append((name, text))

    supervisor = Supervisor.__new__(Supervisor)
    supervisor.output = _Output()
    comp = type("Comp", (), {"tail": [], "name": "ingest"})()
    proc = subprocess.Popen([sys.executable, "-c", "print('jdbc url postgresql://u:child-secret-42@db/c'); "
                                                   "print('Authorization: Basic dXNlcjpwYXNz')"],
                            stdout=subprocess.PIPE, text=True)
    supervisor._relay(comp, proc)
    proc.wait(10)
    text = "".join(t for _, t in lines)
    assert "child-secret-42" not in text and "dXNlcjpwYXNz" not in text and "u:***@db" in text
