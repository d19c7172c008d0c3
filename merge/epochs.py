"""Source epochs in the merge (table_meta/source_epochs.py says what they are and why).

Three things, each over a merge batch's changes in Spark:
- the source names a batch brings that the change log's record lacks: each new one opens the
  next epoch (recorded before the batch is ordered, so its own changes are ordered by it);
- each change's sequence with its epoch before it;
- the regressions: a change of a key at a later offset of the same partition than another
  change of that key (in the batch, or the one the key state holds) whose sequence is smaller,
  with no epoch to explain it. They are counted, with the first offset per partition.
"""

from __future__ import annotations

from typing import Any

from streamberg.merge.order import WorkingNames, quote
from streamberg.table_meta.changelog import OFFSET, PARTITION, SOURCE_ID
from streamberg.table_meta.source_epochs import Epochs


def source_names(changes: Any, has_column: bool) -> tuple[list[str], dict[str, dict[int, int]]]:
    """The source names in a batch and, per name, the first offset per partition it has."""
    from pyspark.sql import functions as F

    if not has_column:
        return [], {}
    rows = (changes.where(F.col(SOURCE_ID).isNotNull()).groupBy(SOURCE_ID, PARTITION)
            .agg(F.min(OFFSET).alias("first")).collect())
    first: dict[str, dict[int, int]] = {}
    for row in rows:
        first.setdefault(row[SOURCE_ID], {})[int(row[PARTITION])] = int(row["first"])
    return sorted(first), first


def epoch_of(epochs: Epochs, source_id: Any) -> Any:
    """A change's epoch: the greater of its source name's and of the declared epochs its Kafka
    position falls in (a partition a declared epoch does not name is in it whole)."""
    from pyspark.sql import functions as F

    partition, offset = F.col(PARTITION), F.col(OFFSET)
    by_name = F.lit(0)
    if epochs.sources:
        pairs = [item for name, n in sorted(epochs.sources.items()) for item in (F.lit(name), F.lit(n))]
        by_name = F.coalesce(F.create_map(*pairs)[source_id], F.lit(0))
    by_position = F.lit(0)
    for epoch in sorted((e for e in epochs.epochs if e.source is None), key=lambda e: e.epoch):
        before = F.lit(False)
        for p, o in epoch.since.items():
            before = before | ((partition == F.lit(p)) & (offset < F.lit(o)))
        by_position = F.when(~before, F.lit(epoch.epoch)).otherwise(by_position)
    return F.greatest(by_name, by_position)


def with_epoch(sequence: Any, epoch: Any, epochs: Epochs) -> Any:
    """The sequence with its epoch before it (epoch 0 as it is; a null sequence stays null)."""
    from pyspark.sql import functions as F

    out = sequence
    for number, prefix in epochs.prefixes().items():
        out = F.when(epoch == F.lit(number), F.concat(F.lit(prefix), sequence)).otherwise(out)
    return out


def regressed(own: Any, keys: list[str], seq: str, stored: dict[str, str], names: WorkingNames) -> Any:
    """`own` (a batch's changes joined with the key state's `stored` columns) with a boolean
    column names("regressed"): a change whose sequence is smaller than that of an earlier
    change of its key in its partition, in the batch or the one the key state holds (at a
    lower offset of the same partition: a replay comes at or below it, and is not one)."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    earlier = (Window.partitionBy(*[F.col(quote(k)) for k in keys], F.col(PARTITION)).orderBy(F.col(OFFSET))
               .rowsBetween(Window.unboundedPreceding, -1))
    before_here = F.when((F.col(stored["partition"]) == F.col(PARTITION)) & (F.col(stored["offset"]) < F.col(OFFSET)),
                         F.col(stored["seq"]))
    highest = F.greatest(F.max(F.col(seq)).over(earlier), before_here)
    return own.withColumn(names("regressed"), F.col(seq).isNotNull() & highest.isNotNull() & (F.col(seq) < highest))


def first_offsets(frame: Any, flag: str) -> tuple[int, dict[int, int]]:
    """How many rows carry `flag`, and the first offset of them per partition."""
    from pyspark.sql import functions as F

    rows = frame.where(F.col(flag)).groupBy(PARTITION).agg(F.count(F.lit(1)).alias("n"),
                                                            F.min(OFFSET).alias("first")).collect()
    return sum(int(r["n"]) for r in rows), {int(r[PARTITION]): int(r["first"]) for r in rows}
