"""The merge's action for a keeper of many tables (table_meta/keeping.py): due while the change
log holds changes the table has not applied; urgency is the oldest pending change's age over
`merge.interval_seconds`. A primary-key table its first merge makes is due before it exists."""

from __future__ import annotations

import time
from typing import Any

from streamberg.table_meta.changelog import changelog_identifier, has_changelog, merge_position
from streamberg.table_meta.keeping import Due
from streamberg.table_meta.table_runtime import TableRuntime


class MergeExecutor:
    action = "merge"

    def enabled(self, table: TableRuntime) -> bool:
        return bool(table.policy.merge_enabled)

    def due(self, kept: TableRuntime, catalog: Any, engine: Any) -> Due | None:
        config, table = kept.settings, kept.table
        if not has_changelog(config):
            return None
        changelog = changelog_identifier(config)
        if not catalog.table_exists(changelog):
            return None
        position = merge_position(catalog.load_table(changelog), table)
        if position.up_to_date:
            return None
        age = time.time() - (position.oldest_pending_ms or 0) / 1000
        return Due(config.table.identifier, self.action, max(1.0, age / max(1.0, config.merge.interval_seconds)),
                   f"{position.pending_records} changes in {position.pending_snapshots} snapshots")

    def run(self, table: TableRuntime, spark: Any) -> dict[str, Any]:
        from streamberg.merge.app import MergeOptions, run_merge

        return run_merge(table.settings, MergeOptions(once=True), spark=spark)
