"""`streamberg replay`: the command line of ingest/replay.py."""

from __future__ import annotations

import argparse
import datetime as dt
import json

from streamberg.cli.configs import add_table_argument, config_of
from streamberg.cli.errors import CommandError

DESCRIPTION = """\
Re-ingests records into the table as ONE Iceberg append, with the ingest's own decoding
and file writing, without ever moving the ingest's committed Kafka offsets.

Topic range (rows lost downstream, or a range dead-lettered by a bug now fixed):
  streamberg replay --config F --partition P --from-offset A --to-offset B
re-reads Kafka records [A, B) of partition P. Refused (exit 1) when B is beyond the
ingest's committed offset of P (that is the ingest's job) or when the range overlaps a
range already replayed into the table (recorded in its snapshot summaries as
streamberg.replay.<topic>), unless --force. Replaying rows that are still in the table
duplicates them: check first that they are gone.

Dead letters (after `streamberg table --evolve`, or a raised ingest.max_record_bytes):
  streamberg replay --config F --dead-letters [--reason-like TEXT] [--since ISO]
re-decodes dead-lettered records against the table's current schema, appends those that
now decode and deletes them from the dead-letter table (recorded as
streamberg.dlq-replayed.<topic>, so no record is replayed twice); the rest stay there.

--dry-run reads and decodes but writes nothing. Prints one JSON object: records read,
added, still bad (by reason), dead letters removed, the snapshot id."""


def _since(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO-8601 time: {text!r} (e.g. 2026-11-22T01:00:00Z)") from None
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def _replay(args: argparse.Namespace) -> int:
    from pyiceberg.exceptions import CommitFailedException

    from streamberg.common.errors import ReplayRefused
    from streamberg.ingest.replay import replay_dead_letters, replay_range

    validate(args)
    config = config_of(args)  # the ingest writes a primary-key table's change log itself
    try:
        if args.dead_letters:
            outcome = replay_dead_letters(config, reason_like=args.reason_like, since=args.since, dry_run=args.dry_run)
        else:
            outcome = replay_range(config, args.partition, args.from_offset, args.to_offset,
                                   force=args.force, dry_run=args.dry_run)
    except ReplayRefused as exc:
        raise CommandError(f"refused: {exc}") from exc
    except CommitFailedException as exc:
        raise CommandError(f"the append kept losing races with other commits ({exc}); nothing was added, "
                           f"run the replay again") from exc
    print(json.dumps(outcome.to_json(), indent=None if args.compact else 2))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "replay", help="re-ingest a Kafka offset range or dead-lettered records, once, without moving the ingest",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="the streamberg YAML config")
    add_table_argument(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--partition", type=int, help="the Kafka partition of the range to replay")
    source.add_argument("--dead-letters", action="store_true", help="replay dead-lettered records instead of a range")
    parser.add_argument("--from-offset", type=int, help="first offset of the range (inclusive)")
    parser.add_argument("--to-offset", type=int, help="end of the range (exclusive), at most the committed offset")
    parser.add_argument("--force", action="store_true", help="replay even if the range overlaps one replayed before")
    parser.add_argument("--reason-like", default=None,
                        help="only dead letters whose reason matches this SQL LIKE pattern, "
                             "e.g. \"missing required field 'user_id'%%\"")
    parser.add_argument("--since", type=_since, default=None,
                        help="only dead letters dead-lettered at or after this ISO-8601 time (UTC if no zone)")
    parser.add_argument("--dry-run", action="store_true", help="read and decode, count, write nothing")
    parser.add_argument("--compact", action="store_true", help="print the JSON on one line")
    parser.set_defaults(func=_replay, _parser=parser)


def validate(args: argparse.Namespace) -> None:
    """Option combinations argparse cannot express; a usage error (exit 2) names the option."""
    parser = args._parser
    if args.dead_letters:
        for name in ("from_offset", "to_offset"):
            if getattr(args, name) is not None:
                parser.error(f"--{name.replace('_', '-')} belongs to a range replay, not --dead-letters")
        if args.force:
            parser.error("--force belongs to a range replay; dead letters are never replayed twice")
    else:
        if args.from_offset is None or args.to_offset is None:
            parser.error("a range replay needs --partition, --from-offset and --to-offset")
        if args.reason_like is not None or args.since is not None:
            parser.error("--reason-like and --since filter dead letters; add --dead-letters")
