"""The exit codes the README states, over every subcommand: 2 for bad usage (an unknown option)
and for an invalid configuration file; never a traceback. Each command runs through the real
entry point (`streamberg.cli.main.main`, in this process: argparse, the handlers, the error
mapping); nothing it would reach (broker, catalog) exists, so a command that got past the
configuration would fail with 1, not 2: the test tells the two apart."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from streamberg.cli.main import build_parser, main
from streamberg.common.exit_codes import ExitCode

BAD_CONFIG = "kafka: {topic: t}\ntable: {identifier: db.e, schema: [{name: id, type: lng}]}\n"


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own exit (usage errors: 2)
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_an_unknown_option_exits_2_for_every_command(capsys: pytest.CaptureFixture) -> None:
    for name in _commands():
        code, output = _run([name, "--no-such-option"], capsys)
        assert code == ExitCode.USAGE, (name, code, output[-500:])
        assert "Traceback" not in output, name


def test_an_invalid_config_exits_2_for_every_command_that_reads_one(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_CONFIG)
    extra = {"deploy": ["k8s"], "query": ["SELECT * FROM db.e"], "replay": ["--dead-letters"], "produce": ["--count", "1"],
             "broker": ["status"]}
    checked = []
    for name, parser in _commands().items():
        takes_config = any("--config" in a.option_strings for a in parser._actions) or name == "deploy"
        if not takes_config:
            continue
        argv = [name, *extra.get(name, []), "--config", str(bad)]
        code, output = _run(argv, capsys)
        assert code == ExitCode.USAGE, (name, code, output[-800:])
        assert "Traceback" not in output and "lng" in output, (name, output[-800:])
        checked.append(name)
    assert len(checked) >= 12, checked
    assert not list(tmp_path.glob("*.db")) and not (tmp_path / ".streamberg").exists(), \
        "a command refusing its config created something"
