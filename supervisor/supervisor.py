"""`streamberg run`: ingest, compactor and maintenance on one machine, under one small supervisor.

Each component runs as its own `streamberg <command>` subprocess, exactly as an operator
would start it by hand, so the supervisor imports no component: it is a composition root
like the CLI. What it adds:

- Children run in their own sessions (process groups): a Ctrl-C at the terminal reaches only
  the supervisor, which then stops the children itself, in order (ingest first: it has
  records in flight and the longest drain), each with SIGTERM to the component's Python
  process only (its JVM must outlive the graceful stop), a per-component timeout
  (run.stop_timeout_seconds), then SIGKILL of the child's whole group. A second Ctrl-C kills
  at once (safe: every commit is atomic; uncommitted work is re-read).
- A component that exits while the loop runs is restarted with exponential backoff
  (run.restart_backoff_seconds doubling up to run.restart_backoff_max_seconds; back to the
  start after run.healthy_after_seconds of healthy running); every restart is logged and
  counted.
- Two exits are final, because a restart cannot help: a fenced ingest (exit 3,
  `ExitCode.FENCED`: another loop owns the table) and exit 2 (invalid configuration or
  usage). The supervisor keys on the exit code, never on what the child printed. The supervisor then stops the other components too and
  exits with that code: a second loop on one table is an operator mistake to fix, and a
  half-running loop (a compactor without its ingest) would hide it.
- Every line a child prints is relayed with the component's name: JSON log lines get a
  "process" key (they are still one JSON object per line), other lines a "name | " prefix
  (in JSON mode they are wrapped into a JSON object).
- Children die with the supervisor even if it is SIGKILLed (Linux parent-death signal).

Exit status (common/exit_codes.py): 0 after a requested stop (signal, --duration), 3 after
a fenced ingest, 2 when a component reports an invalid configuration.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from streamberg.common.config import StreambergConfig
from streamberg.common.exit_codes import ExitCode
from streamberg.common.log import get_logger
from streamberg.common.redact import redact
from streamberg.common.stop import stop_on_signals
from streamberg.table_meta.changelog import has_changelog
from streamberg.table_meta.keeping import backoff as restart_backoff

# Component name -> the `streamberg` subcommand arguments that run it continuously.
COMMANDS = {
    "ingest": ["ingest", "--quiet"],
    "compact": ["compact"],
    "maintain": ["maintain"],
    "merge": ["merge"],
    # `streamberg run` serves the dashboard itself (cli/run.py): its governor serves none.
    "govern": ["govern", "--dashboard", "off"],
}
# Stop order: ingest first (records in flight, the longest drain), then the compactor
# (finishes its pass), then maintenance. They stop concurrently; only the signals are ordered.
STOP_ORDER = ("ingest", "merge", "compact", "maintain", "govern")

EXIT_OK, EXIT_FENCED, EXIT_CONFIG = ExitCode.OK, ExitCode.FENCED, ExitCode.USAGE


def _parent_death_signal() -> Callable[[], None] | None:
    """A preexec function asking Linux to SIGTERM the child when the supervisor dies."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def set_pdeathsig() -> None:  # runs in the forked child: one syscall, nothing else
        prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG

    return set_pdeathsig


@dataclass
class Component:
    name: str
    argv: list[str]
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    failures_in_a_row: int = 0
    restart_at: float | None = None
    last_exit: int | None = None
    final: bool = False  # exited for good (fenced, bad config, stopped)
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=80))
    relay: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Output:
    """Serialises relayed lines and the status line on the supervisor's stderr."""

    def __init__(self, stream: IO[str], json_lines: bool, status_line: bool):
        self.stream, self.json_lines = stream, json_lines
        self.lock = threading.Lock()
        self.bar = None
        if status_line:
            from tqdm import tqdm

            # A bar-less tqdm is a status line that tqdm keeps below the relayed lines.
            self.bar = tqdm(total=0, bar_format="{desc}", file=stream, leave=False, dynamic_ncols=True)
            self.bar.set_description_str("starting...")

    def line(self, name: str, text: str) -> None:
        text = text.rstrip("\n")
        if not text:
            return
        if self.json_lines:
            try:
                record = json.loads(text)
            except ValueError:
                record = None
            if not isinstance(record, dict):
                record = {"event": text, "stream": "output"}
            text = json.dumps({**record, "process": name})
        else:
            text = f"{name:<8}| {text}"
        self.write(text)

    def write(self, text: str) -> None:
        with self.lock:
            if self.bar is not None:
                self.bar.write(text, file=self.stream)
            else:
                self.stream.write(text + "\n")
                self.stream.flush()

    def status(self, text: str) -> None:
        with self.lock:
            if self.bar is not None:
                self.bar.set_description_str(text)

    def close(self) -> None:
        with self.lock:
            if self.bar is not None:
                self.bar.close()
                self.bar = None


class _LinesAboveTheBar:
    """Stands in for sys.stderr while the status line is shown: this process's own log lines
    (supervisor, monitoring's collection) go through tqdm.write too, instead of tearing the bar."""

    def __init__(self, output: Output):
        self.output, self.pending = output, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self.output.write(line)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def _log_through(stream: Any) -> None:
    """Re-point structlog (configured once per process, bound to the stderr of that moment)."""
    from streamberg.common.log import reconfigure_logging

    sys.stderr = stream
    reconfigure_logging()


class Supervisor:
    def __init__(self, config: StreambergConfig, config_path: str, *, duration: float | None = None,
                 components: list[str] | None = None, status: bool = True,
                 status_collector: Callable[[], dict[str, Any]] | None = None,
                 stream: IO[str] | None = None):
        self.config, self.duration = config, duration
        self.settings = config.run
        stream = stream or sys.stderr
        fmt = os.environ.get("STREAMBERG_LOG_FORMAT")
        tty = stream.isatty()
        json_lines = fmt == "json" or (fmt != "console" and not tty)
        self.child_env = dict(os.environ)
        # Children write to a pipe, so they would pick JSON; follow the supervisor's choice.
        self.child_env["STREAMBERG_LOG_FORMAT"] = "json" if json_lines else "console"
        self.output = Output(stream, json_lines, status_line=status and tty)
        self.real_stderr = None
        if self.output.bar is not None:
            self.real_stderr = sys.stderr
            _log_through(_LinesAboveTheBar(self.output))
        self.log = get_logger("supervisor", table=config.table.identifier)
        self.status_collector = status_collector if status else None
        names = components or list(self.settings.components)
        if not has_changelog(config):  # no change log: an append table has nothing to merge
            names = [n for n in names if n != "merge"]
        # Not `python -m streamberg.cli.main`: that module would run as __main__, a second copy
        # whose CommandError the subcommands do not raise (tracebacks instead of messages).
        base = [sys.executable, "-c", "import sys; from streamberg.cli.main import main; sys.exit(main())"]
        self.components = {
            name: Component(name, base + [COMMANDS[name][0], "--config", config_path] + COMMANDS[name][1:])
            for name in STOP_ORDER if name in names
        }
        self.stop_reason: str | None = None
        self.kill_now = False
        self.exit_code = EXIT_OK
        self.started = 0.0
        self.status_thread: threading.Thread | None = None
        self.status_stop = threading.Event()
        self.last_status: dict[str, Any] | None = None

    # -- children -------------------------------------------------------------------------
    def _start(self, comp: Component) -> None:
        comp.proc = subprocess.Popen(
            comp.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self.child_env, text=True, errors="replace", bufsize=1,
            start_new_session=True, preexec_fn=_parent_death_signal(),
        )
        comp.started_at, comp.restart_at = time.monotonic(), None
        comp.tail.clear()
        comp.relay = threading.Thread(target=self._relay, args=(comp, comp.proc), daemon=True,
                                      name=f"relay-{comp.name}")
        comp.relay.start()
        self.log.info("component started", process=comp.name, pid=comp.proc.pid, restarts=comp.restarts)

    def _relay(self, comp: Component, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            # A child's lines are its own (structlog redacts them), but JVM and librdkafka
            # lines and tracebacks are not: every relayed line is redacted here.
            text = redact(raw)
            comp.tail.append(text)
            self.output.line(comp.name, text)

    def _exited(self, comp: Component, code: int) -> None:
        """A component exited while the loop runs: restart it, or end the loop if that cannot help."""
        if comp.relay is not None:
            comp.relay.join(timeout=5)  # its last lines are relayed before the loop says why it ends
        self._reap_group(comp)
        comp.last_exit, comp.proc = code, None
        if comp.name == "ingest" and code == EXIT_FENCED:
            comp.final = True
            self.log.error("ingest fenced: another ingest instance is writing this table; not restarting, "
                           "stopping the loop", process=comp.name, exit_code=code)
            self._request_stop("ingest fenced", EXIT_FENCED)
            return
        if code == EXIT_CONFIG:
            comp.final = True
            self.log.error("component reports an invalid configuration; not restarting, stopping the loop",
                           process=comp.name, exit_code=code)
            self._request_stop(f"{comp.name}: invalid configuration", EXIT_CONFIG)
            return
        ran = time.monotonic() - comp.started_at
        comp.failures_in_a_row = 1 if ran >= self.settings.healthy_after_seconds else comp.failures_in_a_row + 1
        backoff = restart_backoff(comp.failures_in_a_row, self.settings.restart_backoff_seconds,
                                  self.settings.restart_backoff_max_seconds)
        comp.restarts += 1
        comp.restart_at = time.monotonic() + backoff
        self.log.warning("component exited; restarting", process=comp.name, exit_code=code,
                         ran_seconds=round(ran, 1), restarts=comp.restarts, backoff_seconds=round(backoff, 1))

    def _reap_group(self, comp: Component) -> None:
        """Kill whatever the component left in its process group (a JVM whose parent died)."""
        if comp.proc is None:
            return
        try:
            os.killpg(comp.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    # -- stopping ---------------------------------------------------------------------------
    def _request_stop(self, reason: str, code: int = EXIT_OK) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self.exit_code = code
            self.log.info("stopping the loop", reason=reason)

    def _kill_now(self, reason: str) -> None:
        self.kill_now = True  # a signal while stopping: no more waiting
        self._request_stop(reason)

    def _stop_all(self) -> None:
        running = [c for c in self.components.values() if c.running]
        for comp in running:
            self.log.info("stopping component", process=comp.name, pid=comp.proc.pid)
            try:
                comp.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + self.settings.stop_timeout_seconds
        for comp in running:
            while comp.proc.poll() is None and not self.kill_now and time.monotonic() < deadline:
                time.sleep(0.2)
            if comp.proc.poll() is None:
                self.log.warning("component did not stop in time; killing it", process=comp.name,
                                 stop_timeout_seconds=self.settings.stop_timeout_seconds)
            self._reap_group(comp)  # SIGKILL the group: the child if still there, and its JVM
            comp.last_exit = comp.proc.wait()
            if comp.relay is not None:
                comp.relay.join(timeout=5)
            self.log.info("component stopped", process=comp.name, exit_code=comp.last_exit)

    # -- status ----------------------------------------------------------------------------
    def _status_loop(self) -> None:
        previous: tuple[float, int] | None = None
        while not self.status_stop.wait(0 if previous is None else self.settings.status_interval_seconds):
            try:
                facts = self.status_collector()
            except Exception as exc:  # noqa: BLE001 - the status must never take the loop down
                facts = {"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
            now = time.monotonic()
            consumed = facts.get("consumed_total")
            if consumed is not None and previous is not None and now > previous[0]:
                facts["rate"] = max(0.0, (consumed - previous[1]) / (now - previous[0]))
            if consumed is not None:
                previous = (now, consumed)
            elif previous is None:
                previous = (now, 0)
            facts["restarts"] = {c.name: c.restarts for c in self.components.values()}
            self.last_status = facts
            if self.output.bar is not None:
                self.output.status(status_text(facts))
            else:
                self.log.info("status", **facts)

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> int:
        with stop_on_signals(self._request_stop, lambda: self.stop_reason is not None, again=self._kill_now):
            return self._loop()

    def _loop(self) -> int:
        self.started = time.monotonic()
        self.log.info("starting the loop", components=list(self.components), duration_s=self.duration)
        try:
            for comp in self.components.values():
                self._start(comp)
            if self.status_collector is not None:
                self.status_thread = threading.Thread(target=self._status_loop, daemon=True, name="status")
                self.status_thread.start()
            while self.stop_reason is None:
                time.sleep(0.2)
                now = time.monotonic()
                for comp in self.components.values():
                    if comp.proc is not None and (code := comp.proc.poll()) is not None:
                        self._exited(comp, code)
                    elif comp.proc is None and not comp.final and comp.restart_at is not None and now >= comp.restart_at:
                        self._start(comp)
                if self.duration is not None and now - self.started >= self.duration:
                    self._request_stop(f"duration {self.duration:g}s elapsed")
            self._stop_all()
        finally:
            # Whatever happened above (even an exception here), no child outlives the supervisor.
            for comp in self.components.values():
                if comp.proc is not None and comp.proc.poll() is None:
                    self._reap_group(comp)
                    comp.proc.wait()
            self.status_stop.set()
            if self.status_thread is not None:
                self.status_thread.join(timeout=30)
            self.output.close()
            if self.real_stderr is not None:
                _log_through(self.real_stderr)
                self.log = get_logger("supervisor", table=self.config.table.identifier)
        self.log.info("loop stopped", reason=self.stop_reason, exit_code=self.exit_code,
                      restarts={c.name: c.restarts for c in self.components.values()})
        return self.exit_code

    def summary(self) -> dict[str, Any]:
        return {
            "stopped_because": self.stop_reason,
            "seconds": round(time.monotonic() - self.started, 1),
            "exit_code": self.exit_code,
            "components": {c.name: {"restarts": c.restarts, "last_exit": c.last_exit}
                           for c in self.components.values()},
        }


def status_text(facts: dict[str, Any]) -> str:
    """One line: committed records and rate, lag, pending files, last optimize, health, restarts."""
    if "error" in facts:
        return f"status unavailable: {facts['error']}"
    parts = []
    if facts.get("records") is not None:
        rate = facts.get("rate")
        parts.append(f"committed {facts['records']:,} rec" + (f" ({rate:,.0f}/s)" if rate is not None else ""))
    else:
        parts.append("no commit yet")
    if facts.get("lag") is not None:
        parts.append(f"lag {facts['lag']:,}")
    if facts.get("pending_files") is not None:
        parts.append(f"pending files {facts['pending_files']}")
    age = facts.get("last_optimize_age_seconds")
    parts.append("last optimize " + ("never" if age is None else f"{age:.0f}s ago"))
    if facts.get("dead_letters"):
        parts.append(f"dead letters {facts['dead_letters']:,}")
    restarts = sum((facts.get("restarts") or {}).values())
    if restarts:
        parts.append(f"restarts {restarts}")
    parts.append(f"health {facts.get('health', '?')}")
    return " | ".join(parts)
