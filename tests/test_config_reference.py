"""docs/configuration.md is what scripts/config_reference.py makes of the configuration
models now: a key added, removed or re-documented without regenerating fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_reference_is_current() -> None:
    generator = _generator()
    assert (ROOT / "docs" / "configuration.md").read_text() == generator.render(), \
        "docs/configuration.md is stale: run .venv/bin/python scripts/config_reference.py"


def test_every_key_has_its_meaning_type_and_default() -> None:
    from streamberg.common.config import StreambergConfig

    text = (ROOT / "docs" / "configuration.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) > 100
    assert not [r for r in rows if r.rstrip().endswith("|  |")], "a key without its meaning"
    for section in ("kafka", "catalog", "table", "ingest", "compactor", "maintenance", "monitoring", "merge", "run"):
        assert section in StreambergConfig.model_fields
        assert any(r.startswith(f"| `{section}.") for r in rows), section
    assert "| `maintenance.expire.max_snapshots` | integer | `500` | an integer between 1 and 1000000000 |" in text
