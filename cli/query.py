"""`streamberg query`: SQL in DuckDB over the tables of a config, committed or fresh."""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import re
import sys
from typing import Any

from streamberg.cli.errors import CommandError, UsageError

DESCRIPTION = """\
Runs one SQL query in DuckDB over the tables of a config (one table or many), each by its
identifier (namespace.table):

  streamberg query --config F "SELECT city, count(*) FROM shop.events GROUP BY city"
  streamberg query --config F --fresh --json "SELECT count(*) FROM shop.events WHERE id > 10"

Without --fresh a table is its current snapshot (what every engine sees). With --fresh it is
the table as of now, exact: the snapshot plus the Kafka records after the offsets the
snapshot recorded, up to each partition's end when the query started, decoded as the ingest
decodes them (a record the ingest dead-letters is not returned). Refused with the reason when
that cannot be exact: records deleted by Kafka's retention, a recreated topic, a partition
the table has not placed yet. A primary-key table read fresh is its state as of now (the
merge's rules over its change log and tail). With --fresh --until kept the tail ends where
the ingest's kept tail ends (ingest.keep_tail): exact to that end, a fraction of a second
behind Kafka, no broker round trip; where no live kept tail is on this machine, to Kafka's
end as without it. docs/fresh-read.md.

Only the tables the query names are read; --columns limits what is read of them. Prints a
table, or with --json one JSON object per row; --explain adds each table's snapshot, offsets,
watermarks and tail size to stderr. The query reads those tables and nothing else: DuckDB's
access to files, URLs and extensions is off (and cannot be turned back on by the query)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("query", help="SQL over the config's tables in DuckDB (--fresh: plus the Kafka tail)",
                                   description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the config file (one table or many)")
    parser.add_argument("--fresh", action="store_true", help="the tables as of now: snapshot plus Kafka tail")
    parser.add_argument("--until", choices=("now", "kept"), default="now",
                        help="--fresh: the tail to each partition's end now (default), or to where the kept tail ends")
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    parser.add_argument("--explain", action="store_true", help="each table's read (snapshot, offsets, tail) on stderr")
    parser.add_argument("--columns", default=None, metavar="A,B",
                        help="read only these columns of every table named (default: all)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="how long a fresh read waits for Kafka to hand over the tail (default 60)")
    parser.add_argument("sql", help="the query; tables by their identifiers")
    parser.set_defaults(func=_query)


def tables_named(sql: str, identifiers: list[str]) -> list[str]:
    """The identifiers the query names (as namespace.table, case-insensitive, quoted or not)."""
    found = []
    for identifier in identifiers:
        namespace, _, name = identifier.rpartition(".")
        pattern = (rf'(?<![\w."]){_part(namespace)}\s*\.\s*{_part(name)}(?![\w"])')
        if re.search(pattern, sql, flags=re.IGNORECASE):
            found.append(identifier)
    return found


def _part(name: str) -> str:
    return rf'(?:{re.escape(name)}|"{re.escape(name)}")'


def _query(args: argparse.Namespace) -> int:
    import duckdb

    from streamberg.common.errors import FreshReadRefused
    from streamberg.common.tables import config_tables
    from streamberg.fresh import read

    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
    try:  # a query that does not parse is refused before any table is read (exit 2)
        duckdb.extract_statements(args.sql)
    except duckdb.ParserException as exc:
        raise UsageError(f"DuckDB: {str(exc).splitlines()[0]}") from None
    tables = config_tables(args.config)
    named = tables_named(args.sql, sorted(tables.configs))
    if not named:
        raise UsageError(f"the query names none of the config's tables ({', '.join(sorted(tables.configs)[:20])})")
    connection = duckdb.connect(":memory:")
    for n, identifier in enumerate(named):
        try:
            result = read(tables.configs[identifier], columns=columns, fresh=args.fresh, timeout_seconds=args.timeout,
                          until=args.until)
        except FreshReadRefused as exc:
            raise CommandError(str(exc)) from None
        if args.explain:
            print(json.dumps({"explain": result.to_json()}), file=sys.stderr)
        namespace, _, name = identifier.rpartition(".")
        view = f"__streamberg_{n}"
        connection.register(view, result.rows)
        connection.execute(f'CREATE SCHEMA IF NOT EXISTS "{namespace}"')
        connection.execute(f'CREATE OR REPLACE VIEW "{namespace}"."{name}" AS SELECT * FROM {view}')
    # The query reads the tables given, nothing else: no files, no network, no extensions
    # (a query pasted from elsewhere cannot read the machine's files or reach a URL).
    connection.execute("SET enable_external_access=false")
    connection.execute("SET lock_configuration=true")
    try:
        cursor = connection.execute(args.sql)
    except (duckdb.ParserException, duckdb.BinderException) as exc:  # invalid input: exit 2
        raise UsageError(f"DuckDB: {str(exc).splitlines()[0]}") from None
    except duckdb.Error as exc:
        raise CommandError(f"DuckDB: {str(exc).splitlines()[0]}") from None
    names = [d[0] for d in cursor.description or []]
    rows = cursor.fetchall()
    if args.json:
        for row in rows:
            print(json.dumps(dict(zip(names, row)), default=_json_value))
    else:
        _print_table(names, rows)
    return 0


def _json_value(value: Any) -> Any:
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _print_table(names: list[str], rows: list[tuple]) -> None:
    text = [[("NULL" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(n)] + [len(r[i]) for r in text]) for i, n in enumerate(names)]
    print("  ".join(n.ljust(w) for n, w in zip(names, widths)))
    for row in text:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
