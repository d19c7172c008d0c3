"""Two ingests on one table: the second is fenced, says so, stops at once and is not restarted.

The first runs as `streamberg ingest` with 1 s commits while a producer writes; the second
runs under `streamberg run --components ingest` (20 s commits, started just after a 20 s
boundary, so its first commit comes well after the first ingest has moved the offsets it read). Its committer refuses (fence), the
driver stops the whole run before Flink would restart the committer, and it exits 1 with the
fencing message, reporting only what it committed itself (nothing); the supervisor does not
restart it. The first ingest carries on: every valid id exactly once.
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
from streamberg.common.catalog import load_catalog
from streamberg.table_meta.offsets import FENCED_MESSAGE, committed_position, consumed_by_run
from tests.helpers import BackgroundProducer, config_at, duplicates, json_events, table_ids, write_config

pytestmark = pytest.mark.flink

SECOND_INTERVAL = 20  # seconds between the second ingest's commits


def test_second_ingest_on_a_table_is_fenced_and_stops_without_restart(tmp_path: Path, broker: str) -> None:
    path = write_config(tmp_path, broker, ingest={"commit_interval_seconds": 1, "max_poll_records": 500})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 2)
    exe = str(Path(sys.executable).parent / "streamberg")
    env = {**os.environ, "STREAMBERG_LOG_FORMAT": "json"}
    first_log = tmp_path / "first.log"
    producer = BackgroundProducer(config, 200, rate=400).start()
    first = subprocess.Popen([exe, "ingest", "--config", str(path), "--quiet"], stdout=first_log.open("w"),
                             stderr=subprocess.STDOUT, env=env)
    catalog = load_catalog(config.catalog)
    try:
        deadline = time.monotonic() + 240
        while '"event": "committed"' not in first_log.read_text():
            assert first.poll() is None and time.monotonic() < deadline, first_log.read_text()[-3000:]
            time.sleep(0.5)
        second_log, second_out = tmp_path / "second.log", tmp_path / "second.out"
        # Commits flush at wall-clock multiples of the interval. Started just after a 20 s
        # boundary, the second reads the committed offsets at least several seconds before its
        # first commit, by when the first (1 s commits) has moved them. (With 6 s commits
        # and no alignment, a slow start-up could open it just before a boundary that the
        # first shares, and the second could win the race.)
        time.sleep((-time.time()) % SECOND_INTERVAL + 0.2)
        second = subprocess.Popen(
            [exe, "run", "--config", str(path), "--components", "ingest", "--no-status"], stdout=second_out.open("w"),
            stderr=second_log.open("w"),
            env={**env, "STREAMBERG_INGEST__COMMIT_INTERVAL_SECONDS": str(SECOND_INTERVAL)})
        try:
            second.wait(240)
        except subprocess.TimeoutExpired:
            second.kill()
            pytest.fail("the fenced ingest did not stop:\n" + second_log.read_text()[-5000:])
        second.stdout, second.stderr = second_out.read_text(), second_log.read_text()
        assert first.poll() is None, first_log.read_text()[-3000:]
        commits_before = committed_position(catalog.load_table(config.table.identifier), config.kafka.topic).commit_seq
        producer.stop()
        deadline = time.monotonic() + 120
        while committed_position(catalog.load_table(config.table.identifier),
                                 config.kafka.topic).consumed_total < producer.produced:
            assert first.poll() is None and time.monotonic() < deadline, first_log.read_text()[-3000:]
            time.sleep(0.5)
    finally:
        producer.stop()
        first.send_signal(signal.SIGINT)
        first.wait(120)

    # The fenced ingest: exit 3 (its own code, which the supervisor keys on) with the
    # message, not restarted, the supervisor says why and exits with the same code.
    assert second.returncode == 3, second.stderr[-4000:]
    assert FENCED_MESSAGE in second.stderr and "Traceback" not in second.stderr.split("streamberg run:")[-1]
    summary = json.loads(second.stdout.strip().splitlines()[-1])
    assert summary["components"]["ingest"] == {"restarts": 0, "last_exit": 3}
    assert summary["stopped_because"] == "ingest fenced"
    events = json_events(second.stderr)
    # Its own summary line: stopped because fenced, and only what this run committed itself.
    own = [e for e in events if e.get("process") == "ingest" and "stopped_because" in e]
    assert own and own[-1]["stopped_because"] == "fenced", second.stderr[-3000:]
    table = catalog.load_table(config.table.identifier)
    assert own[-1]["consumed"] == consumed_by_run(table, config.kafka.topic, own[-1]["run_id"]) == 0
    # Stopped before Flink restarted the failed committer: it opened exactly once.
    opened = [e for e in events if e.get("event") == "committer opened"]
    assert len(opened) == 1, second.stderr[-3000:]

    # The first ingest was not disturbed: it kept committing and ends with every id once.
    assert first.returncode == 0, first_log.read_text()[-3000:]
    assert committed_position(table, config.kafka.topic).commit_seq > commits_before
    ids = table_ids(config)
    assert not duplicates(ids) and ids == sorted(producer.ids)
