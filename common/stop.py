"""Graceful stop on SIGINT/SIGTERM, one rule for every long-running process (the ingest's
driver, the compactor, maintenance, the supervisor): the first signal asks the work to stop
gracefully, a signal that comes while it is already stopping ends it at once."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _interrupt(_name: str) -> None:
    raise KeyboardInterrupt


def _install(request: Callable[[str], None], stopping: Callable[[], bool],
             again: Callable[[str], None]) -> dict[int, Any]:
    def handler(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if stopping():
            again(name)
        else:
            request(name)

    return {s: signal.signal(s, handler) for s in STOP_SIGNALS}


@contextmanager
def stop_on_signals(request: Callable[[str], None], stopping: Callable[[], bool],
                    again: Callable[[str], None] = _interrupt) -> Iterator[None]:
    """While inside: a signal calls `request(<signal name>)`, or `again(<name>)` once
    `stopping()` (by default: raise KeyboardInterrupt). The previous handlers come back after."""
    previous = _install(request, stopping, again)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def install_stop_handlers(stop: threading.Event) -> None:
    """For the rest of the process: a signal sets `stop`, so the loop ends after its running
    pass; a signal after that raises KeyboardInterrupt at once."""
    _install(lambda _name: stop.set(), stop.is_set, _interrupt)
