"""What the dashboard's pages show, computed from the exporter's model (monitoring/watch.py:
every table's last status, their history) and the governor's state file: plain dicts the
templates render and `/api/*.json` returns. Nothing here asks the catalog or the broker.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from streamberg.monitoring.collect import state_document
from streamberg.monitoring.fleet import FleetStatus
from streamberg.monitoring.model import Status
from streamberg.table_meta.policy import GOVERN_HEARTBEAT_FILE

# The runbook of each health check (docs/runbooks/): the page an operator opens for it.
RUNBOOKS = {
    "catalog": "catalog-down", "table": "catalog-down", "broker": "ingest-lag", "topic": "ingest-lag",
    "lag": "ingest-lag", "commit_age": "ingest-lag", "commit_time": "commit-failures",
    "lost_offsets": "lost-offsets", "unknown_fields": "poison-or-schema-change",
    "dead_letters": "poison-or-schema-change", "compactor": "compactor-behind", "small_files": "compactor-behind",
    "snapshots": "compactor-behind", "metadata": "compactor-behind", "maintenance": "governor-action-failing",
    "merge": "upsert-table-behind", "governor": "governor-action-failing", "policy": "governor-action-failing",
    "paused": "fleet-table-paused",
}
FAILURE_WINDOW_SECONDS = 3600.0
# The rows the server renders into the fleet page (the worst first): a screenful and more. The
# rest come from /api/fleet.json at once; a browser builds 1,000 rows from data in a fraction of
# the time it parses them as markup (measured in bench/dashboard.py).
FIRST_ROWS = 60
VERDICT_RANK = {"critical": 0, "paused": 1, "warn": 2, "ok": 3}


def _namespace(identifier: str) -> str:
    return identifier.rsplit(".", 1)[0] if "." in identifier else ""


def heartbeat_document(state_dir: str) -> dict[str, Any] | None:
    """`streamberg govern`'s heartbeat (<state_dir>/govern.heartbeat), or None."""
    return state_document(state_dir, GOVERN_HEARTBEAT_FILE)


def running_actions(heartbeat: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The actions the governor runs now (its heartbeat is written as each starts and ends),
    with their age."""
    now = time.time()
    return [{**r, "seconds": round(now - float(r.get("started_at") or now), 1)}
            for r in (heartbeat or {}).get("running") or [] if isinstance(r, dict)]


def _next_action(table: str, governor: dict[str, Any] | None) -> dict[str, Any] | None:
    """The action the governor found due for the table in its last round, the most urgent first
    (the state is written when a round ends: what it chose has run by then)."""
    if governor is None:
        return None
    due = sorted((d for d in governor.get("due", []) if isinstance(d, dict) and d.get("table") == table),
                 key=lambda d: -float(d.get("urgency") or 0))
    return {"action": due[0].get("action"), "why": due[0].get("why")} if due else None


def _policy_kind(status: Status) -> str:
    """What keeps the table's policy, for the fleet page's filter: its problems first, else
    whether any key is set by a table property, else the config's and the defaults."""
    if status.policy_problems:
        return "problems"
    if any(s.get("origin") == "table property" for s in status.settings or ()):
        return "table properties"
    return "config and defaults"


def fleet_row(status: Status, paused: dict[str, str], governor: dict[str, Any] | None,
              history: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """One table's line of the fleet page (every number as `status --json` has it; the lag's
    p95 over the model's history of the table: the last hour at the default refresh)."""
    health = status.health
    verdict = "paused" if status.table in paused else health.verdict if health is not None else "unknown"
    findings = list(health.findings) if health is not None else []
    if status.table in paused:
        findings.insert(0, {"check": "paused", "severity": "critical", "reason": paused[status.table]})
    commit = status.ingest.last_commit
    last_optimize = status.compactor.last_optimize if status.compactor is not None else None
    last_run = (status.maintenance or {}).get("last_run") if isinstance(status.maintenance, dict) else None
    return {
        "table": status.table, "namespace": _namespace(status.table), "verdict": verdict,
        "reasons": [{"reason": f["reason"], "check": f["check"], "runbook": RUNBOOKS.get(f["check"])}
                    for f in findings],
        "lag_records": status.ingest.lag.total if status.ingest.lag is not None else None,
        "lag_seconds": status.ingest.lag.seconds if status.ingest.lag is not None else None,
        "lag_seconds_p95": _p95([p["lag_seconds"] for p in history if p.get("lag_seconds") is not None]),
        "last_commit_age_seconds": commit.age_seconds if commit is not None else None,
        "commit_seconds_p95": status.snapshots.commit_seconds_p95 if status.snapshots is not None else None,
        "data_files": status.files.data_files if status.files is not None else None,
        "small_files": status.files.small_files if status.files is not None else None,
        "pending_bytes": status.compactor.pending_bytes if status.compactor is not None else None,
        "last_compaction_age_seconds": last_optimize.age_seconds if last_optimize is not None else None,
        "last_maintenance_age_seconds": last_run.get("age_seconds") if isinstance(last_run, dict) else None,
        "next_action": _next_action(status.table, governor),
        "policy_problems": list(status.policy_problems),
        "policy": _policy_kind(status),
        "dead_letters": status.dead_letters.records if status.dead_letters is not None else None,
    }


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def fleet_page(fleet: FleetStatus | None, governor: dict[str, Any] | None, refreshed_at: float | None,
               history: Mapping[str, Iterable[dict[str, Any]]] | None = None,
               heartbeat: dict[str, Any] | None = None) -> dict[str, Any]:
    """The fleet page: a row a table, worst first, and the summary bar."""
    if fleet is None:
        return {"rows": [], "summary": {"tables": 0, "by_verdict": {}}, "refreshed_at": None, "collecting": True}
    rows = sorted((fleet_row(status, fleet.paused, governor, (history or {}).get(status.table, ()))
                   for _, status in fleet.tables),
                  key=lambda r: (VERDICT_RANK.get(r["verdict"], len(VERDICT_RANK)), r["table"]))
    by_verdict: dict[str, int] = {}
    for row in rows:
        by_verdict[row["verdict"]] = by_verdict.get(row["verdict"], 0) + 1
    now = time.time()
    log = (governor or {}).get("log") or []
    failures = [e for e in log if isinstance(e, dict) and not e.get("ok") and
                now - float(e.get("started_at") or 0) <= FAILURE_WINDOW_SECONDS]
    return {"rows": rows, "refreshed_at": refreshed_at, "collecting": False,
            "summary": {"tables": len(rows), "by_verdict": by_verdict,
                        "actions_last_minute": ((governor or {}).get("fleet") or {}).get("actions_last_minute", 0),
                        "running": len(running_actions(heartbeat)),
                        "failures_last_hour": len(failures),
                        "refused_tables": dict(fleet.refused_tables), "refused_topics": dict(fleet.refused)}}


def table_page(status: Status, fleet: FleetStatus, governor: dict[str, Any] | None, history: list[dict[str, Any]],
               settings: list[dict[str, Any]] | None, heartbeat: dict[str, Any] | None = None) -> dict[str, Any]:
    """A table's page: its row, its settings and where each came from, its charts' series, its
    governor actions, scan statistics and dead letters."""
    row = fleet_row(status, fleet.paused, governor, history)
    log = [e for e in ((governor or {}).get("log") or []) if isinstance(e, dict) and e.get("table") == status.table]
    queued = [a for a in ((governor or {}).get("actions") or []) if isinstance(a, dict) and a.get("table") == status.table]
    queries = status.queries or {}
    dead = status.dead_letters
    return {"row": row, "settings": settings or [], "history": history, "log": list(reversed(log[-50:])),
            "running": [r for r in running_actions(heartbeat) if r.get("table") == status.table],
            "dead_letter_table": dead.table if dead is not None and dead.exists else None,
            "recent_dead_letters": list(dead.recent) if dead is not None else [],
            "actions": queued, "queries": queries, "status": status.to_dict(),
            "charts": charts(history)}


CHARTS = (("lag", "ingest lag (records)"), ("lag_seconds", "ingest lag (seconds the oldest record waited)"), ("data_files", "data files"), ("small_files", "small files"),
          ("snapshots", "snapshots"), ("metadata_bytes", "metadata bytes"),
          ("commits_per_minute", "records committed a minute"))
FILES_PER_POINT = "files_per_point:"  # a history key per clustering column


def charts(history: list[dict[str, Any]], width: int = 320, height: int = 60) -> list[dict[str, Any]]:
    """Each series as an SVG polyline's points (drawn by the template: no chart code needed)."""
    points = list(history)
    # Records committed a minute, from the running total between two points.
    for before, after in zip(points, points[1:], strict=False):
        a, b = before.get("consumed_total"), after.get("consumed_total")
        span = after["at"] - before["at"]
        after["commits_per_minute"] = round((b - a) * 60 / span) if a is not None and b is not None and span > 0 else None
    out = []
    columns = sorted({k for p in points for k in p if k.startswith(FILES_PER_POINT)})
    series = [*CHARTS, *((k, f"files read per point query on {k[len(FILES_PER_POINT):]}") for k in columns)]
    for key, label in series:
        values = [(p["at"], p.get(key)) for p in points if p.get(key) is not None]
        if not values:
            out.append({"key": key, "label": label, "points": "", "last": None, "min": None, "max": None})
            continue
        low, high = min(v for _, v in values), max(v for _, v in values)
        first_at, last_at = values[0][0], values[-1][0]
        spread, span = (high - low) or 1, (last_at - first_at) or 1
        coords = " ".join(f"{(at - first_at) / span * width:.1f},{height - (v - low) / spread * height:.1f}"
                          for at, v in values)
        out.append({"key": key, "label": label, "points": coords, "last": values[-1][1], "min": low, "max": high})
    return out


def governor_page(governor: dict[str, Any] | None, heartbeat: tuple[bool, str] | None,
                  beat: dict[str, Any] | None = None) -> dict[str, Any]:
    """The governor: its queue (due, by urgency), what runs, concurrency, failures and
    backoff, its heartbeat."""
    if governor is None:
        return {"running": False, "heartbeat": heartbeat, "due": [], "planned": [], "actions": [], "log": [],
                "running_now": running_actions(beat),
                "fleet": None}
    actions = [a for a in governor.get("actions") or [] if isinstance(a, dict)]
    return {"running": True, "heartbeat": heartbeat, "fleet": governor.get("fleet"),
            "written_age_seconds": round(time.time() - float(governor.get("written_at") or 0), 1),
            "due": sorted((d for d in governor.get("due") or [] if isinstance(d, dict)),
                          key=lambda d: -float(d.get("urgency") or 0)),
            "planned": governor.get("planned") or [], "concurrency": governor.get("concurrency"),
            "running_now": running_actions(beat),
            "failing": [a for a in actions if a.get("failures")],
            "log": list(reversed([e for e in governor.get("log") or [] if isinstance(e, dict)][-100:]))}
