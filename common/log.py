"""Structured logging for every streamberg process (CLI, Flink workers, Spark driver).

JSON lines when stderr is not a terminal (log shippers, CI, Flink worker logs), a readable
console renderer otherwise. Set STREAMBERG_LOG_FORMAT=json|console to force one, and
STREAMBERG_LOG_LEVEL=debug|info|warning|error for the level. Every line is redacted
(common/redact.py): passwords in URIs and values of secret-named keys never reach the log.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, TextIO

import structlog

from streamberg.common.redact import redact_log_event

_configured = False


def renders_json() -> bool:
    """Whether this process's log lines are JSON (the rule configure_logging applies)."""
    fmt = os.environ.get("STREAMBERG_LOG_FORMAT")
    return fmt == "json" or (fmt != "console" and not sys.stderr.isatty())


def reconfigure_logging() -> None:
    """Configure again, for a process whose stderr was re-pointed (the supervisor's status
    line): structlog binds the stream of the moment it is configured."""
    global _configured
    structlog.reset_defaults()
    _configured = False
    configure_logging()


class RotatingLineFile:
    """A log file one process appends lines to, kept under `max_bytes`: past it the file
    becomes `<name>.1` (the older one dropped) and a new one starts. One writer per file, so
    the rename is safe; a reader following the file by inode reads the renamed one to its end
    (ingest/local/worker_logs.py). Line-buffered: each line is one write(2)."""

    def __init__(self, path: Path, max_bytes: int = 32 * 1024 * 1024) -> None:
        self.path, self.max_bytes = Path(path), max_bytes
        self._open()

    def _open(self) -> None:
        self._file = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the process
        self._size = self._file.tell()

    def write(self, text: str) -> int:
        if self._size + len(text) > self.max_bytes and self._size > 0:
            self._file.close()
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            self._open()
        written = self._file.write(text)
        self._size += len(text.encode("utf-8", errors="replace")) if not text.isascii() else len(text)
        return written

    def flush(self) -> None:
        self._file.flush()


def configure_logging(force_json: bool | None = None, file: Path | None = None) -> None:
    """Configure structlog once per process; later calls are no-ops.

    `file`: append the lines to this file instead of stderr (a local Flink job's Python
    worker processes, whose stderr nobody reads; the driver relays the file, see
    ingest/local/worker_logs.py).
    """
    global _configured
    if _configured:
        return
    level_name = os.environ.get("STREAMBERG_LOG_LEVEL", "info").upper()
    level = getattr(logging, level_name, logging.INFO)
    if force_json is None:
        force_json = renders_json()
    out: TextIO | RotatingLineFile = sys.stderr
    if file is not None:
        out = RotatingLineFile(file)
    renderer: Any = structlog.processors.JSONRenderer() if force_json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            # Last before rendering, so exception text and bound context are covered too.
            redact_log_event,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # Write, not print: a PyFlink Python worker on a Flink cluster replaces builtins.print
        # with one that takes no `flush` (PrintLogger's call fails there) and routes
        # sys.stderr.write to the TaskManager's log, where these lines then appear.
        logger_factory=structlog.WriteLoggerFactory(file=out),  # type: ignore[arg-type]  # a TextIO in duck type
        cache_logger_on_first_use=True,
    )
    _configured = True


def get_logger(component: str, **context: Any) -> structlog.typing.FilteringBoundLogger:
    """A logger bound to a component name (ingest.writer, compactor, cli, ...) and context."""
    configure_logging()
    return structlog.get_logger().bind(component=component, **context)
