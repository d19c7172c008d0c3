"""Which change of a key is the newer: the one rule the merge applies (docs/cdc.md#order).

A change's **sequence** is `table.sequence_field` when the config sets one (encoded as ordered
text, common/changelog.encode_sequence), else its source position (`_source_seq`, a Debezium
connector's log position, ingest/decode/envelopes/source_position.py), else none. Then, of two changes of
one key:

1. both have a sequence and they differ: the greater sequence is the newer;
2. else, on the same Kafka partition: the greater offset is the newer (Kafka's own order);
3. else (different partitions, equal or missing sequences): the later source time
   (`_source_ts`) where both have one and they differ; failing that, against the state a
   table already holds, the arriving change is the newer (it was read after the one merged);
   inside one batch a delete is the newer, then the greater offset: deterministic, never the
   partition number.

Inside one merge batch a change without a sequence takes the last sequence before it in its
partition (an upsert tombstone carries no sequence_field value: it deletes the key at the
point of its partition where it stands). The batch's last change of a key is found in two
steps, each a total order: per key and partition by (sequence, offset), then across the
partitions by (sequence, source time, delete first, offset).

Spark working columns get names no column of the table has (`WorkingNames`): a source column
named like one of them never collides with the merge's own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pyiceberg.types import DateType, IcebergType, IntegerType, LongType, StringType, TimestampType, TimestamptzType

from streamberg.common.changelog import DELETE, OFFSET, OP, PARTITION, SOURCE_TS

# An int or long is shifted by 2^63 before it is written, so negative values order too.
_SHIFT = 2**63


class WorkingNames:
    """Names for the merge's own working columns that no column of the table takes."""

    def __init__(self, taken: Iterable[str]) -> None:
        self.taken = {t.lower() for t in taken}
        self.names: dict[str, str] = {}

    def __call__(self, base: str) -> str:
        if base not in self.names:
            name = f"_streamberg_{base}"
            while name.lower() in self.taken:
                name = "_" + name
            self.taken.add(name.lower())
            self.names[base] = name
        return self.names[base]


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def encoded_sequence(column: str, field_type: IcebergType) -> Any:
    """The Spark expression of a sequence_field's value as ordered text (null stays null)."""
    from pyspark.sql import functions as F

    value = F.col(quote(column))
    if isinstance(field_type, StringType):
        return value
    if isinstance(field_type, (TimestampType, TimestamptzType)):
        number = F.unix_micros(value)
    elif isinstance(field_type, DateType):
        number = F.unix_date(value)
    elif isinstance(field_type, (IntegerType, LongType)):
        number = value
    else:
        raise ValueError(f"a sequence column is int, long, date, timestamp or string, not {field_type}")
    digits = (number.cast("decimal(20,0)") + F.lit(str(_SHIFT)).cast("decimal(20,0)")).cast("string")
    return F.concat(F.lpad(F.length(digits).cast("string"), 2, "0"), digits)


def last_changes(changes: Any, keys: list[str], names: WorkingNames) -> Any:
    """Per key, the newest of its changes in a batch (rule above). `changes` has the key
    columns, OP, PARTITION, OFFSET, SOURCE_TS and the sequence in the column names("seq")."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    seq, rank = names("seq"), names("rank")
    key = [F.col(quote(k)) for k in keys]
    partition_order = Window.partitionBy(*key, F.col(PARTITION)).orderBy(F.col(OFFSET))
    filled = changes.withColumn(seq, F.last(F.col(seq), ignorenulls=True).over(
        partition_order.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
    per_partition = Window.partitionBy(*key, F.col(PARTITION)).orderBy(
        F.col(seq).desc_nulls_last(), F.col(OFFSET).desc())
    newest_here = filled.withColumn(rank, F.row_number().over(per_partition)).where(F.col(rank) == 1)
    across = Window.partitionBy(*key).orderBy(
        F.col(seq).desc_nulls_last(), F.col(SOURCE_TS).desc_nulls_last(),
        (F.col(OP) == DELETE).desc(), F.col(OFFSET).desc())
    return newest_here.withColumn(rank, F.row_number().over(across)).where(F.col(rank) == 1).drop(rank)


def newer_than_stored(seq: str, stored: dict[str, str], recovering: bool) -> Any:
    """Whether a batch's last change applies over the state the table holds for its key
    (`stored`: the key state's columns "seq", "partition", "offset", "source_ts" as joined,
    null when the key has none). `recovering`: the key state holds what the last merge
    recorded and the table never got (it was killed between the two commits), so a change
    equal to the stored one is applied again instead of skipped as a repeat."""
    from pyspark.sql import functions as F

    mine_seq, their_seq = F.col(seq), F.col(stored["seq"])
    same_partition = F.col(PARTITION) == F.col(stored["partition"])
    offset_rule = (F.col(OFFSET) >= F.col(stored["offset"])) if recovering else (F.col(OFFSET) > F.col(stored["offset"]))
    mine_ts, their_ts = F.col(SOURCE_TS), F.col(stored["source_ts"])
    return (F.when(F.col(stored["partition"]).isNull(), F.lit(True))
            .when(mine_seq.isNotNull() & their_seq.isNotNull() & (mine_seq != their_seq), mine_seq > their_seq)
            .when(same_partition, offset_rule)
            .when(mine_ts.isNotNull() & their_ts.isNotNull() & (mine_ts != their_ts), mine_ts > their_ts)
            .otherwise(F.lit(True)))
