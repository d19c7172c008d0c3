"""Soak: the whole loop for 20+ minutes, everything it holds and writes sampled (docs/performance.md).

    .venv/bin/python bench/soak.py [--minutes 22] [--rate 1500] [--interval 1] [--sample 30]

1. Starts its own tansu broker, and `streamberg produce` at `--rate` events/s (1 % malformed)
   into the demo's table shape for the whole run.
2. `streamberg run` (ingest with a `--interval` s commit interval, the continuous compactor,
   maintenance) on every other setting's default, for `--minutes`.
3. Every `--sample` seconds: the resident memory of each component's process tree (the
   ingest's JVM and Python workers, the compactor's and maintenance's JVM and Python), the
   table's snapshots, its metadata JSON and metadata folder, the dead-letter table's, and the
   ingest's commit times (p50/p99 of `streamberg.previous-commit-ms` committed since the last
   sample).
4. At the end: every record once (distinct ids = valid records produced, rows + dead letters =
   produced), and the second half flat: each series' samples in the second half within 10 %
   of its value at the half. A PNG of every series.

Writes bench/results/soak-<time>.json and .png and prints a summary. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from streamberg.bench.harness import ROOT, broker_in, process_tree, results_path, stamp, tree_rss
from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.table_meta.offsets import summary_properties
from streamberg.table_meta.summary_keys import SummaryKeys

COMPONENTS = ("ingest", "compact", "maintain")


def component_rss(supervisor: int) -> dict[str, int]:
    """Resident bytes of each component's process tree under the supervisor."""
    tree = process_tree()
    out = {name: 0 for name in COMPONENTS}
    for child in tree.get(supervisor, []):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        name = next((w for w in words if w in COMPONENTS), None)
        if name is not None:
            out[name] += tree_rss(child, tree)
    return out


def _folder_bytes(path: Path) -> int:
    total = 0
    for p in path.glob("*"):
        try:
            total += p.stat().st_size
        except OSError:
            continue
    return total


def table_sample(config: Any, seen_commits: set[int]) -> dict[str, Any]:
    catalog = load_catalog(config.catalog)
    out: dict[str, Any] = {}
    for name, identifier in (("table", config.table.identifier), ("dead_letters", config.ingest_target.dead_letter_table)):
        try:
            table = catalog.load_table(identifier)
        except Exception:  # noqa: BLE001 - not created yet
            continue
        metadata = Path(table.metadata_location.removeprefix("file://").removeprefix("file:"))
        out[f"{name}_snapshots"] = len(table.metadata.snapshots)
        out[f"{name}_metadata_json_bytes"] = metadata.stat().st_size
        out[f"{name}_metadata_folder_bytes"] = _folder_bytes(metadata.parent)
        if name == "table":
            times = []
            for s in table.metadata.snapshots:
                value = summary_properties(s).get(SummaryKeys.PREVIOUS_COMMIT_MS)
                if value is not None and s.snapshot_id not in seen_commits:
                    seen_commits.add(s.snapshot_id)
                    times.append(int(value) / 1000)
            times.sort()
            out["commits"] = len(times)
            if times:
                out["commit_p50_s"] = times[len(times) // 2]
                out["commit_p99_s"] = times[min(len(times) - 1, int(len(times) * 0.99))]
    return out


def flat(series: list[float | None]) -> tuple[bool, float | None, float | None]:
    """Whether the second half stays within 10 % of the value at the half: (flat, value at the
    half, the largest departure from it as a ratio)."""
    values = [v for v in series if v is not None]
    if len(values) < 4:
        return False, None, None
    half = values[len(values) // 2]
    if half == 0:
        return all(v == 0 for v in values[len(values) // 2:]), 0.0, None
    worst = max(abs(v - half) / half for v in values[len(values) // 2:])
    return worst <= 0.10, half, round(worst, 3)


def draw(samples: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s["t"] / 60 for s in samples]
    panels = [
        ("resident memory (MB)", [(f"{c} (process tree)", [s["rss"][c] / 1e6 for s in samples]) for c in COMPONENTS]),
        ("snapshots", [("table", [s.get("table_snapshots") for s in samples]),
                       ("dead letters", [s.get("dead_letters_snapshots") for s in samples])]),
        ("metadata (KB)", [("metadata JSON", [(s.get("table_metadata_json_bytes") or 0) / 1e3 for s in samples]),
                           ("metadata folder / 10", [(s.get("table_metadata_folder_bytes") or 0) / 1e4
                                                     for s in samples])]),
        ("ingest commit time (s)", [("p50", [s.get("commit_p50_s") for s in samples]),
                                    ("p99", [s.get("commit_p99_s") for s in samples])]),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 11), sharex=True)
    for ax, (title, lines) in zip(axes, panels):
        for label, values in lines:
            ax.plot(minutes, [v if v is not None else float("nan") for v in values], label=label)
        ax.axvline(minutes[len(minutes) // 2], color="grey", linestyle=":", linewidth=1)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=22.0)
    parser.add_argument("--rate", type=int, default=1500, help="events per second")
    parser.add_argument("--interval", type=float, default=1.0, help="the ingest's commit interval (s)")
    parser.add_argument("--sample", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--workdir", type=Path, default=ROOT / ".streamberg" / "soak")
    args = parser.parse_args()

    run_at = stamp()
    work = args.workdir / run_at
    work.mkdir(parents=True)
    with broker_in(work) as bootstrap:
        demo = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
        demo["kafka"] = {"bootstrap_servers": bootstrap, "topic": "soak-events"}
        demo["catalog"] = {"uri": f"sqlite:///{work}/catalog.db", "warehouse": str(work / "warehouse")}
        demo["ingest"] = {**demo["ingest"], "commit_interval_seconds": args.interval, "state_dir": str(work / "state")}
        demo["compactor"]["checkpoint_dir"] = str(work / "checkpoint")
        demo.pop("run", None)
        config_path = work / "soak.yaml"
        config_path.write_text(yaml.safe_dump(demo, sort_keys=False))
        config = load_config(config_path)
        ensure_topic(bootstrap, "soak-events", 4)
        exe = Path(sys.executable).parent / "streamberg"
        seconds = args.minutes * 60
        count = int(args.rate * seconds)
        env = {**os.environ, "STREAMBERG_LOG_FORMAT": "json"}
        producer = subprocess.Popen([str(exe), "produce", "--config", str(config_path), "--count", str(count),
                                     "--rate", str(args.rate), "--bad-fraction", "0.01"],
                                    stdout=(work / "produce.json").open("w"), stderr=subprocess.DEVNULL, env=env)
        run = subprocess.Popen([str(exe), "run", "--config", str(config_path), "--duration", str(seconds + 60),
                                "--no-status"], stdout=(work / "run.json").open("w"),
                               stderr=(work / "run.log").open("w"), env=env)
        samples: list[dict[str, Any]] = []
        seen: set[int] = set()
        started = time.monotonic()
        try:
            while run.poll() is None:
                time.sleep(args.sample)
                sample = {"t": round(time.monotonic() - started, 1), "rss": component_rss(run.pid)}
                sample.update(table_sample(config, seen))
                samples.append(sample)
                print(json.dumps(sample), flush=True)
        finally:
            if producer.poll() is None:
                producer.terminate()
            run.wait()
        produced = json.loads((work / "produce.json").read_text() or "{}")
        catalog = load_catalog(config.catalog)
        ids = catalog.load_table(config.table.identifier).scan(selected_fields=("id",)).to_arrow().column("id")
        dead = catalog.load_table(config.ingest_target.dead_letter_table).scan(selected_fields=("offset",)).to_arrow()
        import pyarrow.compute as pc

        distinct = len(pc.unique(ids))
    # The run's start (JVMs, first commits) is not its steady state: the flat check reads the
    # samples after the first two minutes.
    steady = [s for s in samples if 120 <= s["t"] <= seconds]  # after start-up, while events arrive
    verdicts = {}
    for key in ("table_snapshots", "table_metadata_json_bytes", "table_metadata_folder_bytes", "dead_letters_snapshots"):
        verdicts[key] = flat([s.get(key) for s in steady])
    for component in COMPONENTS:
        verdicts[f"rss_{component}"] = flat([s["rss"][component] for s in steady])
    verdicts["commit_p50_s"] = flat([s.get("commit_p50_s") for s in steady])
    result = {
        "date": run_at, "machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()},
        "args": {k: str(v) for k, v in vars(args).items()}, "produced": produced,
        "rows": len(ids), "distinct_ids": distinct, "dead_letters": dead.num_rows,
        "every_record_once": (len(ids) == distinct == produced.get("valid")
                              and len(ids) + dead.num_rows == produced.get("produced")),
        "flat_second_half": {k: {"flat": v[0], "at_half": v[1], "worst_departure": v[2]} for k, v in verdicts.items()},
        "samples": samples,
    }
    out = results_path("soak", run_at, "")
    Path(f"{out}.json").write_text(json.dumps(result, indent=1))
    draw(samples, Path(f"{out}.png"))
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    print(f"wrote {out}.json and {out}.png")
    return 0 if result["every_record_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
