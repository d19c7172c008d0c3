"""`--help` says what the code does: every exit status and default a command's help names is
the one the code has.

- Exit statuses: each sentence of a help text that speaks of an exit status names only codes
  of common/exit_codes.py, and the one it gives for being fenced or for an invalid
  configuration is that contract's (3 and 2).
- Defaults: "(default N)" is the argument's own default; "(default: section.key[: value])"
  names a real configuration key, and the value, when given, is that key's default.
"""

from __future__ import annotations

import argparse
import re

from streamberg.cli.main import build_parser
from streamberg.common.config import StreambergConfig
from streamberg.common.exit_codes import ExitCode

CODES = {c.value for c in ExitCode}
_SENTENCE = re.compile(r"[^.\n]*(?:\n(?!\n)[^.\n]*)*")
_DEFAULT = re.compile(r"\(default:?\s+([^)]*)\)")
_KEY = re.compile(r"^([a-z_]+)\.([a-z_]+)(?:[:,]\s*(.+))?$")


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _config_default(section: str, key: str):
    model = StreambergConfig.model_fields[section].annotation
    field = model.model_fields[key]  # type: ignore[union-attr]
    return field.get_default(call_default_factory=True)


def test_every_exit_status_a_help_names_is_the_contracts() -> None:
    checked = 0
    for name, parser in _commands().items():
        text = " ".join(parser.format_help().split())
        for sentence in re.split(r"(?<=[.;])\s", text):
            if not re.search(r"\bexit", sentence, re.I) or "show this help message" in sentence:
                continue
            codes = [int(n) for n in re.findall(r"\b(\d{1,3})\b", sentence)
                     if re.search(rf"(exit[^.]*?\b{n}\b|\b{n}\b (when|after|for|ok))", sentence, re.I)]
            assert set(codes) <= CODES, f"{name}: {sentence!r} names {codes}, not all exit codes"
            for phrase, code in (("fenced", ExitCode.FENCED), ("invalid configuration", ExitCode.USAGE)):
                near = re.findall(rf"(\d+) (?:when|for)[^,;]*{phrase}|{phrase}[^,;.]*\(?(?:it )?exits? (\d+)", sentence)
                for found in near:
                    number = int(next(n for n in found if n))
                    assert number == code, f"{name}: {sentence!r} gives {number} for {phrase!r}; the code uses {code}"
                    checked += 1
    assert checked >= 3  # run's and ingest's statements were read


def test_every_default_a_help_names_is_the_codes() -> None:
    checked = 0
    for name, parser in _commands().items():
        for action in parser._actions:
            if not action.help or action.help == argparse.SUPPRESS:
                continue
            match = _DEFAULT.search(" ".join(action.help.split()))
            if match is None:
                continue
            said = match.group(1).strip()
            key = _KEY.match(said)
            if key is not None:
                section, field, value = key.groups()
                default = _config_default(section, field)
                if value is not None and not value.startswith(("at least", "0.0.0.0")):
                    shown = value.split(";")[0].strip()
                    expected = ",".join(default) if isinstance(default, list) else str(default)
                    assert shown == expected, f"{name} {action.dest}: help says {shown!r}, {section}.{field} is {expected!r}"
                checked += 1
            elif re.fullmatch(r"\d+", said):
                # An optional value (nargs "?") defaults to its const when the flag is given bare.
                actual = action.const if action.nargs == "?" else action.default
                assert actual == int(said), f"{name} {action.dest}: help says {said}, default {actual}"
                checked += 1
    assert checked >= 5
