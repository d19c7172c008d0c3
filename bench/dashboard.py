"""The dashboard and the metrics over many tables, from the one model (monitoring/watch.py).

    .venv/bin/python bench/dashboard.py [--tables 1000] [--scrapes 200] [--refreshes 20]

Makes N real tables in a SQLite catalog (each with one committed snapshot written by
pyiceberg), all fed from one topic of the embedded broker; collects every table's status once
(the model's refresh, timed: what one scrape cost when each scrape collected, the baseline);
then, from the real server (the dashboard's Flask app on Werkzeug, as `govern` serves it):

- `--scrapes` scrapes of /metrics over HTTP, each timed, with the SQL catalog's calls counted
  during them (a scrape must make none);
- in headless Chromium (Debian's, through Selenium), the fleet page's first load (navigation
  start to every row on the page: the server renders the worst 60, the page builds the rest
  from /api/fleet.json at once; the load event's time is reported beside it) and `--refreshes` refreshes
  of its rows (the page's own measure: fetch, parse, rows built);
- the process's resident memory before the model and the server were made and after.

Prints the figures against the issue's goals; writes bench/results/dashboard-<time>.json and a
summary in bench/summaries/.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from streamberg.bench.harness import broker_in, percentile, rss_bytes, stamp, write_results
from streamberg.cli.sample_events import SAMPLE_EVENT_SCHEMA
from streamberg.common.broker import ensure_topic, free_port
from streamberg.common.catalog import shared_catalog
from streamberg.common.config import StreambergConfig
from streamberg.monitoring.collect import collect_status
from streamberg.monitoring.dashboard.app import make_app, serve_dashboard
from streamberg.monitoring.fleet import FleetStatus
from streamberg.monitoring.health import with_health
from streamberg.monitoring.metrics import fleet_families
from streamberg.monitoring.refresh import StatusModel
from streamberg.monitoring.watch import Watch
from streamberg.table_meta.declared import ensure_table
from streamberg.table_meta.table_files import ManifestCache


def _pct(values: list[float], q: float) -> float:
    return round(percentile(values, q) or 0.0, 4)


def _rss_mib() -> float:
    return round(rss_bytes(os.getpid()) / 2**20, 1)


def _make_tables(folder: Path, bootstrap: str, tables: int) -> list[StreambergConfig]:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    base = {"kafka": {"bootstrap_servers": bootstrap, "topic": "events"},
            "catalog": {"name": "bench", "uri": f"sqlite:///{folder / 'catalog.db'}", "warehouse": str(folder / "w"),
                        "scan_reports_dir": str(folder / "reports")},
            "ingest": {"state_dir": str(folder / "state")}}
    configs = [StreambergConfig.model_validate({**base, "table": {"identifier": f"ns{i % 10}.t{i:04d}",
                                                                  "schema": SAMPLE_EVENT_SCHEMA}})
               for i in range(tables)]
    for config in configs:
        table = ensure_table(shared_catalog(config.catalog), config.table)
        arrow = schema_to_pyarrow(table.schema(), include_field_ids=False)
        table.append(pa.Table.from_pylist([{"id": 1, "ts": datetime.now(timezone.utc), "user_id": "u1"}],
                                          schema=arrow))
    return configs


def _model_passes(configs: list[StreambergConfig], reported: int = 10) -> dict[str, Any]:
    """A collection of every table timed four ways: each table on its own (a catalog opened
    and a broker consumer made for each: the collection before the model), the model's
    first pass (every table read in full, one catalog and one broker reader shared), a
    pass with no commit reported (each table's lag alone read again) and one after
    `reported` commits were reported (those tables read in full)."""
    from streamberg.table_meta.query_stats import record_commit

    cache = ManifestCache()
    started = time.monotonic()
    for config in configs:
        with_health(collect_status(config, cache=cache), config)
    alone = time.monotonic() - started
    model = StatusModel()  # a cache of its own: the first pass parses every manifest, as the baseline did
    started = time.monotonic()
    model.collect(configs)
    first = time.monotonic() - started
    started = time.monotonic()
    model.collect(configs)
    quiet = time.monotonic() - started
    full_before = model.full_reads
    for config in configs[:reported]:
        record_commit(str(config.catalog.scan_reports_dir), config.table.identifier, None, "append")
    started = time.monotonic()
    model.collect(configs)
    after = time.monotonic() - started
    return {"each_table_alone_s": round(alone, 2), "first_pass_s": round(first, 2),
            "first_over_baseline": round(first / alone, 3), "quiet_pass_s": round(quiet, 2),
            "quiet_over_baseline": round(quiet / alone, 3), "reported": reported,
            "reported_pass_s": round(after, 2), "reported_full_reads": model.full_reads - full_before}


def _browser_figures(url: str, refreshes: int) -> dict[str, Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1500,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "chromedriver"), options=options)
    try:
        started = time.monotonic()
        driver.get(url)
        load_ms = driver.execute_script("const t = performance.timing; return t.loadEventEnd - t.navigationStart;")
        # Where the first load's time went: the server's answer, the document's parse, the rest.
        phases = driver.execute_script(
            "const t = performance.timing; return {server_ms: t.responseStart - t.requestStart, "
            "transfer_ms: t.responseEnd - t.responseStart, parsed_ms: t.domInteractive - t.responseEnd, "
            "scripts_and_layout_ms: t.loadEventEnd - t.domInteractive};")
        loaded_s = time.monotonic() - started
        while not driver.execute_script("return document.body.dataset.completeMs"):
            time.sleep(0.01)
        complete_ms = float(driver.execute_script("return document.body.dataset.completeMs"))
        rows = driver.execute_script("return document.querySelectorAll('#fleet tbody tr').length")
        # The refreshes made so far: one at load when the server rendered only some rows, none otherwise.
        times, seen = [], int(driver.execute_script("return document.body.dataset.refreshes") or 0)
        deadline = time.monotonic() + 60 + refreshes * 10
        while len(times) < refreshes and time.monotonic() < deadline:
            count = int(driver.execute_script("return document.body.dataset.refreshes") or 0)
            if count > seen:
                seen = count
                times.append(float(driver.execute_script("return document.body.dataset.lastRefreshMs")) / 1000)
            time.sleep(0.05)
        severe = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    finally:
        driver.quit()
    return {"rows": rows, "first_load_s": round(complete_ms / 1000, 3), "load_event_s": round(load_ms / 1000, 3),
            "get_returned_s": round(loaded_s, 3), "first_load_phases_ms": phases,
            "refresh_p50_s": _pct(times, 50) if times else None, "refresh_p95_s": _pct(times, 95) if times else None,
            "refreshes": len(times), "console_errors": severe[:5]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=1000)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--refreshes", type=int, default=20)
    args = parser.parse_args()
    run_at = stamp()
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as work:
        folder = Path(work)
        with broker_in(folder) as bootstrap:
            ensure_topic(bootstrap, "events", 1)
            made = time.monotonic()
            configs = _make_tables(folder, bootstrap, args.tables)
            print(f"{args.tables} tables made in {time.monotonic() - made:.1f} s", flush=True)
            rss_before = _rss_mib()
            model = StatusModel()

            def collect() -> FleetStatus:
                return FleetStatus(tables=list(zip([c.kafka.topic for c in configs], model.collect(configs))))

            # Refreshed every 2 s for the page's refreshes (the collection runs back to back).
            watch = Watch(collect, fleet_families, refresh_seconds=2.0, scope="bench")
            facts = watch.refresh()
            print(f"one collection of every table: {facts.seconds:.2f} s, exposition {len(facts.text):,} bytes",
                  flush=True)
            server, _ = serve_dashboard(make_app(watch, str(folder / "state")), "127.0.0.1", free_port(), None)
            url = f"http://127.0.0.1:{server.server_port}/"
            try:
                from pyiceberg.catalog.sql import SqlCatalog

                calls = {"n": 0}
                originals = {}
                for name in ("load_table", "list_tables", "table_exists", "list_namespaces"):
                    originals[name] = real = getattr(SqlCatalog, name)

                    def counted(*a: Any, _real: Any = real, **k: Any) -> Any:
                        calls["n"] += 1
                        return _real(*a, **k)

                    setattr(SqlCatalog, name, counted)
                scrapes = []
                for _ in range(args.scrapes):
                    started = time.monotonic()
                    with urllib.request.urlopen(url + "metrics", timeout=30) as response:
                        body = response.read()
                    scrapes.append(time.monotonic() - started)
                    assert body == facts.text
                catalog_calls = calls["n"]
                for name, real in originals.items():
                    setattr(SqlCatalog, name, real)
                stop = threading.Event()
                watch.start(stop)  # the page now refreshes from a model refreshed in the background
                page = _browser_figures(url, args.refreshes) if shutil.which("chromium") else {"skipped": "no chromium"}
                stop.set()
                rss_after = _rss_mib()
            finally:
                server.shutdown()
            passes = _model_passes(configs)  # after the memory figures: it holds models of its own
            result = {"stamp": run_at, "command": " ".join(sys.argv), "tables": args.tables,
                      "scrape_p50_s": _pct(scrapes, 50), "scrape_p95_s": _pct(scrapes, 95),
                      "scrape_max_s": round(max(scrapes), 4), "catalog_calls_during_scrapes": catalog_calls,
                      "collection_s": facts.seconds, "exposition_bytes": len(facts.text),
                      "collected_at_each_scrape_over_served_p95": round(facts.seconds / max(_pct(scrapes, 95), 1e-6), 1),
                      "model_passes": passes, "page": page, "rss_before_model_mib": rss_before, "rss_after_mib": rss_after,
                      "added_mib": round(rss_after - rss_before, 1)}
    write_results("dashboard", run_at, result, result)  # the record and, kept in the repository, the same as summary
    print(f"metrics scrape over {args.tables} tables from the model: p50 {result['scrape_p50_s']} s, p95 "
          f"{result['scrape_p95_s']} s (goal <= 0.1 s), catalog calls during {args.scrapes} scrapes: "
          f"{catalog_calls}; collecting at each scrape instead cost {result['collection_s']} s "
          f"({result['collected_at_each_scrape_over_served_p95']}x)")
    if "first_load_s" in page:
        print(f"fleet page, {page['rows']} rows: first load {page['first_load_s']} s to every row on the page "
              f"(its load event {page['load_event_s']} s, {page['get_returned_s']} s to the browser's return) (goal <= 1 s; {page['first_load_phases_ms']}); a refresh p50 {page['refresh_p50_s']} s, p95 "
              f"{page['refresh_p95_s']} s (goal <= 0.3 s); console errors {len(page['console_errors'])}")
    print(f"the model's passes over {args.tables} tables: each table on its own (the baseline) "
          f"{passes['each_table_alone_s']} s; the first pass {passes['first_pass_s']} s "
          f"({passes['first_over_baseline']}x); a pass with nothing reported {passes['quiet_pass_s']} s "
          f"({passes['quiet_over_baseline']}x); a pass after {passes['reported']} commits were reported "
          f"{passes['reported_pass_s']} s ({passes['reported_full_reads']} tables read in full)")
    print(f"memory: {rss_before} MiB before the model and the server, {rss_after} MiB after: "
          f"+{result['added_mib']} MiB (goal <= 100)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
