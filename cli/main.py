"""The `streamberg` command: the parser composed from cli/*.py, and exit codes.

Each module in COMMAND_MODULES has a `register(subparsers)` function. Exit codes
(common/exit_codes.py): 0 success, 1 runtime failure (a library error from
common/errors.py or a command's own CommandError, printed as one line), 2 bad usage or
invalid configuration, 3 a fenced ingest, 130 interrupted. A library error carries its
code (`StreambergError.exit_code`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from streamberg.cli.errors import CommandError, UsageError
from streamberg.common.errors import ConfigError, StreambergError
from streamberg.common.exit_codes import ExitCode
from streamberg.common.log import get_logger
from streamberg.common.redact import redact
from streamberg.common.runtime import current as current_runtime

# Modules that contribute subcommands, in the order `--help` lists them.
COMMAND_MODULES = (
    "streamberg.cli.local",
    "streamberg.cli.ingest",
    "streamberg.cli.replay",
    "streamberg.cli.compact",
    "streamberg.cli.merge",
    "streamberg.cli.maintain",
    "streamberg.cli.status",
    "streamberg.cli.query",
    "streamberg.cli.tail",
    "streamberg.cli.run",
    "streamberg.cli.check",
    "streamberg.cli.deploy",
    "streamberg.cli.govern",
    "streamberg.cli.completion",
)
# Subcommands whose code needs an optional extra: module, command, extra.
OPTIONAL_COMMAND_MODULES = (
    ("streamberg.bench.commands", "bench", "bench"),
)
# The module that registers each command, so a run of one command imports that module alone:
# a module's imports are its command's (`status` brings the monitoring model, pyiceberg and
# SQLAlchemy: 1.3 s of a 1.6 s start before this), and `streamberg check` or `deploy k8s` need
# none of it. `--help`, `completion` and a word that is no command build every one. Kept equal to
# what the modules register by tests/test_cli.py.
COMMANDS = {
    "broker": "streamberg.cli.local", "produce": "streamberg.cli.local", "table": "streamberg.cli.local",
    "ingest": "streamberg.cli.ingest", "replay": "streamberg.cli.replay", "compact": "streamberg.cli.compact",
    "merge": "streamberg.cli.merge", "maintain": "streamberg.cli.maintain", "status": "streamberg.cli.status",
    "metrics": "streamberg.cli.status", "query": "streamberg.cli.query", "tail": "streamberg.cli.tail",
    "run": "streamberg.cli.run", "check": "streamberg.cli.check", "deploy": "streamberg.cli.deploy",
    "govern": "streamberg.cli.govern", "completion": "streamberg.cli.completion", "bench": "streamberg.bench.commands",
}

DESCRIPTION = """\
Exactly-once streaming ingest from Kafka into Apache Iceberg, plus an incremental
Z-order/Hilbert compactor.

Typical local session (embedded broker, SQLite catalog, local warehouse):
  streamberg broker start
  streamberg produce --config examples/demo.yaml --count 100000
  streamberg ingest  --config examples/demo.yaml --max-records 100000
  streamberg table   --config examples/demo.yaml
  streamberg run     --config examples/demo.yaml   # ingest + compactor + maintenance together

Every subcommand has its own --help. Configuration is one YAML file; any key can be
overridden by an environment variable STREAMBERG_<SECTION>__<KEY>.
"""


__all__ = ["CommandError", "build_parser", "main"]  # CommandError: cli/errors.py, kept importable here


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("streamberg")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or (`command`, one of COMMANDS) of that command's module alone."""
    parser = argparse.ArgumentParser(
        prog="streamberg", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"streamberg {_version()}",
                        help="print the installed version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = COMMANDS.get(command or "")
    for name in COMMAND_MODULES:
        if chosen is None or name == chosen:
            importlib.import_module(name).register(subparsers)
    for name, command, extra in OPTIONAL_COMMAND_MODULES:
        if chosen is not None and name != chosen:
            continue
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            _register_missing(subparsers, command, extra, exc)
            continue
        module.register(subparsers)
    return parser


def _register_missing(subparsers: argparse._SubParsersAction, command: str, extra: str,
                      exc: ModuleNotFoundError) -> None:
    """A command whose optional dependencies are not installed says so when run (exit 2)."""
    message = (f"`streamberg {command}` needs the {extra!r} extra ({exc.name} is not installed): "
               f"pip install 'streamberg[{extra}]', or run `make setup` in a checkout")
    parser = subparsers.add_parser(command, help=f"(not installed: needs the {extra!r} extra)",
                                   description=message)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def refuse(args: argparse.Namespace) -> int:
        print(f"streamberg: {message}", file=sys.stderr)
        return ExitCode.USAGE

    parser.set_defaults(func=refuse)


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(words[0] if words else None)
    args = parser.parse_args(argv)
    # Every message below passes through redact(): exception text from drivers, Spark and
    # the JVM quotes URIs and connection properties, passwords included.
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        # One line, so a wrapper or log shipper shows the whole reason.
        print(f"streamberg: {' '.join(redact(str(exc)).split())}", file=sys.stderr)
        return ExitCode.USAGE
    except CommandError as exc:
        print(f"streamberg {args.command}: {redact(str(exc))}", file=sys.stderr)
        return ExitCode.USAGE if isinstance(exc, UsageError) else ExitCode.FAILED
    except StreambergError as exc:
        print(f"streamberg {args.command}: {redact(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("streamberg: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:  # the reader went away (`streamberg ... | head`): nothing to say to it
        sys.stderr.close()
        return ExitCode.OK
    except Exception as exc:  # noqa: BLE001 - a bug or an unforeseen failure: no raw traceback
        # The traceback (redacted) goes to the debug log; the operator gets one line.
        get_logger("cli").debug("unexpected error", command=args.command, traceback=traceback.format_exc())
        first = (redact(str(exc)).strip().splitlines() or [""])[0]
        print(f"streamberg {args.command}: unexpected error: {type(exc).__name__}: {first} "
              f"(STREAMBERG_LOG_LEVEL=debug shows the traceback)", file=sys.stderr)
        return ExitCode.FAILED
    finally:
        if argv is None:  # the process's command ends: its runtime's catalogs, engines and clients close once
            current_runtime().close()


if __name__ == "__main__":
    sys.exit(main())
