"""One optimize pass: plan (planner.py) -> rewrite groups (runner.py) -> commit (commit.py).

``Compactor.run_pass`` is what each streaming micro-batch (watcher.py) and ``--full`` call.
It plans against the table's current snapshot, rewrites the selected groups in commit
batches (partial progress: at most ``max_commits`` commits per plan, each saved as soon as
its groups are written), and records every commit in its snapshot summary (record.py) and
in one structured log line.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table as PyTable

from streamberg.common.catalog import shared_catalog
from streamberg.common.config import CompactorConfig, TableTarget
from streamberg.common.errors import GroupRewriteError
from streamberg.common.jvm import iterate, java_message, load_table
from streamberg.common.log import get_logger
from streamberg.common.spark import activate
from streamberg.compactor import record
from streamberg.compactor.commit import CommitManager
from streamberg.compactor.iceberg_scan import partition_filter_json, plan_scan_tasks
from streamberg.compactor.layouts import Layout, resolve_layout
from streamberg.compactor.lease import TableLease
from streamberg.compactor.planner import PassPlanner, Plan, describe
from streamberg.compactor.runner import GroupRunner, RewriteResult
from streamberg.table_meta.pending import Mode
from streamberg.table_meta.summary_keys import SummaryKeys, TablePropertyKeys
from streamberg.table_meta.table_files import sealed_sequence_numbers


@dataclass
class CommitReport:
    snapshot_id: int | None
    status: str
    groups: int
    files_in: int
    files_out: int
    bytes_in: int
    bytes_out: int
    rebased_over: int
    attempts: int


@dataclass
class PassReport:
    mode: str
    batch_id: int | None
    plan: dict[str, Any]
    commits: list[CommitReport] = field(default_factory=list)
    groups_failed: int = 0
    seconds: float = 0.0

    @property
    def committed(self) -> list[CommitReport]:
        return [c for c in self.commits if c.status == "committed"]

    def totals(self) -> dict[str, int]:
        done = self.committed
        return {
            "commits": len(done),
            "groups": sum(c.groups for c in done),
            "files_in": sum(c.files_in for c in done),
            "files_out": sum(c.files_out for c in done),
            "bytes_in": sum(c.bytes_in for c in done),
            "bytes_out": sum(c.bytes_out for c in done),
            "conflicts": sum(1 for c in self.commits if c.status != "committed"),
            "groups_failed": self.groups_failed,
        }

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "batch_id": self.batch_id, "plan": self.plan, **self.totals(),
                "seconds": round(self.seconds, 3), "commit_details": [asdict(c) for c in self.commits]}


class Compactor:
    """Plans and runs optimize passes on one table with one SparkSession."""

    def __init__(self, settings: CompactorConfig, target: TableTarget, spark: Any, *, strategy: str | None = None,
                 columns: list[str] | None = None, lease: TableLease | None = None,
                 catalog: Catalog | None = None, layout: Layout | None = None) -> None:
        """`settings`: the `compactor` section; `target`: the catalog and table it optimizes.
        `catalog` and `layout`: as the caller already opened and resolved them (one
        `streamberg compact` run does both once); otherwise opened and resolved here, with
        `strategy`/`columns` overriding the settings."""
        self.settings = settings
        self.target = target
        self.spark = spark
        self.catalog = catalog if catalog is not None else shared_catalog(target.catalog)
        self.identifier = target.identifier
        self.spark_table = target.spark_name
        self.layout = layout if layout is not None else resolve_layout(settings, strategy, columns, self.load(),
                                                                        self.identifier)
        self.strategy, self.columns = self.layout.strategy, self.layout.columns
        self.planner = PassPlanner(settings, target, self.columns)
        self.lease = lease
        self.run_id = str(uuid.uuid4())
        self.log = get_logger("compactor", table=self.identifier, run_id=self.run_id, strategy=self.strategy,
                              columns=",".join(self.columns))

    def load(self) -> PyTable:
        return self.catalog.load_table(self.identifier)

    def plan(self, mode: Mode = "incremental", up_to_snapshot_id: int | None = None) -> tuple[PyTable, Plan]:
        table = self.load()
        return table, self.planner.plan(table, mode, up_to_snapshot_id=up_to_snapshot_id)

    def run_pass(self, mode: Mode = "incremental", *, batch_id: int | None = None,
                 up_to_snapshot_id: int | None = None) -> PassReport:
        started = time.monotonic()
        activate(self.spark)
        table, plan = self.plan(mode, up_to_snapshot_id)
        report = PassReport(mode=mode, batch_id=batch_id, plan=describe(plan))
        log = self.log.bind(mode=mode, batch_id=batch_id, plan_snapshot_id=plan.starting_snapshot_id)
        if not plan.groups:
            log.info("nothing to rewrite", **describe(plan),
                     deferred=[{"partition": d.partition_path, "files": d.files} for d in plan.deferred[:20]])
            if plan.seal_only:
                self._record_sealed(plan, plan.seal_only, log)
            report.seconds = time.monotonic() - started
            return report
        log.info("plan", **describe(plan))
        assert plan.starting_snapshot_id is not None and plan.starting_sequence_number is not None
        jtable = load_table(self.spark, self.spark_table)
        filters = [partition_filter_json(table, g.spec_id, g.partition) for g in plan.groups]
        tasks_by_path = plan_scan_tasks(self.spark, jtable, plan.starting_snapshot_id, filters)
        runner = GroupRunner(self.spark, self.spark_table, jtable, self.layout, self.planner.target_file_size(table))
        commits = CommitManager(
            self.spark, jtable, starting_snapshot_id=plan.starting_snapshot_id,
            starting_sequence_number=plan.starting_sequence_number, retries=self.settings.commit_retries,
            lease_check=self.lease.check if self.lease is not None else None, table=self.identifier,
        )
        batches = plan.commit_batches(self.settings.max_commits)
        sealed: list[str] = list(plan.seal_only)
        for k, batch in enumerate(batches, start=1):
            results: list[RewriteResult] = []
            for group in batch:
                tasks = [tasks_by_path.get(f.path) for f in group.files]
                if any(t is None for t in tasks):
                    report.groups_failed += 1
                    log.error("group files missing from Iceberg's scan at the plan snapshot; group skipped",
                              group=group.index, partition=group.partition_path)
                    continue
                try:
                    results.append(runner.rewrite(group, tasks, has_deletes=plan.has_delete_files))
                except GroupRewriteError as exc:
                    report.groups_failed += 1
                    log.error("group rewrite failed; its files stay pending", error=str(exc), group=group.index)
            if not results:
                continue
            summary = self._summary(plan, results, k, len(batches), batch_id)
            outcome = commits.commit(results, summary)
            entry = CommitReport(
                snapshot_id=outcome.snapshot_id, status=outcome.status, groups=len(results),
                files_in=sum(len(r.group.files) for r in results), files_out=sum(r.files_out for r in results),
                bytes_in=sum(r.group.size_bytes for r in results), bytes_out=sum(r.bytes_out for r in results),
                rebased_over=len(outcome.rebased_over), attempts=outcome.attempts,
            )
            report.commits.append(entry)
            if outcome.committed:
                sealed += [r.group.sealed_key for r in results if r.group.seal]
                log.info("optimize committed", snapshot_id=outcome.snapshot_id, commit=f"{k}/{len(batches)}",
                         groups=entry.groups, files_in=entry.files_in, files_out=entry.files_out,
                         bytes_in=entry.bytes_in, bytes_out=entry.bytes_out,
                         records=int(summary[SummaryKeys.COMPACTOR_RECORDS]), duration_ms=int(summary[SummaryKeys.COMPACTOR_DURATION_MS]),
                         covered_snapshots=len(summary[SummaryKeys.COMPACTOR_COVERED_SNAPSHOTS].split(",")),
                         rebased_over=entry.rebased_over, attempts=entry.attempts)
            elif outcome.status == "lease-lost":
                break
        if sealed:
            self._record_sealed(plan, sealed, log)
        if plan.has_delete_files and any(c.status == "committed" for c in report.commits):
            self._remove_dangling_deletes(jtable, log)
        report.seconds = time.monotonic() - started
        log.info("pass done", seconds=round(report.seconds, 3), **report.totals())
        return report

    def _remove_dangling_deletes(self, jtable: Any, log: Any) -> None:
        """Drop the delete files that no live data file can match any more: the rewrite read
        through them, so the rows they deleted are gone from the new files (Iceberg's
        RemoveDanglingDeleteFiles: by data sequence number per partition). A metadata commit
        under the same lease as the rewrite; skipped, not retried, when it loses a race (the
        next pass that commits tries again)."""
        if self.lease is not None:
            try:
                self.lease.check()
            except Exception as exc:  # noqa: BLE001 - any lease problem means: do not commit
                log.error("lease lost; dangling delete files left for the next pass", error=str(exc))
                return
        try:
            jtable.refresh()
            result = self.spark._jvm.org.apache.iceberg.spark.actions.SparkActions.get(
                self.spark._jsparkSession).removeDanglingDeleteFiles(jtable).execute()
            removed = len(iterate(result.removedDeleteFiles()))
        except Exception as exc:  # noqa: BLE001 - Py4JJavaError: logged, the next pass tries again
            log.warning("dangling delete files not removed", error=java_message(exc)[:500])
            return
        log.info("dangling delete files removed", files=removed)

    def _record_sealed(self, plan: Plan, keys: list[str], log: Any) -> None:
        """Record finished partitions as sealed up to the plan's data sequence number.

        A separate metadata commit after the rewrite: if it never lands (a crash between the
        two), the partition is one unsealed run, and the next pass seals it without a rewrite.
        Entries of partitions that no longer have live files are dropped.

        Checked against the one-compactor lease like every rewrite commit: a compactor that
        lost its lease writes nothing, not even this property (the new holder may be
        rewriting these partitions; its next pass finds them finished and seals them).
        """
        assert plan.starting_sequence_number is not None
        if self.lease is not None:
            try:
                self.lease.check()
            except Exception as exc:  # noqa: BLE001 - any lease problem means: do not commit
                log.error("lease lost; finished partitions not recorded as sealed", partitions=keys,
                          error=str(exc))
                return
        table = self.load()
        record = {k: v for k, v in sealed_sequence_numbers(table).items() if k in set(plan.live_partition_keys)}
        record.update({key: plan.starting_sequence_number for key in keys})
        jtable = load_table(self.spark, self.spark_table)
        jtable.updateProperties().set(TablePropertyKeys.COMPACTOR_SEALED, json.dumps(record, sort_keys=True)).commit()
        log.info("partitions sealed", partitions=keys, sealed_up_to_sequence_number=plan.starting_sequence_number)

    def _summary(self, plan: Plan, results: list[RewriteResult], k: int, n: int, batch_id: int | None) -> dict[str, str]:
        files = [f for r in results for f in r.group.files]
        covered = [s for _, s in sorted({(seq, sid) for r in results
                                         for seq, sid in ((f.sequence_number, f.snapshot_id) for f in r.group.files)
                                         if sid not in r.group.merged_runs})]
        summary = {
            SummaryKeys.COMPACTOR_RUN_ID: self.run_id,
            SummaryKeys.COMPACTOR_MODE: plan.mode,
            SummaryKeys.COMPACTOR_STRATEGY: self.strategy,
            SummaryKeys.COMPACTOR_COLUMNS: ",".join(self.columns),
            SummaryKeys.COMPACTOR_GROUPS: str(len(results)),
            SummaryKeys.COMPACTOR_COMMIT: f"{k}/{n}",
            SummaryKeys.COMPACTOR_FILES_IN: str(len(files)),
            SummaryKeys.COMPACTOR_FILES_OUT: str(sum(r.files_out for r in results)),
            SummaryKeys.COMPACTOR_BYTES_IN: str(sum(f.size_bytes for f in files)),
            SummaryKeys.COMPACTOR_BYTES_OUT: str(sum(r.bytes_out for r in results)),
            SummaryKeys.COMPACTOR_RECORDS: str(sum(r.records_out for r in results)),
            SummaryKeys.COMPACTOR_DURATION_MS: str(int(sum(r.seconds for r in results) * 1000)),
            SummaryKeys.COMPACTOR_PLAN_SNAPSHOT_ID: str(plan.starting_snapshot_id),
            SummaryKeys.COMPACTOR_COVERED_SNAPSHOTS: record.covered_value(covered),
        }
        if batch_id is not None:
            summary[SummaryKeys.COMPACTOR_BATCH_ID] = str(batch_id)
        kinds: dict[str, int] = {}
        for r in results:
            kinds[r.group.kind] = kinds.get(r.group.kind, 0) + 1
        summary[SummaryKeys.COMPACTOR_GROUP_KINDS] = ",".join(f"{k}:{v}" for k, v in sorted(kinds.items()))
        summary[SummaryKeys.COMPACTOR_RUNS_IN] = str(sum(len(r.group.merged_runs) for r in results))
        before = [r.group.files_per_point_before for r in results if r.group.files_per_point_before]
        if before:  # summed over the rewritten partitions: files a point query reads in them
            summary[SummaryKeys.COMPACTOR_FILES_PER_POINT] = json.dumps(
                {c: round(sum(b[c] for b in before), 3) for c in before[0]}, sort_keys=True)
        return summary
