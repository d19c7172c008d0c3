"""Ingest benchmark: streamberg (PyFlink, exactly-once) at parallelism 1 and 2 vs a bare Python
baseline, same topic, same run.

    .venv/bin/python bench/ingest_throughput.py [--records 2000000] [--partitions 4] [--parallelisms 1,2]

1. Starts its own tansu broker, produces N JSON events (the demo schema) to a fresh topic.
2. Baseline: one Python process consumes the topic with confluent-kafka (assign, from 0),
   decodes each batch with pyarrow.json and writes Parquet files: no Flink, no Iceberg
   commit, no dead-letter checks.
3. streamberg: `streamberg ingest --max-records N` on the same topic into a fresh table, once
   per parallelism. Per run: end to end (wall clock of the command, JVM and job start
   included), start-up (command start to the last writer reading), and steady state (records
   committed / time from the writers reading to the last commit).
   Then the highest parallelism once more with `ingest.fork_python_workers=false` (each
   Python worker a fresh interpreter instead of a fork of the pre-warmed one): start-up and
   end to end side by side (`--no-unforked-run` skips it).
4. Nested JSON: the same number of orders-shaped events (a struct in a struct, a list of
   strings, a list of structs with decimals) to a topic of their own, ingested at the highest
   parallelism; records/s and MB/s set against the flat run of that parallelism
   (`--no-nested-run` skips it).
5. Schema evolution: the same orders into a table declared without `customer.geo`, which every
   record carries: the ingest adds it (ingest.schema_evolution: add; the writers hold the records
   until the committer's first commit added it, then decode them themselves); records/s set
   against the nested run of the same records (`--no-evolving-run` skips it).
6. Avro and Protobuf: the same number of flat events written as Confluent-framed Avro and
   Protobuf (confluent-kafka's AvroSerializer and ProtobufSerializer) through a registry
   stand-in (tests/fixtures/registry.py: no registry server is installable here), ingested
   with kafka.value_format avro, then protobuf, at the highest parallelism; records/s set
   against the flat JSON run (`--no-avro-run`, `--no-protobuf-run` skip them).
7. Freshness: with the ingest running, events are produced at a fixed rate; for every
   record, (commit time of the snapshot that made it visible) - (its produce time, the `ts`
   field) gives p50/p95, set against the commit interval.

Prints a table (rates as ratios to the baseline, and parallelism 2 to 1) and writes
bench/results/ingest-<time>.json. Figures are measured, never assumed; run it on an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute
import pyarrow.json as pj
import pyarrow.parquet as pq
import yaml
from confluent_kafka import Consumer, TopicPartition

from streamberg.bench.harness import broker_in, checkout_tests, results_path, stamp
from streamberg.cli.sample_events import SAMPLE_EVENT_SCHEMA, produce_events
from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.table_meta.offsets import summary_properties
from streamberg.table_meta.summary_keys import SummaryKeys

SCHEMA = SAMPLE_EVENT_SCHEMA
# The orders shape of the real-records issue: nested objects, a list, a list of objects.
ORDERS_SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "ts", "type": "timestamptz", "required": True},
    {"name": "customer", "type": "struct", "fields": [
        {"name": "cid", "type": "long"}, {"name": "geo", "type": "struct<city:string,lat:double>"}]},
    {"name": "tags", "type": "list<string>"},
    {"name": "items", "type": "list<struct<sku:string,qty:int,price:decimal(10,2)>>"},
]


ENGINE = "flink"  # ingest.engine of every streamberg run (--engine)


def write_config(directory: Path, bootstrap: str, topic: str, interval: float, parallelism: int,
                 schema: list | None = None, registry_url: str | None = None, value_format: str = "avro") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    doc = {
        "kafka": {"bootstrap_servers": bootstrap, "topic": topic,
                  **({"value_format": value_format, "schema_registry": {"url": registry_url}} if registry_url else {})},
        "catalog": {"uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "table": {"identifier": f"bench.{topic.replace('-', '_')}", "schema": schema or SCHEMA},
        "ingest": {"commit_interval_seconds": interval, "parallelism": parallelism, "state_dir": "state",
                   "max_poll_records": 10000, "engine": ENGINE},
    }
    path = directory / f"{topic}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def baseline(bootstrap: str, topic: str, partitions: int, records: int, out_dir: Path) -> float:
    """Bare consume -> pyarrow.json -> Parquet in one process; returns seconds."""
    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("user_id", pa.string()),
                        ("city", pa.string()), ("amount", pa.float64())])
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    started = time.perf_counter()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "baseline", "enable.auto.commit": False,
                         "fetch.max.bytes": 64 * 1024 * 1024})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = pq.ParquetWriter(out_dir / "part-0.parquet", schema)
    pending, pending_rows, seen = [], 0, 0
    while seen < records:
        messages = consumer.consume(10000, 1.0)
        values = [m.value() for m in messages if m.error() is None]
        if not values:
            continue
        seen += len(values)
        pending.append(pj.read_json(io.BytesIO(b"\n".join(values)), parse_options=options))
        pending_rows += pending[-1].num_rows
        if pending_rows >= 131072:
            writer.write_table(pa.concat_tables(pending))
            pending, pending_rows = [], 0
    if pending:
        writer.write_table(pa.concat_tables(pending))
    writer.close()
    consumer.close()
    return time.perf_counter() - started


def run_streamberg(config_path: Path, records: int, parallelism: int, env: dict | None = None) -> dict:
    exe = Path(sys.executable).parent / "streamberg"
    started = time.perf_counter()
    started_wall = time.time()
    proc = subprocess.run([str(exe), "ingest", "--config", str(config_path), "--max-records", str(records),
                           "--parallelism", str(parallelism), "--quiet"], capture_output=True, text=True,
                          env={**os.environ, "STREAMBERG_LOG_FORMAT": "json", **(env or {})})
    seconds = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"streamberg ingest failed:\n{proc.stderr[-3000:]}")
    config = load_config(config_path)
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    snapshots = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms)
    done_at = snapshots[-1].timestamp_ms / 1000  # the commit that made the last record visible
    records = int(summary_properties(snapshots[-1]).get("total-records", 0))
    # Steady state: from the moment the writers were reading (job started, logged by each
    # writer) to that last commit, so JVM and job start-up are left out.
    opened = [datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp()
              for line in proc.stderr.splitlines() if '"lane opened"' in line]
    running = done_at - max(opened)
    return {"parallelism": parallelism, "seconds": seconds, "records": records, "commits": len(snapshots),
            "records_per_s": records / seconds, "startup_seconds": max(opened) - started_wall,
            "steady_seconds": running, "steady_records_per_s": records / running}


def freshness(bootstrap: str, directory: Path, partitions: int, parallelism: int, interval: float,
              rate: int, seconds: int) -> dict:
    topic = "bench-fresh"
    ensure_topic(bootstrap, topic, partitions)
    path = write_config(directory, bootstrap, topic, interval, parallelism)
    config = load_config(path)
    exe = Path(sys.executable).parent / "streamberg"
    log = (directory / "fresh.log").open("w")
    proc = subprocess.Popen([str(exe), "ingest", "--config", str(path), "--quiet"], stdout=log, stderr=log,
                            env={**os.environ, "STREAMBERG_LOG_FORMAT": "json"})
    # Warm up: a first commit proves the job (writers and committer) is up, so neither JVM
    # start nor operator start-up is counted. Warm-up ids start at 10**9 and are left out.
    warmup_id = 10**9
    produce_events(config, 1000, start_id=warmup_id)
    deadline = time.monotonic() + 300
    while '"committed"' not in (directory / "fresh.log").read_text():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"freshness run did not start: {(directory / 'fresh.log').read_text()[-2000:]}")
        time.sleep(0.5)
    produce_events(config, rate * seconds, rate=rate, start_id=0)
    # Then the producers add a field the table lacks: a few seconds of records carrying it, at
    # the same rate. The ingest adds the column in the commit that first carries them.
    evolve_start, evolve_seconds = rate * seconds, 5
    evolving = load_config(write_config(directory / "evolving", bootstrap, topic, interval, parallelism,
                                        schema=[*SCHEMA, {"name": "added_later", "type": "string"}]))
    produce_events(evolving, rate * evolve_seconds, rate=rate, start_id=evolve_start)
    # Let the last records become visible, then stop gracefully.
    time.sleep(3 * interval + 2)
    proc.send_signal(2)
    proc.wait(120)
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    lag_ms, evolved_lag_ms = [], []
    first_carrier_us = None
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue  # a manifest carried over from an earlier snapshot
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                data = pq.read_table(entry.data_file.file_path.removeprefix("file://"), columns=["id", "ts"])
                measured = data.filter(pa.compute.less(data.column("id"), warmup_id))
                ids = measured.column("id").to_numpy()
                micros = measured.column("ts").cast(pa.int64()).to_numpy()
                lag_ms.append(snapshot.timestamp_ms - micros[ids < evolve_start] / 1000)
                carriers = micros[ids >= evolve_start]
                evolved_lag_ms.append(snapshot.timestamp_ms - carriers / 1000)
                if len(carriers):
                    first_carrier_us = min(first_carrier_us or carriers.min(), carriers.min())
    lag = np.concatenate(lag_ms) / 1000
    evolved_lag = np.concatenate(evolved_lag_ms) / 1000
    # The snapshot that added the column, against the produce time of the first record carrying it.
    added = [s for s in table.metadata.snapshots if SummaryKeys.SCHEMA_ADDED in summary_properties(s)]
    column_after_s = (added[0].timestamp_ms / 1000 - first_carrier_us / 1e6) if added and first_carrier_us else None
    return {"records": int(lag.size), "rate": rate, "commit_interval_s": interval,
            "p50_s": float(np.percentile(lag, 50)), "p95_s": float(np.percentile(lag, 95)),
            "max_s": float(lag.max()), "evolving_records": int(evolved_lag.size),
            "evolving_p50_s": float(np.percentile(evolved_lag, 50)),
            "evolving_p95_s": float(np.percentile(evolved_lag, 95)),
            "column_visible_after_s": column_after_s, "column_added": bool(added)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--engine", choices=("flink", "processes"), default="flink",
                        help="ingest.engine of the streamberg runs (processes: no JVM; its runs skip the unforked one)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--parallelisms", default="1,2", help="streamberg runs, one per parallelism (comma list)")
    parser.add_argument("--interval", type=float, default=5.0, help="commit interval of the streamberg runs")
    parser.add_argument("--fresh-rate", type=int, default=10_000, help="events/s during the freshness run (0: skip)")
    parser.add_argument("--fresh-seconds", type=int, default=30)
    parser.add_argument("--no-nested-run", action="store_true", help="skip the nested-JSON (orders) run")
    parser.add_argument("--no-avro-run", action="store_true", help="skip the Avro (schema registry) run")
    parser.add_argument("--no-protobuf-run", action="store_true", help="skip the Protobuf (schema registry) run")
    parser.add_argument("--no-evolving-run", action="store_true",
                        help="skip the run whose table lacks a field the orders carry (schema evolution)")
    parser.add_argument("--no-unforked-run", action="store_true",
                        help="skip the comparison run whose Python workers start fresh interpreters "
                             "(ingest.fork_python_workers=false)")
    args = parser.parse_args()
    global ENGINE
    ENGINE = args.engine
    parallelisms = [int(p) for p in args.parallelisms.split(",")]

    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        directory = Path(tmp)
        with broker_in(directory) as bootstrap:
            topic = "bench-events"
            ensure_topic(bootstrap, topic, args.partitions)
            produce_config = write_config(directory, bootstrap, topic, args.interval, 1)
            print(f"producing {args.records:,} events ...", file=sys.stderr)
            flat_bytes = produce_events(load_config(produce_config), args.records).bytes
            print("baseline ...", file=sys.stderr)
            base_s = baseline(bootstrap, topic, args.partitions, args.records, directory / "baseline")
            runs = []
            for parallelism in parallelisms:
                print(f"streamberg ingest, parallelism {parallelism} ...", file=sys.stderr)
                # A table of its own per run (same topic): each run reads all N records.
                config_path = write_config(directory / f"p{parallelism}", bootstrap, topic, args.interval,
                                           parallelism)
                runs.append(run_streamberg(config_path, args.records, parallelism))
            unforked = None
            if not args.no_unforked_run and args.engine == "flink":  # forking is the Flink workers'
                # The same run at the highest parallelism, each Python worker a fresh
                # interpreter instead of a fork of the pre-warmed one (ingest/local/fork_server.py).
                parallelism = max(parallelisms)
                print(f"streamberg ingest, parallelism {parallelism}, workers not forked ...", file=sys.stderr)
                config_path = write_config(directory / f"p{parallelism}-unforked", bootstrap, topic,
                                           args.interval, parallelism)
                unforked = run_streamberg(config_path, args.records, parallelism,
                                          env={"STREAMBERG_INGEST__FORK_PYTHON_WORKERS": "false"})
            nested = None
            if not args.no_nested_run:
                parallelism = max(parallelisms)
                orders_topic = "bench-orders"
                ensure_topic(bootstrap, orders_topic, args.partitions)
                orders_config = write_config(directory / "orders", bootstrap, orders_topic, args.interval,
                                             parallelism, ORDERS_SCHEMA)
                print(f"producing {args.records:,} orders (nested JSON) ...", file=sys.stderr)
                nested_bytes = produce_events(load_config(orders_config), args.records).bytes
                print(f"streamberg ingest, parallelism {parallelism}, nested JSON ...", file=sys.stderr)
                nested = {**run_streamberg(orders_config, args.records, parallelism), "bytes": nested_bytes}
            evolving = None
            if nested is not None and not args.no_evolving_run:
                lacking = [{**f, "fields": [g for g in f["fields"] if g["name"] != "geo"]} if f["name"] == "customer"
                           else f for f in ORDERS_SCHEMA]
                evolve_config = write_config(directory / "orders-evolving", bootstrap, orders_topic,
                                             args.interval, nested["parallelism"], lacking)
                print(f"streamberg ingest, parallelism {nested['parallelism']}, nested JSON into a table lacking "
                      "customer.geo ...", file=sys.stderr)
                evolving = run_streamberg(evolve_config, args.records, nested["parallelism"])
                evolved = load_catalog(load_config(evolve_config).catalog).load_table(
                    load_config(evolve_config).table.identifier)
                held = [int(summary_properties(s).get("streamberg.evolved-records", 0)) for s in evolved.snapshots()]
                evolving.update({"field_added": str(evolved.schema().find_type("customer.geo")),
                                 "held_records": sum(held)})
            framed: dict[str, dict] = {}
            formats = [f for f, skip in (("avro", args.no_avro_run), ("protobuf", args.no_protobuf_run)) if not skip]
            if formats:
                checkout_tests()
                from tests.fixtures.registry import start_registry

                registry, registry_server = start_registry()
                try:
                    parallelism = max(parallelisms)
                    for value_format in formats:
                        framed_topic = f"bench-{value_format}"
                        ensure_topic(bootstrap, framed_topic, args.partitions)
                        framed_config = write_config(directory / value_format, bootstrap, framed_topic,
                                                     args.interval, parallelism, registry_url=registry.url,
                                                     value_format=value_format)
                        print(f"producing {args.records:,} events as {value_format} ...", file=sys.stderr)
                        framed_bytes = produce_events(load_config(framed_config), args.records).bytes
                        print(f"streamberg ingest, parallelism {parallelism}, {value_format} ...", file=sys.stderr)
                        framed[value_format] = {**run_streamberg(framed_config, args.records, parallelism),
                                                "bytes": framed_bytes}
                finally:
                    registry_server.shutdown()
            fresh = None
            if args.fresh_rate:
                print("freshness ...", file=sys.stderr)
                fresh = freshness(bootstrap, directory, args.partitions, max(parallelisms), args.interval,
                                  args.fresh_rate, args.fresh_seconds)

    base_rate = args.records / base_s
    for run in runs:
        run["ratio_end_to_end"] = run["records_per_s"] / base_rate
        run["ratio_steady_state"] = run["steady_records_per_s"] / base_rate
    by_p = {run["parallelism"]: run for run in runs}
    for run in runs:
        run["bytes"] = flat_bytes
    if nested is not None:
        flat = by_p[nested["parallelism"]]
        nested["mb_per_s"] = nested["bytes"] / nested["seconds"] / 1e6
        flat["mb_per_s"] = flat_bytes / flat["seconds"] / 1e6
        nested["records_ratio_to_flat"] = nested["records_per_s"] / flat["records_per_s"]
        nested["mb_ratio_to_flat"] = nested["mb_per_s"] / flat["mb_per_s"]
    scaling = by_p[2]["records_per_s"] / by_p[1]["records_per_s"] if 1 in by_p and 2 in by_p else None
    result = {
        "records": args.records, "partitions": args.partitions, "cores": os.cpu_count(), "engine": args.engine,
        "python_workers": os.environ.get("_python_worker_execution_mode", "process"),  # noqa: SIM112 - PyFlink's name
        "baseline": {"seconds": base_s, "records_per_s": base_rate},
        "streamberg": runs, "p2_over_p1_end_to_end": scaling, "freshness": fresh,
        "unforked_workers": unforked, "nested": nested, "evolving": evolving, **framed,
    }
    results_path("ingest", stamp()).write_text(json.dumps(result, indent=2))
    print(f"\nrecords {args.records:,}, {args.partitions} partitions, {os.cpu_count()} cores, "
          f"Python workers: {result['python_workers']}")
    print(f"{'':38}{'records/s':>12}{'seconds':>10}{'ratio':>8}")
    print(f"{'baseline (python, no flink/commit)':38}{base_rate:>12,.0f}{base_s:>10.1f}{1.0:>8.2f}")
    for run in runs:
        p = run["parallelism"]
        print(f"{f'streamberg p={p} end to end (w/ start)':38}{run['records_per_s']:>12,.0f}"
              f"{run['seconds']:>10.1f}{run['ratio_end_to_end']:>8.2f}")
        print(f"{f'streamberg p={p} steady (job running)':38}{run['steady_records_per_s']:>12,.0f}"
              f"{run['steady_seconds']:>10.1f}{run['ratio_steady_state']:>8.2f}")
        print(f"{f'  p={p} start-up to the writers reading':38}{'':>12}{run['startup_seconds']:>10.1f}"
              f"   commits: {run['commits']}")
    if scaling is not None:
        print(f"p=2 / p=1 end to end: {scaling:.2f}x")
    if unforked is not None:
        forked = by_p[unforked["parallelism"]]
        print(f"p={unforked['parallelism']} start-up, workers forked vs fresh interpreters: "
              f"{forked['startup_seconds']:.1f}s vs {unforked['startup_seconds']:.1f}s "
              f"({forked['startup_seconds'] / unforked['startup_seconds']:.2f}x); end to end "
              f"{forked['seconds']:.1f}s vs {unforked['seconds']:.1f}s")
    if nested is not None:
        flat = by_p[nested["parallelism"]]
        print(f"p={nested['parallelism']} nested JSON (orders) vs flat, end to end: "
              f"{nested['records_per_s']:,.0f} vs {flat['records_per_s']:,.0f} records/s "
              f"({nested['records_ratio_to_flat']:.2f}x); {nested['mb_per_s']:.1f} vs {flat['mb_per_s']:.1f} MB/s "
              f"({nested['mb_ratio_to_flat']:.2f}x); steady {nested['steady_records_per_s']:,.0f} vs "
              f"{flat['steady_records_per_s']:,.0f} records/s")
    if evolving is not None:
        print(f"p={evolving['parallelism']} nested JSON into a table lacking customer.geo (added by the ingest: "
              f"{evolving['field_added']}): {evolving['records_per_s']:,.0f} vs {nested['records_per_s']:,.0f} "
              f"records/s end to end ({evolving['records_per_s'] / nested['records_per_s']:.2f}x the nested run); "
              f"{evolving['held_records']:,} records decoded by the committer after the change")
    for value_format, run in framed.items():
        flat = by_p[run["parallelism"]]
        print(f"p={run['parallelism']} {value_format} through a registry vs JSON, same events, end to end: "
              f"{run['records_per_s']:,.0f} vs {flat['records_per_s']:,.0f} records/s "
              f"({run['records_per_s'] / flat['records_per_s']:.2f}x); steady {run['steady_records_per_s']:,.0f} vs "
              f"{flat['steady_records_per_s']:,.0f} records/s; {run['bytes'] / args.records:.0f} vs "
              f"{flat_bytes / args.records:.0f} bytes a record, {run['bytes'] / run['seconds'] / 1e6:.1f} vs "
              f"{flat_bytes / flat['seconds'] / 1e6:.1f} MB/s "
              f"({run['bytes'] / run['seconds'] / (flat_bytes / flat['seconds']):.2f}x)")
    if fresh:
        print(f"freshness at {fresh['rate']:,}/s, commit interval {fresh['commit_interval_s']}s: "
              f"p50 {fresh['p50_s']:.2f}s  p95 {fresh['p95_s']:.2f}s  max {fresh['max_s']:.2f}s over "
              f"{fresh['records']:,} records")
        visible = fresh["column_visible_after_s"]
        print(f"then records with a field the table lacks: the column visible "
              f"{'never' if visible is None else f'{visible:.2f}s'} "
              f"after the first such record was produced; their lag p50 {fresh['evolving_p50_s']:.2f}s "
              f"p95 {fresh['evolving_p95_s']:.2f}s over {fresh['evolving_records']:,} records "
              f"({fresh['evolving_p95_s'] / fresh['p95_s']:.2f}x the p95 before)")


if __name__ == "__main__":
    main()
