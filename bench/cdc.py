"""Change-data-capture benchmark (docs/cdc.md): one run, every figure beside its baseline.

    .venv/bin/python bench/cdc.py [--changes 1000000] [--keys 100000] [--fresh-rate 2000]

1. Starts its own tansu broker and produces a Debezium change stream (bare JSON events:
   inserts, 50 % updates, 10 % deletes, re-inserts) over `--keys` keys, by key over the
   partitions, computing the final state as it goes.
2. Ingest rate: `streamberg ingest` of the stream twice, at the same parallelism: as an
   append table of the events themselves (kafka.envelope none, a table of before/after/op/
   source columns: the same bytes) and as a primary-key table's change log (kafka.envelope
   debezium). End to end and steady state, as bench/ingest_throughput.py measures them.
3. Merge throughput: `streamberg merge`'s merge of the whole change log into the empty
   primary-key table (changes/s), checked against the computed state.
4. Freshness: the ingest (`streamberg ingest --duration`) and the merge stage (continuous, in
   this process) run while changes are produced at `--fresh-rate` for `--fresh-seconds`,
   each carrying its produce time as source.ts_ms. Every change's latency is the commit time
   of the merge that applied it minus that time (from the change log's `_source_ts` and the
   change-log snapshots each merge recorded); p50/p95 against the aim of merge interval +
   commit interval + 5 s.
5. Full scans in Spark (count, sums over every column; median of 5 after a warm-up) of the
   primary-key table with the freshness phase's position deletes, then after the compactor's
   delete compaction (`streamberg compact --once`), against a plain append table holding the
   same final rows.

Prints the figures and writes bench/results/cdc-<time>.json. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import yaml
from confluent_kafka import Producer

from streamberg.bench.harness import broker_in, results_path, stamp
from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.table_meta.changelog import changelog_identifier, has_changelog, merge_position
from streamberg.table_meta.offsets import ancestry, committed_position, summary_properties
from streamberg.table_meta.summary_keys import SummaryKeys
from streamberg.table_meta.table_files import live_data_files

USERS = [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string", "required": True},
    {"name": "score", "type": "long"},
    {"name": "city", "type": "string"},
    {"name": "updated", "type": "long"},
]
ROW = "struct<id:long,name:string,score:long,city:string,updated:long>"
# The events themselves as an append table: the same bytes, no envelope.
EVENTS = [
    {"name": "before", "type": ROW}, {"name": "after", "type": ROW}, {"name": "op", "type": "string", "required": True},
    {"name": "ts_ms", "type": "long"}, {"name": "source", "type": "struct<ts_ms:long,lsn:long,db:string,table:string>"},
]
CITIES = ["ams", "bcn", "lis", "ber", "par", "rom", None]


class ChangeStream:
    """A table's changes as Debezium writes them, and the state they leave."""

    def __init__(self, keys: int, partitions: int, seed: int = 21) -> None:
        self.rng = random.Random(seed)
        self.keys, self.partitions = keys, partitions
        self.rows: dict[int, dict[str, Any]] = {}
        self.free = list(range(keys))
        self.rng.shuffle(self.free)
        self.lsn = 0

    def _row(self, key: int) -> dict[str, Any]:
        return {"id": key, "name": f"user-{key}-{self.lsn}", "score": self.rng.randrange(10**9),
                "city": self.rng.choice(CITIES), "updated": self.lsn}

    def next(self, now_ms: int) -> tuple[int, bytes]:
        """One change: (partition, event)."""
        self.lsn += 1
        pick = self.rng.random()
        if self.rows and (pick < 0.5 or not self.free):
            key = self.rng.choice(tuple(self.rows)) if len(self.rows) < 64 else self._some_key()
            op, before, after = "u", self.rows[key], self._row(key)
            self.rows[key] = after
        elif self.rows and pick < 0.6:
            key = self._some_key()
            op, before, after = "d", self.rows.pop(key), None
            self.free.append(key)
        else:
            key = self.free.pop(self.rng.randrange(len(self.free)))
            op, before, after = "c", None, self._row(key)
            self.rows[key] = after
        event = {"before": before, "after": after, "op": op, "ts_ms": now_ms,
                 "source": {"ts_ms": now_ms, "lsn": self.lsn, "db": "shop", "table": "users"}}
        return key % self.partitions, json.dumps(event, separators=(",", ":")).encode()

    def _some_key(self) -> int:
        while True:  # rejection sampling over the key space: O(1) where choice(tuple) is O(n)
            key = self.rng.randrange(self.keys)
            if key in self.rows:
                return key


def write_config(directory: Path, bootstrap: str, topic: str, envelope: str, args: argparse.Namespace) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    table = ({"identifier": "bench.users", "schema": USERS, "primary_key": ["id"]} if envelope != "none"
             else {"identifier": "bench.events", "schema": EVENTS})
    doc = {
        "kafka": {"bootstrap_servers": bootstrap, "topic": topic, "envelope": envelope},
        "catalog": {"uri": "sqlite:///catalog.db", "warehouse": "warehouse", "name": "bench"},
        "table": table,
        "ingest": {"commit_interval_seconds": args.commit_interval, "parallelism": args.parallelism,
                   "state_dir": "state", "max_poll_records": 10000},
        "merge": {"interval_seconds": args.merge_interval, "spark_master": "local[2]"},
        "compactor": {"spark_master": "local[2]", "checkpoint_dir": "compactor-checkpoint"},
    }
    path = directory / "streamberg.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def produce(bootstrap: str, topic: str, events: list[tuple[int, bytes]]) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                         "queue.buffering.max.messages": 1_000_000})
    size = 0
    for partition, value in events:
        while True:
            try:
                producer.produce(topic, value=value, partition=partition)
                break
            except BufferError:
                producer.poll(0.05)
        size += len(value)
    assert producer.flush(120) == 0, "events left undelivered"
    return size


def ingest(config_path: Path, records: int, parallelism: int) -> dict[str, float]:
    """`streamberg ingest --max-records`: end to end and steady state (the writers reading to
    the last commit), as bench/ingest_throughput.py."""
    exe = Path(sys.executable).parent / "streamberg"
    started, started_wall = time.perf_counter(), time.time()
    proc = subprocess.run([str(exe), "ingest", "--config", str(config_path), "--max-records", str(records),
                           "--parallelism", str(parallelism), "--quiet"], capture_output=True, text=True,
                          env={**os.environ, "STREAMBERG_LOG_FORMAT": "json"})
    seconds = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"streamberg ingest failed:\n{proc.stderr[-3000:]}")
    config = load_config(config_path)
    name = changelog_identifier(config) if has_changelog(config) else config.table.identifier
    table = load_catalog(config.catalog).load_table(name)
    last = max(table.metadata.snapshots, key=lambda s: s.timestamp_ms)
    opened = [datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp()
              for line in proc.stderr.splitlines() if '"tables routed"' in line]
    steady = last.timestamp_ms / 1000 - max(opened)
    return {"seconds": seconds, "records": records, "records_per_s": records / seconds,
            "startup_seconds": max(opened) - started_wall, "steady_seconds": steady,
            "steady_records_per_s": records / steady}


def scan_seconds(spark: Any, name: str, repeats: int = 5) -> tuple[float, list]:
    query = (f"SELECT count(*) AS n, sum(score) AS s, sum(updated) AS u, count(city) AS c, "
             f"sum(length(name)) AS l FROM {name}")
    result = spark.sql(query).collect()  # warm-up (and the answer)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        spark.sql(query).collect()
        times.append(time.perf_counter() - started)
    return statistics.median(times), [tuple(r) for r in result]


def latencies(config: Any, since_ms: int) -> np.ndarray:
    """Seconds from each change's produce time to the commit of the merge that applied it,
    for the changes produced from `since_ms`."""
    catalog = load_catalog(config.catalog)
    target = catalog.load_table(config.table.identifier)
    changelog = catalog.load_table(changelog_identifier(config))
    merges = [(int(summary_properties(s)[SummaryKeys.CHANGELOG_APPLIED]), s.timestamp_ms)
              for s in reversed(list(ancestry(target))) if SummaryKeys.CHANGELOG_APPLIED in summary_properties(s)]
    order = {s.snapshot_id: i for i, s in enumerate(reversed(list(ancestry(changelog))))}
    visible_at = {}  # change-log snapshot -> the commit time of the merge that applied it
    start = -1
    for applied, at in merges:
        for sid, i in order.items():
            if start < i <= order[applied]:
                visible_at[sid] = at
        start = order[applied]
    out = []
    for f in live_data_files(changelog)[0]:
        if f.snapshot_id not in visible_at:
            continue
        ts = pq.read_table(f.path.removeprefix("file://"), columns=["_source_ts"]).column(0)
        ms = ts.cast("int64").to_numpy(zero_copy_only=False) // 1000
        ms = ms[ms >= since_ms]
        out.append((visible_at[f.snapshot_id] - ms) / 1000)
    return np.concatenate(out) if out else np.empty(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--commit-interval", type=float, default=5.0)
    parser.add_argument("--merge-interval", type=float, default=10.0)
    parser.add_argument("--fresh-rate", type=int, default=2000, help="changes/s in the freshness phase")
    parser.add_argument("--fresh-seconds", type=int, default=60)
    args = parser.parse_args()

    from streamberg.common.spark import build_spark_session, quiet_spark_logs, register_catalog
    from streamberg.compactor.app import CompactOptions, run_compact
    from streamberg.merge.app import MergeOptions, run_merge

    results: dict[str, Any] = {"args": vars(args), "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    with tempfile.TemporaryDirectory(prefix="sb-bench-cdc-") as tmp:
        directory = Path(tmp)
        with broker_in(directory) as bootstrap:
            topic = "bench-cdc"
            ensure_topic(bootstrap, topic, args.partitions)
            stream = ChangeStream(args.keys, args.partitions)
            print(f"producing {args.changes:,} changes over {args.keys:,} keys ...", file=sys.stderr)
            now = int(time.time() * 1000)
            size = produce(bootstrap, topic, [stream.next(now) for _ in range(args.changes)])
            results["stream"] = {"changes": args.changes, "bytes": size, "keys_live": len(stream.rows)}

            print("append ingest of the same events ...", file=sys.stderr)
            append = ingest(write_config(directory / "append", bootstrap, topic, "none", args), args.changes,
                            args.parallelism)
            print("change-log ingest ...", file=sys.stderr)
            cdc_path = write_config(directory / "cdc", bootstrap, topic, "debezium", args)
            cdc = ingest(cdc_path, args.changes, args.parallelism)
            results["ingest"] = {"append": append, "changelog": cdc,
                                 "ratio": cdc["records_per_s"] / append["records_per_s"],
                                 "steady_ratio": cdc["steady_records_per_s"] / append["steady_records_per_s"]}

            config = load_config(cdc_path)
            spark = build_spark_session(config.catalog, "local[2]", {"spark.sql.shuffle.partitions": "4",
                                                                     "spark.driver.memory": "2g"},
                                        app_name="streamberg-bench-cdc")
            quiet_spark_logs(spark)
            print("merge of the whole change log ...", file=sys.stderr)
            started = time.perf_counter()
            summary = run_merge(config, MergeOptions(once=True), spark=spark)
            merge_s = time.perf_counter() - started
            catalog = load_catalog(config.catalog)
            live = catalog.load_table(config.table.identifier).scan(selected_fields=("id", "updated")).to_arrow()
            expected = {k: r["updated"] for k, r in stream.rows.items()}
            got = dict(zip(live.column("id").to_pylist(), live.column("updated").to_pylist()))
            results["merge"] = {"changes": summary["changes"], "seconds": merge_s,
                                "changes_per_s": summary["changes"] / merge_s, "rows": len(got),
                                "equals_computed_state": got == expected}

            print(f"freshness: {args.fresh_rate} changes/s for {args.fresh_seconds} s ...", file=sys.stderr)
            exe = Path(sys.executable).parent / "streamberg"
            log = (directory / "fresh-ingest.log").open("w")
            ingest_proc = subprocess.Popen(
                [str(exe), "ingest", "--config", str(cdc_path), "--duration", str(args.fresh_seconds + 25), "--quiet"],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "STREAMBERG_LOG_FORMAT": "json"})
            stop = threading.Event()
            merger = threading.Thread(target=run_merge, args=(config, MergeOptions()),
                                      kwargs={"spark": spark, "stop": stop}, daemon=True)
            merger.start()
            time.sleep(12)  # the ingest's job start
            producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
            phase_start = int(time.time() * 1000)
            sent = 0
            while sent < args.fresh_rate * args.fresh_seconds:
                due = (time.time() * 1000 - phase_start) / 1000 * args.fresh_rate
                while sent < due and sent < args.fresh_rate * args.fresh_seconds:
                    partition, value = stream.next(int(time.time() * 1000))
                    producer.produce(topic, value=value, partition=partition)
                    sent += 1
                producer.poll(0)
                time.sleep(0.005)
            producer.flush(60)
            del producer  # its broker connection goes now, not after the broker stops
            ingest_proc.wait(timeout=300)
            changelog = catalog.load_table(changelog_identifier(config))
            deadline = time.monotonic() + 120
            while not merge_position(changelog.refresh(), catalog.load_table(config.table.identifier)).up_to_date:
                if time.monotonic() > deadline:
                    raise SystemExit("the merge did not catch up within 120 s")
                time.sleep(1)
            stop.set()
            merger.join(timeout=120)
            consumed = sum(committed_position(changelog.refresh(), topic).offsets.values())
            lat = latencies(config, phase_start)
            aim = args.merge_interval + args.commit_interval + 5
            results["freshness"] = {
                "changes": sent, "measured": int(len(lat)), "consumed_total": consumed,
                "p50_s": float(np.percentile(lat, 50)), "p95_s": float(np.percentile(lat, 95)),
                "max_s": float(lat.max()), "aim_p95_s": aim}

            print("scans before and after delete compaction ...", file=sys.stderr)
            name = register_catalog(spark, config.catalog)
            pk = f"{name}.{config.table.identifier}"
            target = catalog.load_table(config.table.identifier)
            delete_files = sum(len(t.delete_files) for t in target.scan().plan_files())
            before_s, before_answer = scan_seconds(spark, pk)
            spark.sql(f"CREATE TABLE {name}.bench.users_plain USING iceberg AS SELECT * FROM {pk}")
            started = time.perf_counter()
            compact = run_compact(config, CompactOptions(once=True), spark=spark)
            compact_s = time.perf_counter() - started
            target = catalog.load_table(config.table.identifier)
            after_deletes = sum(len(t.delete_files) for t in target.scan().plan_files())
            after_s, after_answer = scan_seconds(spark, pk)
            plain_s, plain_answer = scan_seconds(spark, f"{name}.bench.users_plain")
            results["scan"] = {
                "delete_files_before": delete_files, "delete_files_after": after_deletes,
                "before_s": before_s, "after_s": after_s, "plain_s": plain_s,
                "before_ratio": before_s / plain_s, "after_ratio": after_s / plain_s,
                "compaction_seconds": compact_s, "compaction_commits": compact.get("commits"),
                "same_answers": before_answer == after_answer == plain_answer}
            live = catalog.load_table(config.table.identifier).scan(selected_fields=("id", "updated")).to_arrow()
            got = dict(zip(live.column("id").to_pylist(), live.column("updated").to_pylist()))
            results["final_state_equals_computed"] = got == {k: r["updated"] for k, r in stream.rows.items()}
            spark.stop()

    out = results_path("cdc", stamp())
    out.write_text(json.dumps(results, indent=2))
    i, m, f, s = results["ingest"], results["merge"], results["freshness"], results["scan"]
    print(f"""
change-data capture, {args.changes:,} changes over {args.keys:,} keys, parallelism {args.parallelism}
  ingest, change log        {i['changelog']['records_per_s']:>10,.0f} records/s  {i['ratio']:.2f}x the append ingest of the same events ({i['append']['records_per_s']:,.0f}/s); steady {i['steady_ratio']:.2f}x (aim >= 0.8x)
  merge of the whole log    {m['changes_per_s']:>10,.0f} changes/s  ({m['changes']:,} in {m['seconds']:.1f} s; equals the computed state: {m['equals_computed_state']})
  freshness ({args.fresh_rate}/s)      p50 {f['p50_s']:.1f} s, p95 {f['p95_s']:.1f} s, max {f['max_s']:.1f} s over {f['measured']:,} changes (aim p95 <= {f['aim_p95_s']:g} s)
  full scan in Spark        {s['before_s']*1000:.0f} ms with {s['delete_files_before']} delete files ({s['before_ratio']:.2f}x), {s['after_s']*1000:.0f} ms after delete compaction ({s['after_ratio']:.2f}x) vs {s['plain_s']*1000:.0f} ms for an append table of the same rows (aim <= 1.1x); same answers: {s['same_answers']}
  final table equals the computed state: {results['final_state_equals_computed']}
results: {out}""")


if __name__ == "__main__":
    main()
