"""The floors hold: components import only common/, common/ imports no component.

Read from the source with `ast` (every import statement, at any depth, lazy ones included).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = ("ingest", "compactor", "maintenance", "monitoring")
# Besides itself, what each folder may import from streamberg.
ALLOWED = {**{c: {"common"} for c in COMPONENTS}, "common": set(), "supervisor": {"common"}}


def _streamberg_imports(path: Path) -> set[str]:
    """Second-level package of every `streamberg.X...` import in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "streamberg" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_folder_imports_only_the_floors_below(folder: str) -> None:
    wrong = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        bad = _streamberg_imports(path) - ALLOWED[folder] - {folder}
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(bad)
    assert not wrong, f"imports across the floors: {wrong}"


def test_the_check_sees_imports() -> None:
    """The reader above finds lazy imports too (else the test above proves nothing)."""
    assert _streamberg_imports(ROOT / "cli" / "run.py") >= {"common", "monitoring", "supervisor"}
