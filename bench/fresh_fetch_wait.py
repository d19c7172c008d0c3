"""How long a fresh read's fetches may wait (`fetch.wait.max.ms`), measured against the broker.

A fresh read to Kafka's end reads every partition from an offset a few thousand records
below its end until the broker says the end is reached. Under a steady producer a topic
holds many small record batches; the 09:30 run of `bench/fresh.py` had reads that got
nothing for 60 s after a kill -9 of the ingest. This bench reproduces the shape on its own:
one topic of 4 partitions filled with small batches (`--batch` records each), then reads of
all four partitions from random offsets up to `--below` records under the end, with the
product's own consumer settings (fresh/consumers.read_settings) and each wait in `--waits`,
optionally with `--busy` processes spinning on the cores beside it.

    .venv/bin/python bench/fresh_fetch_wait.py --records 300000 --busy 2

It reports, per wait, the read time to every partition's end (p50, p95, max), how many reads
took longer than `--stall` seconds, and each wait's p95 as a ratio to the product's.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from streamberg.bench.harness import percentile, stamp, work_with_broker, write_results
from streamberg.common.broker import ensure_topic
from streamberg.fresh.consumers import FETCH_WAIT_MS, read_settings

TOPIC = "fetch_wait"
PARTITIONS = 4


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _fill(bootstrap: str, records: int, batch: int) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "batch.num.messages": batch,
                         "queue.buffering.max.messages": 2_000_000})
    started = time.monotonic()
    for i in range(records):
        producer.produce(TOPIC, b'{"id": %d, "city": "c%d", "payload": "%s"}' % (i, i % 97, b"x" * 48),
                         partition=i % PARTITIONS)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush()
    return time.monotonic() - started


def _read(consumer: Consumer, starts: dict[int, int], limit: float) -> tuple[float, int, bool]:
    """Read each partition from its start to the end the broker reports; (seconds, records,
    every partition ended within `limit`)."""
    consumer.assign([TopicPartition(TOPIC, p, o) for p, o in starts.items()])
    started = time.monotonic()
    ended: set[int] = set()
    records = 0
    while len(ended) < len(starts) and time.monotonic() - started < limit:
        for message in consumer.consume(10_000, 0.05):
            error = message.error()
            if error is None:
                records += 1
            elif error.code() == KafkaError._PARTITION_EOF:
                ended.add(message.partition())
    consumer.unassign()
    return time.monotonic() - started, records, len(ended) == len(starts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=300_000, help="records in the topic (default 300,000)")
    parser.add_argument("--batch", type=int, default=6, help="records a producer batch at most (default 6)")
    parser.add_argument("--below", type=int, default=3_000, help="a read starts up to this many records below "
                                                                 "each partition's end (default 3,000)")
    parser.add_argument("--reads", type=int, default=12, help="reads a wait (default 12)")
    parser.add_argument("--waits", default="10,50,100,250,500", help="fetch.wait.max.ms values, comma-separated")
    parser.add_argument("--busy", type=int, default=0, help="processes spinning beside the reads (default 0)")
    parser.add_argument("--stall", type=float, default=5.0, help="a read longer than this counts as stalled")
    parser.add_argument("--limit", type=float, default=30.0, help="a read is given up after this (default 30 s)")
    args = parser.parse_args()
    waits = [int(w) for w in args.waits.split(",") if w.strip()]
    run = stamp()
    spinners: list[multiprocessing.Process] = []
    with work_with_broker("fetch-wait-") as work:
        ensure_topic(work.bootstrap, TOPIC, PARTITIONS)
        fill_seconds = _fill(work.bootstrap, args.records, args.batch)
        per_partition = args.records // PARTITIONS
        spinners = [multiprocessing.Process(target=_spin, args=(3600.0,), daemon=True) for _ in range(args.busy)]
        for spinner in spinners:
            spinner.start()
        rows: dict[str, dict] = {}
        try:
            chooser = random.Random(7)
            for wait in waits:
                settings = {**read_settings({"bootstrap.servers": work.bootstrap}, "bench-fetch-wait"),
                            "fetch.wait.max.ms": wait}
                consumer = Consumer(settings)
                times, stalled, unfinished = [], 0, 0
                try:
                    for _ in range(args.reads):
                        starts = {p: max(0, per_partition - chooser.randint(1, args.below)) for p in range(PARTITIONS)}
                        seconds, _, finished = _read(consumer, starts, args.limit)
                        times.append(seconds)
                        stalled += seconds > args.stall
                        unfinished += not finished
                finally:
                    consumer.close()
                rows[str(wait)] = {"p50_s": round(percentile(times, 50) or 0, 3),
                                   "p95_s": round(percentile(times, 95) or 0, 3),
                                   "max_s": round(max(times), 3), "stalled": stalled, "unfinished": unfinished}
                print(f"fetch.wait.max.ms={wait:>4}: p50 {rows[str(wait)]['p50_s']:.2f} s, p95 "
                      f"{rows[str(wait)]['p95_s']:.2f} s, max {rows[str(wait)]['max_s']:.2f} s, "
                      f"{stalled} of {args.reads} over {args.stall:g} s, {unfinished} unfinished", flush=True)
        finally:
            for spinner in spinners:
                spinner.terminate()
    product = rows.get(str(FETCH_WAIT_MS))
    for row in rows.values():
        row["p95_over_product"] = round(row["p95_s"] / product["p95_s"], 2) if product and product["p95_s"] else None
    summary = {"stamp": run, "command": "bench/fresh_fetch_wait.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()), "product_wait_ms": FETCH_WAIT_MS,
        "records": args.records, "batch": args.batch, "busy": args.busy, "fill_seconds": round(fill_seconds, 1),
        "waits": rows}
    print("summary:", write_results("fresh-fetch-wait", run, summary, summary))


if __name__ == "__main__":
    main()
