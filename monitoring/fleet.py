"""`streamberg status` of a config of many tables: one line a table, worst first.

Each table's facts and verdict are the single-table ones (collect_status, with_health); the
tables are the routes' named topics' and the broker's topics that a route takes (as the
ingest routes them, common/config/resolve.resolve_fleet), and for a route by a record field
the tables its values made (the catalog's record of them). A table the ingest paused (its
commits kept failing, ingest/committers.py) is critical with the reason the run folder records;
a topic no table can take (a name colliding with another's table) is listed as refused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from streamberg.common.config import FleetConfig
from streamberg.common.tables import fleet_tables, paused_tables
from streamberg.monitoring.collect import governor_state
from streamberg.monitoring.model import Status
from streamberg.monitoring.refresh import StatusModel

_RANK = {"critical": 0, "warn": 1, "ok": 2}


@dataclass
class FleetStatus:
    tables: list[tuple[str, Status]] = field(default_factory=list)  # (topic, status), worst first
    paused: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # topic -> why it is not read
    refused_tables: dict[str, str] = field(default_factory=dict)  # a table found and not kept -> why
    broker_error: str | None = None
    governor: dict[str, Any] | None = None  # `streamberg govern`'s fleet line, when it runs

    @property
    def verdict(self) -> str:
        verdicts = [s.health.verdict for _, s in self.tables] + (["critical"] if self.paused else []) \
            + (["warn"] if self.refused or self.refused_tables else [])
        return min(verdicts, key=lambda v: _RANK[v]) if verdicts else "ok"

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "tables": [{"topic": t, **s.to_dict()} for t, s in self.tables],
                "paused": self.paused, "refused": self.refused,
                "refused_tables": self.refused_tables, "broker_error": self.broker_error,
                "governor": self.governor}


def collect_fleet(fleet: FleetConfig, model: StatusModel | None = None) -> FleetStatus:
    """Every table of the config (common/tables.fleet_tables: the one resolver), its status
    and verdict, worst first; paused tables and refused topics and tables named. `model`: the
    statuses kept from the last pass (monitoring/refresh.py; a long-running caller keeps one)."""
    model = model or StatusModel()
    tables = fleet_tables(fleet)
    settings = tables.run_settings
    assert settings is not None
    out = FleetStatus(broker_error=tables.broker_error, refused=dict(tables.refused_topics),
                      refused_tables=dict(tables.refused_tables))
    out.paused = paused_tables(settings.ingest.state_dir)
    governor = governor_state(settings)
    if governor is not None and isinstance(governor.get("fleet"), dict):
        out.governor = {**governor["fleet"], "written_age_seconds": governor["written_age_seconds"]}
    statuses = model.collect(tables.configs.values())
    out.tables.extend((tables.topics[identifier], status) for identifier, status in zip(tables.configs, statuses))
    sort_worst_first(out)
    return out


def sort_worst_first(status: FleetStatus) -> None:
    """Paused first, then critical, warn, ok; the most lag first within each."""
    status.tables.sort(key=lambda ts: (
        _RANK[ts[1].health.verdict] if ts[1].health is not None and ts[1].table not in status.paused else -1,
        -(ts[1].ingest.lag.total if ts[1].ingest.lag is not None else 0)))


def render_fleet(status: FleetStatus) -> str:
    """One line a table: verdict, last commit, lag, files waiting, dead letters, first reason."""
    lines = [f"{len(status.tables)} tables, verdict {status.verdict.upper()}"
             + (f"; broker not reached ({status.broker_error}): pattern routes' tables not listed"
                if status.broker_error else ""),
             f"{'verdict':<9}{'table':<40}{'last commit':>12}{'lag':>10}{'waiting':>9}{'dead':>7}  reason"]
    if (g := status.governor) is not None:
        lines.insert(1, f"governor: {g.get('tables_due', '?')} tables due, oldest wait {g.get('oldest_wait_seconds', '?')} s, "
                        f"{g.get('actions_last_minute', '?')} actions in the last minute "
                        f"(written {g.get('written_age_seconds', '?')} s ago)")
    for _topic, s in status.tables:
        commit = s.ingest.last_commit
        verdict = "PAUSED" if s.table in status.paused else s.health.verdict.upper()
        reason = status.paused.get(s.table) or (s.health.reasons[0] if s.health.reasons else "")
        lines.append(f"{verdict:<9}{s.table[:39]:<40}"
                     f"{(f'{commit.age_seconds:.0f} s ago' if commit else 'never'):>12}"
                     f"{(f'{s.ingest.lag.total:,}' if s.ingest.lag is not None else '?'):>10}"
                     f"{(f'{s.compactor.pending_files:,}' if s.compactor is not None else '-'):>9}"
                     f"{(f'{s.dead_letters.records:,}' if s.dead_letters is not None else '-'):>7}  {reason[:90]}")
    for table, reason in status.paused.items():
        if not any(s.table == table for _, s in status.tables):
            lines.append(f"{'PAUSED':<9}{table[:39]:<40}{'':>12}{'':>10}{'':>9}{'':>7}  {reason[:90]}")
    for topic, reason in status.refused.items():
        lines.append(f"{'REFUSED':<9}{('topic ' + topic)[:39]:<40}{'':>38}  {reason[:90]}")
    for table, reason in status.refused_tables.items():
        lines.append(f"{'REFUSED':<9}{table[:39]:<40}{'':>38}  {reason[:90]}")
    return "\n".join(lines)


def fleet_checked_at() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
