"""The Grafana dashboard in deploy/grafana/ queries only what the exporter really exports: every
metric name in every panel's expression is in a real scrape (the exporter's model over a real
table with real ingest commits, plus a kept tail's section), and the manifests' ServiceMonitor
scrapes the exporter's Service port."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from streamberg.monitoring.collect import collect_status
from streamberg.monitoring.fleet import FleetStatus
from streamberg.monitoring.health import with_health
from streamberg.monitoring.metrics import fleet_families
from streamberg.monitoring.watch import Watch
from tests.monitoring.helpers import Scenario

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "streamberg-tables.json"
NAME = re.compile(r"\bstreamberg_[a-z0-9_]+")


def _exported(scenario: Scenario) -> set[str]:
    status = with_health(collect_status(scenario.config), scenario.config)
    kept = dataclasses.replace(status, table="db.kept", tail_cache={
        "alive": True, "kept_by": "ingest", "segments": 2, "bytes": 100, "kept_records": 10,
        "past_kept_records": 3, "behind_seconds": 0.4})
    watch = Watch(lambda: FleetStatus(tables=[("t", status), ("t", kept)]), fleet_families, 60.0)
    text = watch.refresh().text.decode()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_panel_queries_a_metric_the_exporter_exports(scenario: Scenario) -> None:
    exported = _exported(scenario)
    dashboard = json.loads(DASHBOARD.read_text())
    asked = {}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for name in NAME.findall(target["expr"]):
                asked.setdefault(name, []).append(panel["title"])
    assert len(dashboard["panels"]) >= 10 and len(asked) >= 12
    missing = {name: panels for name, panels in asked.items() if name not in exported}
    assert not missing, f"panels query metrics the exporter does not export: {missing}"
    # The check can fail: a name the exporter never had is caught.
    assert "streamberg_ingest_lag_bytes" not in exported
    # The table variable is every table label the exporter gives.
    assert "streamberg_up" in exported and "label_values(streamberg_up, table)" in json.dumps(dashboard)
