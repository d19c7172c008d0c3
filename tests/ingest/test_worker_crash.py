"""A Python worker killed with SIGKILL is a Flink task failure, not the end of the ingest.

A local `streamberg ingest` runs its writers and committer in Python worker processes of
their own (Flink's process mode), children of the MiniCluster's JVM. While a producer writes,
one worker process is killed with SIGKILL after the job has committed. Flink's restart
strategy restarts the job's tasks, every writer resumes from the offsets recorded in the
table, and the same `streamberg ingest` run goes on to drain and exit 0: every valid id
exactly once, the restart logged by the driver's relay of the workers' log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.common.offsets import committed_position
from streamberg.common.sample_events import produce_events
from tests.helpers import config_at, dead_letters, duplicates, end_offsets_by_reading, table_ids, write_config
from tests.listening import process_tree

pytestmark = pytest.mark.flink

PARTITIONS = 2
BATCHES = 12  # 1,000 records a second


def _python_workers(root: int) -> list[int]:
    """The Flink Python worker processes (beam_boot) under the ingest process `root`."""
    workers = []
    for pid in process_tree(root):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pyflink.fn_execution.beam.beam_boot" in command:
            workers.append(pid)
    return sorted(workers)


def _committed(config) -> int:
    catalog = load_catalog(config.catalog)
    if not catalog.table_exists(config.table.identifier):
        return 0
    return sum(committed_position(catalog.load_table(config.table.identifier), config.kafka.topic).offsets.values())


def test_sigkill_of_a_python_worker_is_restarted_by_flink_and_loses_nothing(tmp_path: Path, broker: str) -> None:
    path = write_config(tmp_path, broker, "worker-crash-events",
                        ingest={"commit_interval_seconds": 1, "max_poll_records": 500, "parallelism": 2})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, PARTITIONS)
    produced_ids: list[int] = []
    produced_bad = [0]

    def produce() -> None:
        for batch in range(BATCHES):
            result = produce_events(config, 1000, rate=1000, bad_fraction=0.01, start_id=batch * 1000, seed=batch)
            produced_ids.extend(result.valid_ids)
            produced_bad[0] += sum(result.bad.values())

    producer = threading.Thread(target=produce)
    producer.start()
    exe = Path(sys.executable).parent / "streamberg"
    log = tmp_path / "ingest.log"
    proc = subprocess.Popen([str(exe), "ingest", "--config", str(path), "--max-records", str(BATCHES * 1000),
                             "--quiet"], stdout=subprocess.PIPE, stderr=log.open("wb"), start_new_session=True,
                            env={**os.environ, "STREAMBERG_LOG_FORMAT": "json"})
    try:
        deadline = time.monotonic() + 240
        while _committed(config) == 0 or len(_python_workers(proc.pid)) < 2:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the job never committed with its Python workers running"
            time.sleep(0.5)
        workers = _python_workers(proc.pid)
        # The ingest runs in process mode: its Python operators are not in the driver.
        assert proc.pid not in workers
        os.kill(workers[-1], signal.SIGKILL)
        killed_at_committed = _committed(config)
        producer.join()
        stdout, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        producer.join()

    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    events = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    restarts = [e for e in events if e.get("event", "").startswith("task restarted by Flink")]
    assert restarts, "the killed worker's tasks were never restarted"
    assert all(e["attempt"] >= 1 for e in restarts)
    # The driver survived the worker and reported the whole run.
    summary = json.loads(stdout.decode().strip().splitlines()[-1])
    assert summary["consumed"] == BATCHES * 1000 > killed_at_committed

    ids = table_ids(config)
    assert not duplicates(ids)
    assert sorted(ids) == sorted(produced_ids)
    assert dead_letters(config).num_rows == produced_bad[0]
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    offsets = committed_position(table, config.kafka.topic).offsets
    assert {str(p): o for p, o in offsets.items()} == end_offsets_by_reading(broker, config.kafka.topic, PARTITIONS)
