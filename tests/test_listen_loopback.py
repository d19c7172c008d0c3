"""Nothing streamberg starts locally listens off loopback (docs/security.md, "What listens where").

One real run of each long-lived command at once — `streamberg ingest` (PyFlink MiniCluster:
REST, BLOB server, RPC, the Python workers' gRPC servers), `streamberg compact --once` and
`streamberg maintain --once` (Spark driver, block manager, UI) and `streamberg metrics` —
with every listening TCP socket of each process tree sampled from /proc while they run
(tests/listening.py). The test fails naming the process and the address of any socket that
is not on 127.0.0.0/8 or ::1. The Python workers' mode (loopback in the driver, or separate
processes under the TaskManager) follows `_python_worker_execution_mode` from the
environment; the tree walk covers both. Sampling misses a socket that lives for
milliseconds, so a second test, where strace may run, reads every bind() of the same commands.
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

from streamberg.cli.sample_events import produce_events
from streamberg.common.broker import ensure_topic, free_port
from streamberg.common.catalog import load_catalog
from streamberg.table_meta.declared import ensure_table
from streamberg.table_meta.offsets import committed_position
from tests.helpers import config_at, write_config
from tests.listening import Listener, listeners, strace_usable, tcp_binds, traced

pytestmark = [pytest.mark.flink, pytest.mark.spark]

SAMPLE_SECONDS = 0.3


def _start(name: str, args: list[str], directory: Path, trace: bool = False) -> subprocess.Popen:
    command = [str(Path(sys.executable).parent / "streamberg"), *args]
    if trace:
        command = traced(command, directory / f"{name}.strace")
    log = (directory / f"{name}.log").open("w")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**os.environ, "STREAMBERG_LOG_FORMAT": "json"})


def _local_config(tmp_path: Path, broker: str, metrics_port: int) -> Path:
    return write_config(tmp_path, broker, ingest={"commit_interval_seconds": 2, "parallelism": 2}, extra={
        "compactor": {"checkpoint_dir": "checkpoint", "min_files": 1, "columns": ["user_id", "city"],
                      "spark_master": "local[1]", "spark_conf": {"spark.sql.shuffle.partitions": "1"}},
        "monitoring": {"metrics_port": metrics_port},  # the address is left to its default
    })


def test_local_processes_listen_on_loopback_only(tmp_path: Path, broker: str) -> None:
    metrics_port = free_port()
    path = _local_config(tmp_path, broker, metrics_port)
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


@pytest.mark.skipif(not strace_usable(), reason="needs strace, allowed to trace child processes")
def test_every_bind_of_a_local_run_is_on_loopback(tmp_path: Path, broker: str) -> None:
    """Every bind() of `ingest`, `compact --once` and `maintain --once`, from strace: a socket
    that listens for milliseconds (the gateway JVM's start-up port probe, caught once by the
    sampling above on a loaded CI machine) is seen every time, not by luck."""
    path = _local_config(tmp_path, broker, free_port())
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 2)
    produce_events(config, 500)

    runs = {"ingest": ["ingest", "--config", str(path), "--max-records", "500", "--quiet"]}
    ingest = _start("ingest", runs["ingest"], tmp_path, trace=True)
    assert ingest.wait(300) == 0, (tmp_path / "ingest.log").read_text()[-3000:]
    runs |= {"compact": ["compact", "--config", str(path), "--once"],
             "maintain": ["maintain", "--config", str(path), "--once"]}
    spark = {name: _start(name, runs[name], tmp_path, trace=True) for name in ("compact", "maintain")}
    for name, proc in spark.items():
        assert proc.wait(300) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]

    binds = {name: tcp_binds(tmp_path / f"{name}.strace") for name in runs}
    # Each command bound its servers (so the trace saw them), and only on loopback.
    assert all(binds.values()), {name: len(found) for name, found in binds.items()}
    exposed = sorted(f"{name}: {b.command}" for name, found in binds.items() for b in found if not b.loopback)
    assert not exposed, "bound off loopback:\n" + "\n".join(exposed)


def test_flink_local_settings_bind_loopback_and_stay_overridable(tmp_path: Path) -> None:
    """The local MiniCluster's settings, and `ingest.flink` widening one of them for a cluster."""
    from streamberg.ingest.job import flink_configuration

    path = write_config(tmp_path, "127.0.0.1:9", ingest={"flink": {"rest.bind-address": "0.0.0.0"}})
    conf = flink_configuration(config_at(path), 2).to_dict()
    assert conf["rest.bind-address"] == "0.0.0.0"  # the operator's choice wins
    assert conf["jobmanager.bind-host"] == conf["taskmanager.bind-host"] == "127.0.0.1"
    assert conf["web.submit.enable"] == conf["web.cancel.enable"] == "false"
