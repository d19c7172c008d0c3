"""The governor's column lifecycle (table_meta/column_lifecycle.py): drop the columns no query
reads, on a table whose policy says `streamberg.columns.drop_unused=true` and acknowledges
which engines read it (`streamberg.columns.reporting_engines`), and nowhere else.

Due when the table's scan statistics (catalog.scan_reports_dir) prove columns unused over a
whole window with each column present (table_meta/query_stats.unused_columns) that are not
protected; the run reads the table and the statistics again, drops them and records them as
ignored fields, and what was dropped, when and why, in one commit of the table's metadata (no
data file is touched: the next rewrite of each file leaves their bytes behind). Undo: remove
the name from `streamberg.ingest.ignored-fields`, then `streamberg table --evolve` (a declared
column) or schema evolution (`add`) brings the column back for new records (docs/governor.md).
"""

from __future__ import annotations

import json
import time
from typing import Any

from streamberg.common.catalog import shared_catalog
from streamberg.common.log import get_logger
from streamberg.table_meta.column_lifecycle import (
    DROPPED_PROPERTY,
    IGNORED_FIELDS_PROPERTY,
    MAX_DROP_LOG,
    MAX_IGNORED,
    droppable,
    ignored_fields,
)
from streamberg.table_meta.keeping import Due
from streamberg.table_meta.policy import TablePolicy
from streamberg.table_meta.query_stats import usage
from streamberg.table_meta.table_runtime import TableRuntime


def unused_columns(kept: TableRuntime) -> tuple[list[str], dict[str, str], float]:
    """(droppable, kept with why, the days) by the table's statistics and policy, with its
    effective settings (its clustering columns are `auto`'s choice where the table says `auto`)."""
    config, table, policy = kept.settings, kept.table, kept.policy
    days = policy.unused_after_days
    folder = config.catalog.scan_reports_dir
    if not folder or not _acknowledged(policy):
        return [], {}, days
    found = usage(str(folder), config.table.identifier, kept.column_facts(), days)
    unused = (found or {}).get("unused_columns") or []
    drop, kept = droppable(config, table, unused)
    return drop, kept, days


def _acknowledged(policy: TablePolicy) -> bool:
    return policy.drop_unused and bool(policy.reporting_engines)


def _drop_log(properties: dict[str, str], entries: list[dict[str, Any]]) -> str:
    try:
        earlier = json.loads(properties.get(DROPPED_PROPERTY) or "[]")
    except (ValueError, RecursionError):
        earlier = []
    earlier = [e for e in earlier if isinstance(e, dict)] if isinstance(earlier, list) else []
    return json.dumps((earlier + entries)[-MAX_DROP_LOG:], separators=(",", ":"))


class DropColumnsExecutor:
    action = "drop-columns"

    def enabled(self, table: TableRuntime) -> bool:
        return _acknowledged(table.policy)

    def due(self, table: TableRuntime, catalog: Any, engine: Any) -> Due | None:
        if table.table is None:
            return None
        config = table.settings
        drop, kept, days = unused_columns(table)
        if not drop:
            return None
        why = f"no scan read {', '.join(drop)} in {days:g} days: dropped and ignored by the ingest"
        if kept:
            why += f" (kept: {', '.join(f'{c} ({w})' for c, w in sorted(kept.items()))})"
        return Due(config.table.identifier, self.action, 1.0, why)

    def run(self, kept_table: TableRuntime, spark: Any) -> dict[str, Any]:
        """Drop what is still unused and unprotected now (the table and its policy read again:
        the statistics may have moved since the probe, its properties been changed), recording
        the names the ingest ignores and the drop itself, in one commit."""
        config = kept_table.config
        log = get_logger("maintenance.columns", table=config.table.identifier)
        now = kept_table.refreshed(shared_catalog(config.catalog).load_table(config.table.identifier))
        table = now.table
        if not _acknowledged(now.policy):
            return {"dropped": [], "kept": {}, "why": "the table's policy no longer drops columns"}
        drop, kept, days = unused_columns(now)
        if not drop:
            return {"dropped": [], "kept": kept}
        names = sorted(ignored_fields(table.properties) | set(drop))[:MAX_IGNORED]
        schema = table.schema()
        engines = now.policy.reporting_engines
        why = f"no scan reported by {', '.join(engines)} read it in {days:g} days"
        fields = [schema.find_field(name) for name in drop]
        entries = [{"column": f.name, "field_id": f.field_id, "type": str(f.field_type), "at": round(time.time(), 3),
                    "why": why} for f in fields]
        with table.transaction() as transaction:
            with transaction.update_schema() as update:
                for name in drop:
                    update.delete_column(name)
            transaction.set_properties({IGNORED_FIELDS_PROPERTY: json.dumps(names),
                                        DROPPED_PROPERTY: _drop_log(dict(table.properties), entries)})
        snapshot = table.refresh().current_snapshot()
        log.warning("unused columns dropped; the ingest ignores these fields from now on (undo: remove them from "
                    f"{IGNORED_FIELDS_PROPERTY}, docs/governor.md)", dropped=drop, why=why,
                    field_ids=[e["field_id"] for e in entries], unused_after_days=days, kept=kept,
                    ignored_fields=names, snapshot=snapshot.snapshot_id if snapshot is not None else None)
        return {"dropped": drop, "kept": kept, "ignored_fields": names}
