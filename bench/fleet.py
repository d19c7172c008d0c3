"""Many tables from one ingest job against the same records into one table, in one run.

    .venv/bin/python bench/fleet.py [--topics 100] [--records 2000000] [--hot 5] [--interval 10]

1. Starts its own tansu broker. Produces `--records` events of the demo shape into `--topics`
   topics (`fleet.t000` ...; the first `--hot` take half of them, the others share the rest:
   a few hot tables, most quiet) and the same events into one topic (`single`), with 2
   partitions a fleet topic and 8 for the single one.
2. One table: `streamberg ingest --max-records N` of the single topic. Many tables: `streamberg
   ingest --max-records N` of a config routing `fleet\\..*` to `bench.{topic}` (declared
   schema, as the single table). Each: wall clock of the command (JVM and job start included),
   the peak resident memory of its whole process tree (the JVM, the Python workers; sampled
   every 0.25 s), catalog commits. Each table is then counted: rows and distinct ids against
   what was produced into its topic.
3. Freshness and commits while events arrive, twice: the many-table ingest runs on while
   events are produced at `--rate`/s for `--seconds` (hot topics 80 % of them, every quiet
   topic some), first committing every table every interval, then with
   `ingest.commit_min_bytes` `--min-bytes` (a table's small intervals wait for more, up to
   60 s). Per record of a hot table, (commit time of the snapshot that made it visible) -
   (its produce time, the `ts` field): p50/p95 against the commit interval; catalog commits
   per minute over all tables in that window.

Ratios: one table's wall clock / many tables' (end to end; >= 0.8 is the goal), many tables'
peak memory / one table's (<= 1.5), and what 100 one-table deployments would hold (100 x the
one-table deployment measured here: an extrapolation, said so). Writes
bench/results/fleet-<time>.json and prints a summary. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml
from confluent_kafka import Producer

from streamberg.bench.harness import ROOT, broker_in, process_tree, results_path, stamp, tree_rss
from streamberg.cli.sample_events import SAMPLE_EVENT_SCHEMA
from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.common.config import CatalogConfig
from streamberg.common.config.fleet import topic_identifier

CITIES = ("ams", "ber", "par", "lis", "osl")


class Events:
    """Produces demo-shaped JSON events; remembers which ids went into which topic."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000,
                                  "queue.buffering.max.messages": 1_000_000})
        self.ids: dict[str, list[int]] = {}

    def send(self, topic: str, first: int, count: int, partitions: int) -> None:
        ids = self.ids.setdefault(topic, [])
        for i in range(first, first + count):
            now = datetime.now(timezone.utc).isoformat()
            value = orjson.dumps({"id": i, "ts": now, "user_id": f"u{i % 997}", "city": CITIES[i % 5],
                                  "amount": (i % 10_000) / 100})
            while True:
                try:
                    self.producer.produce(topic, value=value, partition=i % partitions)
                    break
                except BufferError:
                    self.producer.poll(0.05)
            ids.append(i)
        self.producer.poll(0)

    def flush(self) -> None:
        assert self.producer.flush(120) == 0, "the broker did not take every event"


def shares(records: int, topics: int, hot: int) -> list[int]:
    """Events per topic: the hot ones half of them, the quiet ones the other half."""
    hot_each = records // 2 // hot
    quiet_each = (records - hot_each * hot) // (topics - hot)
    counts = [hot_each] * hot + [quiet_each] * (topics - hot)
    counts[-1] += records - sum(counts)
    return counts


class PeakMemory:
    """The peak resident memory of a process tree, sampled in the background."""

    def __init__(self, pid: int, every: float = 0.25) -> None:
        self.pid, self.every, self.peak = pid, every, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, tree_rss(self.pid, process_tree()))
            time.sleep(self.every)

    def done(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.peak


def ingest(config: Path, records: int, log: Path, parallelism: int) -> dict[str, Any]:
    exe = Path(sys.executable).parent / "streamberg"
    started = time.perf_counter()
    proc = subprocess.Popen([str(exe), "ingest", "--config", str(config), "--max-records", str(records),
                             "--parallelism", str(parallelism), "--quiet"], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, env={**os.environ, "STREAMBERG_LOG_FORMAT": "json"})
    memory = PeakMemory(proc.pid)
    code = proc.wait()
    seconds = time.perf_counter() - started
    peak = memory.done()
    if code:
        raise SystemExit(f"streamberg ingest of {config.name} exited {code}:\n{log.read_text()[-3000:]}")
    return {"seconds": round(seconds, 2), "peak_rss_bytes": peak}


def count(catalog: Any, identifier: str, produced: list[int]) -> dict[str, Any]:
    ids = catalog.load_table(identifier).scan(selected_fields=("id",)).to_arrow().column("id")
    return {"rows": len(ids), "distinct": len(pc.unique(ids)), "produced": len(produced),
            "exact": len(ids) == len(pc.unique(ids)) == len(produced)}


def commits_between(catalog: Any, identifiers: list[str], start_ms: float, end_ms: float) -> int:
    total = 0
    for identifier in identifiers:
        table = catalog.load_table(identifier)
        total += sum(1 for s in table.metadata.snapshots if start_ms <= s.timestamp_ms <= end_ms)
    return total


def freshness(catalog: Any, identifiers: list[str], start_ms: float) -> np.ndarray:
    """Seconds from each record's produce time (`ts`) to the commit that made it visible."""
    lags = []
    for identifier in identifiers:
        table = catalog.load_table(identifier)
        for snapshot in table.metadata.snapshots:
            if snapshot.timestamp_ms < start_ms:
                continue
            for manifest in snapshot.manifests(table.io):
                if manifest.added_snapshot_id != snapshot.snapshot_id:
                    continue
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                    data = pq.read_table(entry.data_file.file_path.removeprefix("file://"), columns=["ts"])
                    micros = data.column("ts").cast(pa.int64()).to_numpy()
                    micros = micros[micros >= start_ms * 1000]
                    lags.append((snapshot.timestamp_ms - micros / 1000) / 1000)
    return np.concatenate(lags) if lags else np.array([])


def live_phase(path: Path, log: Path, args: argparse.Namespace, events: Events, topics: list[str],
               identifiers: list[str], catalog: Any) -> dict[str, Any]:
    """The many-table ingest running while events arrive at args.rate/s (hot topics 80 %):
    freshness of the hot tables' records, catalog commits per minute over all tables."""
    exe = Path(sys.executable).parent / "streamberg"
    proc = subprocess.Popen([str(exe), "ingest", "--config", str(path), "--parallelism", str(args.parallelism),
                             "--quiet"], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "STREAMBERG_LOG_FORMAT": "json"})
    deadline = time.monotonic() + 300
    # Every writer logs "tables routed" once it opened its tables' lanes.
    while log.read_text().count('"tables routed"') < args.parallelism:
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise SystemExit(f"the live ingest did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    time.sleep(args.interval)  # every lane reading
    start_ms = time.time() * 1000
    hot_rate, quiet_rate = 0.8 * args.rate / args.hot, 0.2 * args.rate / (args.topics - args.hot)
    credit = [0.0] * args.topics
    next_id = max(max(ids) for ids in events.ids.values()) + 1
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        tick = time.monotonic()
        for t, topic in enumerate(topics):
            credit[t] += (hot_rate if t < args.hot else quiet_rate) / 10
            n = int(credit[t])
            credit[t] -= n
            if n:
                events.send(topic, next_id, n, 2)
                next_id += n
        events.producer.poll(0)
        time.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))
    events.flush()
    end_ms = time.time() * 1000
    time.sleep(2 * args.interval + 5)
    proc.send_signal(2)
    proc.wait(180)
    lag = freshness(catalog, identifiers[:args.hot], start_ms)
    commits = commits_between(catalog, identifiers, start_ms, end_ms)
    return {"freshness_hot": {"records": int(lag.size), "p50_s": round(float(np.percentile(lag, 50)), 2),
                              "p95_s": round(float(np.percentile(lag, 95)), 2), "max_s": round(float(lag.max()), 2),
                              "goal_p95_s": args.interval + 5} if lag.size else None,
            "catalog_commits_per_minute": round(commits / ((end_ms - start_ms) / 60_000), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--hot", type=int, default=5)
    parser.add_argument("--interval", type=float, default=10.0, help="commit interval (s)")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--rate", type=int, default=5000, help="events/s during the freshness phase")
    parser.add_argument("--seconds", type=int, default=60, help="length of each freshness phase (0: none)")
    parser.add_argument("--max-open-files", type=int, default=None,
                        help="ingest.max_open_files of every run (default: the product's default)")
    parser.add_argument("--min-bytes", type=int, default=16 * 1024,
                        help="ingest.commit_min_bytes of the second freshness phase (quiet tables wait, up to 60 s)")
    parser.add_argument("--engine", choices=("flink", "processes"), default="flink",
                        help="ingest.engine of both runs (the ratio compares like with like)")
    parser.add_argument("--workdir", type=Path, default=ROOT / ".streamberg" / "bench-fleet")
    args = parser.parse_args()

    run_at = stamp()
    work = args.workdir / run_at
    work.mkdir(parents=True)
    load_before = os.getloadavg()
    with broker_in(work) as bootstrap:
        catalog_doc = {"name": "benchfleet", "uri": f"sqlite:///{work}/catalog.db", "warehouse": str(work / "warehouse")}
        common = {"kafka": {"bootstrap_servers": bootstrap, "value_format": "json"}, "catalog": catalog_doc}
        ingest_settings = {"commit_interval_seconds": args.interval, "state_dir": str(work / "state"),
                           "max_poll_records": 10000, "topic_discovery_seconds": 10, "engine": args.engine,
                           **({"max_open_files": args.max_open_files} if args.max_open_files else {})}
        single_path = work / "single.yaml"
        single_path.write_text(yaml.safe_dump({
            **common, "kafka": {**common["kafka"], "topic": "single"},
            "table": {"identifier": "bench.single", "schema": SAMPLE_EVENT_SCHEMA}, "ingest": ingest_settings}))
        route = {"identifier": "bench.{topic}", "topic_pattern": "fleet\\..*", "schema": SAMPLE_EVENT_SCHEMA}
        fleet_path, quiet_path = work / "fleet.yaml", work / "fleet-min-bytes.yaml"
        fleet_path.write_text(yaml.safe_dump({**common, "defaults": {"ingest": ingest_settings}, "tables": [route]}))
        quiet_path.write_text(yaml.safe_dump({**common, "tables": [route], "defaults": {"ingest": {
            **ingest_settings, "commit_min_bytes": args.min_bytes, "commit_max_wait_seconds": 60}}}))
        topics = [f"fleet.t{t:03d}" for t in range(args.topics)]
        identifiers = [f"bench.{topic_identifier(t)}" for t in topics]
        counts = shares(args.records, args.topics, args.hot)
        print(f"producing {args.records:,} events into {args.topics} topics and the same into one ...", flush=True)
        events = Events(bootstrap)
        ensure_topic(bootstrap, "single", 8)
        first = 0
        for topic, n in zip(topics, counts):
            ensure_topic(bootstrap, topic, 2)
            events.send(topic, first, n, 2)
            events.send("single", first, n, 8)
            first += n
        events.flush()
        catalog = load_catalog(CatalogConfig.model_validate(catalog_doc))

        print("one table ...", flush=True)
        one = ingest(single_path, args.records, work / "single.log", args.parallelism)
        one["check"] = count(catalog, "bench.single", events.ids["single"])
        one["commits"] = len(catalog.load_table("bench.single").metadata.snapshots)
        print(f"  {one}", flush=True)

        print(f"{args.topics} tables from one job ...", flush=True)
        many = ingest(fleet_path, args.records, work / "fleet.log", args.parallelism)
        checks = {i: count(catalog, i, events.ids[t]) for i, t in zip(identifiers, topics)}
        many["tables_exact"] = sum(c["exact"] for c in checks.values())
        many["not_exact"] = {i: c for i, c in checks.items() if not c["exact"]}
        many["commits"] = sum(len(catalog.load_table(i).metadata.snapshots) for i in identifiers)
        print(f"  {many['seconds']} s, peak {many['peak_rss_bytes'] / 1e6:,.0f} MB, "
              f"{many['tables_exact']}/{args.topics} tables exact", flush=True)

        live = {}
        phases = (("every_interval", fleet_path), ("commit_min_bytes", quiet_path)) if args.seconds else ()
        for label, path in phases:
            print(f"freshness ({label}): {args.rate:,} events/s for {args.seconds} s while the many-table ingest "
                  "runs ...", flush=True)
            live[label] = live_phase(path, work / f"fleet-live-{label}.log", args, events, topics, identifiers,
                                     catalog)
            print(f"  {live[label]}", flush=True)
        live_checks = {i: count(catalog, i, events.ids[t]) for i, t in zip(identifiers, topics)}
    result = {
        "date": run_at, "machine": {"cpus": os.cpu_count(), "load_before": load_before},
        "args": {k: str(v) for k, v in vars(args).items()},
        "one_table": one, "many_tables": many,
        "end_to_end_ratio_one_over_many": round(one["seconds"] / many["seconds"], 3),
        "peak_memory_ratio_many_over_one": round(many["peak_rss_bytes"] / one["peak_rss_bytes"], 3),
        "peak_memory_of_that_many_one_table_deployments_bytes (extrapolated)": one["peak_rss_bytes"] * args.topics,
        "live": live,
        "tables_exact_after_live": sum(c["exact"] for c in live_checks.values()),
    }
    out = results_path("fleet", run_at)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0 if many["tables_exact"] == args.topics and result["tables_exact_after_live"] == args.topics else 1


if __name__ == "__main__":
    sys.exit(main())
