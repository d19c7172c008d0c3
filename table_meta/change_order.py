"""Which change of a key is the newer: the one rule (docs/cdc.md#order), written once as SQL
that Spark runs in the merge (merge/order.py) and DuckDB in a fresh read of a primary-key
table (fresh/keyed.py). What the two dialects write differently is in `Dialect`, nowhere else.

A change's **sequence** is `table.sequence_field` when the config sets one (encoded as ordered
text, table_meta/changelog.encode_sequence), else its source position (`_source_seq`, a Debezium
connector's log position), else none. Then, of two changes of one key:

1. both have a sequence and they differ: the greater sequence is the newer;
2. else, on the same Kafka partition: the greater offset is the newer (Kafka's own order);
3. else (different partitions, equal or missing sequences): the later source time
   (`_source_ts`) where both have one and they differ; failing that, against the state a
   table already holds, the arriving change is the newer (it was read after the one merged);
   inside one batch a delete is the newer, then the greater offset; where even the offsets
   are equal (two partitions), the greater partition number, so that every engine keeps the
   same change (it says nothing of which came first).

Inside one batch a change without a sequence takes the last sequence before it in its
partition (an upsert tombstone carries no sequence_field value: it deletes the key at the
point of its partition where it stands). The batch's last change of a key is found in two
steps, each a total order: per key and partition by (sequence, offset), then across the
partitions by (sequence, source time, delete first, offset, partition).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.types import DateType, IcebergType, IntegerType, LongType, StringType, TimestampType, TimestamptzType

from streamberg.table_meta.changelog import DELETE, OFFSET, OP, PARTITION, SOURCE_TS

# The facts of a change the rule reads, by role.
ROLES = ("seq", "partition", "offset", "source_ts")


@dataclass(frozen=True)
class Dialect:
    """How one engine writes what the rule needs."""

    name: str
    identifier_quote: str
    last_non_null: str  # a window function: the last non-null {expr} of the frame
    timestamp_micros: str  # microseconds since the epoch of a timestamp {expr}
    date_days: str  # days since the epoch of a date {expr}

    def quote(self, name: str) -> str:
        q = self.identifier_quote
        return q + name.replace(q, q + q) + q


SPARK = Dialect("spark", "`", "last({expr}, true)", "unix_micros({expr})", "unix_date({expr})")
DUCKDB = Dialect("duckdb", '"', "last_value({expr} IGNORE NULLS)", "epoch_us({expr})",
                 "CAST({expr} - DATE '1970-01-01' AS BIGINT)")

# An int or long is shifted by 2^63 before it is written, so negative values order too.
SHIFT = 2**63


@dataclass(frozen=True)
class ChangeColumns:
    """The names of a batch's columns the rule reads (the engines name their working columns)."""

    keys: tuple[str, ...]
    seq: str
    op: str = OP
    partition: str = PARTITION
    offset: str = OFFSET
    source_ts: str = SOURCE_TS

    def of(self, role: str) -> str:
        return str(getattr(self, role))


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def last_changes_sql(dialect: Dialect, source: str, columns: list[str], names: ChangeColumns, rank: str) -> str:
    """A query over `source` (a relation with `columns`) that keeps, per key, the newest of its
    changes (the rule above), every column as it came, the sequence filled within partitions.
    `rank`: a working column's name no column of `source` takes."""
    q = dialect.quote
    keys = ", ".join(q(k) for k in names.keys)
    seq, partition, offset = q(names.seq), q(names.partition), q(names.offset)
    others = ", ".join(q(c) for c in columns if c != names.seq)
    every = ", ".join(q(c) for c in columns)
    fill = dialect.last_non_null.format(expr=seq)
    return (
        f"WITH filled AS (SELECT {others}, {fill} OVER (PARTITION BY {keys}, {partition} ORDER BY {offset} "
        f"ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS {seq} FROM {source}), "
        f"here AS (SELECT {every}, row_number() OVER (PARTITION BY {keys}, {partition} "
        f"ORDER BY {seq} DESC NULLS LAST, {offset} DESC) AS {q(rank)} FROM filled), "
        f"newest AS (SELECT {every}, row_number() OVER (PARTITION BY {keys} ORDER BY {seq} DESC NULLS LAST, "
        f"{q(names.source_ts)} DESC NULLS LAST, ({q(names.op)} = {_literal(DELETE)}) DESC, {offset} DESC, {partition} DESC) "
        f"AS {q(rank)} FROM here WHERE {q(rank)} = 1) "
        f"SELECT {every} FROM newest WHERE {q(rank)} = 1")


def newer_than_stored_sql(mine: dict[str, str], theirs: dict[str, str], recovering: bool) -> str:
    """A boolean SQL expression: whether a batch's last change of a key applies over what the
    key state holds for it. `mine` and `theirs` give each role (ROLES) as an expression of the
    engine's (quoted, qualified); the stored partition is null where the key has no state.
    `recovering`: the key state holds what the last merge recorded and the table never got (it
    was killed between the two commits), so a change equal to the stored one applies again
    instead of being skipped as a repeat."""
    seq, stored_seq = mine["seq"], theirs["seq"]
    ts, stored_ts = mine["source_ts"], theirs["source_ts"]
    offset_rule = ">=" if recovering else ">"
    return (f"CASE WHEN {theirs['partition']} IS NULL THEN true "
            f"WHEN {seq} IS NOT NULL AND {stored_seq} IS NOT NULL AND {seq} <> {stored_seq} THEN {seq} > {stored_seq} "
            f"WHEN {mine['partition']} = {theirs['partition']} THEN {mine['offset']} {offset_rule} {theirs['offset']} "
            f"WHEN {ts} IS NOT NULL AND {stored_ts} IS NOT NULL AND {ts} <> {stored_ts} THEN {ts} > {stored_ts} "
            f"ELSE true END")


def references(dialect: Dialect, names: ChangeColumns | dict[str, str], qualifier: str | None = None) -> dict[str, str]:
    """Each role's column as the dialect references it (`qualifier.`column where given)."""
    prefix = f"{qualifier}." if qualifier else ""
    named = names.of if isinstance(names, ChangeColumns) else names.__getitem__
    return {role: prefix + dialect.quote(named(role)) for role in ROLES}


def encoded_sequence_sql(dialect: Dialect, expr: str, field_type: IcebergType) -> str:
    """A `table.sequence_field`'s value as ordered text (null stays null): a string as it is;
    an int, long, date (days) or timestamp (microseconds) shifted by 2^63 and written as its
    digits' count and its digits (table_meta/changelog.encode_digits' form)."""
    if isinstance(field_type, StringType):
        return expr
    if isinstance(field_type, (TimestampType, TimestamptzType)):
        number = dialect.timestamp_micros.format(expr=expr)
    elif isinstance(field_type, DateType):
        number = dialect.date_days.format(expr=expr)
    elif isinstance(field_type, (IntegerType, LongType)):
        number = expr
    else:
        raise ValueError(f"a sequence column is int, long, date, timestamp or string, not {field_type}")
    digits = f"CAST(CAST({number} AS DECIMAL(20,0)) + CAST('{SHIFT}' AS DECIMAL(20,0)) AS STRING)"
    return f"lpad(CAST(length({digits}) AS STRING), 2, '0') || {digits}"
