"""`streamberg completion SHELL`: the shell's completion script for every subcommand and option,
generated from the parser itself (shtab), so it never drifts from `--help`."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Prints a completion script for the shell. Install it once, for example:
  streamberg completion bash > ~/.local/share/bash-completion/completions/streamberg
  streamberg completion zsh  > "${fpath[1]}/_streamberg"
Generated from the same parser as --help (subcommands, options, choices), so it stays exact."""
SHELLS = ("bash", "zsh", "tcsh")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("completion", help="print the shell completion script (bash, zsh, tcsh)",
                                   description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shell", choices=SHELLS, help="the shell the script is for")
    parser.set_defaults(func=_completion)


def _completion(args: argparse.Namespace) -> int:
    import shtab

    from streamberg.cli.main import build_parser

    print(shtab.complete(build_parser(), shell=args.shell))
    return 0
