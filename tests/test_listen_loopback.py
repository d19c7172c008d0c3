"""Nothing streamberg starts locally listens off loopback (docs/security.md, "What listens where").

One real run of each long-lived command at once — `streamberg ingest` (PyFlink MiniCluster:
REST, BLOB server, RPC, the Python workers' gRPC servers), `streamberg compact --once` and
`streamberg maintain --once` (Spark driver, block manager, UI) and `streamberg metrics` —
with every listening TCP socket of each process tree sampled from /proc while they run
(tests/listening.py). The test fails naming the process and the address of any socket that
is not on 127.0.0.0/8 or ::1. The Python workers' mode (loopback in the driver, or separate
processes under the TaskManager) follows `_python_worker_execution_mode` from the
environment; the tree walk covers both.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from streamberg.common.broker import ensure_topic, free_port
from streamberg.common.catalog import ensure_table, load_catalog
from streamberg.common.offsets import committed_position
from streamberg.common.sample_events import produce_events
from tests.helpers import config_at, write_config
from tests.listening import Listener, listeners

pytestmark = [pytest.mark.flink, pytest.mark.spark]

SAMPLE_SECONDS = 0.3


def _start(name: str, args: list[str], directory: Path) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "streamberg"
    log = (directory / f"{name}.log").open("w")
    return subprocess.Popen([str(exe), *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**os.environ, "STREAMBERG_LOG_FORMAT": "json"})


def test_local_processes_listen_on_loopback_only(tmp_path: Path, broker: str) -> None:
    metrics_port = free_port()
    path = write_config(tmp_path, broker, ingest={"commit_interval_seconds": 2, "parallelism": 2}, extra={
        "compactor": {"checkpoint_dir": "checkpoint", "min_files": 1, "columns": ["user_id", "city"],
                      "spark_master": "local[1]", "spark_conf": {"spark.sql.shuffle.partitions": "1"}},
        "monitoring": {"metrics_port": metrics_port},  # the address is left to its default
    })
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 2)
    produce_events(config, 2_000)
    catalog = load_catalog(config.catalog)
    ensure_table(catalog, config.table)

    seen: dict[str, set[Listener]] = {}
    procs: dict[str, subprocess.Popen] = {}

    def sample() -> None:
        for name, proc in procs.items():
            if proc.poll() is None:
                seen.setdefault(name, set()).update(listeners(proc.pid))

    def sample_until(condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}; logs in {tmp_path}")
            sample()
            time.sleep(SAMPLE_SECONDS)

    def committed() -> bool:
        table = catalog.load_table(config.table.identifier)
        return committed_position(table, config.kafka.topic).consumed_total >= 2_000

    try:
        procs["metrics"] = _start("metrics", ["metrics", "--config", str(path)], tmp_path)
        procs["ingest"] = _start("ingest", ["ingest", "--config", str(path), "--duration", "600", "--quiet"], tmp_path)
        # Workers are up (and polling) once records are committed: every ingest server exists.
        sample_until(committed, 300, "the ingest to commit the produced records")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as response:
            assert b"streamberg_up" in response.read()
        procs["compact"] = _start("compact", ["compact", "--config", str(path), "--once"], tmp_path)
        procs["maintain"] = _start("maintain", ["maintain", "--config", str(path), "--once"], tmp_path)
        sample_until(lambda: procs["compact"].poll() is not None and procs["maintain"].poll() is not None,
                     300, "compact --once and maintain --once to finish")
        sample()
        assert procs["compact"].returncode == 0, (tmp_path / "compact.log").read_text()[-3000:]
        assert procs["maintain"].returncode == 0, (tmp_path / "maintain.log").read_text()[-3000:]
        assert procs["ingest"].poll() is None, (tmp_path / "ingest.log").read_text()[-3000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in procs.values():
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    # Each command was caught listening (the sampling saw its servers), and only on loopback.
    assert {name for name, found in seen.items() if found} == {"metrics", "ingest", "compact", "maintain"}, seen
    assert any(s.port == metrics_port for s in seen["metrics"])
    exposed = sorted(f"{name}: {s}" for name, found in seen.items() for s in found if not s.loopback)
    assert not exposed, "listening off loopback:\n" + "\n".join(exposed)
    print(json.dumps({name: sorted(f"{s.address}:{s.port}" for s in found) for name, found in seen.items()}))


def test_flink_local_settings_bind_loopback_and_stay_overridable(tmp_path: Path) -> None:
    """The local MiniCluster's settings, and `ingest.flink` widening one of them for a cluster."""
    from streamberg.ingest.job import flink_configuration

    path = write_config(tmp_path, "127.0.0.1:9", ingest={"flink": {"rest.bind-address": "0.0.0.0"}})
    conf = flink_configuration(config_at(path), 2).to_dict()
    assert conf["rest.bind-address"] == "0.0.0.0"  # the operator's choice wins
    assert conf["jobmanager.bind-host"] == conf["taskmanager.bind-host"] == "127.0.0.1"
    assert conf["web.submit.enable"] == conf["web.cancel.enable"] == "false"
