"""A Python worker killed with SIGKILL is a Flink task failure, not the end of the ingest.

A local `streamberg ingest` runs its writers and committer in Python worker processes of
their own (Flink's process mode), forked by the run's fork server (ingest/local/fork_server.py). While a producer writes,
one worker process is killed with SIGKILL after the job has committed. Flink's restart
strategy restarts the job's tasks, every writer resumes from the offsets recorded in the
table, and the same `streamberg ingest` run goes on reading, then drains on SIGTERM and
exits 0: every valid id
exactly once, the restart logged by the driver's relay of the workers' log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamberg.common.broker import ensure_topic
from streamberg.ingest.local.fork_server import PROCESS_NAME
from tests.helpers import (
    BackgroundProducer,
    assert_every_record_once,
    committed_records,
    config_at,
    json_events,
    write_config,
)
from tests.listening import process_tree, processes_named

pytestmark = pytest.mark.flink

PARTITIONS = 2
RATE = 1000  # records a second
AFTER_KILL_SECONDS = 3.0


def _python_workers(root: int) -> list[int]:
    """The Flink Python worker processes under the ingest process `root`: the processes the
    fork server forked (ingest/local/fork_server.py names them), not their launchers."""
    return processes_named(root, PROCESS_NAME)


def _launchers(root: int) -> list[int]:
    """What Flink started as the Python workers: the fork server's launchers."""
    launchers = []
    for pid in process_tree(root):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pyflink.fn_execution.beam.beam_boot" in command and any(a.endswith(b"fork_launcher.py") for a in command):
            launchers.append(pid)
    return sorted(launchers)


def test_sigkill_of_a_python_worker_is_restarted_by_flink_and_loses_nothing(tmp_path: Path, broker: str) -> None:
    path = write_config(tmp_path, broker, "worker-crash-events",
                        ingest={"commit_interval_seconds": 1, "max_poll_records": 500, "parallelism": 2})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, PARTITIONS)
    producer = BackgroundProducer(config, 1000, rate=RATE, bad_fraction=0.01).start()
    exe = Path(sys.executable).parent / "streamberg"
    log = tmp_path / "ingest.log"
    # Unbounded: the run must still be reading when the worker dies, however slow its start.
    proc = subprocess.Popen([str(exe), "ingest", "--config", str(path), "--quiet"], stdout=subprocess.PIPE,
                            stderr=log.open("wb"), start_new_session=True,
                            env={**os.environ, "STREAMBERG_LOG_FORMAT": "json"})
    try:
        deadline = time.monotonic() + 240
        while (committed_records(config) == 0 or len(_python_workers(proc.pid)) < 2
               or len(_launchers(proc.pid)) != len(_python_workers(proc.pid))):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the job never committed with its Python workers running"
            time.sleep(0.5)
        workers = _python_workers(proc.pid)
        # The ingest runs in process mode, its workers forked by the fork server (the loop
        # waited for one launcher per worker): not in the driver, each a process of its own.
        assert proc.pid not in workers
        os.kill(workers[-1], signal.SIGKILL)
        killed_at_committed = committed_records(config)
        time.sleep(AFTER_KILL_SECONDS)  # records keep coming while Flink restarts the tasks
        producer.stop()
        while committed_records(config) < producer.produced:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline + 240, "the restarted job never caught up"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)  # an operator's stop: drain, commit, exit 0
        stdout, _ = proc.communicate(timeout=300)
    finally:
        producer.stop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)

    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    events = json_events(text)
    restarts = [e for e in events if e.get("event", "").startswith("task restarted after a failure")]
    assert restarts, "the killed worker's tasks were never restarted"
    assert all(e["attempt"] >= 1 for e in restarts)
    # The driver survived the worker and reported the whole run.
    summary = json.loads(stdout.decode().strip().splitlines()[-1])
    assert summary["consumed"] == producer.produced > killed_at_committed

    assert_every_record_once(config, producer, PARTITIONS)
