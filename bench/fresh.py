"""Fresh reads against committed reads, in one run: freshness, read time, exactness.

    .venv/bin/python bench/fresh.py [--rate 10000] [--seconds 300] [--intervals 5,60]

Per commit interval (`--intervals`), on its own topic and table, in phases (`--phases`):
with every fresh read decoding its tail from Kafka (`kafka`), with the ingest's own writers
keeping the rows they decode (`ingest`: `ingest.keep_tail`), the same read only as far as
that kept tail goes (`kept-end`: `until="kept"`, no broker round trip), or with `streamberg
tail` keeping the tail decoded (`kept`), `--seconds` each. The ingest (`--engine`) keeps its tail
in every phase when `ingest` is among them (the same load for all); the other phases' reads
look at another state folder and never see it.
1. The real `streamberg ingest` (PyFlink, exactly-once) runs on its own tansu broker while
   events (the demo shape, `ts` = produce time) are produced at `--rate`/s.
2. Freshness. Every `--probe-every` s a probe event is produced and its produce time kept;
   a fresh read filtered to its id (`streamberg.fresh.read`) is repeated until the probe is in
   it: produce -> visible in a fresh read. The same probe's committed freshness: the commit
   time of the first snapshot whose recorded offsets cover it, less its produce time (what
   every engine reading the table sees). p50/p95 of both.
3. Read time. Between probes, the same filtered count (`city = 'ber'`, column `id`) read
   fresh and snapshot-only, alternately: p50/p95 of each and the ratio fresh / snapshot.
4. Exactness. Every unfiltered fresh read (one per probe cycle) is checked: its rows equal
   the records below its watermarks (every event valid, the topic new: the sum of the
   watermarks), each id once.
5. Memory: the peak resident memory of this reading process (the tail is decoded in it) and
   of the tail keeper.

Prints a summary and writes bench/results/fresh-<time>.json. Figures are measured, never
assumed; run it on an otherwise idle machine (the broker, Flink and the producer share it).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import yaml
from confluent_kafka import Producer

from streamberg.bench.harness import (
    ROOT,
    broker_in,
    checkout_tests,
    process_tree,
    results_path,
    stamp,
    tree_rss,
    write_results,
)
from streamberg.cli.sample_events import SAMPLE_EVENT_SCHEMA
from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.fresh import read
from streamberg.table_meta.offsets import decode_offsets
from streamberg.table_meta.summary_keys import kafka_offsets_key
from streamberg.table_meta.tail_segments import cache_folder, segments

CITIES = ("ams", "ber", "par", "lis", "osl")
PARTITIONS = 4
PROBE_BASE = 1_000_000_000  # probe ids, apart from the stream's


def _event(i: int) -> bytes:
    return orjson.dumps({"id": i, "ts": datetime.now(timezone.utc).isoformat(), "user_id": f"u{i % 997}",
                         "city": CITIES[i % 5], "amount": (i % 10_000) / 100})


class Stream(threading.Thread):
    """Events at a fixed rate, in 10 ms slices; counts what the broker took."""

    def __init__(self, bootstrap: str, topic: str, rate: int) -> None:
        super().__init__(daemon=True)
        self.topic, self.rate = topic, rate
        self.stop = threading.Event()
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 10000,
                                  "queue.buffering.max.messages": 2_000_000})
        self.sent = 0
        self.behind = 0.0  # the most the producer fell behind its schedule, s

    def run(self) -> None:
        started = time.monotonic()
        while not self.stop.is_set():
            elapsed = time.monotonic() - started
            due = int(elapsed * self.rate)
            self.behind = max(self.behind, (due - self.sent) / self.rate)
            while self.sent < due:
                try:
                    self.producer.produce(self.topic, value=_event(self.sent), partition=self.sent % PARTITIONS)
                    self.sent += 1
                except BufferError:
                    self.producer.poll(0.01)
            self.producer.poll(0)
            time.sleep(0.01)
        assert self.producer.flush(120) == 0


class Probes:
    """Probe events, one at a time, with their produce time and position."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        self.sent: list[dict[str, Any]] = []

    def send(self) -> dict[str, Any]:
        probe: dict[str, Any] = {"id": PROBE_BASE + len(self.sent)}
        partition = len(self.sent) % PARTITIONS

        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            probe["partition"], probe["offset"] = msg.partition(), msg.offset()

        probe["produced"] = time.time()
        self.producer.produce(self.topic, value=_event(probe["id"]), partition=partition, on_delivery=delivered)
        assert self.producer.flush(30) == 0
        self.sent.append(probe)
        return probe


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def _committed_freshness(config: Any, probes: list[dict[str, Any]]) -> list[float]:
    """Per probe: the commit time of the first snapshot covering it, less its produce time."""
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    key = kafka_offsets_key(config.kafka.topic)
    commits = sorted((s.timestamp_ms / 1000, decode_offsets(s.summary.additional_properties[key]))
                     for s in table.snapshots() if s.summary is not None and key in s.summary.additional_properties)
    out = []
    for probe in probes:
        for when, offsets in commits:
            if offsets.get(probe["partition"], 0) > probe["offset"]:
                out.append(when - probe["produced"])
                break
    return out


def run_interval(work: Path, bootstrap: str, interval: float, args: argparse.Namespace) -> dict[str, Any]:
    topic = f"fresh-{int(interval)}s"
    ensure_topic(bootstrap, topic, PARTITIONS)
    path = work / f"{topic}.yaml"
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": bootstrap, "topic": topic},
        "catalog": {"name": f"bench{int(interval)}", "uri": f"sqlite:///{work}/catalog.db",
                    "warehouse": str(work / "warehouse")},
        "table": {"identifier": f"bench.fresh_{int(interval)}s", "schema": SAMPLE_EVENT_SCHEMA},
        "ingest": {"commit_interval_seconds": interval, "state_dir": str(work / f"state-{int(interval)}"),
                   "parallelism": 2, "max_poll_records": 10000, "keep_tail": bool({"ingest", "kept-end"} & set(args.phases.split(","))),
                   "engine": args.engine}}))
    config = load_config(path)

    def reading_from(state: str) -> tuple[Path, Any]:
        """The same table read with another state folder (another kept tail, or none)."""
        document = yaml.safe_load(path.read_text())
        document["ingest"].update(state_dir=str(work / f"{state}-{int(interval)}"), keep_tail=False)
        other = work / f"{topic}-{state}.yaml"
        other.write_text(yaml.safe_dump(document))
        return other, load_config(other)

    log = (work / f"ingest-{topic}.log").open("w")
    command = [str(Path(sys.executable).parent / "streamberg"), "ingest", "--config", str(path), "--quiet"]
    ingest = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    running = {"ingest": ingest}
    stream = Stream(bootstrap, topic, args.rate)
    stream.start()  # records wait in Kafka while the job starts
    probes = Probes(bootstrap, topic)
    phases: dict[str, Any] = {}
    keeper = None
    try:
        # The table exists once the ingest prepared it; wait for its first commit (with
        # --from-start: measure from the start, reads before the first commit included).
        deadline = time.monotonic() + 180
        while not args.from_start:
            try:
                if load_catalog(config.catalog).load_table(config.table.identifier).current_snapshot() is not None:
                    break
            except Exception:  # noqa: BLE001 - not made yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no commit within 180 s: see {work}/ingest-{topic}.log")
            time.sleep(0.5)
        if not args.from_start:
            time.sleep(args.warmup)
        for phase in args.phases.split(","):
            reader = config  # "ingest": the ingest's own state folder, where its writers keep the tail
            if phase == "kafka":
                _, reader = reading_from("no-kept-tail")
            elif phase == "kept":  # `streamberg tail` keeps the tail decoded
                kept_path, reader = reading_from("keeper")
                keeper = subprocess.Popen([str(Path(sys.executable).parent / "streamberg"), "tail", "--config",
                                           str(kept_path)], stdout=subprocess.DEVNULL, stderr=log)
                time.sleep(args.warmup)
            print(f"  interval {interval:g} s, tail {phase}: measuring for {args.seconds} s at {args.rate}/s",
                  flush=True)
            crash = _Crash(running, command, log, args.crash_at) if args.crash_at else None
            phases[phase] = _measure(reader, probes, args, keeper if phase == "kept" else None,
                                     "kept" if phase == "kept-end" else "now")
            if crash is not None:
                phases[phase]["crash"] = crash.done()
    finally:
        if keeper is not None:
            keeper.send_signal(2)
            try:
                keeper.wait(60)
            except subprocess.TimeoutExpired:
                keeper.kill()
        stream.stop.set()
        stream.join(120)
        ingest = running["ingest"]
        ingest.send_signal(2)
        try:
            ingest.wait(120)
        except subprocess.TimeoutExpired:
            ingest.kill()
        log.close()
    for phase in phases.values():
        committed = _committed_freshness(config, phase.pop("probes_sent"))
        phase["committed_visible_s"] = {"p50": _pct(committed, 50), "p95": _pct(committed, 95), "n": len(committed)}
        phase["committed_series"] = [round(c, 3) for c in committed]
    return {"interval_s": interval, "rate": args.rate, "seconds": args.seconds, "events": stream.sent,
            "producer_behind_max_s": round(stream.behind, 2), "phases": phases,
            "reader_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


class _Crash(threading.Thread):
    """SIGKILL of the whole ingest (its process group: driver, JVM, Python workers) `at`
    seconds into a phase, and its restart at once with the same command: what an operator's
    supervisor does after a crash. The reads go on meanwhile."""

    def __init__(self, running: dict[str, Any], command: list[str], log: Any, at: float) -> None:
        super().__init__(daemon=True)
        self.running, self.command, self.log, self.at = running, command, log, at
        self.killed_at: float | None = None
        self.start()

    def run(self) -> None:
        import os
        import signal

        time.sleep(self.at)
        os.killpg(self.running["ingest"].pid, signal.SIGKILL)
        self.running["ingest"].wait(30)
        self.killed_at = time.time()
        self.running["ingest"] = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=self.log,
                                                  start_new_session=True)

    def done(self) -> dict[str, Any]:
        self.join(5)
        return {"at_s": self.at, "killed_at": self.killed_at}


def _measure(config: Any, probes: Probes, args: argparse.Namespace, keeper: Any, until: str = "now") -> dict[str, Any]:
    """One phase: probes (freshness), exactness of every unfiltered read, read times."""
    fresh_seen: list[float] = []
    read_fresh: list[float] = []
    read_snapshot: list[float] = []
    exact = {"reads": 0, "inexact": 0, "tail_records_max": 0, "tail_cached_share": []}
    refused: list[dict[str, Any]] = []  # reads refused (FreshReadRefused): when and why; the first success
    started_wall = time.time()
    sent_before = len(probes.sent)
    keeper_rss = 0.0
    kept_bytes = 0  # the kept tail's files at most (what it costs on disk / in the page cache)
    folder = cache_folder(config)
    series: list[tuple[float, float]] = []  # (seconds into the phase, produce -> visible fresh)
    started = time.monotonic()
    while time.monotonic() - started < args.seconds:
        probe = probes.send()
        while True:  # produce -> visible in a fresh read
            found = _attempt(refused, lambda p=probe: read(config, columns=["id"], row_filter=f"id = {p['id']}",
                                                           until=until))
            if found is not None and found.rows.num_rows:
                fresh_seen.append(time.time() - probe["produced"])
                break
            if time.monotonic() - started > args.seconds + 120:
                break  # never visible: counted by the probes that were not
        whole = _attempt(refused, lambda: read(config, columns=["id"], until=until))  # exactness, once
        if whole is None or not fresh_seen:
            continue
        ids = whole.rows.column("id")
        expected = sum(whole.bounds.watermarks.values())
        exact["reads"] += 1
        exact["tail_records_max"] = max(exact["tail_records_max"], whole.bounds.tail_records)
        if whole.tail is not None and whole.tail.records:
            exact["tail_cached_share"].append(whole.tail.cached / whole.tail.records)
        series.append((round(time.monotonic() - started, 2), round(fresh_seen[-1], 3)))
        if len(ids) != expected or len(set(ids.to_pylist())) != expected:
            exact["inexact"] += 1
        if keeper is not None:
            keeper_rss = max(keeper_rss, tree_rss(keeper.pid, process_tree()) / 2**20)
        kept_bytes = max(kept_bytes, sum(_size(s.path) for s in segments(folder)))
        next_probe = time.monotonic() + args.probe_every
        while time.monotonic() < next_probe:
            t = time.monotonic()
            if _attempt(refused, lambda: read(config, columns=["id"], row_filter="city = 'ber'", until=until)):
                read_fresh.append(time.monotonic() - t)
            t = time.monotonic()
            read(config, columns=["id"], row_filter="city = 'ber'", fresh=False)
            read_snapshot.append(time.monotonic() - t)
    shares = exact.pop("tail_cached_share")
    exact["tail_cached_share_p50"] = _pct(shares, 50)
    return {
        "probes_sent": probes.sent[sent_before:],
        "fresh_visible_s": {"p50": _pct(fresh_seen, 50), "p95": _pct(fresh_seen, 95), "n": len(fresh_seen)},
        "fresh_series": series,
        "read_fresh_s": {"p50": _pct(read_fresh, 50), "p95": _pct(read_fresh, 95), "n": len(read_fresh)},
        "read_snapshot_s": {"p50": _pct(read_snapshot, 50), "p95": _pct(read_snapshot, 95), "n": len(read_snapshot)},
        "fresh_over_snapshot_p95": (round(_pct(read_fresh, 95) / _pct(read_snapshot, 95), 2)  # type: ignore[operator]
                                    if read_fresh and read_snapshot else None),
        "exactness": exact,
        # Refusals while the ingest had not made the table yet are apart: no table, nothing to read.
        "refused": {"reads": len([r for r in refused if "why" in r and not _unmade(r)]),
                    "before_the_table_existed": len([r for r in refused if "why" in r and _unmade(r)]),
                    "first": [r for r in refused if "why" in r and not _unmade(r)][:5],
                    "first_ok_after_s": next((round(r["ok_at"] - started_wall, 2) for r in refused if "ok_at" in r),
                                             None)},
        "read_fresh_max_s": round(max(read_fresh), 3) if read_fresh else None,
        "keeper_peak_rss_mib": round(keeper_rss, 1) if keeper is not None else None,
        "kept_tail_peak_mib": round(kept_bytes / 2**20, 1),
    }


def _unmade(refusal: dict[str, Any]) -> bool:
    return "does not exist yet" in refusal["why"]


def _attempt(refused: list[dict[str, Any]], reading: Any) -> Any:
    """A read, or None when it was refused (recorded: a refusal is a result, not a crash)."""
    from streamberg.common.errors import FreshReadRefused

    try:
        found = reading()
    except FreshReadRefused as exc:
        refused.append({"at": round(time.time(), 3), "why": str(exc)[:300]})
        time.sleep(0.1)
        return None
    if not any("ok_at" in r for r in refused[-1:]) and not any("ok_at" in r for r in refused):
        refused.append({"ok_at": time.time()})  # the phase's first read that succeeded
    return found


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # deleted meanwhile (a commit covered it)
        return 0


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Produce -> visible, per probe over each phase: in a fresh read, and in the committed table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(r["interval_s"], name, phase) for r in results for name, phase in r["phases"].items()]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.8 * len(panels)), squeeze=False)
    for ax, (interval, name, phase) in zip(axes[:, 0], panels):
        fresh = phase.get("fresh_series") or []
        committed = phase.get("committed_series") or []
        ax.plot([t for t, _ in fresh], [v for _, v in fresh], ".", label="fresh read", color="tab:blue")
        if committed and fresh:
            span = fresh[-1][0] if fresh else 1.0
            step = span / max(1, len(committed))
            ax.plot([i * step for i in range(len(committed))], committed, ".", label="committed table",
                    color="tab:orange", alpha=0.6)
        ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
        ax.set_yscale("log")
        ax.set_title(f"commit interval {interval:g} s, tail {name}: produce -> visible (s)")
        ax.set_xlabel("seconds into the phase")
        ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def quiet_tail(work: Path, bootstrap: str, records: int) -> dict[str, Any]:
    """The kept tail alone (no ingest running, nothing else on the machine): `records` events
    past one commit, kept by a TailKeeper; fresh filtered reads with it, the same snapshot-only,
    then fresh reads with the tail from Kafka (the keeper stopped)."""
    import statistics

    from streamberg.fresh.cache import TailKeeper, cache_folder, cached_rows
    from streamberg.ingest.dead_letters import open_tables
    checkout_tests()
    from tests.runbooks.inprocess import ingest_until  # the real writer and committer, in-process

    topic = "fresh-quiet"
    ensure_topic(bootstrap, topic, PARTITIONS)
    path = work / "quiet.yaml"
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": bootstrap, "topic": topic},
        "catalog": {"name": "quiet", "uri": f"sqlite:///{work}/quiet.db", "warehouse": str(work / "warehouse")},
        "table": {"identifier": "bench.quiet", "schema": SAMPLE_EVENT_SCHEMA},
        "ingest": {"parallelism": 1, "state_dir": str(work / "state-quiet")}}))
    config = load_config(path)
    open_tables(config)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "queue.buffering.max.messages": 2_000_000})
    for i in range(4000):
        producer.produce(topic, value=_event(i), partition=i % PARTITIONS)
    assert producer.flush(60) == 0
    ingest_until(config, {p: 1000 for p in range(PARTITIONS)})
    for i in range(4000, 4000 + records):
        producer.produce(topic, value=_event(i), partition=i % PARTITIONS)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0
    stop = threading.Event()
    keeper = threading.Thread(target=TailKeeper(config, stop).run)
    keeper.start()
    from streamberg.fresh.tail import tail_identity

    table = load_catalog(config.catalog).load_table(config.table.identifier)
    identity, schema_id = tail_identity(config, table), table.schema().schema_id
    deadline = time.monotonic() + 300
    while sum(cached_rows(cache_folder(config), identity, schema_id,
                          {p: 1000 for p in range(PARTITIONS)})[1].values()) < 4000 + records:
        assert time.monotonic() < deadline, "the keeper did not catch up"
        time.sleep(0.5)
    kept, snapshot, kafka = [], [], []
    for _ in range(20):
        t = time.monotonic()
        read(config, columns=["id"], row_filter="city = 'ber'")
        kept.append(time.monotonic() - t)
        t = time.monotonic()
        read(config, columns=["id"], row_filter="city = 'ber'", fresh=False)
        snapshot.append(time.monotonic() - t)
    stop.set()
    keeper.join(60)
    for _ in range(5):
        t = time.monotonic()
        read(config, columns=["id"], row_filter="city = 'ber'")
        kafka.append(time.monotonic() - t)
    out = {"records": records, "kept_median_s": round(statistics.median(kept), 4), "kept_max_s": round(max(kept), 4),
           "snapshot_median_s": round(statistics.median(snapshot), 4),
           "kafka_median_s": round(statistics.median(kafka), 4)}
    out["kept_over_snapshot"] = round(out["kept_median_s"] / out["snapshot_median_s"], 2)
    out["kafka_over_kept"] = round(out["kafka_median_s"] / out["kept_median_s"], 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=10_000, help="events/s")
    parser.add_argument("--seconds", type=int, default=300, help="measuring time per phase")
    parser.add_argument("--warmup", type=int, default=10, help="seconds of events before measuring")
    parser.add_argument("--intervals", default="5,60", help="commit intervals (s), comma-separated")
    parser.add_argument("--probe-every", type=float, default=2.0, help="seconds between probes")
    parser.add_argument("--phases", default="kafka,ingest",
                        help="per interval: reads with the tail from Kafka (kafka), kept by the ingest's writers "
                             "(ingest: ingest.keep_tail), the same to the kept tail's end (kept-end), kept by "
                             "`streamberg tail` (kept)")
    parser.add_argument("--engine", choices=("flink", "processes"), default="flink", help="the ingest's engine")
    parser.add_argument("--quiet-tail", type=int, default=300_000, metavar="RECORDS",
                        help="then the kept tail alone: fresh reads of this many kept records (0: skip)")
    parser.add_argument("--crash-at", type=float, default=0.0, metavar="S",
                        help="SIGKILL the whole ingest S seconds into each phase and restart it at once (0: never)")
    parser.add_argument("--from-start", action="store_true",
                        help="measure from the ingest's start, not after its first commit (reads before it count)")
    parser.add_argument("--workdir", type=Path, default=ROOT / ".streamberg" / "bench-fresh")
    args = parser.parse_args()
    run_at = stamp()
    work = args.workdir / run_at
    work.mkdir(parents=True)
    results = []
    with broker_in(work) as bootstrap:
        for interval in [float(x) for x in args.intervals.split(",") if x.strip()]:
            results.append(run_interval(work, bootstrap, interval, args))
        quiet = quiet_tail(work, bootstrap, args.quiet_tail) if args.quiet_tail else None
    # A small summary, kept in the repository (bench/summaries/): the evidence of the figures
    # docs/performance.md cites (the full result with its series stays in bench/results/).
    summary = {"stamp": run_at, "command": " ".join(sys.argv), "engine": args.engine,
               "results": [{**{k: v for k, v in r.items() if k != "phases"},
                            "phases": {n: {k: v for k, v in ph.items() if not k.endswith("_series")}
                                       for n, ph in r["phases"].items()}} for r in results],
               "quiet_tail": quiet}
    write_results("fresh", run_at, {"stamp": run_at, "engine": args.engine, "phases": args.phases, "results": results,
                                   "quiet_tail": quiet}, summary)
    out = results_path("fresh", run_at)
    if results:
        plot(results, out.with_suffix(".png"))
    for r in results:
        print(f"interval {r['interval_s']:g} s, {r['events']:,} events at {r['rate']}/s "
              f"(producer behind at most {r['producer_behind_max_s']} s):")
        for name, p in r["phases"].items():
            print(f"  tail {name}: visible fresh p50 {p['fresh_visible_s']['p50']} s p95 {p['fresh_visible_s']['p95']} s"
                  f" | committed p50 {p['committed_visible_s']['p50']} s p95 {p['committed_visible_s']['p95']} s")
            print(f"    read fresh p95 {p['read_fresh_s']['p95']} s | snapshot p95 {p['read_snapshot_s']['p95']} s |"
                  f" ratio {p['fresh_over_snapshot_p95']} | exact {p['exactness']['reads'] - p['exactness']['inexact']}"
                  f"/{p['exactness']['reads']} | tail up to {p['exactness']['tail_records_max']:,} records, cached "
                  f"share p50 {p['exactness']['tail_cached_share_p50']} | kept tail at most {p['kept_tail_peak_mib']} MiB"
                  f" | keeper RSS {p['keeper_peak_rss_mib']} MiB")
            print(f"    refused {p['refused']['reads']} read(s) (and {p['refused'].get('before_the_table_existed', 0)} "
                  f"before the ingest made the table); one read's time max {p['read_fresh_max_s']} s"
                  + (f"; ingest killed at {p['crash']['at_s']:g} s and restarted" if p.get("crash") else ""))
    if quiet:
        print(f"kept tail alone, {quiet['records']:,} records: fresh read median {quiet['kept_median_s']} s "
              f"(max {quiet['kept_max_s']} s), {quiet['kept_over_snapshot']}x the snapshot-only "
              f"{quiet['snapshot_median_s']} s; from Kafka {quiet['kafka_median_s']} s ({quiet['kafka_over_kept']}x)")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
