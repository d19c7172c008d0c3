"""What engines read of each table, from Iceberg's scan reports: bounded, decayed statistics
per table, and the clustering columns `streamberg.cluster.columns=auto` follows.

Reports arrive as JSON lines in `catalog.scan_reports_dir`: from any Spark (or other Java)
application whose catalog has `metrics-reporter-impl` set to the writer streamberg builds
(common/report_jar.py; the product's own sessions get it with the setting), and from the
product's own fresh reads (`record_read`). Each report is Iceberg's own JSON form
(ScanReportParser): the table, the filter (values hidden by Iceberg), the projected columns,
and the files scanned and skipped.

`fold` consumes the report files into `query-stats.json` in the same folder: per table the
number of scans, files scanned and skipped, and per column how often it was filtered (by
predicate kind) and projected; every count decays by half every `HALF_LIFE_DAYS`, so old
habits fade and the file stays small (bounded columns per table, tables per folder). One
process folds at a time (a lock file); a report line cut by a concurrent write is skipped.

`auto_columns` chooses up to `AUTO_MAX_COLUMNS` columns from the filter statistics (a
point predicate weighs more than a range, a null check little), with hysteresis: a chosen
set is replaced only once `AUTO_MIN_SCANS` scans were seen since it was chosen and the new
set's score is `AUTO_SWITCH_RATIO` times the current's, so a few odd queries never flip a
table's layout. The choice and its evidence are kept beside the statistics.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STATS_FILE = "query-stats.json"
LOCK_FILE = ".fold.lock"
HALF_LIFE_DAYS = 7.0
MAX_COLUMNS_PER_TABLE = 500
MAX_TABLES = 10_000
AUTO_MAX_COLUMNS = 4
AUTO_MIN_SCANS = 20
AUTO_SWITCH_RATIO = 1.25
AUTO_MIN_SHARE = 0.5  # a column is chosen when its score is at least this share of the top one's
# Predicate kinds (Iceberg's expression JSON types) and what a filter of that kind is worth
# to clustering: a point predicate prunes most, a range a little less, a null check little.
KIND_OF = {"eq": "point", "in": "point", "starts-with": "point", "not-eq": "other", "not-in": "other",
           "not-starts-with": "other", "lt": "range", "lt-eq": "range", "gt": "range", "gt-eq": "range",
           "is-null": "null", "not-null": "null", "is-nan": "null", "not-nan": "null"}
KIND_WEIGHT = {"point": 1.0, "range": 0.8, "other": 0.3, "null": 0.1}


def filter_terms(expression: Any) -> list[tuple[str, str]]:
    """(column, kind) of every predicate in an Iceberg filter's JSON form."""
    out: list[tuple[str, str]] = []

    def walk(node: Any) -> None:
        if not isinstance(node, dict):
            return  # "true", "false"
        kind = str(node.get("type", ""))
        if kind in ("and", "or"):
            walk(node.get("left"))
            walk(node.get("right"))
        elif kind == "not":
            walk(node.get("child"))
        elif "term" in node:
            term = node["term"]
            while isinstance(term, dict):  # a transform's term: the column under it
                term = term.get("term")
            if isinstance(term, str) and term:
                out.append((term[:200], KIND_OF.get(kind, "other")))

    walk(expression)
    return out


def _decayed(entry: dict[str, Any], now: float) -> None:
    age_days = max(0.0, now - float(entry.get("updated", now))) / 86400
    factor = 0.5 ** (age_days / HALF_LIFE_DAYS)
    for key in ("scans", "files_scanned", "files_skipped"):
        entry[key] = float(entry.get(key, 0.0)) * factor
    for column in entry.get("columns", {}).values():
        for key in list(column):
            if key != "last_used":
                column[key] = float(column[key]) * factor
    entry["updated"] = now


def _metric(metrics: dict[str, Any], name: str) -> float:
    value = metrics.get(name)
    return float(value.get("value", 0)) if isinstance(value, dict) else 0.0


def table_of(report_table: str, catalog_name: str) -> str:
    """A report's `table-name` (the engine's catalog name, then the identifier) as streamberg's identifier."""
    head, _, rest = report_table.partition(".")
    return rest if rest and head.lower() == catalog_name.lower() else report_table


def _add(stats: dict[str, Any], report: dict[str, Any], catalog_name: str, now: float) -> None:
    name = report.get("table-name")
    if not isinstance(name, str) or not name:
        return
    tables = stats.setdefault("tables", {})
    identifier = table_of(name, catalog_name)[:400]
    if identifier not in tables and len(tables) >= MAX_TABLES:
        return
    entry = tables.setdefault(identifier, {"scans": 0.0, "files_scanned": 0.0, "files_skipped": 0.0,
                                           "updated": now, "columns": {}, "scans_total": 0, "since": now})
    _decayed(entry, now)
    found_metrics = report.get("metrics")
    metrics: dict[str, Any] = found_metrics if isinstance(found_metrics, dict) else {}
    entry["scans"] += 1
    entry["scans_total"] = int(entry.get("scans_total", 0)) + 1
    entry["files_scanned"] += _metric(metrics, "result-data-files")
    entry["files_skipped"] += _metric(metrics, "skipped-data-files")
    columns = entry["columns"]

    def column(name: str) -> dict[str, Any] | None:
        if name not in columns and len(columns) >= MAX_COLUMNS_PER_TABLE:
            return None
        return columns.setdefault(name, {})

    for term, kind in filter_terms(report.get("filter")):
        found = column(term)
        if found is not None:
            found["filter"] = found.get("filter", 0.0) + 1
            found[kind] = found.get(kind, 0.0) + 1
            found["last_used"] = now
    for projected in report.get("projected-field-names") or []:
        if isinstance(projected, str) and (found := column(projected[:200])) is not None:
            found["projected"] = found.get("projected", 0.0) + 1
            found["last_used"] = now


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load(folder: str | Path) -> dict[str, Any]:
    try:
        found = json.loads((Path(folder) / STATS_FILE).read_text())
    except (OSError, ValueError):
        return {"version": 1, "tables": {}}
    return found if isinstance(found, dict) and isinstance(found.get("tables"), dict) else {"version": 1, "tables": {}}


def _save(folder: Path, stats: dict[str, Any]) -> None:
    temporary = folder / f"{STATS_FILE}.tmp"
    temporary.write_text(json.dumps(stats, separators=(",", ":")))
    os.replace(temporary, folder / STATS_FILE)


def fold(folder: str | Path, catalog_name: str, now: float | None = None) -> dict[str, Any]:
    """Consume the report files into the statistics; return them."""
    folder = Path(folder)
    now = time.time() if now is None else now
    with _locked(folder):
        return _fold_locked(folder, catalog_name, now)


def _fold_locked(folder: Path, catalog_name: str, now: float) -> dict[str, Any]:
    """`fold` under the lock the caller holds; the file is written only when a report came."""
    stats = load(folder)
    folded = False
    for path in sorted(folder.glob("reports-*.jsonl")):
        taken = path.with_suffix(".folding")
        try:
            os.replace(path, taken)  # the writer's next report starts a new file of the same name
            lines = taken.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # cut by a concurrent write
            kind = record.get("report-type") if isinstance(record, dict) else None
            # Ours wraps the report; a REST catalog's ReportMetricsRequest is flat.
            report = record.get("report", record) if kind in ("scan-report", "commit-report") else None
            if isinstance(report, dict) and kind == "scan-report":
                _add(stats, report, catalog_name, now)
            elif isinstance(report, dict):
                _add_commit(stats, report, catalog_name, now)
        taken.unlink(missing_ok=True)
        folded = True
    if folded:
        _save(folder, stats)
    return stats


def _add_commit(stats: dict[str, Any], report: dict[str, Any], catalog_name: str, now: float) -> None:
    """A commit to a table (a Java engine's CommitReport, or ours: `record_commit`): counted
    apart from the scans, so a table written and never read is not "watched" for unused columns."""
    name = report.get("table-name")
    if not isinstance(name, str) or not name:
        return
    commits = stats.setdefault("commits", {})
    identifier = table_of(name, catalog_name)[:400]
    if identifier not in commits and len(commits) >= MAX_TABLES:
        return
    entry = commits.setdefault(identifier, {"total": 0})
    entry["total"] = int(entry.get("total", 0)) + 1
    entry["last_at"] = now
    snapshot = report.get("snapshot-id")
    if isinstance(snapshot, int):
        entry["snapshot_id"] = snapshot


def _append_report(folder: str | Path, kind: str, report: dict[str, Any]) -> None:
    """One report line of this process, in the Java writer's form, into the folder it folds."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"reports-python-{os.getpid()}.jsonl").open("a") as out:
        out.write(json.dumps({"report-type": kind, "report": report}) + "\n")


def record_commit(folder: str | Path, identifier: str, snapshot_id: int | None, operation: str) -> None:
    """A commit of the product's own (pyiceberg writes: the ingest's, maintenance's), as a
    commit report in Iceberg's JSON form: the governor wakes on it (governor/keeper.py)."""
    _append_report(folder, "commit-report", {"table-name": identifier, "snapshot-id": snapshot_id,
                                             "operation": operation, "metrics": {}})


def commits(folder: str | Path, catalog_name: str, now: float | None = None) -> dict[str, dict[str, Any]]:
    """identifier -> its reported commits (`total`, `last_at`), the pending reports folded first."""
    found = fold(folder, catalog_name, now).get("commits")
    return found if isinstance(found, dict) else {}


def record_read(folder: str | Path, identifier: str, filter_json: Any, projected: list[str]) -> None:
    """A read of the product's own (a fresh read), as a scan report in Iceberg's JSON form."""
    _append_report(folder, "scan-report", {"table-name": identifier, "filter": filter_json,
                                           "projected-field-names": projected, "metrics": {}})


def _score(columns: dict[str, Any], name: str) -> float:
    found = columns.get(name, {})
    return sum(float(found.get(kind, 0.0)) * weight for kind, weight in KIND_WEIGHT.items())


def _with_hysteresis(scored: list[tuple[float, str]], current: list[str], columns: dict[str, Any]) -> list[str]:
    """The columns by score (each at least AUTO_MIN_SHARE of the top one's, at most
    AUTO_MAX_COLUMNS), with a margin for the current choice: a chosen column stays while it
    keeps AUTO_MIN_SHARE / AUTO_SWITCH_RATIO of the top score, and the leading column changes
    only when another's score is AUTO_SWITCH_RATIO times its own. A column that fades drops
    out, a column that rises joins: a few odd queries move nothing."""
    top = scored[0][0]
    keep = AUTO_MIN_SHARE / AUTO_SWITCH_RATIO
    picked = [c for s, c in scored if s >= AUTO_MIN_SHARE * top or (c in current and s >= keep * top)]
    picked = picked[:AUTO_MAX_COLUMNS]
    if current and current[0] in picked and picked[0] != current[0] \
            and _score(columns, picked[0]) < AUTO_SWITCH_RATIO * _score(columns, current[0]):
        picked.remove(current[0])
        picked.insert(0, current[0])  # the leading column holds until beaten by the ratio
    return picked


def auto_columns(folder: str | Path, catalog_name: str, identifier: str, names: set[str],
                 now: float | None = None) -> tuple[list[str], str]:
    """The clustering columns `auto` gives the table now and why (empty when no query filtered
    any of its columns yet). Folds the pending reports first; keeps the choice (hysteresis)."""
    folder = Path(folder)
    now = time.time() if now is None else now
    with _locked(folder):
        stats = _fold_locked(folder, catalog_name, now)
        entry = stats["tables"].get(identifier)
        if entry is None:
            return [], "no scan report of this table yet"
        columns = entry.get("columns", {})
        scored = sorted(((round(_score(columns, c), 3), c) for c in columns if c in names and _score(columns, c) > 0),
                        reverse=True)
        if not scored:
            return [], f"no filter on its columns in {int(entry.get('scans_total', 0))} scans"
        chosen = entry.get("auto") or {}
        current = [c for c in chosen.get("columns", []) if c in names]
        scans_since = int(entry.get("scans_total", 0)) - int(chosen.get("scans_total", 0))
        evidence = ", ".join(f"{c} {s:g}" for s, c in scored[:6])
        candidate = _with_hysteresis(scored, current, columns)
        if current and candidate == current:
            return current, f"chosen from the filters of {int(entry.get('scans_total', 0))} scans: {evidence}"
        if current and scans_since < AUTO_MIN_SCANS:
            return current, (f"kept {', '.join(current)} (filter scores {evidence}; a change needs "
                             f"{AUTO_MIN_SCANS} scans since the choice)")
        if candidate != current:
            entry["auto"] = {"columns": candidate, "since": now, "scans_total": int(entry.get("scans_total", 0)),
                             "evidence": evidence, "was": current}
            _save(folder, stats)
        return candidate, f"chosen from the filters of {int(entry.get('scans_total', 0))} scans: {evidence}"


def usage(folder: str | Path, identifier: str, columns_of_table: list[str] | None = None,
          unused_after_days: float = 30.0, now: float | None = None) -> dict[str, Any] | None:
    """The table's statistics as `status` shows them (None without any report). With the
    table's top-level columns: those no reported scan filtered or projected within
    `unused_after_days`, once reports have been collected that long."""
    entry = load(folder)["tables"].get(identifier)
    if entry is None:
        return None
    now = time.time() if now is None else now
    unused: list[str] | None = None
    since = float(entry.get("since", entry.get("updated", now)))
    if columns_of_table is not None and now - since >= unused_after_days * 86400:
        cutoff = now - unused_after_days * 86400
        seen = entry.get("columns", {})
        unused = [c for c in columns_of_table if float(seen.get(c, {}).get("last_used", 0)) < cutoff]
    columns = entry.get("columns", {})
    scanned, skipped = float(entry.get("files_scanned", 0)), float(entry.get("files_skipped", 0))
    return {"scans": round(float(entry.get("scans", 0)), 1), "scans_total": int(entry.get("scans_total", 0)),
            "files_skipped_share": round(skipped / (scanned + skipped), 3) if scanned + skipped else None,
            "filtered": {c: round(_score(columns, c), 2) for c in sorted(columns, key=lambda c: -_score(columns, c))
                         if _score(columns, c) > 0},
            "auto": entry.get("auto"), "reported_since": since, "unused_columns": unused,
            "unused_after_days": unused_after_days}
