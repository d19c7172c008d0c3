"""The same fresh read as a Spark DataFrame: Spark reads the pinned snapshot itself (Iceberg's
Spark runtime, `snapshot-id`), and the tail decoded by fresh/tail.py joins it as a DataFrame of
the same schema. Same bounds, same rows as `streamberg.fresh.read`. A primary-key table: the
keys its unmerged changes and tail touch leave Spark's rows, the rows they make join them
(fresh/keyed.py computes both).

    from streamberg.fresh.spark import spark_read
    frame, bounds = spark_read(spark, "fleet.yaml", "shop.events", row_filter="city = 'ams'")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamberg.common.config import StreambergConfig
from streamberg.common.spark import register_catalog
from streamberg.fresh.bounds import FreshBounds
from streamberg.fresh.read import DEFAULT_TIMEOUT_SECONDS, Until, plan_read


def spark_read(spark: Any, config: str | Path | StreambergConfig, identifier: str | None = None, *,
               columns: list[str] | None = None, row_filter: str | None = None, fresh: bool = True,
               timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS, until: Until = "now") -> tuple[Any, FreshBounds]:
    """A DataFrame of the table as of now (or of its current snapshot) and the read's bounds.
    `row_filter` is a filter both pyiceberg and Spark SQL read (`id > 5 and city = 'ams'`);
    `until` as streamberg.fresh.read's."""
    plan = plan_read(config, identifier, columns=columns, row_filter=row_filter, fresh=fresh,
                     timeout_seconds=timeout_seconds, until=until)
    name = f"{register_catalog(spark, plan.config.catalog)}.{plan.config.table.identifier}"
    reader = spark.read
    if plan.bounds.snapshot_id is not None:
        reader = reader.option("snapshot-id", str(plan.bounds.snapshot_id))
    frame = reader.table(name)
    if plan.bounds.snapshot_id is None:
        frame = frame.limit(0)
    if row_filter:
        frame = frame.where(row_filter)
    read_columns = plan.read_columns
    if read_columns:
        frame = frame.select(*read_columns)
    if not fresh:
        return frame, plan.bounds
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    schema = plan.table.schema()
    target = schema_to_pyarrow(schema.select(*read_columns) if read_columns else schema, include_field_ids=False)
    tail = plan.tail(timeout_seconds)
    if plan.keyed is not None:
        change = plan.keyed_delta(tail)
        if change.removed.num_rows:
            keys = frame.select(*plan.keyed.keys).schema
            removed = spark.createDataFrame(change.removed.select(plan.keyed.keys).to_pandas(), schema=keys)
            frame = frame.join(removed, on=plan.keyed.keys, how="left_anti")
        made, _ = plan.keyed_rows(target.empty_table(), change)
        if made.num_rows:
            frame = frame.unionByName(spark.createDataFrame(made.to_pandas(), schema=frame.schema))
        return (frame.select(*columns) if columns else frame), plan.bounds
    if tail.rows.num_rows:
        rows = plan.shaped(tail.rows, target)
        frame = frame.unionByName(spark.createDataFrame(rows.to_pandas(), schema=frame.schema))
    return frame, plan.bounds
