"""Worker log lines of a local run reach `streamberg ingest`'s own stderr.

A local run starts its Python operators (writers, committer) as separate worker processes
(Flink's process mode, see `run_ingest`). Flink gives those processes no stderr anyone
reads, so each worker appends its structlog lines to one file in the run's folder
(`WorkerLogTarget.configure`), and the driver copies every complete new line of that file
to its own stderr while the job runs (`WorkerLogRelay`). The file stays in the run folder
for later reading; the driver prints its path at start.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from streamberg.common.redact import redact

WORKER_LOG_NAME = "workers.log"


@dataclass(frozen=True)
class WorkerLogTarget:
    """Where and how a worker process logs; pickled into the Flink operators."""

    path: str
    json: bool

    def configure(self) -> None:
        """In a worker process: log to the file. A no-op where logging is set up already
        (loopback mode, where the operators run inside the driver)."""
        from streamberg.common.log import configure_logging

        configure_logging(force_json=self.json, file=Path(self.path))


class WorkerLogRelay:
    """Copies complete lines appended to `path` to `write` (stderr), from a daemon thread.

    `write` takes a block of whole lines; with a progress bar on the terminal it is the
    bar's own write, so lines land above the bar instead of through it.
    """

    def __init__(self, path: Path, write: Callable[[str], None] | None = None, interval: float = 0.2):
        self.path, self.interval = path, interval
        self.write = write or _write_stderr
        self._offset = 0
        self._partial = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-log-relay", daemon=True)

    def start(self) -> WorkerLogRelay:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and copy what is left (a last line without newline included)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.pump()
        if self._partial:
            self._emit(self._partial + b"\n")
            self._partial = b""

    def pump(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        if not chunk:
            return
        self._offset += len(chunk)
        data = self._partial + chunk
        complete, _, self._partial = data.rpartition(b"\n")
        if complete:
            self._emit(complete + b"\n")

    def _emit(self, data: bytes) -> None:
        # Worker lines include what structlog did not write (a forked worker's traceback,
        # Beam's own lines): redacted here, with the driver's registered secrets.
        self.write(redact(data.decode("utf-8", errors="replace")))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.pump()


def _write_stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()
