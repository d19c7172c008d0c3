"""Fault injection for crash tests: a named point where a process can be made to wait, so a
test can kill -9 it at exactly that moment (the evolution commit, say) instead of hoping a
random kill lands there.

Inert unless `STREAMBERG_FAULT_PAUSE` names the point: then the process writes
`STREAMBERG_FAULT_MARKER` (a file path, if set) and sleeps `STREAMBERG_FAULT_PAUSE_SECONDS`
(default 120) before going on. Nothing is skipped or changed: a process that is not killed
carries on exactly as it would have.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from streamberg.common.log import get_logger

# The points the code offers (a test names one).
EVOLUTION_COMMIT = "evolution-commit"  # ingest committer: schema update and files staged, not yet committed
MERGE_COMMIT = "merge-commit"  # merge stage: the last changes read, the MERGE not yet run


def pause_point(name: str) -> None:
    if os.environ.get("STREAMBERG_FAULT_PAUSE") != name:
        return
    seconds = float(os.environ.get("STREAMBERG_FAULT_PAUSE_SECONDS", "120"))
    get_logger("faults").warning("fault injection: pausing", point=name, seconds=seconds)
    marker = os.environ.get("STREAMBERG_FAULT_MARKER")
    if marker:
        Path(marker).write_text(f"{name} {os.getpid()}\n")
    time.sleep(seconds)
