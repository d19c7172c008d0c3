"""The change-order rule (table_meta/change_order.py, the one text of it) as the merge runs it on
Spark, and the merge's own helpers: the sequence_field's encoding as a Spark expression and
working columns' names.

Spark working columns get names no column of the table has (`WorkingNames`): a source column
named like one of them never collides with the merge's own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from pyiceberg.types import IcebergType

from streamberg.table_meta.change_order import (
    SPARK,
    ChangeColumns,
    encoded_sequence_sql,
    last_changes_sql,
    newer_than_stored_sql,
    references,
)


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
    """The Spark expression of a sequence_field's value as ordered text (null stays null),
    table_meta/change_order.encoded_sequence_sql."""
    from pyspark.sql import functions as F

    return F.expr(encoded_sequence_sql(SPARK, quote(column), field_type))


def last_changes(changes: Any, keys: list[str], names: WorkingNames) -> Any:
    """Per key, the newest of its changes in a batch (table_meta/change_order.py). `changes` has
    the key columns, OP, PARTITION, OFFSET, SOURCE_TS and the sequence in the column names("seq")."""
    mark = f"streamberg_changes_{uuid.uuid4().hex}"  # where the DataFrame goes in the text
    text = last_changes_sql(SPARK, mark, list(changes.columns), ChangeColumns(tuple(keys), seq=names("seq")),
                            names("rank"))
    # spark.sql formats its text with the DataFrame's view: a brace of a column's name is escaped.
    text = text.replace("{", "{{").replace("}", "}}").replace(mark, "{changes}")
    return changes.sparkSession.sql(text, changes=changes)


def newer_than_stored(seq: str, stored: dict[str, str], recovering: bool) -> Any:
    """Whether a batch's last change applies over the state the table holds for its key
    (`stored`: the key state's columns "seq", "partition", "offset", "source_ts" as joined,
    null when the key has none), table_meta/change_order.newer_than_stored_sql."""
    from pyspark.sql import functions as F

    mine = references(SPARK, ChangeColumns((), seq=seq))
    theirs = references(SPARK, {"seq": stored["seq"], "partition": stored["partition"], "offset": stored["offset"],
                                "source_ts": stored["source_ts"]})
    return F.expr(newer_than_stored_sql(mine, theirs, recovering))
