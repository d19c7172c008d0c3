"""Catalog calls of the governor for a fleet of mostly idle tables: polling every table each
round (no report folder) against waking on reported commits (catalog.scan_reports_dir).

    .venv/bin/python bench/govern_events.py [--tables 1000] [--seconds 60] [--active 10]

Makes N tables in a SQLite catalog, then runs the governor's real probes (governor/keeper.py
with the components' real executors, cli/govern.executors) round after round for the given
time, planning only (a dry run: no Spark), once per mode, after a first round that reads
every table in both. `--active` of the tables get a
commit every 10 s (reported the way the ingest reports its own). Counts every call the probes
make to the catalog (a counting wrapper around the real catalog) and prints catalog calls per
minute, rounds, and seconds per round, per mode, with the ratio. Writes
bench/results/govern-events-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from streamberg.bench.harness import results_path, stamp
from streamberg.cli.govern import executors
from streamberg.cli.sample_events import SAMPLE_EVENT_SCHEMA
from streamberg.common.catalog import load_catalog
from streamberg.common.config import StreambergConfig
from streamberg.governor.app import Governor, Keeper
from streamberg.governor.keeper import SharedCatalogs, TableKeeper
from streamberg.table_meta.declared import ensure_table
from streamberg.table_meta.query_stats import record_commit
from streamberg.table_meta.schedule import Scheduler

ROUND_SECONDS = 10.0  # govern.interval_seconds' default: a round's pause when nothing ran


class CountingCatalog:
    """The real catalog, every call counted."""

    def __init__(self, catalog: Any) -> None:
        self._catalog, self.calls = catalog, 0

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._catalog, name)
        if not callable(found):
            return found

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return found(*args, **kwargs)

        return counted


class CountingCatalogs(SharedCatalogs):
    def __init__(self) -> None:
        super().__init__()
        self.counting: CountingCatalog | None = None

    def get(self, config: StreambergConfig) -> tuple[Any, Any]:
        catalog, engine = super().get(config)
        if self.counting is None:
            self.counting = CountingCatalog(catalog)
        return self.counting, engine


def configs(folder: Path, tables: int, reports: bool) -> list[StreambergConfig]:
    base = {"kafka": {"bootstrap_servers": "127.0.0.1:9", "topic": "idle"},
            "catalog": {"name": "bench", "uri": f"sqlite:///{folder / 'catalog.db'}", "warehouse": str(folder / "w"),
                        **({"scan_reports_dir": str(folder / "reports")} if reports else {})},
            "ingest": {"state_dir": str(folder / "state")}}
    return [StreambergConfig.model_validate({**base, "table": {"identifier": f"idle.t{i:04d}",
                                                               "schema": SAMPLE_EVENT_SCHEMA}})
            for i in range(tables)]


def run_mode(folder: Path, tables: int, seconds: float, active: int, reports: bool) -> dict[str, Any]:
    fleet = configs(folder, tables, reports)
    catalogs = CountingCatalogs()
    kept = [TableKeeper(c, executors(c), None, catalogs) for c in fleet]
    governor = Governor(lambda: [Keeper(k.identifier, k.probe, k.run) for k in kept], Scheduler(), budget=0)
    catalogs.get(fleet[0])
    assert catalogs.counting is not None
    governor.round(dry_run=True)  # the first round reads every table in both modes: not counted
    started, rounds, round_seconds, last_commit = time.monotonic(), 0, [], 0.0
    catalogs.counting.calls = 0
    for k in kept:
        k.catalog_reads = 0
    while time.monotonic() - started < seconds:
        if reports and time.monotonic() - last_commit >= 10.0:  # the few busy tables commit
            for config in fleet[:active]:
                record_commit(str(config.catalog.scan_reports_dir), config.table.identifier, None, "append")
            last_commit = time.monotonic()
        began = time.monotonic()
        governor.round(dry_run=True)
        round_seconds.append(time.monotonic() - began)
        rounds += 1
        time.sleep(max(0.0, min(ROUND_SECONDS, seconds - (time.monotonic() - started))))
    minutes = (time.monotonic() - started) / 60
    return {"reports": reports, "rounds": rounds, "catalog_calls": catalogs.counting.calls,
            "catalog_calls_per_minute": round(catalogs.counting.calls / minutes, 1),
            "table_reads": sum(k.catalog_reads for k in kept),
            "round_seconds_median": round(sorted(round_seconds)[len(round_seconds) // 2], 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--active", type=int, default=10, help="tables committing every 10 s")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sb-govern-events-") as tmp:
        folder = Path(tmp)
        print(f"making {args.tables} tables ...", file=sys.stderr)
        catalog = load_catalog(configs(folder, 1, False)[0].catalog)
        for config in configs(folder, args.tables, False):
            ensure_table(catalog, config.table)
        results = []
        for reports in (False, True):
            print(f"rounds for {args.seconds:g} s, {'woken by reported commits' if reports else 'polling'} ...",
                  file=sys.stderr)
            results.append(run_mode(folder, args.tables, args.seconds, args.active, reports))
    before, after = results
    ratio = before["catalog_calls_per_minute"] / max(after["catalog_calls_per_minute"], 0.1)
    print(f"{args.tables} tables, {args.active} committing every 10 s, {args.seconds:g} s a mode, "
          f"rounds every {ROUND_SECONDS:g} s")
    for r in results:
        print(f"  {'commit reports' if r['reports'] else 'polling':<15} {r['catalog_calls_per_minute']:>9,.1f} catalog "
              f"calls/min  {r['table_reads']:>6} table reads  {r['rounds']} rounds  "
              f"median round {r['round_seconds_median']:.2f} s")
    print(f"  polling / commit reports: {ratio:.1f}x the catalog calls")
    run_at = stamp()
    out = results_path("govern-events", run_at)
    out.write_text(json.dumps({"at": run_at, "tables": args.tables, "active": args.active, "seconds": args.seconds,
                               "results": results, "ratio": ratio}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
