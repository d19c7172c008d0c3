"""Flink's `python.executable` in a local run: Python commands forked by the fork server.

Run as `python -I -S fork_launcher.py SOCKET SERVER_PID PYTHON ARGS...` (standard library
only, so it starts in milliseconds; see fork_server.py for the design). For `ARGS` =
`-m MODULE ...` (a worker: `-m pyflink.fn_execution.beam.beam_boot ...`) or `-c CODE ...`
(Flink asking for PyFlink's folder before each worker) it sends its arguments, environment,
working directory, stdin/stdout/stderr and ignored signals to the fork server, forwards
SIGTERM/SIGINT/SIGHUP (unless ignored) to the forked process and exits with its status, so
to Flink it is that process. If the launcher is killed, the fork server kills the process.
Anything else, or a fork server that is gone or never became ready, runs `PYTHON ARGS`
itself: slower, never wrong.

Nothing here may import beyond the standard library: the script runs without site-packages.
"""

import json
import os
import signal
import socket
import struct
import sys
import time

# `python -m MODULE ...` (a worker: pyflink.fn_execution.beam.beam_boot) and `python -c CODE`
# (Flink asking for PyFlink's folder before each worker) go to the fork server.
FORKED_OPTIONS = ("-m", "-c")
# Signals whose disposition the worker takes from the launcher: ignored here (PyFlink starts
# its JVM with SIGINT ignored, so a terminal's Ctrl-C reaches only the driver, which drains
# the workers) means ignored there, as for an interpreter Flink had started itself.
INHERITED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# The fork server becomes ready once its imports are done (a few seconds on a loaded machine);
# waiting is cheaper than importing everything again here.
READY_WAIT_SECONDS = 60.0
POLL_SECONDS = 0.02


def run_with_interpreter(python: str, args: list[str]) -> None:
    os.execv(python, [python, *args])


def server_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def connect(path: str, server_pid: int) -> socket.socket | None:
    """A connection to the fork server once it is ready; None if it is gone or never gets ready.

    The server creates the socket file only when it is listening, so a missing file means
    "not ready yet" and a refused connection means "gone"."""
    deadline = time.monotonic() + READY_WAIT_SECONDS
    while not os.path.exists(path):
        if not server_alive(server_pid) or time.monotonic() > deadline:
            return None
        time.sleep(POLL_SECONDS)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        return None
    return conn


def exit_code(line: str) -> int:
    """The shell's convention: the worker's exit code, or 128 + the signal that killed it."""
    word, _, number = line.partition(" ")
    if word == "exit" and number.strip().lstrip("-").isdigit():
        return int(number)
    if word == "signal" and number.strip().isdigit():
        return 128 + int(number)
    return 1  # the fork server went away: it killed the worker on its way out


def main(argv: list[str]) -> int:
    path, server_pid, python, args = argv[1], int(argv[2]), argv[3], argv[4:]
    if len(args) < 2 or args[0] not in FORKED_OPTIONS:
        run_with_interpreter(python, args)
    conn = connect(path, server_pid)
    if conn is None:
        print("streamberg: the fork server is not running; starting this Python command with a fresh interpreter",
              file=sys.stderr, flush=True)
        run_with_interpreter(python, args)
    ignored = [int(signum) for signum in INHERITED_SIGNALS if signal.getsignal(signum) == signal.SIG_IGN]
    request = json.dumps({"argv": args, "env": dict(os.environ), "cwd": os.getcwd(),
                          "ignored_signals": ignored}).encode()
    socket.send_fds(conn, [struct.pack("!I", len(request)) + request], [0, 1, 2])
    replies = conn.makefile("r", encoding="ascii", errors="replace")
    word, _, pid = replies.readline().partition(" ")
    if word != "pid" or not pid.strip().isdigit():
        print("streamberg: the fork server could not start this Python command; starting it with a fresh interpreter",
              file=sys.stderr, flush=True)
        conn.close()
        run_with_interpreter(python, args)
    worker = int(pid)

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(worker, signum)
        except OSError:
            pass

    for signum in FORWARDED_SIGNALS:
        if int(signum) not in ignored:
            signal.signal(signum, forward)
    return exit_code(replies.readline())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
