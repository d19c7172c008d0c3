"""The CLI package: a subcommand whose optional extra is missing says so instead of vanishing."""

from __future__ import annotations

import sys

import pytest

from streamberg.cli.main import build_parser, main


def test_bench_without_its_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    for name in [m for m in sys.modules if m.startswith("streamberg.bench")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "duckdb", None)  # as if the `bench` extra were not installed
    assert "bench" in build_parser().format_help()  # still listed
    assert main(["bench", "skipping", "--scale", "1"]) == 2
    err = capsys.readouterr().err
    assert "needs the 'bench' extra" in err and "duckdb" in err and "pip install 'streamberg[bench]'" in err


def test_every_component_registers_its_commands() -> None:
    text = build_parser().format_help()
    for command in ("broker", "produce", "table", "ingest", "replay", "compact", "maintain", "status", "metrics",
                    "run", "bench"):
        assert f"    {command} " in text or f"    {command}\n" in text, command
