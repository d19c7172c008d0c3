"""Worker log lines of a local run reach `streamberg ingest`'s own stderr.

A local run starts its Python operators (writers, committer) as separate worker processes
(Flink's process mode, see `run_ingest`). Flink gives those processes no stderr anyone
reads, so each worker appends its structlog lines to a file of its own in the run's folder
(`workers-<pid>.log`, `WorkerLogTarget.configure`), and the driver copies every complete new
line of those files to its own stderr while the job runs (`WorkerLogRelay`). The files stay
in the run folder for later reading; the driver prints the folder at start.

Bounded for months: each file is rotated at 32 MB to `<name>.1`, the older one dropped
(common/log.RotatingLineFile), so a worker keeps at most 64 MB. The relay follows each file
by inode, so it reads a file renamed by its rotation to the end.
"""

from __future__ import annotations

import os
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
        """In a worker process: log to a file of its own beside `path`. A no-op where logging
        is set up already (loopback mode, where the operators run inside the driver)."""
        from streamberg.common.log import configure_logging

        base = Path(self.path)
        configure_logging(force_json=self.json, file=base.with_name(f"{base.stem}-{os.getpid()}{base.suffix}"))


class WorkerLogRelay:
    """Copies complete lines appended to `path` to `write` (stderr), from a daemon thread.

    `write` takes a block of whole lines; with a progress bar on the terminal it is the
    bar's own write, so lines land above the bar instead of through it.
    """

    def __init__(self, path: Path, write: Callable[[str], None] | None = None, interval: float = 0.2):
        # `path` and the files of the workers beside it (`<stem>-<pid><suffix>`, and each one's
        # rotated `.1`), each followed by its inode: offset and the unterminated last line.
        self.path, self.interval = path, interval
        self.write = write or _write_stderr
        self._files: dict[tuple[int, int], tuple[int, bytes]] = {}
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
        for key, (offset, partial) in list(self._files.items()):
            if partial:
                self._emit(partial + b"\n")
                self._files[key] = (offset, b"")

    def _paths(self) -> list[Path]:
        folder, stem, suffix = self.path.parent, self.path.stem, self.path.suffix
        try:
            names = sorted(folder.iterdir(), key=lambda p: p.name.endswith(".1"), reverse=True)  # rotated first
        except OSError:
            return []
        return [p for p in names if p.name == self.path.name or p.name == f"{self.path.name}.1"
                or (p.name.startswith(f"{stem}-") and (p.name.endswith(suffix) or p.name.endswith(f"{suffix}.1")))]

    def pump(self) -> None:
        seen = set()
        for path in self._paths():
            try:
                with open(path, "rb") as f:
                    st = os.fstat(f.fileno())
                    key = (st.st_dev, st.st_ino)
                    seen.add(key)
                    offset, partial = self._files.get(key, (0, b""))
                    if st.st_size < offset:  # a new file on a reused inode
                        offset, partial = 0, b""
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                continue
            if not chunk:
                self._files[key] = (offset, partial)
                continue
            data = partial + chunk
            complete, _, partial = data.rpartition(b"\n")
            self._files[key] = (offset + len(chunk), partial)
            if complete:
                self._emit(complete + b"\n")
        for key in [k for k in self._files if k not in seen and not self._files[k][1]]:
            del self._files[key]  # gone (a dropped rotation), nothing left to say

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
