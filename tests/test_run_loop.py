"""`streamberg run`: the whole loop under its supervisor, at a small scale, with real components.

A producer writes while `streamberg run` supervises the PyFlink ingest, the Spark compactor
and maintenance. The compactor is started before the ingest's first commit (it must wait for
the table, not crash), then killed with SIGKILL mid-run: the supervisor restarts it and counts
the restart. A SIGTERM to the supervisor then stops everything gracefully: exit 0, each
component exiting 0 within its stop timeout, every valid id exactly once, dead letters
present, compactor replace snapshots on the table, and no process of the loop left running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.table_meta.offsets import committed_position
from tests.helpers import (
    BackgroundProducer,
    config_at,
    dead_letters,
    duplicates,
    json_events,
    table_ids,
    wait_for,
    write_config,
)

pytestmark = [pytest.mark.flink, pytest.mark.spark]

PARTITIONS = 2


def _supervisor_events(log: Path, event: str, process: str | None = None) -> list[dict]:
    return [e for e in json_events(log.read_text()) if e.get("component") == "supervisor" and e.get("event") == event
            and (process is None or e.get("process") == process)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose (nothing runs), but there should be none either.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _in_groups(groups: list[int]) -> list[str]:
    """Processes in the given process groups (each component leads its own: its JVM is in it)."""
    out = subprocess.run(["ps", "-eo", "pid,pgid,stat,args"], capture_output=True, text=True).stdout
    rows = [line.split(None, 3) for line in out.splitlines()[1:]]
    return [" ".join(r) for r in rows if len(r) >= 3 and int(r[1]) in groups and not r[2].startswith("Z")]


def _processes_mentioning(text: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if text in line and "ps -eo" not in line]


def test_run_supervises_the_loop_restarts_a_killed_component_and_stops_cleanly(tmp_path: Path, broker: str) -> None:
    path = write_config(
        tmp_path, broker, partition_spec=[{"source": "ts", "transform": "day"}],
        ingest={"commit_interval_seconds": 1, "max_poll_records": 500},
        extra={
            "compactor": {"strategy": "zorder", "columns": ["user_id", "city"], "min_files": 2,
                          "every_n_snapshots": 2, "max_delay_seconds": None, "checkpoint_dir": "checkpoint",
                          "trigger_interval_seconds": 2, "wait_for_table_seconds": 600},
            "maintenance": {"interval_seconds": 30, "wait_for_table_seconds": 600},
            "run": {"restart_backoff_seconds": 1, "status_interval_seconds": 5, "stop_timeout_seconds": 120},
        },
    )
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, PARTITIONS)
    log = tmp_path / "run.log"
    out = tmp_path / "run.out"
    exe = Path(sys.executable).parent / "streamberg"
    # Before any record, so before the ingest's first commit: the compactor must come up and
    # wait (for the catalog, the table, or the first snapshot), not crash. Whether the ingest
    # has created the empty table by then is a race; the waiting itself is tested without it
    # in tests/test_run_supervisor.py.
    run = subprocess.Popen([str(exe), "run", "--config", str(path)], stdout=out.open("w"), stderr=log.open("w"),
                           env={**os.environ, "STREAMBERG_LOG_FORMAT": "json"})
    producer = BackgroundProducer(config, 250, rate=500, bad_fraction=0.02, max_batches=40)
    # Records produced only after the compactor's restart: the restarted compactor has work
    # however far the first one got (on a loaded machine it can optimize everything before
    # the kill).
    later = BackgroundProducer(config, 250, rate=500, bad_fraction=0.02, max_batches=8, first_id=10**6)
    try:
        wait_for(lambda: any(e.get("process") == "compact" and ("waiting for the" in str(e.get("event"))
                                                              or e.get("event") == "watching snapshots")
                          for e in json_events(log.read_text())),
                 240, "the compactor up before the first commit", proc=run, log=log, every=0.5)
        assert not any(e.get("event") == "committed" for e in json_events(log.read_text()))  # no commit yet: no records
        producer.start()
        catalog = load_catalog(config.catalog)

        def replaces() -> int:
            try:
                table = catalog.load_table(config.table.identifier)
            except Exception:  # noqa: BLE001 - not created yet
                return 0
            return sum(1 for s in table.metadata.snapshots if s.summary and s.summary.operation.value == "replace")

        wait_for(lambda: replaces() > 0, 240, "a compactor replace snapshot", proc=run, log=log, every=0.5)
        # Kill the compactor's Python process outright (no graceful stop): the supervisor restarts it.
        victim = _supervisor_events(log, "component started", "compact")[-1]["pid"]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: len(_supervisor_events(log, "component started", "compact")) >= 2, 240,
                 "the compactor restarted", proc=run, log=log, every=0.5)
        producer.join()
        replaces_before = replaces()
        later.start().join()
        wait_for(lambda: committed_position(catalog.load_table(config.table.identifier),
                                         config.kafka.topic).consumed_total >= producer.produced + later.produced,
                 240, "every produced record committed", proc=run, log=log, every=0.5)
        # The restarted compactor keeps working on what the ingest committed since.
        wait_for(lambda: replaces() > replaces_before, 240, "a replace by the restarted compactor", proc=run, log=log,
                 every=0.5)
    finally:
        producer.stop()
        later.stop()
        run.send_signal(signal.SIGTERM)
        run.wait(240)
    text = log.read_text()
    assert run.returncode == 0, text[-4000:]
    summary = json.loads(out.read_text().strip().splitlines()[-1])
    assert summary["components"]["compact"]["restarts"] >= 1, summary
    assert summary["components"]["ingest"]["restarts"] == 0, summary
    restarted = _supervisor_events(log, "component exited; restarting", "compact")
    assert restarted and restarted[0]["exit_code"] == -signal.SIGKILL and restarted[0]["restarts"] == 1
    # Every component's lines are relayed with its name.
    assert {e.get("process") for e in json_events(log.read_text())} >= {"ingest", "compact", "maintain"}
    # Graceful stop: the ingest drained (its last unit committed) and reported how it stopped.
    ingest_summary = [e for e in json_events(log.read_text()) if e.get("process") == "ingest" and "stopped_because" in e]
    assert ingest_summary and ingest_summary[-1]["stopped_because"] == "SIGTERM", text[-3000:]
    # ... and so did the compactor and maintenance: every component exited 0 on its SIGTERM within
    # run.stop_timeout_seconds (a SIGKILL after the timeout would show as exit -9 and a warning).
    assert not _supervisor_events(log, "component did not stop in time; killing it"), text[-4000:]
    stopped = {e["process"]: e["exit_code"] for e in _supervisor_events(log, "component stopped")}
    assert stopped == {"ingest": 0, "compact": 0, "maintain": 0}, text[-4000:]
    assert {name: c["last_exit"] for name, c in summary["components"].items()} == stopped, summary

    ids = table_ids(config)
    assert not duplicates(ids)
    assert ids == sorted(producer.ids + later.ids)
    bad = dead_letters(config)
    assert bad.num_rows == producer.produced + later.produced - len(producer.ids) - len(later.ids) > 0
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    assert committed_position(table, config.kafka.topic).consumed_total == producer.produced + later.produced
    # Nothing of the loop is left: every component process started, and their JVMs.
    started = [e["pid"] for e in _supervisor_events(log, "component started")]
    assert started and not [pid for pid in started if _alive(pid)]
    assert not _in_groups(started), _in_groups(started)
    assert not _processes_mentioning(str(path)), _processes_mentioning(str(path))
    assert not _processes_mentioning(str(tmp_path)), _processes_mentioning(str(tmp_path))
