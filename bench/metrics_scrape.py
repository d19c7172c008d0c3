"""A metrics scrape over many tables: served from the exporter's model (monitoring/watch.py)
against collected at every scrape (what the exporter did before), in the same run.

    .venv/bin/python bench/metrics_scrape.py [--tables 1000] [--scrapes 200]

Makes N real tables in a SQLite catalog (each with one committed snapshot written by
pyiceberg), all fed from one topic of the embedded broker, then: one collection of every
table's status (the model's refresh, timed: what one scrape cost when each scrape collected),
then `--scrapes` scrapes over HTTP of the real exporter server (monitoring/watch.serve), each
timed, with the catalog's calls counted during them (a counting wrapper around the real
catalog's opening: a scrape must make none). Prints p50/p95 of a scrape, the collection's time
and the ratio; writes bench/results/metrics-scrape-<time>.json and a summary in
bench/summaries/.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402

from streamberg.cli.sample_events import SAMPLE_EVENT_SCHEMA  # noqa: E402
from streamberg.common.broker import EmbeddedBroker, ensure_topic, free_port  # noqa: E402
from streamberg.common.catalog import ensure_table, shared_catalog  # noqa: E402
from streamberg.common.config import StreambergConfig  # noqa: E402
from streamberg.common.table_files import ManifestCache  # noqa: E402
from streamberg.monitoring.collect import collect_status  # noqa: E402
from streamberg.monitoring.fleet import FleetStatus  # noqa: E402
from streamberg.monitoring.health import with_health  # noqa: E402
from streamberg.monitoring.metrics import fleet_families  # noqa: E402
from streamberg.monitoring.watch import Watch, serve  # noqa: E402


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))], 4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=1000)
    parser.add_argument("--scrapes", type=int, default=200)
    args = parser.parse_args()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as work:
        folder = Path(work)
        broker = EmbeddedBroker(folder / "broker")
        info = broker.start(port=free_port())
        try:
            ensure_topic(info.bootstrap, "events", 1)
            base = {"kafka": {"bootstrap_servers": info.bootstrap, "topic": "events"},
                    "catalog": {"name": "bench", "uri": f"sqlite:///{folder / 'catalog.db'}",
                                "warehouse": str(folder / "w")},
                    "ingest": {"state_dir": str(folder / "state")}}
            configs = [StreambergConfig.model_validate({**base, "table": {"identifier": f"fleet.t{i:04d}",
                                                                          "schema": SAMPLE_EVENT_SCHEMA}})
                       for i in range(args.tables)]
            made = time.monotonic()
            for config in configs:
                table = ensure_table(shared_catalog(config.catalog), config.table)
                from pyiceberg.io.pyarrow import schema_to_pyarrow

                arrow = schema_to_pyarrow(table.schema(), include_field_ids=False)
                table.append(pa.Table.from_pylist([{f.name: None for f in arrow} | {"id": 1}], schema=arrow))
            made = time.monotonic() - made
            print(f"{args.tables} tables made in {made:.1f} s", flush=True)
            cache = ManifestCache()

            def collect() -> FleetStatus:
                return FleetStatus(tables=[(c.kafka.topic, with_health(collect_status(c, cache=cache), c))
                                           for c in configs])

            watch = Watch(collect, fleet_families, refresh_seconds=3600.0, scope="bench")
            facts = watch.refresh()
            print(f"one collection of every table: {facts.seconds:.2f} s, exposition {len(facts.text):,} bytes",
                  flush=True)
            # Every catalog call from here on is counted, whoever opened the catalog (the SQL
            # catalog's class): a scrape must make none.
            from pyiceberg.catalog.sql import SqlCatalog

            calls = {"n": 0}
            for name in ("load_table", "list_tables", "table_exists", "list_namespaces"):
                real = getattr(SqlCatalog, name)

                def counted(*a: Any, _real: Any = real, **k: Any) -> Any:
                    calls["n"] += 1
                    return _real(*a, **k)

                setattr(SqlCatalog, name, counted)
            port = free_port()
            server, _thread = serve(watch, "127.0.0.1", port)
            times = []
            try:
                for _ in range(args.scrapes):
                    started = time.monotonic()
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
                        body = response.read()
                    times.append(time.monotonic() - started)
                    assert body == facts.text
            finally:
                server.shutdown()
            result = {"stamp": stamp, "command": " ".join(sys.argv), "tables": args.tables, "scrapes": args.scrapes,
                      "scrape_p50_s": _pct(times, 50), "scrape_p95_s": _pct(times, 95),
                      "scrape_max_s": round(max(times), 4), "catalog_calls_during_scrapes": calls["n"],
                      "collection_s": facts.seconds, "exposition_bytes": len(facts.text),
                      "collected_per_scrape_over_served": round(facts.seconds / max(_pct(times, 95), 1e-6), 1)}
        finally:
            broker.stop()
    for where in ("results", "summaries"):
        out = ROOT / "bench" / where / f"metrics-scrape-{stamp}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
    print(f"scrape over {args.tables} tables from the model: p50 {result['scrape_p50_s']} s, p95 "
          f"{result['scrape_p95_s']} s, catalog calls during {args.scrapes} scrapes: "
          f"{result['catalog_calls_during_scrapes']}; collected at every scrape (the old way) it cost "
          f"{result['collection_s']} s: {result['collected_per_scrape_over_served']}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
