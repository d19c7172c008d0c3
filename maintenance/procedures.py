"""Runner: the Spark side of maintenance. Each method is one Iceberg operation, nothing more.

- expire: ``CALL <cat>.system.expire_snapshots(table, older_than, retain_last)``.
- orphans: Iceberg's ``DeleteOrphanFiles`` Spark action (through py4j), not the
  ``remove_orphan_files`` procedure: the procedure refuses any ``older_than`` under 24 hours
  ("use the Action API"), while streamberg's floor is a configurable safety age (1 hour
  unless overridden). The action is given a delete function that only collects the paths
  (a ``java.util.stream.Stream.Builder`` is a ``Consumer<String>``), so it finds orphans
  and deletes nothing; the service sizes them, then ``delete_files`` deletes them through
  the table's FileIO.
  One directory listing serves both the dry run and the real run.
- manifests: ``CALL <cat>.system.rewrite_manifests(table)``.
- retention: Spark SQL ``DELETE FROM <table> WHERE <column> < <cutoff>``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamberg.common.config import TableTarget
from streamberg.common.jvm import IcebergFailure, iceberg_failure, iterate, load_table
from streamberg.common.spark import activate
from streamberg.maintenance.planner import ExpirePlan, RetentionPlan


def _timestamp_literal(ms: int) -> str:
    import datetime as dt

    moment = dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc)
    return f"TIMESTAMP '{moment.strftime('%Y-%m-%d %H:%M:%S.%f')}'"


def _quote(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"


def lost_commit_race(exc: BaseException) -> bool:
    """Iceberg gave up committing because other commits kept winning (CommitFailedException)."""
    return iceberg_failure(exc) is IcebergFailure.COMMIT_FAILED


class MaintenanceRunner:
    """Executes planned maintenance operations on one table with one SparkSession."""

    def __init__(self, spark: Any, target: TableTarget) -> None:
        self.spark = spark
        self.catalog = target.catalog.name
        self.identifier = target.identifier
        self.spark_table = target.spark_name

    def _call(self, procedure: str, **args: str) -> dict[str, Any]:
        activate(self.spark)
        rendered = ", ".join([f"table => '{self.identifier}'", *(f"{k} => {v}" for k, v in args.items())])
        rows = self.spark.sql(f"CALL {self.catalog}.system.{procedure}({rendered})").collect()
        return rows[0].asDict() if rows else {}

    def expire_snapshots(self, plan: ExpirePlan) -> dict[str, int]:
        """Counts of deleted files by kind, as Iceberg reports them."""
        row = self._call("expire_snapshots", older_than=_timestamp_literal(plan.older_than_ms),
                         retain_last=str(plan.retain_last))
        return {k: int(v or 0) for k, v in row.items()}

    def find_orphans(self, older_than_ms: int) -> list[str]:
        """Files under the table location, older than the cutoff, referenced by no snapshot or
        metadata file (Iceberg's DeleteOrphanFiles logic); nothing is deleted here."""
        activate(self.spark)
        jvm = self.spark._jvm
        table = load_table(self.spark, self.spark_table)
        collect_only = jvm.java.util.stream.Stream.builder()
        result = (jvm.org.apache.iceberg.spark.actions.SparkActions.get(self.spark._jsparkSession)
                  .deleteOrphanFiles(table).olderThan(older_than_ms).deleteWith(collect_only).execute())
        return sorted(str(p) for p in iterate(result.orphanFileLocations()))

    def delete_files(self, paths: list[str], check: Callable[[str], str | None] | None = None) -> dict[str, str]:
        """Delete through the table's Java FileIO, as Iceberg's own actions do (on a local
        warehouse, Hadoop's file system then removes each file's .crc sidecar with it).

        `check(path)` runs just before each delete; a reason it returns skips the path.
        Returns {skipped path: reason}."""
        activate(self.spark)
        io = load_table(self.spark, self.spark_table).io()
        skipped = {}
        for path in paths:
            reason = check(path) if check is not None else None
            if reason is not None:
                skipped[path] = reason
                continue
            io.deleteFile(path)
        return skipped

    def rewrite_manifests(self) -> dict[str, int]:
        row = self._call("rewrite_manifests")
        return {k: int(v or 0) for k, v in row.items()}

    def count_older_than(self, plan: RetentionPlan) -> int:
        activate(self.spark)
        query = f"SELECT count(*) AS n FROM {self.spark_table} WHERE {_quote(plan.column)} < {plan.sql_literal()}"
        return int(self.spark.sql(query).collect()[0]["n"])

    def delete_older_than(self, plan: RetentionPlan) -> None:
        activate(self.spark)
        self.spark.sql(f"DELETE FROM {self.spark_table} WHERE {_quote(plan.column)} < {plan.sql_literal()}")
