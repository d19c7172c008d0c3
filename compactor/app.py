"""Entry point shared by `streamberg compact`, the governor's compact action and tests: lease,
Spark, then watch (continuous, or `--once` until nothing is pending), one full pass, or one
pass planned from the table (the governor's action)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from streamberg.common.catalog import state_engine
from streamberg.common.catalog_open import close_catalog
from streamberg.common.catalog_wait import open_existing_table
from streamberg.common.config import StreambergConfig
from streamberg.common.errors import CompactError
from streamberg.common.log import get_logger
from streamberg.common.spark import session_for
from streamberg.compactor.compactor import Compactor
from streamberg.compactor.layouts import resolve_layout
from streamberg.compactor.lease import TableLease
from streamberg.compactor.planner import PassPlanner, describe
from streamberg.compactor.watcher import SnapshotWatcher
from streamberg.table_meta.table_files import ManifestCache
from streamberg.table_meta.table_runtime import TableRuntime


@dataclass(frozen=True)
class CompactOptions:
    once: bool = False
    full: bool = False
    # One incremental pass planned from the table, with no streaming query: the governor's
    # action. It probed the table due already, and a pass plans every pending file from the
    # table (watcher.py), so a stream's offsets would add only a query's start-up and its
    # checkpoint's writes to each compaction.
    planned: bool = False
    dry_run: bool = False
    strategy: str | None = None
    columns: list[str] | None = None


def dry_run(config: StreambergConfig, options: CompactOptions, table: Any = None,
            cache: ManifestCache | None = None) -> dict[str, Any]:
    """What a pass would rewrite now, without Spark and without the lease (of `table` when
    the caller has it loaded already; `cache`: the manifests a keeper of many tables keeps)."""
    if table is None:
        _, table = open_existing_table(config, "compactor", CompactError)
    config = TableRuntime.of(config, table).settings  # the table's own streamberg.* settings over the config's
    layout = resolve_layout(config.compactor, options.strategy, options.columns, table, config.table.identifier)
    plan = PassPlanner(config.compactor, config.target, layout.columns, cache).plan(
        table, "full" if options.full else "incremental")
    return {
        "table": config.table.identifier, "dry_run": True, "strategy": layout.strategy, "columns": list(layout.columns),
        **describe(plan),
        "groups_detail": [{"partition": g.partition_path, "files": len(g.files), "bytes": g.size_bytes,
                           "reasons": list(g.reasons)} for g in plan.groups],
        "deferred_detail": [{"partition": d.partition_path, "files": d.files, "bytes": d.size_bytes,
                             "oldest_age_seconds": None if d.oldest_age_seconds is None else round(d.oldest_age_seconds, 1)}
                            for d in plan.deferred],
    }


def run_compact(config: StreambergConfig, options: CompactOptions, *, spark: Any = None,
                stop: threading.Event | None = None) -> dict[str, Any]:
    """Run the compactor as the CLI does; returns the summary it prints.

    `spark`: an existing session (tests); otherwise one is built from the config and stopped
    at the end. `stop`: ends continuous mode when set (SIGINT/SIGTERM set it in the CLI).
    """
    if options.dry_run:
        return dry_run(config, options)
    continuous = not (options.once or options.full or options.planned)
    # Only the continuous service waits for the table: a one-off run (cron, tests) on a
    # missing table is an operator error to report at once.
    catalog, table = open_existing_table(config, "compactor", CompactError,
                                         config.compactor.wait_for_table_seconds if continuous else 0.0, stop)
    if table is None:  # stopped while waiting
        return {"table": config.table.identifier, "mode": "continuous", "batches": 0,
                "stopped_before_table_existed": True}
    # The table's own streamberg.* settings over the config's (table_meta/table_runtime.TableRuntime): a table
    # is compacted alike whoever keeps it (this command, `run`, the governor).
    config = TableRuntime.of(config, table).settings
    # Bad columns fail before Spark starts.
    layout = resolve_layout(config.compactor, options.strategy, options.columns, table, config.table.identifier)
    log = get_logger("compactor", table=config.table.identifier)
    lease = TableLease(state_engine(config.catalog, catalog), config.catalog.name, config.table.identifier, config.compactor.lease_ttl_seconds)
    try:
        from streamberg.common.errors import LeaseHeldError

        lease.acquire(config.compactor.lease_wait_seconds)
    except LeaseHeldError as exc:
        raise CompactError(str(exc)) from None
    started = time.monotonic()
    try:
        with session_for(config.catalog, config.compactor.spark_master, config.compactor.spark_conf,
                         given=spark) as spark:
            compactor = Compactor(config.compactor, config.target, spark, lease=lease, catalog=catalog, layout=layout)
            summary: dict[str, Any] = {"table": config.table.identifier, "strategy": compactor.strategy,
                                       "columns": list(compactor.columns), "run_id": compactor.run_id}
            if options.full:
                report = compactor.run_pass(mode="full")
                summary.update({"mode": "full", "batches": 0, **report.totals()})
            elif options.planned:
                report = compactor.run_pass()
                summary.update({"mode": "pass", "batches": 0, **report.totals()})
            else:
                from streamberg.common.errors import StreamFailed

                watcher = SnapshotWatcher(compactor, once=options.once)
                try:
                    watch = watcher.run(stop)
                except StreamFailed as exc:
                    raise CompactError(str(exc)) from exc
                summary.update({"mode": "once" if options.once else "continuous", "batches": watch.batches,
                                **watch.totals()})
            current = compactor.load().current_snapshot()
            summary["table_data_files"] = int(current.summary["total-data-files"]) if current and current.summary else 0
            summary["seconds"] = round(time.monotonic() - started, 3)
            log.info("compactor finished", **summary)
            return summary
    finally:
        lease.release()
        close_catalog(catalog)  # a stopped query's callback can outlive the run, holding it

