"""The local engine with no JVM (`streamberg ingest --engine processes`, ingest/processes.py).

The same writer and committer tasks as the Flink job, in processes forked by the driver.
Against a real broker, a SQLite catalog and Parquet files, read back by pyiceberg and DuckDB:

- a writer process killed with SIGKILL mid-run: every task starts again from the tables'
  offsets (the driver says so), the run goes on, drains on SIGTERM and exits 0, every valid
  id exactly once, the dead letters beside them, the table's offsets at the topic's end;
- the driver killed with SIGKILL: its task processes go with it (nothing keeps writing a
  table no driver watches);
- a bounded run (--max-records) after it ends with every record committed once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb

from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.ingest.processes import process_name
from streamberg.table_meta.offsets import committed_position
from tests.helpers import (
    BackgroundProducer,
    assert_every_record_once,
    committed_records,
    config_at,
    dead_letters,
    duplicates,
    json_events,
    table_ids,
    wait_for,
    write_config,
)
from tests.listening import process_tree, processes_named

PARTITIONS = 2
RATE = 1000  # records a second
EXE = Path(sys.executable).parent / "streamberg"
ENV = {**os.environ, "STREAMBERG_LOG_FORMAT": "json"}


def _duckdb_ids(config) -> list[int]:
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    files = [task.file.file_path.removeprefix("file://") for task in table.scan().plan_files()]
    listed = ", ".join(f"'{f}'" for f in files)
    return [r[0] for r in duckdb.sql(f"SELECT id FROM read_parquet([{listed}])").fetchall()]


def test_a_killed_writer_process_restarts_the_run_and_loses_nothing(tmp_path: Path, broker: str) -> None:
    path = write_config(tmp_path, broker, "processes-crash-events",
                        ingest={"commit_interval_seconds": 1, "max_poll_records": 500, "parallelism": 2})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, PARTITIONS)
    producer = BackgroundProducer(config, 1000, rate=RATE, bad_fraction=0.01).start()
    log = tmp_path / "ingest.log"
    proc = subprocess.Popen([str(EXE), "ingest", "--config", str(path), "--quiet", "--engine", "processes"],
                            stdout=subprocess.PIPE, stderr=log.open("wb"), start_new_session=True, env=ENV)
    try:
        wait_for(lambda: committed_records(config) > 0 and len(processes_named(proc.pid, process_name("writer-1"))) == 1,
                 120, "the run never committed with its writer processes up", proc=proc, log=log)
        # No JVM: the driver's tree is the driver and its task processes.
        tree = process_tree(proc.pid) - {proc.pid}
        names = sorted(Path(f"/proc/{pid}/comm").read_text().strip() for pid in tree)
        assert names == ["sb-committer", "sb-writer-0", "sb-writer-1"], names
        os.kill(processes_named(proc.pid, process_name("writer-1"))[0], signal.SIGKILL)
        killed_at_committed = committed_records(config)
        wait_for(lambda: "every task starts again" in log.read_text(), 30, "the driver never saw the kill", proc=proc,
                 log=log)
        time.sleep(1.0)  # records keep coming while the tasks start again
        producer.stop()
        wait_for(lambda: committed_records(config) >= producer.produced, 120, "the restarted run never caught up",
                 proc=proc, log=log)
        proc.send_signal(signal.SIGTERM)  # an operator's stop: drain, commit, exit 0
        stdout, _ = proc.communicate(timeout=120)
    finally:
        producer.stop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)

    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    events = json_events(text)
    assert [e for e in events if e.get("event", "").startswith("task restarted after a failure")
            and e.get("attempt") == 1], "the tasks never said they were restarted"
    assert "Traceback" not in text
    summary = json.loads(stdout.decode().strip().splitlines()[-1])
    assert summary["consumed"] == producer.produced > killed_at_committed

    assert_every_record_once(config, producer, PARTITIONS)
    assert sorted(_duckdb_ids(config)) == sorted(producer.ids)  # an independent reader agrees


def test_the_task_processes_die_with_the_driver_and_a_bounded_run_commits_everything(
        tmp_path: Path, broker: str) -> None:
    path = write_config(tmp_path, broker, "processes-bounded-events",
                        ingest={"commit_interval_seconds": 1, "max_poll_records": 500, "parallelism": 2})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, PARTITIONS)
    producer = BackgroundProducer(config, 3000, rate=20_000, max_batches=1).start()
    producer.join()
    log = tmp_path / "ingest.log"
    proc = subprocess.Popen([str(EXE), "ingest", "--config", str(path), "--quiet", "--engine", "processes"],
                            stdout=subprocess.DEVNULL, stderr=log.open("wb"), start_new_session=True, env=ENV)
    try:
        wait_for(lambda: committed_records(config) > 0, 120, "the run never committed", proc=proc, log=log)
        tasks = process_tree(proc.pid) - {proc.pid}
        assert len(tasks) == 3
        proc.kill()  # SIGKILL to the driver alone, not its group
        proc.wait(10)
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() and _alive(pid) for pid in tasks):
            assert time.monotonic() < deadline, "task processes outlived their driver"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)

    # A bounded run on the same table takes what is left and what came since, once (the killed
    # run's uncommitted files are orphans; their records are read again).
    later = BackgroundProducer(config, 2000, rate=20_000, max_batches=1, first_id=3000).start()
    later.join()
    done = subprocess.run([str(EXE), "ingest", "--config", str(path), "--quiet", "--engine", "processes",
                           "--max-records", str(producer.produced + later.produced - committed_records(config))],
                          capture_output=True, text=True, timeout=180, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    ids = table_ids(config)
    assert not duplicates(ids)
    assert sorted(ids) == sorted(producer.ids + later.ids) == sorted(_duckdb_ids(config))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_stop_sent_to_the_whole_process_group_drains_once(tmp_path: Path, broker: str) -> None:
    """SIGTERM to the run's process group (a supervisor, a terminal's Ctrl-C): the tasks leave
    it to the driver, which drains; no task dies of it and none is restarted."""
    path = write_config(tmp_path, broker, "processes-group-stop-events",
                        ingest={"commit_interval_seconds": 1, "max_poll_records": 500, "parallelism": 2})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, PARTITIONS)
    producer = BackgroundProducer(config, 2000, rate=20_000, max_batches=1, bad_fraction=0.01).start()
    producer.join()
    log = tmp_path / "ingest.log"
    proc = subprocess.Popen([str(EXE), "ingest", "--config", str(path), "--quiet", "--engine", "processes"],
                            stdout=subprocess.PIPE, stderr=log.open("wb"), start_new_session=True, env=ENV)
    try:
        wait_for(lambda: committed_records(config) >= producer.produced // 2 and len(process_tree(proc.pid)) == 4, 120,
                 "the run never committed with its task processes up", proc=proc, log=log)
        os.killpg(proc.pid, signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "every task starts again" not in text and "task failed" not in text, text[-3000:]
    assert json.loads(stdout.decode().strip().splitlines()[-1])["stopped_because"] != "unknown"
    ids = table_ids(config)
    assert not duplicates(ids)
    # What the drain committed: every record read before the stop, each once, in order per
    # partition (the table's offsets say how far; every valid record below them is there).
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    offsets = committed_position(table, config.kafka.topic).offsets
    assert sum(offsets.values()) >= producer.produced // 2
    assert set(ids) <= set(producer.ids) and len(ids) + dead_letters(config).num_rows == sum(offsets.values())
