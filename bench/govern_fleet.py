"""The governor keeping 1,000 mostly idle tables for 10 minutes: its whole process tree's CPU,
resident memory and open descriptors, sampled as it runs.

    .venv/bin/python bench/govern_fleet.py [--tables 1000] [--active 10] [--seconds 600]

Makes N tables in namespace `lake` of a SQLite catalog, each carrying `streamberg.*` policy
(so `govern --namespace`-style discovery keeps them: `govern.namespaces: [lake]`), then runs
the real `streamberg govern` as its own process (its dashboard served on loopback, the
catalog's commit reports on, as a deployment runs it). `--active` of the tables get a small
append every 10 s from this script, reported the way the ingest reports its commits, so the
governor compacts them on its Spark session (started when the first action runs) while the
rest sit idle. Maintenance is off on the tables (`streamberg.maintain.enabled: false`): a
fleet never maintained before would make every table due at once, which is a first day, not
a steady state.

Every 5 s: the govern process tree's CPU seconds (user + system, the Spark JVM included),
resident bytes and open descriptors (/proc). Reported: the cores used over the run after its
first round (the round that reads every table) and over the last half, the peak and last
resident memory, descriptors after the first round and at the end (flat: no leak), the actions
run and failed, a /metrics scrape of the dashboard at the end. Goals (issue "The house, fifth
round"): <= 0.2 of a core, <= 1.5 GB resident, descriptors flat.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from streamberg.bench.harness import (
    descriptor_kinds,
    percentile,
    process_cpu_seconds,
    process_tree,
    stamp,
    tree_cpu_seconds,
    tree_descriptors,
    tree_rss,
    work_with_broker,
    write_results,
)
from streamberg.cli.sample_events import SAMPLE_EVENT_SCHEMA
from streamberg.common.broker import ensure_topic, free_port
from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.table_meta.declared import ensure_table
from streamberg.table_meta.policy import GOVERN_STATE_FILE
from streamberg.table_meta.query_stats import record_commit

SAMPLE_SECONDS = 5.0
COMMIT_SECONDS = 10.0
POLICY = {"streamberg.maintain.enabled": "false", "streamberg.compact.min_files": "4"}


def _config(folder: Path, bootstrap: str) -> Path:
    document = {
        "kafka": {"bootstrap_servers": bootstrap, "topic": "events"},
        "catalog": {"name": "bench", "uri": f"sqlite:///{folder / 'catalog.db'}", "warehouse": str(folder / "w"),
                    "scan_reports_dir": str(folder / "reports")},
        "table": {"identifier": "db.events", "schema": SAMPLE_EVENT_SCHEMA},
        "ingest": {"state_dir": str(folder / "state")},
        "govern": {"namespaces": ["lake"]},
        "compactor": {"spark_master": "local[2]"},
    }
    path = folder / "streamberg.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def _rows(arrow: pa.Schema, first: int, count: int) -> pa.Table:
    """Sample events as the table's schema has them, every required field set (pyarrow does not
    refuse a null in a non-nullable field, and a Parquet file with one fails Spark's rewrite)."""
    now = datetime.now(timezone.utc)
    return pa.Table.from_pylist([{"id": first + i, "ts": now, "user_id": f"u{i % 50}", "city": f"c{i % 7}",
                                  "amount": float(i)} for i in range(count)], schema=arrow)


def _make_tables(path: Path, tables: int) -> tuple[Any, list[str]]:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    config = load_config(path)
    catalog = load_catalog(config.catalog)
    ensure_table(catalog, config.table)
    names = [f"lake.t{i:04d}" for i in range(tables)]
    for name in names:
        table = ensure_table(catalog, config.table.model_copy(update={"identifier": name}))
        with table.transaction() as tx:
            tx.set_properties(POLICY)
        arrow = schema_to_pyarrow(table.schema(), include_field_ids=False)
        table.append(_rows(arrow, 0, 1))
    return catalog, names


def _append(catalog: Any, reports: str, name: str, round_number: int, rows: int = 200) -> None:
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from streamberg.common.retry import commit_retrying, is_instance

    # A compaction may commit between the load and the append: loaded again and retried, as
    # the ingest's committer does.
    for attempt in commit_retrying(5, is_instance(CommitFailedException), max_backoff_seconds=1.0):
        with attempt:
            table = catalog.load_table(name)
            arrow = schema_to_pyarrow(table.schema(), include_field_ids=False)
            table.append(_rows(arrow, round_number * rows, rows))
    record_commit(reports, name, table.current_snapshot().snapshot_id, "append")


def _state(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / "state" / GOVERN_STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=1000)
    parser.add_argument("--active", type=int, default=10, help="tables given an append every 10 s")
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--dashboard", choices=("on", "off"), default="on",
                        help="off: govern --dashboard off (the dashboard's model collects every table's status "
                             "in the background: its cost, apart)")
    args = parser.parse_args()
    run = stamp()
    with work_with_broker("bench-govern-fleet-") as work:
        ensure_topic(work.bootstrap, "events", 1)
        path = _config(work.folder, work.bootstrap)
        made = time.monotonic()
        catalog, names = _make_tables(path, args.tables)
        print(f"{args.tables} tables made in {time.monotonic() - made:.0f} s", file=sys.stderr, flush=True)
        port = free_port()
        log = (work.folder / "govern.log").open("w")
        exe = Path(sys.executable).parent / "streamberg"
        proc = subprocess.Popen([str(exe), "govern", "--config", str(path), "--dashboard", f"127.0.0.1:{port}" if args.dashboard == "on" else "off"],
                                stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
        samples: list[dict[str, Any]] = []
        started = time.monotonic()
        first_round_at: float | None = None
        kinds_first: dict[str, int] | None = None
        commits, next_commit, next_sample = 0, started, started
        try:
            while (now := time.monotonic()) - started < args.seconds:
                if proc.poll() is not None:
                    raise SystemExit(f"govern ended early (exit {proc.returncode}); see {work.folder / 'govern.log'}")
                if now >= next_commit:
                    for name in names[:args.active]:
                        _append(catalog, str(work.folder / "reports"), name, commits)
                    commits += 1
                    next_commit += COMMIT_SECONDS
                if now >= next_sample:
                    tree = process_tree()
                    samples.append({"t": round(now - started, 1), "cpu_s": tree_cpu_seconds(proc.pid, tree),
                                    "python_cpu_s": process_cpu_seconds(proc.pid),
                                    "rss": tree_rss(proc.pid, tree), "fds": tree_descriptors(proc.pid, tree),
                                    "processes": len(tree.get(proc.pid, [])) + 1})
                    if first_round_at is None and _state(work.folder) is not None:
                        first_round_at = now - started
                    if kinds_first is None and now - started >= args.seconds / 4:
                        kinds_first = descriptor_kinds(proc.pid, tree)  # the Spark session is up by then
                    next_sample += SAMPLE_SECONDS
                time.sleep(0.2)
            kinds_last = descriptor_kinds(proc.pid)
            exposition, scrape_seconds, fleet_rows = b"", 0.0, 0
            if args.dashboard == "on":
                scrape_started = time.monotonic()
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
                    exposition = response.read()
                scrape_seconds = time.monotonic() - scrape_started
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/fleet.json", timeout=30) as response:
                    fleet_rows = len(json.loads(response.read())["rows"])
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
        log_text = (work.folder / "govern.log").read_text(errors="replace")
    warm = [s for s in samples if first_round_at is not None and s["t"] >= first_round_at]
    half = [s for s in samples if s["t"] >= args.seconds / 2]

    def cores(window: list[dict[str, Any]], key: str = "cpu_s") -> float | None:
        if len(window) < 2 or window[-1]["t"] == window[0]["t"]:
            return None
        return round((window[-1][key] - window[0][key]) / (window[-1]["t"] - window[0]["t"]), 3)

    # The actions, from the service's own log (govern.json keeps the last 500 only), and what
    # the compactions did (a governor's compaction is one planned pass, `mode: pass`; `once` before):
    # a compaction whose groups failed still ends as an action.
    entries = []
    rewrites = {"commits": 0, "groups": 0, "groups_failed": 0, "files_in": 0, "files_out": 0}
    for line in log_text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("component") == "compactor" and event.get("mode") in ("once", "pass"):
            for key in rewrites:
                rewrites[key] += int(event.get(key) or 0)
        if isinstance(event, dict) and event.get("event") in ("action finished", "action failed; the table backs off, "
                                                                                 "the others go on"):
            entries.append({"ok": event["event"] == "action finished", "action": event.get("action")})
    result = {
        "stamp": run, "command": " ".join(sys.argv), "tables": args.tables, "active": args.active,
        "dashboard": args.dashboard,
        "seconds": args.seconds, "commits_each_active": commits, "first_round_s": first_round_at,
        "cores_after_first_round": cores(warm), "cores_last_half": cores(half), "cores_whole_run": cores(samples),
        # The governor's Python process alone (its rounds, the dashboard's model, the HTTP
        # server); the rest of the tree is the Spark JVM (the compactions).
        "python_cores_after_first_round": cores(warm, "python_cpu_s"),
        "python_cores_last_half": cores(half, "python_cpu_s"),
        "rss_peak_gib": round(max(s["rss"] for s in samples) / 2**30, 3),
        "rss_last_gib": round(samples[-1]["rss"] / 2**30, 3),
        "fds_after_first_round": warm[0]["fds"] if warm else None, "fds_last": samples[-1]["fds"],
        "fds_max": max(s["fds"] for s in samples),
        "fds_p50_last_half": percentile([float(s["fds"]) for s in half], 50),
        "actions_ok": sum(1 for e in entries if e.get("ok")), "actions_failed": sum(1 for e in entries if not e.get("ok")),
        "compactions": rewrites,
        "actions_by_kind": {k: sum(1 for e in entries if e.get("action") == k) for k in {e.get("action") for e in entries}},
        # What grew between a quarter in (the Spark session up) and the end, by kind.
        "descriptors_grown": {k: v - (kinds_first or {}).get(k, 0) for k, v in kinds_last.items()
                              if v - (kinds_first or {}).get(k, 0) > 0},
        "scrape_s": round(scrape_seconds, 4), "exposition_bytes": len(exposition), "fleet_rows": fleet_rows,
    }
    summary_path = write_results("govern-fleet", run, {**result, "samples": samples}, result)
    print(f"governor over {args.tables} tables ({args.active} given an append every {COMMIT_SECONDS:g} s) for "
          f"{args.seconds:g} s, dashboard {args.dashboard}; first round done at {first_round_at} s")
    print(f"  CPU: {result['cores_after_first_round']} cores after the first round, {result['cores_last_half']} over "
          f"the last half, {result['cores_whole_run']} over the whole run (goal <= 0.2); the Python process alone "
          f"{result['python_cores_after_first_round']} / {result['python_cores_last_half']}, the rest the Spark JVM")
    print(f"  memory: peak {result['rss_peak_gib']} GiB, last {result['rss_last_gib']} GiB resident for the process "
          f"tree (goal <= 1.5 GB)")
    print(f"  descriptors: {result['fds_after_first_round']} after the first round, {result['fds_last']} at the end, "
          f"max {result['fds_max']} (goal: flat); grown since a quarter in: {result['descriptors_grown']}")
    print(f"  actions: {result['actions_ok']} ok, {result['actions_failed']} failed {result['actions_by_kind']}; "
          f"the compactions: {rewrites}; "
          f"a scrape of /metrics {result['scrape_s']} s ({result['exposition_bytes']:,} bytes), "
          f"{fleet_rows} rows on the fleet page")
    print(f"  summary: {summary_path.relative_to(Path(__file__).resolve().parents[1])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
