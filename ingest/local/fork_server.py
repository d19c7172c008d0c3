"""A local run's Python workers forked from one pre-warmed process, as PySpark's worker daemon does.

In Flink's process mode (local runs, see `python_worker_mode` in gateway.py) every Python
operator subtask is a process of its own, and each starts an interpreter and imports Beam,
PyFlink, pyarrow, pyiceberg and streamberg: about 2 s of CPU per writer and committer, paid
after the job is submitted and again on every restart, and most of a local run's start-up on
two cores. PySpark meets the same cost with its worker daemon (`pyspark/daemon.py`): one
process imports once and forks a worker per request. This module does that for PyFlink:

- the driver starts the fork server (`ForkServer.start`) before the gateway JVM, so the
  imports overlap the JVM and MiniCluster start-up;
- Flink's `python.executable` becomes a two-line script running `fork_launcher.py`, which
  hands a worker's arguments, environment, working directory and stdin/stdout/stderr to the
  server over a Unix socket and exits with the worker's status (anything else Flink runs
  with the interpreter goes to the real interpreter);
- the server forks; the child takes the launcher's environment and descriptors and runs
  PyFlink's own `beam_boot` main module, unchanged: the worker process mode would have
  started, minus the imports.

The server forks from its main thread, with no gRPC channel, JVM or Kafka client open: only
libraries' own background threads run (pyarrow's jemalloc and thread pool, which re-create
their state after a fork through pthread_atfork handlers).

Isolation is that of process mode: every worker is a process of its own (its own GIL; a
native crash or a SIGKILL fails only its task, which Flink restarts from the table's offsets).
A killed launcher (Flink destroying a worker) gets its worker killed; when the driver goes,
the server and its workers go (the server watches a pipe from the driver). The socket lives
in a fresh 0700 folder: nothing listens on a network port and only the user running the
ingest can ask for a worker. If the server is not there, workers start the slow way.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import selectors
import shlex
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from streamberg.common.processes import process_start_time
from streamberg.ingest.local.fork_folders import FOLDER_PREFIX, OWNER_NAME, remove_stale_folders

BOOT_MODULE = "pyflink.fn_execution.beam.beam_boot"
# What a writer or committer process imports before its first record (beam_boot and the SDK
# harness, PyFlink's operations and coders, the streamberg operators and what they use).
# A module missing here is imported by each worker itself: slower, not wrong.
PRELOAD = (
    BOOT_MODULE,
    "pyflink.fn_execution.beam.beam_sdk_worker_main",
    "pyflink.fn_execution.beam.beam_operations",
    "pyflink.fn_execution.beam.beam_coders",
    "apache_beam.runners.worker.sdk_worker",
    "streamberg.ingest.job",
    "streamberg.ingest.writer",
    "streamberg.ingest.committer",
)
# The commands the launcher hands over: `python -m MODULE ...` (the workers) and `python -c
# CODE ...` (Flink asking the interpreter for PyFlink's folder before each worker).
FORKED_OPTIONS = ("-m", "-c")

SOCKET_NAME = "workers.sock"
LAUNCHER_NAME = "python-worker"
PROCESS_NAME = b"pyflink-worker"  # what `ps`/`top` show for a forked worker (/proc/PID/comm)
REQUEST_TIMEOUT_SECONDS = 10.0
MAX_REQUEST_BYTES = 16 << 20
STOP_WAIT_SECONDS = 10.0


class ForkServer:
    """The driver's handle on the fork server: start it, point Flink at its launcher, stop it."""

    def __init__(self, python: str = sys.executable):
        self.python = python
        self.folder: Path | None = None
        self.process: subprocess.Popen | None = None

    @property
    def launcher(self) -> str:
        """The `python.executable` to give Flink."""
        assert self.folder is not None, "start() first"
        return str(self.folder / LAUNCHER_NAME)

    def start(self) -> ForkServer:
        remove_stale_folders()
        # A short private path: a Unix socket path must stay under 108 bytes, and a state dir
        # can be deep. mkdtemp makes the folder 0700.
        self.folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
        if os.statvfs(self.folder).f_flag & os.ST_NOEXEC:
            # Flink executes the launcher script: on a noexec temp folder it could not.
            self.folder.rmdir()
            self.folder = None
            raise ForkServerUnavailable(f"the temp folder {tempfile.gettempdir()} is mounted noexec; set TMPDIR to "
                                        f"an executable folder to fork the Python workers")
        socket_path = self.folder / SOCKET_NAME
        self.process = subprocess.Popen(
            # stdout is the driver's result channel (the run's summary line): not the server's.
            # -I and its own folder as working directory: nothing is imported from where the
            # operator happens to stand (a planted shlex.py would run in every worker).
            [self.python, "-I", "-m", __name__, str(socket_path)], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, close_fds=True, cwd=self.folder)
        launcher = self.folder / LAUNCHER_NAME
        script = Path(__file__).with_name("fork_launcher.py")
        launcher.write_text(
            "#!/bin/sh\n"
            f"exec {shlex.quote(self.python)} -I -S {shlex.quote(str(script))} "
            f"{shlex.quote(str(socket_path))} {self.process.pid} {shlex.quote(self.python)} \"$@\"\n")
        launcher.chmod(0o700)
        # Who owns the folder: the next start removes it if this server was killed (kill -9
        # leaves no one to clean up).
        (self.folder / OWNER_NAME).write_text(f"{self.process.pid} {process_start_time(self.process.pid)}\n")
        return self

    def stop(self) -> None:
        """Stop the server and every worker it forked; remove its folder."""
        if self.process is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()  # the server's signal to kill its workers and exit
            try:
                self.process.wait(timeout=STOP_WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
        if self.folder is not None:
            for name in (SOCKET_NAME, LAUNCHER_NAME, OWNER_NAME):
                with contextlib.suppress(OSError):
                    (self.folder / name).unlink()
            with contextlib.suppress(OSError):
                self.folder.rmdir()
            self.folder = None

    def __enter__(self) -> ForkServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()


class ForkServerUnavailable(RuntimeError):
    """The fork server cannot run here; the workers start with a fresh interpreter each."""


# -- the server process ------------------------------------------------------------------------


def preload(modules: tuple[str, ...] = PRELOAD) -> list[str]:
    """Import what the workers need; the names that failed (each worker will try again)."""
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a worker importing it itself reports the real error
            failed.append(name)
    return failed


def read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """One launcher's request: (argv, env, cwd) and its stdin/stdout/stderr descriptors."""
    conn.settimeout(REQUEST_TIMEOUT_SECONDS)
    data, fds, _flags, _address = socket.recv_fds(conn, 1 << 16, 3)
    try:
        if len(data) < 4 or len(fds) != 3:
            raise ValueError("malformed request")
        size = struct.unpack("!I", data[:4])[0]
        if size > MAX_REQUEST_BYTES:
            raise ValueError("request too large")
        body = bytearray(data[4:])
        while len(body) < size:
            chunk = conn.recv(min(1 << 16, size - len(body)))
            if not chunk:
                raise ValueError("truncated request")
            body += chunk
        request = json.loads(bytes(body))
        argv = request.get("argv") if isinstance(request, dict) else None
        if not (isinstance(argv, list) and len(argv) >= 2 and argv[0] in FORKED_OPTIONS
                and all(isinstance(a, str) for a in argv) and isinstance(request.get("env"), dict)
                and isinstance(request.get("cwd"), str)
                and all(isinstance(s, int) for s in request.get("ignored_signals", []))):
            raise ValueError("malformed request")
        return request, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def name_process(name: bytes) -> None:
    """Name this process as `ps` and `top` show it (/proc/PID/comm, 15 bytes; Linux only)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(15, name, 0, 0, 0)  # PR_SET_NAME


def _inherit_signals(ignored: list[int]) -> None:
    """The dispositions a fresh interpreter started by the launcher's parent would have: what
    the launcher ignored stays ignored; otherwise Python's defaults (KeyboardInterrupt on SIGINT)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        if int(signum) in ignored:
            signal.signal(signum, signal.SIG_IGN)
        elif signum == signal.SIGINT:
            signal.signal(signum, signal.default_int_handler)
        else:
            signal.signal(signum, signal.SIG_DFL)


def run_worker(request: dict, fds: list[int]) -> int:
    """In the forked child: become the process the launcher's command would have started
    (`python -m MODULE ARGS` or `python -c CODE ARGS`)."""
    import builtins
    import runpy

    _inherit_signals(request.get("ignored_signals", []))
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # Flink puts PyFlink's and the job's Python files on PYTHONPATH; the interpreter would
    # have read it at start (PyFlink's loopback worker pool does the same).
    for entry in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(0, entry)
    mode, target, rest = request["argv"][0], request["argv"][1], request["argv"][2:]
    try:
        if mode == "-m":
            if target == BOOT_MODULE:
                name_process(PROCESS_NAME)
            sys.argv = [target, *rest]
            # Run as __main__ from its source; its imports are the preloaded ones. (Executing
            # a module object that is already imported would make runpy warn about it.)
            if not hasattr(sys.modules.get(target), "__path__"):
                sys.modules.pop(target, None)
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:  # -c: Flink asks the interpreter for PyFlink's folder and its version
            sys.argv = ["-c", *rest]
            exec(compile(target, "<string>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
    except BaseException:  # noqa: BLE001 - reported as a worker failure, as the interpreter would
        traceback.print_exc()
        return 1
    return 0


def _status_line(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}\n"
    return f"exit {os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1}\n"


class _Server:
    def __init__(self, socket_path: Path):
        self.socket_path = socket_path
        self.selector = selectors.DefaultSelector()
        self.workers: dict[int, socket.socket] = {}  # worker pid -> its launcher's connection
        self.pending: dict[socket.socket, float] = {}  # connected launchers -> deadline of their request
        self.server_pid = os.getpid()
        self.running = True

    def listen(self) -> None:
        # Bound and listening under a temporary name, then renamed: the launcher takes the
        # socket file's existence for "ready".
        staging = self.socket_path.with_name(self.socket_path.name + ".new")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o077)
        try:
            self.listener.bind(str(staging))
        finally:
            os.umask(old_umask)
        self.listener.listen(64)
        os.replace(staging, self.socket_path)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")

    def serve(self) -> None:
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        # The server lives exactly as long as the driver's pipe: Ctrl-C or a SIGTERM sent to
        # the whole process group is the driver's to handle (it drains the workers first).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.selector.register(wake_read, selectors.EVENT_READ, "wake")
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "driver")
        try:
            while self.running:
                for key, _events in self.selector.select(timeout=1.0 if self.pending else None):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "request":
                        self._request(key.fileobj)
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            os.read(wake_read, 4096)
                        self._reap()
                    elif key.data == "driver":
                        if not os.read(sys.stdin.fileno(), 4096):
                            self._stop()
                    else:
                        self._launcher_event(key.fileobj, key.data)
                self._expire_pending()
        finally:
            self._kill_all()

    def _stop(self) -> None:
        self.running = False

    def _accept(self) -> None:
        """A launcher connected: its request is read once it arrives, so a launcher that
        connects and stalls delays no other (it is dropped after REQUEST_TIMEOUT_SECONDS)."""
        conn, _ = self.listener.accept()
        self.pending[conn] = time.monotonic() + REQUEST_TIMEOUT_SECONDS
        self.selector.register(conn, selectors.EVENT_READ, "request")

    def _expire_pending(self) -> None:
        now = time.monotonic()
        for conn in [c for c, deadline in self.pending.items() if deadline < now]:
            self._drop_pending(conn)
            with contextlib.suppress(OSError):
                conn.sendall(b"error timeout\n")
            conn.close()

    def _drop_pending(self, conn: socket.socket) -> None:
        self.selector.unregister(conn)
        del self.pending[conn]

    def _request(self, conn: socket.socket) -> None:
        self._drop_pending(conn)
        try:
            request, fds = read_request(conn)
        except Exception as exc:  # noqa: BLE001 - a bad request fails that launcher, not the server
            with contextlib.suppress(OSError):
                conn.sendall(f"error {type(exc).__name__}\n".encode())
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:  # EAGAIN, ENOMEM: this launcher starts a fresh interpreter instead
            for fd in fds:
                os.close(fd)
            print(f"streamberg fork server: fork failed ({exc}); the worker starts with a fresh interpreter",
                  file=sys.stderr, flush=True)
            with contextlib.suppress(OSError):
                conn.sendall(f"error {type(exc).__name__}\n".encode())
            conn.close()
            return
        if pid == 0:  # the worker: never returns into the server's loop
            code = 1
            try:
                _die_with(self.server_pid)
                self._forget_server_state(conn)
                code = run_worker(request, fds)
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        for fd in fds:
            os.close(fd)
        conn.setblocking(True)
        conn.settimeout(None)
        try:
            conn.sendall(f"pid {pid}\n".encode())
        except OSError:
            _kill(pid)
        self.workers[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, pid)

    def _forget_server_state(self, own: socket.socket) -> None:
        """In a fresh child: drop the server's signal handlers, sockets and selector."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.selector.close()
        self.listener.close()
        own.close()
        for conn in [*self.workers.values(), *self.pending]:
            conn.close()

    def _launcher_event(self, conn: socket.socket, pid: int) -> None:
        try:
            data = conn.recv(4096)
        except OSError:
            data = b""
        if not data:  # the launcher is gone: Flink destroyed the worker
            _kill(pid)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.workers.pop(pid, None)
            if conn is not None:
                self.selector.unregister(conn)
                with contextlib.suppress(OSError):
                    conn.sendall(_status_line(status).encode())
                conn.close()

    def _kill_all(self) -> None:
        for pid in list(self.workers):
            _kill(pid)
        for pid in list(self.workers):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        with contextlib.suppress(OSError):
            self.socket_path.unlink()


def _die_with(parent: int) -> None:
    """In a forked worker: be killed when the server dies, even by SIGKILL (which leaves it no
    time to kill its workers); a server already gone by now means exit at once."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: python -m {__name__} SOCKET_PATH (started by `streamberg ingest`)", file=sys.stderr)
        return 2
    server = _Server(Path(argv[1]))
    failed = preload()
    # What the imports made goes to the permanent generation: the workers' collections never
    # walk it, so their pages stay shared with this process instead of being copied into
    # each worker by the collector's writes (Python's gc.freeze, made for pre-fork servers).
    gc.collect()
    gc.freeze()
    if failed:
        print(f"streamberg fork server: could not preload {', '.join(failed)}; workers import them themselves",
              file=sys.stderr, flush=True)
    server.listen()
    server.serve()
    return 0


if __name__ == "__main__":
    status = main(sys.argv)
    # No interpreter teardown: its workers are dead and its socket is gone, and finalizing an
    # interpreter that imported Beam, gRPC, PyFlink and pyiceberg takes about a second, which
    # the driver would spend waiting in ForkServer.stop at the end of every run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
