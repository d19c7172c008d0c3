"""Runner: rewrites one file group into new files with Iceberg's staged-rewrite machinery.

The same path Iceberg's own ``rewrite_data_files`` action takes (SparkShufflingFileRewriteRunner):

1. the group's FileScanTasks (planned at the plan's starting snapshot) are staged in Iceberg's
   ``ScanTaskSetManager`` under a fresh id;
2. ``spark.read.format("iceberg").option("scan-task-set-id", id)`` reads exactly those files
   (with any delete files applied);
3. the run's ``Layout`` orders the rows (and, for bin-pack, sets the read splits);
4. the write with ``rewritten-file-scan-task-set-id`` does not commit: Iceberg's
   ``FileRewriteCoordinator`` collects the new DataFiles for the commit manager.

A runner never commits; the commit manager (commit.py) does, after all groups of a batch.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from streamberg.common.errors import GroupRewriteError
from streamberg.common.jvm import iterate, java_list, java_message
from streamberg.common.log import get_logger
from streamberg.compactor.iceberg_scan import (
    DISTRIBUTION_MODE,
    OUTPUT_SPEC_ID,
    REWRITTEN_FILE_SCAN_TASK_SET_ID,
    SCAN_TASK_SET_ID,
    TARGET_FILE_SIZE_BYTES,
    USE_TABLE_DISTRIBUTION_AND_ORDERING,
)
from streamberg.compactor.layouts import Layout
from streamberg.compactor.planner import FileGroup


@dataclass
class RewriteResult:
    """New files written for a group, not yet committed."""

    group: FileGroup
    old_files: list[Any]  # Java DataFile objects being replaced
    new_files: list[Any]  # Java DataFile objects written
    bytes_out: int
    records_out: int
    seconds: float

    @property
    def files_out(self) -> int:
        return len(self.new_files)

    @property
    def new_paths(self) -> list[str]:
        return [str(f.location()) for f in self.new_files]


class GroupRunner:
    """Rewrites groups of one table with one layout into files of `target_file_size_bytes`."""

    def __init__(self, spark: Any, spark_table: str, jtable: Any, layout: Layout, target_file_size_bytes: int) -> None:
        self.spark = spark
        self.spark_table = spark_table
        self.jtable = jtable
        self.layout = layout
        self.target_file_size_bytes = target_file_size_bytes
        self.log = get_logger("compactor.runner", table=spark_table, strategy=layout.strategy)

    def rewrite(self, group: FileGroup, tasks: list[Any], *, has_deletes: bool = False) -> RewriteResult:
        jvm = self.spark._jvm
        started = time.monotonic()
        set_id = f"streamberg-{uuid.uuid4()}"
        manager = jvm.org.apache.iceberg.spark.ScanTaskSetManager.get()
        coordinator = jvm.org.apache.iceberg.spark.FileRewriteCoordinator.get()
        num_files = group.expected_output_files(self.target_file_size_bytes)
        try:
            manager.stageTasks(self.jtable, set_id, java_list(self.spark, tasks))
            reader = self.spark.read.format("iceberg").option(SCAN_TASK_SET_ID, set_id)
            for key, value in self.layout.read_options(group.size_bytes, num_files).items():
                reader = reader.option(key, value)
            rows = reader.load(self.spark_table)
            laid_out = self.layout.apply(rows, num_files, row_count=group.record_count, seed=group.index)
            (laid_out.write.format("iceberg")
             .option(REWRITTEN_FILE_SCAN_TASK_SET_ID, set_id)
             .option(TARGET_FILE_SIZE_BYTES, str(self.target_file_size_bytes))
             .option(USE_TABLE_DISTRIBUTION_AND_ORDERING, "false")
             .option(DISTRIBUTION_MODE, "none")
             .option(OUTPUT_SPEC_ID, str(group.spec_id))
             .mode("append")
             .save(self.spark_table))
            new_files = iterate(coordinator.fetchNewFiles(self.jtable, set_id))
        except Exception as exc:
            raise GroupRewriteError(
                f"group {group.index} ({group.partition_path}, {len(group.files)} files): {java_message(exc)}"
            ) from exc
        finally:
            manager.removeTasks(self.jtable, set_id)
            coordinator.clearRewrite(self.jtable, set_id)
        result = RewriteResult(
            group=group,
            old_files=[t.file() for t in tasks],
            new_files=new_files,
            bytes_out=sum(int(f.fileSizeInBytes()) for f in new_files),
            records_out=sum(int(f.recordCount()) for f in new_files),
            seconds=time.monotonic() - started,
        )
        # A rewrite must keep every row. Without delete files the counts must match exactly;
        # with deletes applied the output can only shrink.
        if result.records_out != group.record_count and (not has_deletes or result.records_out > group.record_count):
            delete_files(self.jtable, result.new_paths)
            raise GroupRewriteError(
                f"group {group.index} ({group.partition_path}): wrote {result.records_out} records "
                f"for {group.record_count} read; new files removed, nothing committed"
            )
        self.log.info("group rewritten", group=group.index, partition=group.partition_path,
                      files_in=len(group.files), files_out=result.files_out, bytes_in=group.size_bytes,
                      bytes_out=result.bytes_out, records=result.records_out, seconds=round(result.seconds, 3))
        return result


def delete_files(jtable: Any, paths: list[str]) -> None:
    """Remove files that were written but will never be committed (best effort)."""
    io = jtable.io()
    for path in paths:
        try:
            io.deleteFile(path)
        except Exception:  # noqa: BLE001 - an orphan file is harmless; remove_orphan_files cleans it
            pass
