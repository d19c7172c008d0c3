"""Graceful stop of a long-running loop on SIGINT/SIGTERM (the compactor, maintenance)."""

from __future__ import annotations

import signal
import threading
from typing import Any


def install_stop_handlers(stop: threading.Event) -> None:
    """SIGINT/SIGTERM set `stop`, so the loop ends after its running pass; a second signal
    raises KeyboardInterrupt at once."""

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
