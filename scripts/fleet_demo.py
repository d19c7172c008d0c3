"""`make demo-fleet`: 28 tables from one ingest job on the embedded defaults (examples/fleet.yaml).

1. A fresh embedded broker (tansu, in memory) and a fresh fleet catalog under .streamberg/fleet/.
2. 24 topics: `orders` (its declared table), 21 `events.*` topics (tables inferred from their
   records), one Debezium topic per source table `dbserver1.inventory.{customers,addresses}`
   (their change logs), and `clicks`, split by its records' `region` into web.clicks_{eu,us,apac};
   1 % malformed records in each.
3. `streamberg run` on the fleet config for --seconds: one ingest job for every table and one
   governor keeping them (`streamberg govern`: clustering, merges of the CDC tables); a topic
   made halfway gets its table without a restart.
4. `streamberg status` of the whole fleet: one line a table, worst first; then each table's
   rows against what was produced (exactly once).
Leaves nothing running (the broker is stopped on any exit).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

from streamberg.common.broker import EmbeddedBroker, ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.common.config import fleet_table, load_fleet

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "fleet.yaml"


def _say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=75.0, help="how long the job runs")
    parser.add_argument("--per-topic", type=int, default=2000, help="events per topic")
    args = parser.parse_args()
    state = ROOT / ".streamberg" / "fleet"
    shutil.rmtree(state, ignore_errors=True)
    broker = EmbeddedBroker(state / "broker")
    _say("fresh embedded broker and an empty fleet catalog (.streamberg/fleet/)")
    info = broker.start(port=19092)
    exe = Path(sys.executable).parent / "streamberg"
    produced: dict[str, list[int]] = {}
    try:
        producer = Producer({"bootstrap.servers": info.bootstrap, "linger.ms": 10})
        topics = ["orders"] + [f"events.{name}" for name in (
            "clicks", "views", "searches", "carts", "payments", "refunds", "logins", "logouts", "signups",
            "shares", "likes", "comments", "reviews", "ratings", "alerts", "errors", "pings", "deploys",
            "builds", "tests", "audits")] + ["dbserver1.inventory.customers", "dbserver1.inventory.addresses", "clicks"]
        regions = ("eu", "us", "apac")

        def produce(topic: str, start: int, count: int) -> None:
            ensure_topic(info.bootstrap, topic, 2)
            for i in range(start, start + count):
                if i % 100 == 99:
                    producer.produce(topic, value=b"{not json", partition=i % 2)
                    continue
                region = regions[i % 3] if topic == "clicks" else None
                produced.setdefault(f"{topic}/{region}" if region else topic, []).append(i)
                if topic.startswith("dbserver1"):
                    value = {"op": "c", "after": {"id": i, "name": f"n{i}", "city": "ams"}, "source": {"ts_ms": i}}
                else:
                    value = {"id": i, "ts": "2026-11-26T10:00:00Z", "user_id": f"u{i % 50}", "amount": i / 10,
                             **({"region": region} if region else {})}
                producer.produce(topic, value=json.dumps(value).encode(), partition=i % 2)
            producer.flush(30)

        _say(f"{len(topics)} topics, {args.per_topic:,} events each, 1 % malformed")
        for topic in topics:
            produce(topic, 0, args.per_topic)

        def late() -> None:
            time.sleep(args.seconds / 2)
            print("   (a topic made while the job runs: events.late)", flush=True)
            produce("events.late", 0, 500)

        threading.Thread(target=late, daemon=True).start()
        _say(f"streamberg run for {args.seconds:.0f} s: one ingest job for every table, one governor keeping them")
        subprocess.run([str(exe), "run", "--config", str(CONFIG), "--duration", str(args.seconds)], check=True)
        _say("streamberg status: one line a table, worst first")
        subprocess.run([str(exe), "status", "--config", str(CONFIG)])
        _say("each table's rows against what was produced into its topic")
        fleet = load_fleet(CONFIG)
        exact = 0
        for key, ids in sorted(produced.items()):
            topic, _, region = key.partition("/")
            route = fleet.route_of(topic)
            config = fleet_table(fleet, route.table_identifier(topic, region or None),
                                 sorted({k.partition("/")[0] for k in produced}))
            name = config.table.identifier + ("_changelog" if topic.startswith("dbserver1") else "")
            rows = load_catalog(config.catalog).load_table(name).scan(selected_fields=("id",)).to_arrow()
            got = rows.column("id").to_pylist()
            ok = len(got) == len(set(got)) == len(ids) and sorted(got) == ids
            exact += ok
            print(f"   {name:<36} {len(got):>7,} rows, {len(set(got)):>7,} distinct, {len(ids):>7,} produced"
                  f"  {'exactly once' if ok else 'MISMATCH'}")
        print(f"\n{exact} of {len(produced)} tables hold each of their records once")
        return 0 if exact == len(produced) else 1
    finally:
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
