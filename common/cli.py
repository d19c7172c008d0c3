"""The `streamberg` command. Each component adds its own subcommands.

Shared subcommands (broker, produce, table) are defined in common/commands.py; ingest/ and
compactor/ each have a commands.py with a `register(subparsers)` function. Exit codes:
0 success, 1 runtime failure, 2 bad usage or invalid configuration.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from streamberg.common.errors import ConfigError, StreambergError
from streamberg.common.log import get_logger
from streamberg.common.redact import redact

# Modules that contribute subcommands, in the order `--help` lists them.
COMMAND_MODULES = (
    "streamberg.common.commands",
    "streamberg.ingest.commands",
    "streamberg.compactor.commands",
    "streamberg.maintenance.commands",
    "streamberg.monitoring.commands",
    "streamberg.supervisor.commands",
    "streamberg.compactor.bench_skipping.commands",
)

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


class CommandError(RuntimeError):
    """A command's own refusal (bad flags, a precondition of the command); printed without a
    traceback, exit 1. Library failures are `StreambergError`s (common/errors.py)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamberg", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that component has no commands yet
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Every message below passes through redact(): exception text from drivers, Spark and
    # the JVM quotes URIs and connection properties, passwords included.
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        # One line, so a wrapper or log shipper shows the whole reason.
        print(f"streamberg: {' '.join(redact(str(exc)).split())}", file=sys.stderr)
        return 2
    except (CommandError, StreambergError) as exc:
        print(f"streamberg {args.command}: {redact(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("streamberg: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug or an unforeseen failure: no raw traceback
        # The traceback (redacted) goes to the debug log; the operator gets one line.
        get_logger("cli").debug("unexpected error", command=args.command, traceback=traceback.format_exc())
        first = (redact(str(exc)).strip().splitlines() or [""])[0]
        print(f"streamberg {args.command}: unexpected error: {type(exc).__name__}: {first} "
              f"(STREAMBERG_LOG_LEVEL=debug shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
