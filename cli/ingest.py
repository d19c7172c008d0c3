"""`streamberg ingest`: run the PyFlink ingest job."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
from typing import NoReturn

from streamberg.cli.errors import CommandError


def _ingest(args: argparse.Namespace) -> int:
    import sqlalchemy.exc
    from py4j.protocol import Py4JJavaError

    from streamberg.common.config.loading import load_tables
    from streamberg.common.errors import IngestFenced, JobFailed, SchemaMismatchError, UnsupportedSchemaError
    from streamberg.ingest.driver import run_ingest

    if args.max_records is not None and args.max_records <= 0:
        raise CommandError("--max-records must be positive")
    if args.duration is not None and args.duration <= 0:
        raise CommandError("--duration must be positive")
    try:
        # One table or many: routes (common/config/loading.load_tables); the ingest writes a
        # primary-key table's change log itself.
        outcome = run_ingest(load_tables(args.config), parallelism=args.parallelism, max_records=args.max_records,
                             duration=args.duration, progress=not args.quiet, engine=args.engine)
    except IngestFenced as exc:
        # Exit 3 (ExitCode.FENCED, cli/main.py) with the fencing message; the summary line
        # still says what this run committed.
        outcome = exc.outcome
        print(json.dumps({"run_id": outcome.run_id, "consumed": outcome.consumed,
                          "seconds": round(outcome.seconds, 1), "stopped_because": outcome.stopped_because}))
        raise
    except (JobFailed, SchemaMismatchError, UnsupportedSchemaError) as exc:
        raise CommandError(str(exc)) from exc
    except sqlalchemy.exc.OperationalError as exc:
        # The catalog database went away (the driver looks at it every second). The job
        # was cancelled on the way out; every commit is atomic, so nothing partial is visible.
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc).splitlines()[0]
        raise CommandError(
            f"catalog database unreachable: {reason}. Ingest stopped (a running Flink job is cancelled); commits "
            f"are atomic, so nothing partial is visible. Start it again once the database is back "
            f"(docs/runbooks/catalog-down.md)") from exc
    except Py4JJavaError as exc:
        # Seen when the job fails for good (e.g. a full disk, after Flink's restarts): the
        # local MiniCluster shuts down and the driver's next status call fails with this.
        java = str(exc.java_exception).splitlines()[0] if exc.java_exception is not None else "unknown"
        raise CommandError(
            f"the Flink job failed and its cluster shut down ({java}); the cause is the last worker error in the "
            f"log above. Commits are atomic, so nothing partial is visible: start the ingest again once the "
            f"cause is fixed") from exc
    print(json.dumps({"run_id": outcome.run_id, "consumed": outcome.consumed,
                      "seconds": round(outcome.seconds, 1), "stopped_because": outcome.stopped_because}))
    _exit_without_teardown()


def _exit_without_teardown() -> NoReturn:
    """End the process now that the run is over and reported: the exit hooks run, the module
    teardown does not. Tearing down an interpreter that imported PyFlink, Beam, pyiceberg and
    pyarrow costs about half a second of every bounded run (`--max-records`, `--duration`,
    the benchmarks, the supervisor's restarts) and does nothing the OS does not."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ingest", help="run the exactly-once Kafka -> Iceberg ingest job (PyFlink)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Runs the PyFlink ingest job: P parallel writers read disjoint Kafka partitions, decode
batches to Arrow and write Parquet files; a single committer makes them visible in one
Iceberg snapshot per commit interval, recording the next Kafka offset per partition in the
snapshot summary. On every start the writers resume from those recorded offsets, so a crash
or kill at any moment loses nothing and duplicates nothing. Malformed records go to the
dead-letter table with the reason.

Without --max-records or --duration it runs until interrupted; Ctrl-C (SIGINT/SIGTERM)
stops gracefully (writers flush, the committer commits), a second Ctrl-C stops at once.
Prints a JSON line on exit: run id, records consumed, seconds, why it stopped. Exit status:
0 after a bounded or requested stop, 1 when the run failed (the reason in one line), 2 for an
invalid configuration, 3 when it was fenced (another ingest writes this table: a restart
cannot help).""",
    )
    parser.add_argument("--config", required=True, help="the streamberg YAML config")
    parser.add_argument("--parallelism", type=int, default=None, help="writer subtasks (default: ingest.parallelism)")
    parser.add_argument("--engine", choices=("flink", "processes"), default=None,
                        help="what runs the writers and the committer here: flink (PyFlink's MiniCluster) or "
                             "processes (the same tasks in processes of their own, no JVM: a faster start, "
                             "less memory) (default: ingest.engine, flink)")
    bound = parser.add_mutually_exclusive_group()
    bound.add_argument("--max-records", type=int, default=None,
                       help="stop once this many records (valid + dead-lettered) are committed by this run")
    bound.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=_ingest)
