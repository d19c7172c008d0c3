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

from streamberg.common.log import get_logger
from streamberg.common.scan_reports import append_report, read_regular, take
from streamberg.table_meta.column_usage import ColumnFacts

STATS_FILE = "query-stats.json"
LOCK_FILE = ".fold.lock"
HALF_LIFE_DAYS = 7.0
# Names (and field ids) kept per table: past it, the least recently used go, and no column can
# be called unused until the window has passed since the newest use that went (usage).
MAX_COLUMNS_PER_TABLE = 2000
MAX_NAMES_PER_REPORT = 4096  # names one report may record; past it, the same as an eviction
MAX_STATS_BYTES = 256 * 1024 * 1024
LOCK_WAIT_SECONDS = 2.0
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
    try:
        return float(value.get("value", 0)) if isinstance(value, dict) else 0.0
    except (TypeError, ValueError, OverflowError):
        return 0.0


def table_of(report_table: str, catalog_name: str) -> str:
    """A report's `table-name` (the engine's catalog name, then the identifier) as streamberg's identifier."""
    head, _, rest = report_table.partition(".")
    return rest if rest and head.lower() == catalog_name.lower() else report_table


def _lose(entry: dict[str, Any], last_used: float) -> None:
    """Evidence of a use is gone (evicted, or past a report's cap): no column can be proven
    unused until the window has passed since then (usage)."""
    entry["evicted_last_used"] = max(float(entry.get("evicted_last_used", 0.0)), last_used)


def _bounded(entry: dict[str, Any], key: str, name: str, limit: int = MAX_COLUMNS_PER_TABLE) -> dict[str, Any]:
    """entry[key], with room for `name`: when full, the least recently used tenth goes (by
    recency, never first come: nothing read lately can be pushed out by old junk)."""
    found: dict[str, Any] = entry.setdefault(key, {})
    if name not in found and len(found) >= limit:
        def last(item: tuple[str, Any]) -> float:
            value = item[1]
            return float(value.get("last_used", 0.0) if isinstance(value, dict) else value)

        oldest = sorted(found.items(), key=last)[: max(1, limit // 10)]
        for name, _ in oldest:
            del found[name]
        _lose(entry, max(last(o) for o in oldest))
    return found


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

    def column(name: str) -> dict[str, Any]:
        found: dict[str, Any] = _bounded(entry, "columns", name).setdefault(name, {})
        return found

    terms = filter_terms(report.get("filter"))
    projected = report.get("projected-field-names")
    names = [p[:200] for p in projected if isinstance(p, str) and p] if isinstance(projected, list) else []
    ids = report.get("projected-field-ids")
    field_ids = [i for i in ids if isinstance(i, int) and not isinstance(i, bool) and 0 < i < 2**31] \
        if isinstance(ids, list) else []
    if len(terms) + len(names) > MAX_NAMES_PER_REPORT or len(field_ids) > MAX_NAMES_PER_REPORT:
        _lose(entry, now)  # a report past the cap: what it read beyond it is not recorded
    for term, kind in terms[:MAX_NAMES_PER_REPORT]:
        found = column(term)
        found["filter"] = found.get("filter", 0.0) + 1
        found[kind] = found.get(kind, 0.0) + 1
        found["last_used"] = now
    for projected_name in names[: max(0, MAX_NAMES_PER_REPORT - len(terms))]:
        found = column(projected_name)
        found["projected"] = found.get("projected", 0.0) + 1
        found["last_used"] = now
    for field_id in field_ids[:MAX_NAMES_PER_REPORT]:
        _bounded(entry, "ids", str(field_id))[str(field_id)] = now


class FoldBusy(Exception):
    """Another process holds the fold lock past the wait: the saved statistics serve meanwhile."""


@contextlib.contextmanager
def _locked(folder: Path, wait_seconds: float = LOCK_WAIT_SECONDS) -> Iterator[None]:
    """The fold lock, waited for at most `wait_seconds` (FoldBusy after): a fold stuck in
    another process never stops `status` or the governor's other work."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise FoldBusy(f"{folder}: another process is folding the scan reports") from None
                time.sleep(0.02)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _empty() -> dict[str, Any]:
    return {"version": 1, "tables": {}}


def load(folder: str | Path) -> dict[str, Any]:
    """The saved statistics (empty when there are none or they do not read)."""
    try:
        read = read_regular(Path(folder) / STATS_FILE, MAX_STATS_BYTES)
        found = json.loads(read[0]) if read is not None else None
    except (OSError, ValueError, RecursionError):
        return _empty()
    return found if isinstance(found, dict) and isinstance(found.get("tables"), dict) else _empty()


def _save(folder: Path, stats: dict[str, Any]) -> None:
    temporary = folder / f".{STATS_FILE}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(stats, separators=(",", ":")))
    os.replace(temporary, folder / STATS_FILE)


def fold(folder: str | Path, catalog_name: str, now: float | None = None) -> dict[str, Any]:
    """Consume the report files into the statistics; return them (the saved ones, unchanged,
    while another process holds the fold lock)."""
    folder = Path(folder)
    now = time.time() if now is None else now
    try:
        with _locked(folder):
            return _fold_locked(folder, catalog_name, now)
    except FoldBusy:
        return load(folder)


def _fold_locked(folder: Path, catalog_name: str, now: float) -> dict[str, Any]:
    """`fold` under the lock the caller holds: every line on its own (a line that fails is
    dropped and counted), the statistics saved before any report file is removed."""
    stats = load(folder)
    taken = take(folder)
    if not taken.files:
        return stats
    for kind, report in taken.reports:
        try:
            if kind == "scan-report":
                _add(stats, report, catalog_name, now)
            else:
                _add_commit(stats, report, catalog_name, now)
        except Exception:  # noqa: BLE001 - a report of the wrong shape: dropped, counted
            taken.drop("a report of the wrong shape")
    if taken.dropped:
        dropped = stats.setdefault("dropped", {})
        for why, count in taken.dropped.items():
            dropped[why] = int(dropped.get(why, 0)) + count
        get_logger("table_meta.query_stats", folder=str(folder)).warning(
            "scan reports dropped while folding", dropped=taken.dropped, files=len(taken.files))
    _save(folder, stats)
    taken.done()
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


def record_commit(folder: str | Path, identifier: str, snapshot_id: int | None, operation: str) -> None:
    """A commit of the product's own (pyiceberg writes: the ingest's, maintenance's), as a
    commit report in Iceberg's JSON form: the governor wakes on it (governor/keeper.py)."""
    append_report(folder, "commit-report", {"table-name": identifier, "snapshot-id": snapshot_id,
                                            "operation": operation, "metrics": {}})


def commits(folder: str | Path, catalog_name: str, now: float | None = None) -> dict[str, dict[str, Any]]:
    """identifier -> its reported commits (`total`, `last_at`), the pending reports folded first."""
    return commits_in(fold(folder, catalog_name, now))


def commits_in(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The reported commits the statistics hold (as `fold` returns them), by identifier."""
    found = stats.get("commits")
    return found if isinstance(found, dict) else {}


def record_read(folder: str | Path, identifier: str, filter_json: Any, projected: list[str]) -> None:
    """A read of the product's own (a fresh read), as a scan report in Iceberg's JSON form."""
    append_report(folder, "scan-report", {"table-name": identifier, "filter": filter_json,
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
    any of its columns yet). Folds the pending reports first; keeps the choice (hysteresis).
    While another process holds the fold lock: the choice saved last, unchanged."""
    folder = Path(folder)
    now = time.time() if now is None else now
    try:
        with _locked(folder):
            stats = _fold_locked(folder, catalog_name, now)
            chosen, why, changed = _choose(stats, identifier, names, now)
            if changed:
                _save(folder, stats)
            return chosen, why
    except FoldBusy:
        entry = load(folder)["tables"].get(identifier) or {}
        found = entry.get("auto")
        saved: dict[str, Any] = found if isinstance(found, dict) else {}
        kept = [c for c in saved.get("columns", []) if isinstance(c, str) and c in names]
        return kept, "the choice saved last (another process is folding the scan reports)"


def _choose(stats: dict[str, Any], identifier: str, names: set[str], now: float) -> tuple[list[str], str, bool]:
    """(columns, why, whether the entry's choice changed) by the table's filter statistics."""
    entry = stats["tables"].get(identifier)
    if entry is None:
        return [], "no scan report of this table yet", False
    columns = entry.get("columns", {})
    scored = sorted(((round(_score(columns, c), 3), c) for c in columns if c in names and _score(columns, c) > 0),
                    reverse=True)
    if not scored:
        return [], f"no filter on its columns in {int(entry.get('scans_total', 0))} scans", False
    chosen = entry.get("auto") or {}
    current = [c for c in chosen.get("columns", []) if c in names]
    scans_since = int(entry.get("scans_total", 0)) - int(chosen.get("scans_total", 0))
    evidence = ", ".join(f"{c} {s:g}" for s, c in scored[:6])
    candidate = _with_hysteresis(scored, current, columns)
    if current and candidate == current:
        return current, f"chosen from the filters of {int(entry.get('scans_total', 0))} scans: {evidence}", False
    if current and scans_since < AUTO_MIN_SCANS:
        return current, (f"kept {', '.join(current)} (filter scores {evidence}; a change needs "
                         f"{AUTO_MIN_SCANS} scans since the choice)"), False
    changed = candidate != current
    if changed:
        entry["auto"] = {"columns": candidate, "since": now, "scans_total": int(entry.get("scans_total", 0)),
                         "evidence": evidence, "was": current}
    return candidate, f"chosen from the filters of {int(entry.get('scans_total', 0))} scans: {evidence}", changed


def observe(folder: str | Path, identifier: str, facts: ColumnFacts, now: float | None = None,
            loaded: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Record what the statistics must know of the table itself, and return its entry (None:
    no report of it yet): its UUID (a table dropped and made again under the same name starts
    its statistics anew), when each of its field ids was first seen (proof the field existed
    then), and no names that were never a column of it (junk, read before these facts were).
    `loaded`: the statistics as a pass over many tables read them once; an entry there that
    needs nothing recorded is returned as it is, with no lock taken and nothing read again."""
    folder = Path(folder)
    now = time.time() if now is None else now
    if loaded is not None:
        kept = loaded.get("tables", {}).get(identifier)
        if not isinstance(kept, dict):
            return None
        if not _needs_recording(kept, facts):
            return kept
    try:
        with _locked(folder, wait_seconds=0.5):
            stats = load(folder)
            entry = stats["tables"].get(identifier)
            if not isinstance(entry, dict):
                return None
            changed = entry.get("uuid") != facts.uuid
            if changed:
                if entry.get("uuid") is not None:  # the table was made again: its statistics start anew
                    for key in ("columns", "ids", "fields", "auto", "evicted_last_used"):
                        entry.pop(key, None)
                    entry["since"] = now
                entry["uuid"] = facts.uuid
            fields = entry.setdefault("fields", {})
            for field_id in facts.current_ids:
                if str(field_id) not in fields:
                    fields[str(field_id)] = now
                    changed = True
            columns = entry.get("columns", {})
            junk = _junk(entry, facts)
            for name in junk:
                del columns[name]
            if junk or changed:
                _save(folder, stats)
            return entry
    except FoldBusy:
        found = load(folder)["tables"].get(identifier)
        return found if isinstance(found, dict) else None


def _junk(entry: dict[str, Any], facts: ColumnFacts) -> list[str]:
    """Names the entry holds that were never a column of the table (read before these facts were)."""
    return [n for n, c in entry.get("columns", {}).items()
            if n not in facts.ids_of_name and float(c.get("last_used", 0)) < facts.loaded_at]


def _needs_recording(entry: dict[str, Any], facts: ColumnFacts) -> bool:
    """Whether observe() would change the entry: another table's UUID, a field not seen
    before, or a name that is no column of the table (what it records, in that order)."""
    fields = entry.get("fields", {})
    return entry.get("uuid") != facts.uuid or any(str(i) not in fields for i in facts.current_ids) \
        or bool(_junk(entry, facts))


def _appeared(entry: dict[str, Any], facts: ColumnFacts, field_id: int, now: float) -> float:
    """The earliest proof that the field exists: a snapshot written with a schema holding it,
    or the statistics' first sight of it; now when there is none (too new to judge)."""
    seen = entry.get("fields", {}).get(str(field_id))
    proofs = [facts.appeared.get(field_id, now)] + ([float(seen)] if isinstance(seen, (int, float)) else [])
    return min(proofs)


def unused_columns(entry: dict[str, Any], facts: ColumnFacts, unused_after_days: float,
                   now: float) -> tuple[list[str] | None, str]:
    """The table's top-level columns no reported scan read (by field id, a leaf's use counting
    for its ancestors) in the whole window with the column present, and a word on why there
    are none. None: the statistics do not cover the window (collected too briefly, or of
    another table of the same name)."""
    window = unused_after_days * 86400
    cutoff = now - window
    since = float(entry.get("since", entry.get("updated", now)))
    if entry.get("uuid") not in (None, facts.uuid):
        return None, "the statistics are of a table of the same name made earlier"
    if now - since < window:
        return None, f"scan reports collected for {max(0.0, now - since) / 86400:.1f} of {unused_after_days:g} days"
    if float(entry.get("evicted_last_used", 0.0)) >= cutoff:
        return [], ("some scan reports within the window were not kept whole (too many names): no column can be "
                    "proven unused until the window has passed since")
    last: dict[int, float] = {}
    for name, column in entry.get("columns", {}).items():
        used = float(column.get("last_used", 0.0)) if isinstance(column, dict) else 0.0
        for top in facts.tops_of_name(name):
            last[top] = max(last.get(top, 0.0), used)
    for key, used_at in entry.get("ids", {}).items():
        top = facts.top_of(int(key)) if str(key).isdigit() else None
        if top is not None:
            last[top] = max(last.get(top, 0.0), float(used_at))
    unused = [name for field_id, name in facts.top.items()
              if last.get(field_id, 0.0) < cutoff and max(since, _appeared(entry, facts, field_id, now)) <= cutoff]
    return unused, ""


def usage(folder: str | Path, identifier: str, facts: ColumnFacts | None = None,
          unused_after_days: float = 30.0, now: float | None = None,
          loaded: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The table's statistics as `status` shows them (None without any report). With the
    table's column facts: the top-level columns no reported scan read within
    `unused_after_days` (`unused_columns`, table_meta/query_stats.unused_columns)."""
    now = time.time() if now is None else now
    found = observe(folder, identifier, facts, now, loaded) if facts is not None else \
        (loaded if loaded is not None else load(folder))["tables"].get(identifier)
    if not isinstance(found, dict):
        return None
    entry: dict[str, Any] = found
    unused, why = unused_columns(entry, facts, unused_after_days, now) if facts is not None else (None, "")
    since = float(entry.get("since", entry.get("updated", now)))
    columns = entry.get("columns", {})
    scanned, skipped = float(entry.get("files_scanned", 0)), float(entry.get("files_skipped", 0))
    return {"scans": round(float(entry.get("scans", 0)), 1), "scans_total": int(entry.get("scans_total", 0)),
            "files_skipped_share": round(skipped / (scanned + skipped), 3) if scanned + skipped else None,
            "filtered": {c: round(_score(columns, c), 2) for c in sorted(columns, key=lambda c: -_score(columns, c))
                         if _score(columns, c) > 0},
            "auto": entry.get("auto"), "reported_since": since, "unused_columns": unused,
            "unused_why_none": why, "unused_after_days": unused_after_days}
