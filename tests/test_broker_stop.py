"""`streamberg broker stop` signals only the broker it started (docs/security.md)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from streamberg.common.broker import BrokerInfo, EmbeddedBroker, free_port, port_open, process_start_time
from tests.helpers import streamberg
from tests.listening import listeners


def _stop(state_dir: Path) -> subprocess.CompletedProcess:
    return streamberg("broker", "stop", "--state-dir", str(state_dir), check=False)


def test_stop_refuses_a_state_file_naming_another_process(tmp_path: Path) -> None:
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        for name, recorded in {
            # What an old state file, an edited one, or a reused pid looks like.
            "no start time": {},
            "right start time, not tansu": {"start_time": process_start_time(bystander.pid), "binary": "/bin/sleep"},
            "another process's start time": {"start_time": process_start_time(bystander.pid) - 1,
                                             "binary": "/opt/tansu"},
        }.items():
            state = tmp_path / name.replace(" ", "-")
            state.mkdir()
            (state / "broker.json").write_text(json.dumps({"pid": bystander.pid, "port": free_port(),
                                                           "log": "x", **recorded}))
            run = _stop(state)
            assert run.returncode == 1, (name, run.stdout, run.stderr)
            assert f"not stopping pid {bystander.pid}" in run.stderr and "stale state file" in run.stderr, name
            assert "Traceback" not in run.stderr
            assert not (state / "broker.json").exists(), name
            assert bystander.poll() is None, f"{name}: the unrelated process was signalled"
    finally:
        bystander.kill()
        bystander.wait()


def test_stop_stops_the_broker_it_started(tmp_path: Path) -> None:
    port = free_port()
    started = streamberg("broker", "start", "--port", str(port), "--state-dir", str(tmp_path))
    pid = json.loads(started.stdout)["pid"]
    info = EmbeddedBroker(tmp_path).info()
    assert isinstance(info, BrokerInfo) and info.not_ours() is None and info.alive()
    listening = listeners(pid)
    assert listening and all(s.loopback for s in listening), sorted(map(str, listening))  # docs/security.md
    run = _stop(tmp_path)
    assert run.returncode == 0 and json.loads(run.stdout) == {"status": "stopped"}
    assert process_start_time(pid) is None and not port_open("127.0.0.1", port)
    assert _stop(tmp_path).stdout.strip() == json.dumps({"status": "not running"})


def test_stop_signals_through_a_pidfd_and_kills_after_the_grace(tmp_path: Path) -> None:
    """The signals go through a pidfd, which names the process, not its number: a process that
    ignores SIGTERM is killed after the grace period, and once the process is gone the pidfd
    signals nothing (where the old code sent SIGKILL to whatever held the pid by then)."""
    import os
    import subprocess
    import sys
    import time

    from streamberg.common.broker import _terminate

    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                 "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
                                stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline().strip() == "ready"
    pidfd = os.pidfd_open(stubborn.pid)
    started = time.monotonic()
    _terminate(pidfd, grace_seconds=1.0)
    assert stubborn.wait(5) == -9 and 0.9 < time.monotonic() - started < 5
    _terminate(pidfd, grace_seconds=1.0)  # the process is gone and reaped: nothing to signal, no error
    os.close(pidfd)
