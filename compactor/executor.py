"""The compactor's action for a keeper of many tables (`streamberg govern`): its due rule
beside its run (table_meta/keeping.py). Due when the planner finds groups to rewrite or finished
partitions to seal; urgency is the files waiting over `compactor.min_files`, raised where
deletes past their thresholds slow every read of a partition (merge-on-read)."""

from __future__ import annotations

import time
from typing import Any

from streamberg.common.config import StreambergConfig
from streamberg.table_meta.keeping import Due
from streamberg.table_meta.table_files import ManifestCache
from streamberg.table_meta.table_runtime import TableRuntime


class CompactExecutor:
    action = "compact"

    def __init__(self, replan_seconds: float, cache: ManifestCache | None = None) -> None:
        # A table whose metadata has not changed keeps its plan (planning reads manifests;
        # probing a hundred tables every round must stay cheap) for replan_seconds: the time
        # triggers (held-back files, idle partitions to finish) change a plan without a commit.
        self.replan_seconds = replan_seconds
        self._plan: tuple[tuple[Any, ...], float, dict[str, Any]] | None = None  # (key, made at, plan)
        # Shared by every table's executor (cli/govern.py): a replan of an unchanged table
        # neither reads nor parses a manifest again.
        self.cache = cache

    def enabled(self, table: TableRuntime) -> bool:
        return bool(table.policy.compact_enabled)

    def due(self, kept: TableRuntime, catalog: Any, engine: Any) -> Due | None:
        config, table = kept.settings, kept.table
        if table is None:
            return None
        plan = self.plan(config, table)
        if not (plan["groups"] or plan["seal_only"]):
            return None
        urgency = max(1.0, plan["files"] / max(1, config.compactor.min_files or 1))
        why = (f"{plan['files']} files ({plan['bytes'] / 1e6:.1f} MB) in {plan['groups']} groups"
               if plan["groups"] else f"{plan['seal_only']} finished partition(s) to seal")
        if deletes := plan.get("group_kinds", {}).get("deletes", 0):
            urgency = max(urgency, 2.0 * deletes)
            why += f"; deletes past their threshold in {deletes} partition(s)"
        return Due(config.table.identifier, self.action, urgency, why)

    def plan(self, config: StreambergConfig, table: Any) -> dict[str, Any]:
        from streamberg.compactor.app import CompactOptions, dry_run

        key = (table.metadata_location, config.compactor.model_dump_json())
        now = time.monotonic()
        if self._plan is not None and self._plan[0] == key and now - self._plan[1] < self.replan_seconds:
            return self._plan[2]
        plan = dry_run(config, CompactOptions(dry_run=True), table, self.cache)
        self._plan = (key, now, plan)
        return plan

    def run(self, table: TableRuntime, spark: Any) -> dict[str, Any]:
        from streamberg.compactor.app import CompactOptions, run_compact

        self._plan = None  # whatever ran, the next probe plans afresh
        # One pass planned from the table: the probe found it due, so no streaming query is
        # started for it (the continuous `streamberg compact` is the long-running form).
        return run_compact(table.settings, CompactOptions(planned=True), spark=spark)
