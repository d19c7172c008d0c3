"""The fork server of a local run (ingest/local/fork_server.py) with its real launcher.

Flink's side is played by this test: it runs the launcher script exactly as
pyflink-udf-runner.sh does (`$python -m pyflink.fn_execution.beam.beam_boot ARGS`). The
forked worker runs PyFlink's real beam_boot; given a provision endpoint that accepts but
never answers, it stays up like a worker waiting for its job.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import streamberg.ingest.local.fork_server as fork_server_module
from streamberg.ingest.local.fork_server import (
    LAUNCHER_NAME,
    PROCESS_NAME,
    REQUEST_TIMEOUT_SECONDS,
    SOCKET_NAME,
    ForkServer,
    ForkServerUnavailable,
)
from tests.helpers import wait_for
from tests.listening import listeners, processes_named

BOOT = ["-m", "pyflink.fn_execution.beam.beam_boot"]


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    with ForkServer() as running:
        wait_for((running.folder / SOCKET_NAME).exists, 120, "the fork server to become ready",
                 proc=running.process, every=0.05)
        yield running




def _forked_workers(server: ForkServer) -> list[int]:
    return [pid for pid in processes_named(server.process.pid, PROCESS_NAME) if pid != server.process.pid]




@pytest.fixture()
def silent_endpoint() -> Iterator[str]:
    """A TCP endpoint on loopback that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_the_folder_is_private_and_nothing_listens_on_the_network(server: ForkServer) -> None:
    assert stat.S_IMODE(server.folder.stat().st_mode) == 0o700
    assert stat.S_ISSOCK((server.folder / SOCKET_NAME).stat().st_mode)
    assert not listeners(server.process.pid)


def test_python_c_is_forked_and_other_commands_run_with_the_real_interpreter(server: ForkServer) -> None:
    # Flink asks `python.executable` for PyFlink's folder (`-c`) before each worker: forked.
    code = "import os, sys, pyflink; print(os.getppid(), sys.argv[1:]); sys.exit(3)"
    result = subprocess.run([server.launcher, "-c", code, "a", "b"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 3, result.stderr
    assert result.stdout.split(" ", 1) == [str(server.process.pid), "['a', 'b']\n"]
    # Anything else is the real interpreter's.
    result = subprocess.run([server.launcher, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == f"Python {sys.version.split()[0]}"


def test_a_worker_is_forked_runs_beam_boot_and_reports_its_exit_status(server: ForkServer, tmp_path: Path) -> None:
    # beam_boot refuses to start without a worker id: its message and exit code come back
    # through the launcher, from a forked process that has the launcher's working directory.
    result = subprocess.run([server.launcher, *BOOT], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 1
    assert "No id provided" in result.stdout
    assert "RuntimeWarning" not in result.stderr
    assert "fork server is not running" not in result.stderr


def test_the_worker_gets_the_launchers_environment_and_is_killed_with_it(
        server: ForkServer, silent_endpoint: str, tmp_path: Path) -> None:
    log = tmp_path / "worker.out"
    # beam_boot takes the loopback path when this variable is set (the launcher's environment,
    # not the server's, decides), and waits there on the silent endpoint.
    env = {**os.environ, "PYTHON_LOOPBACK_SERVER_ADDRESS": silent_endpoint}
    with log.open("wb") as out:
        launcher = subprocess.Popen([server.launcher, *BOOT, "--id=1", f"--provision_endpoint={silent_endpoint}"],
                                    stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        wait_for(lambda: len(_forked_workers(server)) == 1, 30, "a forked worker", log=log, every=0.05)
        [worker] = _forked_workers(server)
        assert Path(f"/proc/{worker}/cwd").resolve() == tmp_path.resolve()
        # Its stdout is the launcher's; what it logs shows it saw the launcher's environment.
        wait_for(lambda: "Starting up Python harness in loopback mode" in log.read_text(), 30, "the harness started",
                 log=log, every=0.05)
        launcher.kill()  # what Flink does to a worker it gives up on
        launcher.wait(timeout=30)
        wait_for(lambda: not _forked_workers(server), 30, "the worker gone with its launcher", every=0.05)
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_a_signal_to_the_launcher_reaches_the_worker(server: ForkServer, silent_endpoint: str) -> None:
    launcher = subprocess.Popen([server.launcher, *BOOT, "--id=2", f"--provision_endpoint={silent_endpoint}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(_forked_workers(server)) == 1, 30, "a forked worker", every=0.05)
        launcher.send_signal(signal.SIGTERM)
        # The worker died of the signal; the launcher reports it as a shell would.
        assert launcher.wait(timeout=30) == 128 + signal.SIGTERM
        wait_for(lambda: not _forked_workers(server), 30, "no forked worker left", every=0.05)
    finally:
        if launcher.poll() is None:
            launcher.kill()


def _ignores(pid: int, signum: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
    return bool(mask & (1 << (signum - 1)))


def test_signals_the_launcher_ignores_stay_ignored_in_the_worker(server: ForkServer, silent_endpoint: str) -> None:
    # PyFlink starts its JVM with SIGINT ignored: a terminal's Ctrl-C must reach only the
    # driver (which drains the workers), not kill forked workers.
    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    launcher = subprocess.Popen([server.launcher, *BOOT, "--id=4", f"--provision_endpoint={silent_endpoint}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=ignore_sigint)
    try:
        wait_for(lambda: len(_forked_workers(server)) == 1, 30, "a forked worker", every=0.05)
        [worker] = _forked_workers(server)
        assert _ignores(worker, signal.SIGINT) and not _ignores(worker, signal.SIGTERM)
        launcher.send_signal(signal.SIGINT)
        os.kill(worker, signal.SIGINT)
        time.sleep(1)
        assert launcher.poll() is None and _forked_workers(server) == [worker]
    finally:
        launcher.kill()
        launcher.wait(timeout=30)
    wait_for(lambda: not _forked_workers(server), 30, "no forked worker left", every=0.05)


def test_a_hostile_request_is_refused_and_the_server_goes_on(server: ForkServer) -> None:
    for payload in (b"", b"\xff" * 3, b"\x00\x00\x00\x05junk!", b"\x7f\xff\xff\xff"):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(server.folder / SOCKET_NAME))
        if payload:
            conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(30)
        assert conn.recv(100).startswith(b"error ")
        conn.close()
    for body in (b"junk!", b'{"argv": "x", "env": {}, "cwd": "/"}', b"[]",
                 b'{"argv": [], "env": {}, "cwd": "/", "ignored_signals": ["x"]}'):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(server.folder / SOCKET_NAME))
        socket.send_fds(conn, [struct.pack("!I", len(body)) + body], [0, 1, 2])
        conn.settimeout(30)
        assert conn.recv(100).startswith(b"error ")
        conn.close()
    result = subprocess.run([server.launcher, *BOOT], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "No id provided" in result.stdout


def test_stop_kills_the_workers_and_removes_the_folder(silent_endpoint: str) -> None:
    server = ForkServer().start()
    wait_for((server.folder / SOCKET_NAME).exists, 120, "the fork server to become ready",
             proc=server.process, every=0.05)
    launcher = subprocess.Popen([server.launcher, *BOOT, "--id=3", f"--provision_endpoint={silent_endpoint}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(_forked_workers(server)) == 1, 30, "a forked worker", every=0.05)
        [worker] = _forked_workers(server)
        folder, process = server.folder, server.process
        server.stop()
        assert process.poll() is not None
        assert not processes_named(worker, PROCESS_NAME)  # gone (or its pid reused by another program)
        assert not folder.exists()
        assert launcher.wait(timeout=30) != 0  # its worker was killed under it
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_without_a_server_the_launcher_starts_the_worker_itself(tmp_path: Path) -> None:
    server = ForkServer().start()
    launcher_text = (server.folder / LAUNCHER_NAME).read_text()
    server.process.kill()
    server.process.wait()
    # Same launcher, its server gone before it got ready: the real beam_boot runs instead.
    script = tmp_path / "python-worker"
    script.write_text(launcher_text)
    script.chmod(0o700)
    server.stop()
    result = subprocess.run([str(script), *BOOT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "No id provided" in result.stdout
    assert "fork server is not running" in result.stderr


def test_nothing_is_imported_from_the_operators_working_directory(tmp_path: Path, monkeypatch) -> None:
    """A module planted where the operator starts `streamberg ingest` must not run in the
    server or in any worker it forks."""
    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "imported"
    for name in ("shlex", "json", "socket", "runpy"):
        (planted / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r})\n")
    monkeypatch.chdir(planted)
    with ForkServer() as running:
        wait_for((running.folder / SOCKET_NAME).exists, 120, "the fork server to become ready",
                 proc=running.process, every=0.05)
        result = subprocess.run([running.launcher, *BOOT], capture_output=True, text=True, timeout=60, cwd=planted)
        assert result.returncode == 1 and "No id provided" in result.stdout
    assert not marker.exists(), marker.read_text()


@pytest.mark.slow
def test_a_launcher_that_connects_and_stalls_delays_no_other(server: ForkServer) -> None:
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stalled.connect(str(server.folder / SOCKET_NAME))  # and sends nothing
    try:
        started = time.monotonic()
        result = subprocess.run([server.launcher, "-c", "import os; print(os.getppid())"], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0 and result.stdout.strip() == str(server.process.pid)  # forked
        assert time.monotonic() - started < REQUEST_TIMEOUT_SECONDS / 2
        # The stalled one is dropped after its deadline, with a word.
        stalled.settimeout(REQUEST_TIMEOUT_SECONDS + 5)
        assert stalled.recv(64) == b"error timeout\n"
    finally:
        stalled.close()


def test_workers_die_with_a_killed_server_and_its_folder_is_removed_next_time(silent_endpoint: str) -> None:
    server = ForkServer().start()
    try:
        wait_for((server.folder / SOCKET_NAME).exists, 120, "the fork server to become ready",
                 proc=server.process, every=0.05)
        env = {**os.environ, "PYTHON_LOOPBACK_SERVER_ADDRESS": silent_endpoint}
        launcher = subprocess.Popen([server.launcher, *BOOT, "--id=9", f"--provision_endpoint={silent_endpoint}"],
                                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: len(_forked_workers(server)) == 1, 30, "a forked worker", every=0.05)
        (worker,) = _forked_workers(server)
        folder = server.folder
        os.kill(server.process.pid, signal.SIGKILL)  # no time to kill its workers or clean up
        server.process.wait(10)
        wait_for(lambda: not Path(f"/proc/{worker}").exists()
                 or Path(f"/proc/{worker}/stat").read_text().split(") ")[1].startswith("Z"), 30,
                 "the worker gone with its server", every=0.05)
        launcher.wait(30)
        assert folder.exists()
        again = ForkServer().start()  # the next run removes what the killed one left
        again.stop()
        assert not folder.exists()
    finally:
        server.process = None  # already dead and reaped
        server.folder = None


def test_a_failed_fork_fails_only_that_launch(tmp_path: Path) -> None:
    """fork() failing (EAGAIN at the process limit; as root the limit cannot be hit, so the
    server's os.fork is made to fail once) hands that launch to a fresh interpreter and the
    server goes on."""
    import textwrap

    folder = tmp_path / "srv"
    folder.mkdir(mode=0o700)
    socket_path = folder / SOCKET_NAME
    code = textwrap.dedent(f"""
        import errno, os, sys
        from streamberg.ingest.local import fork_server
        real, calls = os.fork, []
        def failing_once():
            calls.append(1)
            if len(calls) == 1:
                raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
            return real()
        os.fork = failing_once
        fork_server.main(["fork_server", {str(socket_path)!r}])
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(socket_path.exists, 120, "the server ready", every=0.05)
        script = Path(fork_server_module.__file__).with_name("fork_launcher.py")
        launch = [sys.executable, "-I", "-S", str(script), str(socket_path), str(proc.pid), sys.executable,
                  "-c", "import os; print(os.getppid())"]
        first = subprocess.run(launch, capture_output=True, text=True, timeout=60)
        assert first.returncode == 0 and "fresh interpreter" in first.stderr  # the fallback
        assert first.stdout.strip() != str(proc.pid)
        second = subprocess.run(launch, capture_output=True, text=True, timeout=60)
        assert second.returncode == 0 and second.stdout.strip() == str(proc.pid)  # forked again
        assert proc.poll() is None
    finally:
        proc.stdin.close()
        proc.wait(30)
    assert "fork failed" in proc.stderr.read()


def test_a_noexec_temp_folder_means_no_fork_server(tmp_path: Path, monkeypatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mount = tmp_path / "noexec"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,noexec", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(mount))
        with pytest.raises(ForkServerUnavailable, match="noexec"):
            ForkServer().start()
        assert not list(mount.iterdir())  # nothing left behind
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
