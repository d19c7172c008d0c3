"""The compactor's Iceberg Java calls inside the Spark driver (what pyspark cannot reach).

Only small, metadata-sized calls cross this bridge: loading the Table, planning the scan
tasks of a plan's partitions, staging them, and committing a RewriteFiles. Row data never
passes through Python.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from pyiceberg.table import Table as PyTable

# Iceberg option names (org.apache.iceberg.spark.SparkReadOptions / SparkWriteOptions).
SCAN_TASK_SET_ID = "scan-task-set-id"
REWRITTEN_FILE_SCAN_TASK_SET_ID = "rewritten-file-scan-task-set-id"
SPLIT_SIZE = "split-size"
FILE_OPEN_COST = "file-open-cost"
TARGET_FILE_SIZE_BYTES = "target-file-size-bytes"
USE_TABLE_DISTRIBUTION_AND_ORDERING = "use-table-distribution-and-ordering"
DISTRIBUTION_MODE = "distribution-mode"
OUTPUT_SPEC_ID = "output-spec-id"


def partition_filter_json(table: PyTable, spec_id: int, partition: Sequence[Any]) -> dict[str, Any] | None:
    """Iceberg expression JSON selecting one partition, or None when it cannot be expressed.

    Transform terms (``bucket[4](user_id) == 2``) are evaluated exactly against partition
    values by Iceberg's scan planning. Values JSON cannot carry faithfully (decimals, binary,
    uuids) make the filter None: the caller then plans without pruning, which costs time but
    never correctness (tasks are matched by file path afterwards).
    """
    spec = table.specs()[spec_id]
    schema = table.schema()
    terms = []
    for field, value in zip(spec.fields, partition):
        transform = str(field.transform)
        if transform == "void":
            continue
        name = schema.find_column_name(field.source_id)
        if name is None:
            return None
        term: Any = name if transform == "identity" else {"type": "transform", "transform": transform, "term": name}
        if value is None:
            terms.append({"type": "is-null", "term": term})
        elif isinstance(value, (bool, int, str)) or (isinstance(value, float) and value == value):
            terms.append({"type": "eq", "term": term, "value": value})
        else:
            return None
    return _and_all(terms)


def _and_all(terms: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not terms:
        return None  # unpartitioned (or all-void) spec: nothing to prune on
    expr = terms[0]
    for term in terms[1:]:
        expr = {"type": "and", "left": expr, "right": term}
    return expr


def _or_balanced(terms: list[dict[str, Any]]) -> dict[str, Any]:
    if len(terms) == 1:
        return terms[0]
    mid = len(terms) // 2
    return {"type": "or", "left": _or_balanced(terms[:mid]), "right": _or_balanced(terms[mid:])}


def plan_scan_tasks(spark: Any, jtable: Any, snapshot_id: int, filters: Iterable[dict[str, Any] | None]) -> dict[str, Any]:
    """FileScanTasks (Java objects) of the table at `snapshot_id`, keyed by file location.

    One scan, pruned to the union of `filters` (a None filter means no pruning is possible).
    """
    filters = list(filters)
    jvm = spark._jvm
    # Planned on the same table without the catalog's metrics reporter: the compactor's own
    # scan reads every column, and as a scan report it would count as a query using them
    # (table_meta/query_stats.py: no column would ever be unused on a compacted table).
    unreported = jvm.org.apache.iceberg.BaseTable(jtable.operations(), jtable.name(),
                                                  jvm.org.apache.iceberg.metrics.InMemoryMetricsReporter())
    scan = unreported.newScan().useSnapshot(snapshot_id).ignoreResiduals()
    if filters and all(f is not None for f in filters):
        expr = jvm.org.apache.iceberg.expressions.ExpressionParser.fromJson(json.dumps(_or_balanced(filters)))
        scan = scan.filter(expr)
    tasks = jvm.org.apache.iceberg.relocated.com.google.common.collect.Lists.newArrayList(scan.planFiles())
    by_path = {}
    for i in range(tasks.size()):
        task = tasks.get(i)
        by_path[str(task.file().location())] = task
    return by_path
