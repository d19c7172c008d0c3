"""The runbook pages the dashboard links each problem to (docs/runbooks/ of the checkout or
the folder STREAMBERG_RUNBOOKS names); a name is one of the known pages, never a path."""

from __future__ import annotations

import os
from pathlib import Path

from streamberg.monitoring.dashboard.views import RUNBOOKS


def runbook_text(name: str) -> str | None:
    if name not in set(RUNBOOKS.values()):
        return None
    folders = [Path(os.environ["STREAMBERG_RUNBOOKS"])] if os.environ.get("STREAMBERG_RUNBOOKS") else []
    folders.append(Path(__file__).resolve().parents[2] / "docs" / "runbooks")  # a checkout
    for folder in folders:
        try:
            return (folder / f"{name}.md").read_text()
        except OSError:
            continue
    return f"docs/runbooks/{name}.md of the streamberg repository (not installed beside this package)\n"
