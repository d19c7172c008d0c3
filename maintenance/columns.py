"""The governor's column lifecycle (common/column_lifecycle.py): drop the columns no query
reads, on a table whose policy says `streamberg.columns.drop_unused=true`, and nowhere else.

Due when the table's scan statistics (catalog.scan_reports_dir) list unused columns that are
not protected; the run drops them and records them as ignored fields in one commit of the
table's metadata (no data file is touched: the next rewrite of each file leaves their bytes
behind). A dry run of the governor shows what would go, with the statistics' evidence.
"""

from __future__ import annotations

import json
from typing import Any

from streamberg.common.catalog import load_catalog
from streamberg.common.column_lifecycle import IGNORED_FIELDS_PROPERTY, MAX_IGNORED, droppable, ignored_fields
from streamberg.common.config import StreambergConfig
from streamberg.common.keeping import Due
from streamberg.common.log import get_logger
from streamberg.common.policy import policy_of


def unused_columns(config: StreambergConfig, table: Any) -> tuple[list[str], dict[str, str], float]:
    """(droppable, kept with why, the days) by the table's statistics and policy."""
    from streamberg.common.query_stats import usage

    days = policy_of(table.properties).unused_after_days
    folder = config.catalog.scan_reports_dir
    if not folder:
        return [], {}, days
    found = usage(str(folder), config.table.identifier, [f.name for f in table.schema().fields], days)
    unused = (found or {}).get("unused_columns") or []
    drop, kept = droppable(config, table, unused)
    return drop, kept, days


class DropColumnsExecutor:
    action = "drop-columns"

    def enabled(self, switches: Any) -> bool:
        return bool(getattr(switches, "drop_unused", False))

    def due(self, config: StreambergConfig, table: Any, catalog: Any, engine: Any) -> Due | None:
        if table is None:
            return None
        drop, kept, days = unused_columns(config, table)
        if not drop:
            return None
        why = f"no scan read {', '.join(drop)} in {days:g} days: dropped and ignored by the ingest"
        if kept:
            why += f" (kept: {', '.join(f'{c} ({w})' for c, w in sorted(kept.items()))})"
        return Due(config.table.identifier, self.action, 1.0, why)

    def run(self, config: StreambergConfig, spark: Any) -> dict[str, Any]:
        """Drop what is still unused and unprotected now (read again: the statistics may have
        moved since the probe), recording the names the ingest ignores, in one commit."""
        log = get_logger("maintenance.columns", table=config.table.identifier)
        table = load_catalog(config.catalog).load_table(config.table.identifier)
        drop, kept, days = unused_columns(config, table)
        if not drop:
            return {"dropped": [], "kept": kept}
        names = sorted(ignored_fields(table.properties) | set(drop))[:MAX_IGNORED]
        with table.transaction() as transaction:
            with transaction.update_schema() as update:
                for name in drop:
                    update.delete_column(name)
            transaction.set_properties({IGNORED_FIELDS_PROPERTY: json.dumps(names)})
        snapshot = table.refresh().current_snapshot()
        log.warning("unused columns dropped; the ingest ignores these fields from now on", dropped=drop,
                    unused_after_days=days, kept=kept, ignored_fields=names,
                    snapshot=snapshot.snapshot_id if snapshot is not None else None)
        return {"dropped": drop, "kept": kept, "ignored_fields": names}
