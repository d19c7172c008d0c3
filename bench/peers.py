"""streamberg beside the systems a user would pick instead, in one run on one machine.

    .venv/bin/python bench/peers.py [--records 1000000,10000000] [--systems ...]   (make bench-peers)

The same N JSON events (`streamberg produce`'s sample events, 4 partitions, one tansu broker)
into an unpartitioned Iceberg table, each system until all N rows are committed; then each
table is read back and its rows and distinct ids counted (a system that lost or doubled a
record is marked, not ranked). Per system: end-to-end seconds (the command's wall clock,
interpreter and JVM start included), records/s, the ratio to streamberg at parallelism 2,
and the peak memory of its process tree (RSS and PSS, sampled every 0.2 s from /proc).

- bare loop: consume -> pyarrow.json -> one Parquet file (bench/peer_systems/bare_loop.py);
  no commit, no catalog: the floor.
- streamberg p=2 and p=1: `streamberg ingest --max-records N` (exactly-once, dead letters,
  one commit per table per interval), with its start-up (command start to the last writer
  reading) from its own log; streamberg-proc-p2: the same at p=2 on the engine with no JVM
  (`--engine processes`, ingest/processes.py).
- Quix Streams 3.28.1 `IcebergSink`: AWS Glue with S3 only; moto's server stands in for
  both (bench/peer_systems/quix_sink.py).
- dlt 1.27.2 + dlt-iceberg 0.6.3 (its local SQLite catalog), the backlog in one load, rows
  as dicts and as Arrow tables (bench/peer_systems/dlt_load.py).
- Pathway: its Iceberg writer needs an online-validated licence; not run (recorded).

The peers live in virtualenvs of their own under .bench-peers/ (made on first use, pinned
below; never the product's dependencies). Prints a table, writes
bench/results/peers-<time>.json and a plot beside it. Figures are measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from streamberg.bench.harness import ROOT, broker_in, process_tree, results_path, rss_bytes, stamp, tree_pids
from streamberg.cli.sample_events import SAMPLE_EVENT_SCHEMA, produce_events
from streamberg.common.broker import ensure_topic, free_port, port_open

PEERS_DIR = ROOT / ".bench-peers"
SYSTEMS_DIR = ROOT / "bench" / "peer_systems"
# Pinned: quixstreams' IcebergSink as of 3.28; dlt from 1.28 fails to load with dlt-iceberg
# (`update_stored_schema() got an unexpected keyword argument 'force'`); s3fs/fsspec pinned
# together (pip otherwise settles on an s3fs whose exact fsspec pin is not published).
VENVS = {
    "quix": ["quixstreams[iceberg,iceberg_aws]==3.28.1"],
    "dlt": ["dlt[filesystem]==1.27.2", "dlt-iceberg==0.6.3", "s3fs==2025.3.2", "fsspec==2025.3.2",
            "confluent-kafka"],
}
ALL_SYSTEMS = ("bare", "streamberg-p2", "streamberg-p1", "streamberg-proc-p2", "quix", "dlt-dicts", "dlt-arrow")


def venv_python(name: str) -> Path:
    """The peer's interpreter, its virtualenv made (or remade when its pins changed)."""
    folder = PEERS_DIR / name
    python = folder / "bin" / "python"
    stamp = folder / "streamberg-pins.json"
    wanted = json.dumps(VENVS[name])
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"making the {name} virtualenv in {folder} ...", file=sys.stderr)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(folder)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *VENVS[name]], check=True)
    stamp.write_text(wanted)
    return python


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class PeakTreeMemory:
    """The peak RSS and PSS of a process tree (sums over its processes, sampled)."""

    def __init__(self, pid: int, every: float = 0.2) -> None:
        self.pid, self.every, self.rss, self.pss = pid, every, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            pids = tree_pids(self.pid, process_tree())
            self.rss = max(self.rss, sum(rss_bytes(p) for p in pids))
            self.pss = max(self.pss, sum(_pss(p) for p in pids))
            time.sleep(self.every)

    def done(self) -> tuple[int, int]:
        self.stop.set()
        self.thread.join()
        return self.rss, self.pss


def timed(command: list[str], log: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    started, wall = time.perf_counter(), time.time()
    with log.open("w") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, "AWS_EC2_METADATA_DISABLED": "true", **(env or {})})
        memory = PeakTreeMemory(proc.pid)
        code = proc.wait()
    seconds = time.perf_counter() - started
    rss, pss = memory.done()
    if code:
        raise RuntimeError(f"{command[0]} exited {code}: {log.read_text()[-2000:]}")
    return {"seconds": seconds, "started_at": wall, "peak_rss_bytes": rss, "peak_pss_bytes": pss}


def counted(ids: Any) -> dict[str, int]:
    import pyarrow.compute as pc

    return {"rows": len(ids), "distinct_ids": pc.count_distinct(ids).as_py()}


class Moto:
    """moto's server: Glue and S3 on loopback for Quix's sink (as the product's Glue tests)."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = (folder / "moto.log").open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not port_open("127.0.0.1", self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("moto's server did not start")
            time.sleep(0.2)

    def client(self, service: str) -> Any:
        import boto3

        return boto3.client(service, endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="bench", aws_secret_access_key="bench-secret")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()


def run_system(system: str, records: int, partitions: int, interval: float, bootstrap: str, topic: str,
               folder: Path, moto: Moto | None) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "run.log"
    common = ["--bootstrap", bootstrap, "--topic", topic, "--records", str(records)]
    if system == "bare":
        out = folder / "part-0.parquet"
        result = timed([sys.executable, str(SYSTEMS_DIR / "bare_loop.py"), *common, "--partitions", str(partitions),
                        "--out", str(out)], log)
        import pyarrow.parquet as pq

        return {**result, **counted(pq.read_table(out, columns=["id"]).column("id"))}
    if system.startswith("streamberg-"):  # streamberg-p2: the Flink engine; streamberg-proc-p2: processes
        engine = "processes" if system.startswith("streamberg-proc-") else "flink"
        return _streamberg(int(system.rsplit("-p", 1)[1]), records, interval, bootstrap, topic, folder, log, engine)
    if system == "quix":
        assert moto is not None
        bucket = f"quix-{records}-{int(time.time())}"
        database = f"bench{records}"  # a database of its own per run (one moto server per bench)
        moto.client("s3").create_bucket(Bucket=bucket)
        moto.client("glue").create_database(DatabaseInput={"Name": database})
        table = f"{database}.events"
        result = timed([str(venv_python("quix")), str(SYSTEMS_DIR / "quix_sink.py"), *common, "--interval",
                        str(interval), "--endpoint", moto.endpoint, "--bucket", bucket, "--table", table], log)
        from pyiceberg.catalog import load_catalog as pyiceberg_catalog

        catalog = pyiceberg_catalog("glue", type="glue", **{
            "glue.endpoint": moto.endpoint, "glue.region": "us-east-1", "s3.endpoint": moto.endpoint,
            "s3.region": "us-east-1", "s3.access-key-id": "bench", "s3.secret-access-key": "bench-secret",
            "glue.access-key-id": "bench", "glue.secret-access-key": "bench-secret", "s3.path-style-access": "true"})
        loaded = catalog.load_table(table)
        return {**result, "commits": len(loaded.metadata.snapshots),
                **counted(loaded.scan(selected_fields=("id",)).to_arrow().column("id"))}
    if system.startswith("dlt-"):
        arrow = system == "dlt-arrow"
        result = timed([str(venv_python("dlt")), str(SYSTEMS_DIR / "dlt_load.py"), *common, "--partitions",
                        str(partitions), "--catalog", str(folder / "catalog.db"), "--warehouse",
                        str(folder / "warehouse"), "--pipelines", str(folder / "pipelines"),
                        *(["--arrow"] if arrow else [])], log)
        from pyiceberg.catalog.sql import SqlCatalog

        catalog = SqlCatalog("dlt_catalog", uri=f"sqlite:///{folder / 'catalog.db'}", warehouse=f"file://{folder / 'warehouse'}")
        found = [".".join(t) for ns in catalog.list_namespaces() for t in catalog.list_tables(ns)]
        events = [t for t in found if t.endswith("events")]
        if not events:
            raise RuntimeError(f"dlt made no events table (tables: {found})")
        loaded = catalog.load_table(events[0])
        return {**result, "commits": len(loaded.metadata.snapshots),
                **counted(loaded.scan(selected_fields=("id",)).to_arrow().column("id"))}
    raise SystemExit(f"unknown system {system!r} (one of {', '.join(ALL_SYSTEMS)})")


def _streamberg(parallelism: int, records: int, interval: float, bootstrap: str, topic: str, folder: Path,
                log: Path, engine: str) -> dict[str, Any]:
    import yaml

    from streamberg.common.catalog import load_catalog
    from streamberg.common.config import load_config

    path = folder / "streamberg.yaml"
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": bootstrap, "topic": topic},
        "catalog": {"uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "table": {"identifier": "bench.events", "schema": SAMPLE_EVENT_SCHEMA},
        "ingest": {"commit_interval_seconds": interval, "parallelism": parallelism, "state_dir": "state",
                   "max_poll_records": 10000}}))
    exe = Path(sys.executable).parent / "streamberg"
    result = timed([str(exe), "ingest", "--config", str(path), "--max-records", str(records), "--quiet",
                    "--engine", engine], log,
                   env={"STREAMBERG_LOG_FORMAT": "json"})
    opened = []
    for line in log.read_text().splitlines():
        if '"lane opened"' in line:  # a writer's share of a table, reading
            try:
                opened.append(datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp())
            except (ValueError, KeyError):
                continue
    config = load_config(path)
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    return {**result, "commits": len(table.metadata.snapshots),
            "startup_seconds": (max(opened) - result["started_at"]) if opened else None,
            **counted(table.scan(selected_fields=("id",)).to_arrow().column("id"))}


def report(runs: list[dict[str, Any]]) -> str:
    lines = []
    for records in sorted({r["records"] for r in runs}):
        these = [r for r in runs if r["records"] == records]
        ours = next((r for r in these if r["system"] == "streamberg-p2" and "seconds" in r), None)
        lines += [f"\n{records:,} events", "| system | seconds | events/s | vs streamberg p=2 | peak RSS | peak PSS | "
                  "rows | distinct ids | start-up s |", "|---|---|---|---|---|---|---|---|---|"]
        for r in these:
            if "error" in r:
                lines.append(f"| {r['system']} | failed: {r['error'][:80]} | | | | | | | |")
                continue
            ratio = f"{ours['seconds'] / r['seconds']:.2f}x" if ours else "-"
            exact = "" if r["rows"] == r["distinct_ids"] == records else " (NOT EXACT)"
            startup = f"{r['startup_seconds']:.1f}" if r.get("startup_seconds") is not None else ""
            lines.append(f"| {r['system']}{exact} | {r['seconds']:.1f} | {records / r['seconds']:,.0f} | {ratio} | "
                         f"{r['peak_rss_bytes'] / 2**20:,.0f} MB | {r['peak_pss_bytes'] / 2**20:,.0f} MB | "
                         f"{r['rows']:,} | {r['distinct_ids']:,} | {startup} |")
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["records"] for r in runs})
    fig, axes = plt.subplots(len(sizes), 2, figsize=(11, 3.2 * len(sizes)), squeeze=False)
    for row, records in enumerate(sizes):
        these = [r for r in runs if r["records"] == records and "seconds" in r]
        names = [r["system"] for r in these]
        axes[row][0].barh(names, [records / r["seconds"] for r in these], color="tab:blue")
        axes[row][0].set_title(f"{records:,} events: events/s end to end")
        axes[row][1].barh(names, [r["peak_pss_bytes"] / 2**20 for r in these], color="tab:orange")
        axes[row][1].set_title("peak PSS of the process tree (MB)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", default="1000000", help="comma list of event counts (e.g. 1000000,10000000)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--interval", type=float, default=5.0, help="commit interval where the system has one")
    parser.add_argument("--systems", default=",".join(ALL_SYSTEMS), help=f"comma list of {', '.join(ALL_SYSTEMS)}")
    args = parser.parse_args()
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(ALL_SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown} (one of {', '.join(ALL_SYSTEMS)})")
    for name in {"quix" if s == "quix" else "dlt" if s.startswith("dlt") else "" for s in systems} - {""}:
        venv_python(name)  # made before anything is timed
    runs: list[dict[str, Any]] = []
    run_at = stamp()
    with tempfile.TemporaryDirectory(prefix="sb-peers-") as tmp, broker_in(Path(tmp)) as bootstrap:
        directory = Path(tmp)
        moto = Moto(directory) if "quix" in systems else None
        try:
            for records in [int(r) for r in args.records.split(",")]:
                topic = f"peers-{records}"
                ensure_topic(bootstrap, topic, args.partitions)
                from streamberg.common.config import StreambergConfig

                produce = StreambergConfig.model_validate({
                    "kafka": {"bootstrap_servers": bootstrap, "topic": topic},
                    "catalog": {"uri": f"sqlite:///{directory / 'produce.db'}", "warehouse": str(directory / "w")},
                    "table": {"identifier": "bench.produce", "schema": SAMPLE_EVENT_SCHEMA}})
                print(f"producing {records:,} events to {topic} ...", file=sys.stderr)
                produce_events(produce, records)
                for system in systems:
                    print(f"{system}, {records:,} events ...", file=sys.stderr)
                    try:
                        run = run_system(system, records, args.partitions, args.interval, bootstrap, topic,
                                         directory / f"{system}-{records}", moto)
                    except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, the rest run
                        run = {"error": str(exc).splitlines()[-1] if str(exc) else type(exc).__name__}
                    runs.append({"system": system, "records": records, **run})
                    print(f"  {json.dumps({k: v for k, v in runs[-1].items() if k != 'started_at'})}",
                          file=sys.stderr)
        finally:
            if moto is not None:
                moto.close()
    table = report(runs)
    print(table)
    out = results_path("peers", run_at)
    out.write_text(json.dumps({"at": run_at, "partitions": args.partitions, "interval": args.interval,
                               "cores": os.cpu_count(), "pathway": "not run: its Iceberg writer needs an "
                               "online-validated licence", "runs": runs}, indent=2))
    plot(runs, out.with_suffix(".png"))
    print(f"\nresults: {out} and {out.with_suffix('.png')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
