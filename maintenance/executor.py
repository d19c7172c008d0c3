"""Maintenance's action for a keeper of many tables (table_meta/keeping.py): due once
`maintenance.interval_seconds` passed since the table's last run (never run: due now);
urgency is that age over the interval. The last run is read from the runs table at most once
a minute, the time since then added (a probe of many tables stays cheap)."""

from __future__ import annotations

import json
import time
from typing import Any

from streamberg.common.config import StreambergConfig
from streamberg.table_meta.keeping import Due
from streamberg.table_meta.table_runtime import TableRuntime

READ_EVERY_SECONDS = 60.0


def maintenance_due(age_seconds: float | None, interval_seconds: float) -> float | None:
    """The urgency of maintenance after `age_seconds` since the last recorded run (None: never
    run), None while it is not due. The governor's (a governor started again reads the runs
    table, so it does not maintain a table again early); `streamberg maintain` alone asks the same
    scheduler for a pass every interval from its own first pass (table_meta/schedule.keep_alone)."""
    if age_seconds is None:
        return 1.0
    if age_seconds < interval_seconds:
        return None
    return age_seconds / max(1.0, interval_seconds)


class MaintainExecutor:
    action = "maintain"

    def __init__(self) -> None:
        self._read: tuple[float, float | None] | None = None  # (read at, age then)

    def enabled(self, table: TableRuntime) -> bool:
        return bool(table.policy.maintain_enabled)

    def due(self, kept: TableRuntime, catalog: Any, engine: Any) -> Due | None:
        config = kept.settings
        if kept.table is None:
            return None
        age = self.age(config, engine)
        urgency = maintenance_due(age, config.maintenance.interval_seconds)
        if urgency is None:
            return None
        return Due(config.table.identifier, self.action, urgency,
                   "never maintained" if age is None else f"last maintained {age:.0f} s ago")

    def age(self, config: StreambergConfig, engine: Any) -> float | None:
        from streamberg.table_meta.maintenance_runs import last_maintenance_run

        now = time.monotonic()
        if self._read is None or now - self._read[0] >= READ_EVERY_SECONDS:
            last = last_maintenance_run(config, engine=engine)
            self._read = (now, None if last is None else float(last["age_seconds"]))
        read_at, age = self._read
        return None if age is None else age + (now - read_at)

    def run(self, table: TableRuntime, spark: Any) -> dict[str, Any]:
        from streamberg.maintenance.app import MaintainOptions, run_maintain

        self._read = None
        summary = run_maintain(table.settings, MaintainOptions(once=True), spark=spark)
        if summary.failed_runs:
            raise RuntimeError(f"maintenance failed: {json.dumps(summary.last)[:300]}")
        return {"runs": summary.runs}
