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


def _registered(module: str) -> set[str]:
    import argparse
    import importlib

    subparsers = argparse.ArgumentParser().add_subparsers()
    importlib.import_module(module).register(subparsers)
    return set(subparsers.choices)


def test_the_command_table_is_what_the_modules_register() -> None:
    """main() builds the chosen command's module alone from COMMANDS: a command a module adds
    and the table misses would be an invalid choice when named first."""
    from streamberg.cli.main import COMMAND_MODULES, COMMANDS, OPTIONAL_COMMAND_MODULES

    modules = [*COMMAND_MODULES, *(name for name, _, _ in OPTIONAL_COMMAND_MODULES)]
    assert {command: module for module in modules for command in _registered(module)} == COMMANDS


def test_one_command_imports_its_own_module_alone(tmp_path) -> None:
    """`streamberg check` builds its parser without the other commands' modules (status's brings
    the monitoring model, pyiceberg and SQLAlchemy), and still validates its config."""
    import json
    import subprocess

    config = tmp_path / "c.yaml"
    config.write_text("kafka: {bootstrap_servers: '127.0.0.1:1', topic: t}\ncatalog: {uri: 'sqlite:///c.db', "
                      "warehouse: w}\ntable: {identifier: a.b, schema: [{name: id, type: long}]}\n")
    probe = ("import json, sys\nfrom streamberg.cli.main import main\ncode = main(['check', '--config', sys.argv[1]])\n"
             "print(json.dumps([code, sorted(m for m in sys.modules if m.startswith('streamberg.cli.'))]))")
    out = subprocess.run([sys.executable, "-c", probe, str(config)], capture_output=True, text=True, check=True,
                         cwd=tmp_path)
    code, modules = json.loads(out.stdout.strip().splitlines()[-1])
    assert code == 0
    assert "streamberg.cli.check" in modules and "streamberg.cli.status" not in modules and \
        "streamberg.cli.deploy" not in modules, modules
    # Every command is still listed where no command is chosen: the help, and a word that is none.
    assert "    status " in build_parser().format_help()
    assert "    status " in build_parser("stauts").format_help()
    assert "    status " not in build_parser("check").format_help()
