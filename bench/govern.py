"""One governor keeping many tables against one compactor a table, in one run.

    .venv/bin/python bench/govern.py [--tables 100] [--hot 5] [--seconds 600] [--baseline-seconds 150]
                                     [--max-concurrent 2] [--drain-seconds 360] [--seal-after-seconds 120]

1. A SQL catalog of `--tables` tables (`bench.t000` ...), unpartitioned, clustered on
   `user_id, city` (zorder) by their own properties (`streamberg.cluster.*`, as Spark SQL's
   ALTER TABLE would set them), 256 KB target files; maintenance is switched off on every table
   (`streamberg.maintain.enabled=false`): both sides here do compaction only. Both sides finish
   (seal) a table idle for `--seal-after-seconds` (compactor.seal_after_seconds; the default
   3,600 s is longer than this run).
2. Appends arrive all the time (plain pyiceberg appends from this process, as another engine's
   would): the first `--hot` tables every 5 s (4,000 rows), every other table every 90 s (400
   rows), staggered.
3. Baseline: what one table's own compactor (`streamberg compact --config`, continuous, its own
   Spark application) costs, measured alone for `--baseline-seconds` on a hot table and then on
   a quiet one: peak resident memory of its process tree (the JVM included) and CPU seconds a
   second. 100 per-table compactors are then *estimated* as hot x the hot one + quiet x the
   quiet one (an extrapolation from one each, said so; running a hundred Spark applications on
   2 cores is not possible here).
4. The service: `streamberg govern --namespace bench` for `--seconds` with the appends running:
   its peak memory and CPU seconds (process tree, sampled every second) and actions per minute
   over that time. At the cut-off the appends stop and files a point query reads (`user_id =
   v`, `city = v`, 20 sampled values each, from the manifests' bounds) are taken as they are
   (live); the service then runs on for `--drain-seconds` (idle tables are finished). The
   worst wait of a due action over both (from its log: each action's wait when it started; and
   what still waits at the end, from govern.json).
5. At the end: every table's rows and distinct ids against what was appended; files a point
   query reads as the governor left each table, then after a full optimize of that table (the
   compactor's `--full`), and the ratio per table, beside the live ratio at the cut-off.

Writes bench/results/govern-<time>.json and prints a summary. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import yaml

from streamberg.bench.harness import (
    process_tree,
    results_path,
    stamp,
    tree_cpu_seconds,
    tree_rss,
)
from streamberg.bench.incremental.scenario import files_per_query

SCHEMA = [{"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamptz", "required": True},
          {"name": "user_id", "type": "string"}, {"name": "city", "type": "string"}, {"name": "amount", "type": "double"}]
HOT_EVERY, HOT_ROWS, QUIET_EVERY, QUIET_ROWS = 5.0, 4000, 90.0, 400
USERS, CITIES = 5000, 200


class Sampler:
    """Peak resident memory and CPU seconds of a process tree, every second."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.cpu = pid, 0, 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            tree = process_tree()
            self.peak = max(self.peak, tree_rss(self.pid, tree))
            self.cpu = max(self.cpu, tree_cpu_seconds(self.pid, tree))
            time.sleep(1.0)

    def done(self) -> tuple[int, float]:
        self.stop.set()
        self.thread.join()
        return self.peak, self.cpu


class Appends:
    """Appends to every table on its schedule, from a thread; counts what each table got."""

    def __init__(self, catalog: Any, tables: list[str], hot: int, seed: int = 11) -> None:
        self.catalog, self.tables, self.hot = catalog, tables, hot
        self.rows = {t: 0 for t in tables}
        self.commits = 0
        self.rng = np.random.default_rng(seed)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.arrow: pa.Schema | None = None

    def start(self) -> None:
        self.thread.start()

    def _batch(self, table: str, n: int) -> pa.Table:
        first = self.rows[table]
        now = np.datetime64(datetime.now(timezone.utc).replace(tzinfo=None), "us")
        return pa.Table.from_pydict({
            "id": np.arange(first, first + n, dtype=np.int64),
            "ts": pa.array(np.full(n, now), pa.timestamp("us", tz="UTC")),
            "user_id": pa.array([f"u{v:05d}" for v in self.rng.integers(0, USERS, n)]),
            "city": pa.array([f"c{v:03d}" for v in self.rng.integers(0, CITIES, n)]),
            "amount": self.rng.random(n) * 100}, schema=self.arrow)

    def _run(self) -> None:
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        self.arrow = schema_to_pyarrow(self.catalog.load_table(self.tables[0]).schema())
        start = time.monotonic()
        # Staggered: quiet table k first appends at k/len of its period.
        due = {t: start + (i * HOT_EVERY / max(1, self.hot) if i < self.hot
                           else (i - self.hot) * QUIET_EVERY / max(1, len(self.tables) - self.hot))
               for i, t in enumerate(self.tables)}
        while not self.stop.is_set():
            table, at = min(due.items(), key=lambda item: item[1])
            if self.stop.wait(max(0.0, at - time.monotonic())):
                break
            hot = self.tables.index(table) < self.hot
            n = HOT_ROWS if hot else QUIET_ROWS
            for attempt in range(5):
                try:
                    self.catalog.load_table(table).append(self._batch(table, n))
                    break
                except Exception as exc:  # noqa: BLE001 - a lost race with the compactor's commit: retried
                    if attempt == 4:
                        print(f"  append to {table} failed: {exc}", flush=True)
                        n = 0
            self.rows[table] += n
            self.commits += 1
            due[table] = at + (HOT_EVERY if hot else QUIET_EVERY)

    def done(self) -> None:
        self.stop.set()
        self.thread.join()


def write_config(workdir: Path, identifier: str, compactor: dict[str, Any]) -> Path:
    document = {
        "kafka": {"topic": "unused"},
        "catalog": {"name": "bench", "uri": f"sqlite:///{workdir}/catalog.db", "warehouse": f"file://{workdir}/warehouse"},
        "table": {"identifier": identifier, "schema": SCHEMA, "target_file_size_bytes": 256 * 1024},
        "ingest": {"state_dir": str(workdir / "state")},
        "compactor": {"columns": ["user_id", "city"], "strategy": "zorder",
                      "checkpoint_dir": str(workdir / "checkpoints" / identifier), **compactor},
        "maintenance": {"interval_seconds": 86400},
        "govern": {"namespaces": ["bench"]},
    }
    path = workdir / f"{identifier}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def measured(argv: list[str], seconds: float, log: Path, at_cutoff: Callable[[], None] | None = None,
             then_seconds: float = 0.0) -> dict[str, Any]:
    """Run a streamberg command for `seconds` (its memory and CPU measured over them), call
    `at_cutoff`, let it go on unmeasured for `then_seconds`, then stop it as an operator would
    (SIGTERM)."""
    exe = Path(sys.executable).parent / "streamberg"
    proc = subprocess.Popen([str(exe), *argv], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "STREAMBERG_LOG_FORMAT": "json", "STREAMBERG_LOG_LEVEL": "info"},
                            start_new_session=True)

    def run_for(span: float) -> float:
        """Let it run `span` seconds; it must not exit meanwhile."""
        started = time.monotonic()
        while time.monotonic() - started < span and proc.poll() is None:
            time.sleep(1.0)
        if proc.poll() is not None:
            raise SystemExit(f"streamberg {argv[0]} exited {proc.returncode} early:\n{log.read_text()[-3000:]}")
        return time.monotonic() - started

    sampler = Sampler(proc.pid)
    ran = run_for(seconds)
    peak, cpu = sampler.done()  # before the stop: a shutdown's work is not the service's
    if at_cutoff is not None:
        at_cutoff()
    run_for(then_seconds)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return {"seconds": round(ran, 1), "peak_rss_bytes": peak, "cpu_seconds": round(cpu, 1)}


def log_events(log: Path, event: str) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"{event}"' in line:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("event") == event:
                out.append(record)
    return out


def _ratio_summary(per_table: dict[str, Any], key: str) -> dict[str, Any]:
    """Each table's worse column's ratio to a full optimize, summed up over the tables."""
    ratios = [max(r for r in t[key].values() if r is not None) for t in per_table.values()]
    hot = [r for r, t in zip(ratios, per_table.values()) if t["hot"]]
    quiet = [r for r, t in zip(ratios, per_table.values()) if not t["hot"]]
    return {"tables_within_1_2": sum(1 for r in ratios if r <= 1.2), "tables": len(ratios),
            "worst_ratio": round(max(ratios), 3), "median_ratio": round(float(np.median(ratios)), 3),
            "hot_worst_ratio": round(max(hot, default=0.0), 3), "quiet_worst_ratio": round(max(quiet, default=0.0), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=100)
    parser.add_argument("--hot", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=600.0, help="the service's run")
    parser.add_argument("--baseline-seconds", type=float, default=150.0, help="each per-table compactor's run")
    parser.add_argument("--max-concurrent", type=int, default=2)
    parser.add_argument("--drain-seconds", type=float, default=360.0,
                        help="after the appends stop, the service runs on this long before the end state is read")
    parser.add_argument("--seal-after-seconds", type=float, default=120.0,
                        help="compactor.seal_after_seconds of every table (both sides): an idle table is finished")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    os.environ["STREAMBERG_LOG_LEVEL"] = "warning"  # this process's own compactor runs: their summary is ours

    from streamberg.common.catalog import load_catalog
    from streamberg.common.config import load_config
    from streamberg.table_meta.declared import ensure_table
    from streamberg.table_meta.table_files import ManifestCache

    workdir = Path(tempfile.mkdtemp(prefix="sb-bench-govern-"))
    results: dict[str, Any] = {"started_at": datetime.now(timezone.utc).isoformat(), "cpus": os.cpu_count(),
                               "tables": args.tables, "hot": args.hot, "seconds": args.seconds,
                               "baseline_seconds": args.baseline_seconds, "max_concurrent": args.max_concurrent,
                               "drain_seconds": args.drain_seconds, "seal_after_seconds": args.seal_after_seconds,
                               "load_before": os.getloadavg()[0],
                               "appends": {"hot_every_seconds": HOT_EVERY, "hot_rows": HOT_ROWS,
                                           "quiet_every_seconds": QUIET_EVERY, "quiet_rows": QUIET_ROWS}}
    names = [f"bench.t{i:03d}" for i in range(args.tables)]
    configs = {name: write_config(workdir, name, {"seal_after_seconds": args.seal_after_seconds}) for name in names}
    config = load_config(configs[names[0]])
    catalog = load_catalog(config.catalog)
    catalog.create_namespace_if_not_exists("bench")
    for name in names:
        table = ensure_table(catalog, load_config(configs[name]).table)
        with table.transaction() as tx:
            tx.set_properties({"streamberg.cluster.columns": "user_id,city", "streamberg.cluster.strategy": "zorder",
                               "streamberg.maintain.enabled": "false"})
    print(f"{args.tables} tables in {workdir}; appends start", flush=True)
    appends = Appends(catalog, names, args.hot)
    appends.start()
    try:
        # 3. One table's own compactor, hot then quiet.
        hot_table, quiet_table = names[0], names[-1]
        baseline = {}
        for kind, name in (("hot", hot_table), ("quiet", quiet_table)):
            print(f"baseline: streamberg compact of {name} ({kind}) for {args.baseline_seconds:.0f} s", flush=True)
            baseline[kind] = measured(["compact", "--config", str(configs[name])], args.baseline_seconds,
                                      workdir / f"compact-{kind}.log")
            baseline[kind]["cpu_per_second"] = round(baseline[kind]["cpu_seconds"] / baseline[kind]["seconds"], 4)
            print(f"  {json.dumps(baseline[kind])}", flush=True)
        quiet = args.tables - args.hot
        estimate = {
            "peak_rss_bytes": args.hot * baseline["hot"]["peak_rss_bytes"] + quiet * baseline["quiet"]["peak_rss_bytes"],
            "cpu_seconds": round(args.seconds * (args.hot * baseline["hot"]["cpu_per_second"]
                                                  + quiet * baseline["quiet"]["cpu_per_second"]), 1)}
        results["per_table_compactors"] = {"measured": baseline, "estimate_for_all": estimate}

        # 4. The service: measured while the appends run; at the cut-off the appends stop and
        # what a point query reads is taken as it is then (live); the service then drains.
        rng = np.random.default_rng(3)
        points = {"user_id": [f"u{v:05d}" for v in rng.integers(0, USERS, 20)],
                  "city": [f"c{v:03d}" for v in rng.integers(0, CITIES, 20)]}
        cache = ManifestCache()
        live: dict[str, dict[str, float]] = {}
        cutoff: list[datetime] = []

        def at_cutoff() -> None:
            appends.done()
            cutoff.append(datetime.now(timezone.utc))
            print(f"  cut-off: appends stopped; files per point query as they are; draining {args.drain_seconds:.0f} s",
                  flush=True)
            for name in names:
                live[name] = files_per_query(catalog.load_table(name), points, cache)

        print(f"service: streamberg govern --namespace bench for {args.seconds:.0f} s", flush=True)
        log = workdir / "govern.log"
        service = measured(["govern", "--config", str(configs[names[0]]), "--max-concurrent",
                            str(args.max_concurrent)], args.seconds, log, at_cutoff, args.drain_seconds)

        def before_cutoff(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [e for e in events if datetime.fromisoformat(str(e.get("timestamp", "")).replace("Z", "+00:00")) < cutoff[0]]

        started = log_events(log, "action started")
        finished_all = log_events(log, "action finished")
        finished = before_cutoff(finished_all)
        failed = log_events(log, "action failed; the table backs off, the others go on")
        failed_live = before_cutoff(failed)
        state = json.loads((workdir / "state" / "govern.json").read_text())
        still = [a["waiting_seconds"] for a in state["actions"] if a["waiting_seconds"] is not None]
        waits = [float(e.get("waited_seconds", 0.0)) for e in started]
        service.update({
            "actions": len(finished), "failed_actions": len(failed_live),
            "drain_actions": len(finished_all) - len(finished), "drain_failed_actions": len(failed) - len(failed_live),
            "actions_per_minute": round(len(finished) / (service["seconds"] / 60), 2),
            "actions_by_kind": {k: sum(1 for e in finished if e.get("action") == k) for k in ("compact", "merge", "maintain")},
            "tables_acted_on": len({e.get("table") for e in finished}),
            "worst_wait_started_seconds": round(max(waits, default=0.0), 1),
            "worst_wait_pending_at_end_seconds": round(max(still, default=0.0), 1),
            "wait_p95_seconds": round(float(np.percentile(waits, 95)), 1) if waits else None,
            "max_wait_bound_seconds": config.govern.max_wait_seconds})
        results["service"] = service
        results["ratios"] = {"memory_service_vs_estimate": round(service["peak_rss_bytes"] / estimate["peak_rss_bytes"], 4),
                             "cpu_service_vs_estimate": round(service["cpu_seconds"] / estimate["cpu_seconds"], 4)}
        results["appended"] = {"commits": appends.commits, "rows": sum(appends.rows.values())}
        print(f"  {json.dumps(service)}", flush=True)

        # 5. Rows, then files a point query reads: as governed, then after a full optimize.
        from streamberg.common.spark import build_spark_session, quiet_spark_logs
        from streamberg.compactor.compactor import Compactor

        print("checking rows and files per point query (then a full optimize of each table)", flush=True)
        spark = build_spark_session(config.catalog, "local[*]", {}, app_name="bench-govern-reference")
        quiet_spark_logs(spark)
        per_table: dict[str, Any] = {}
        wrong = []
        try:
            for name in names:
                table = catalog.load_table(name)
                ids = table.scan(selected_fields=("id",)).to_arrow().column("id")
                rows, distinct = len(ids), len(set(ids.to_pylist()))
                if rows != appends.rows[name] or distinct != appends.rows[name]:
                    wrong.append({"table": name, "rows": rows, "distinct": distinct, "appended": appends.rows[name]})
                governed = files_per_query(table, points, cache)
                own = load_config(configs[name])
                Compactor(own.compactor, own.target, spark).run_pass(mode="full")
                full = files_per_query(catalog.load_table(name), points, cache)
                per_table[name] = {"hot": names.index(name) < args.hot, "rows": rows,
                                   "live": live[name], "governed": governed, "full_optimize": full,
                                   "live_ratio": {c: round(live[name][c] / full[c], 3) if full[c] else None for c in points},
                                   "ratio": {c: round(governed[c] / full[c], 3) if full[c] else None for c in points}}
        finally:
            spark.stop()
        results["rows_exact"] = not wrong
        results["rows_wrong"] = wrong
        # At the end (drained: the goal's measure) and at the cut-off (live, appends running).
        results["files_per_query"] = _ratio_summary(per_table, "ratio")
        results["files_per_query_live"] = _ratio_summary(per_table, "live_ratio")
        results["per_table"] = per_table
    finally:
        if appends.thread.is_alive():
            appends.done()
    out = results_path("govern", stamp())
    out.write_text(json.dumps(results, indent=1))
    s, e, f = results["service"], results["per_table_compactors"]["estimate_for_all"], results["files_per_query"]
    fl = results["files_per_query_live"]
    print(f"\n{args.tables} tables ({args.hot} hot), {args.seconds:.0f} s, {os.cpu_count()} cores:")
    print(f"  service: peak {s['peak_rss_bytes'] / 1e6:,.0f} MB, {s['cpu_seconds']:,.0f} CPU s; "
          f"{args.tables} compactors (estimate): {e['peak_rss_bytes'] / 1e6:,.0f} MB, {e['cpu_seconds']:,.0f} CPU s; "
          f"ratios {results['ratios']['memory_service_vs_estimate']:.3f} / {results['ratios']['cpu_service_vs_estimate']:.3f}")
    print(f"  actions {s['actions']} ({s['actions_per_minute']}/min, {s['failed_actions']} failed; "
          f"{s['drain_actions']} more while draining), worst wait "
          f"{s['worst_wait_started_seconds']} s started / {s['worst_wait_pending_at_end_seconds']} s pending "
          f"(bound {s['max_wait_bound_seconds']:.0f} s)")
    for label, g in ((f"after a {args.drain_seconds:.0f} s drain", f), ("live, at the cut-off", fl)):
        print(f"  files per point query vs a full optimize, {label}: {g['tables_within_1_2']}/{g['tables']} within "
              f"1.2x, median {g['median_ratio']}, worst {g['worst_ratio']} (hot {g['hot_worst_ratio']}, "
              f"quiet {g['quiet_worst_ratio']})")
    print(f"  rows exact in every table: {results['rows_exact']}; results: {out}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if results["rows_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
