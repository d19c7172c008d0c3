"""The exporter's model of its tables: every table's last status (collect_status, judged),
refreshed in the background, so a scrape reads what was collected and never calls the catalog
or the broker itself (a scrape over a thousand tables answers in milliseconds; a broker that
is down slows the refresh, not the scrape).

Each refresh collects every table once (one table: its status; a config of many: the fleet's,
monitoring/fleet.py), renders the Prometheus exposition once and keeps it; a scrape is that
text. The refresh loop's heartbeat says whether the exporter is alive (`/healthz`); the last
refresh's reachability of the catalog and the broker whether it is ready (`/readyz`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from streamberg.common.log import get_logger
from streamberg.monitoring.fleet import FleetStatus

HISTORY_POINTS = 240  # per table: the charts' points (an hour at the default 15 s refresh)
# A loop that has not finished a refresh in this many refresh intervals (plus its last
# collection's own time) is stuck: /healthz says so.
STUCK_AFTER_INTERVALS = 3.0


@dataclass(frozen=True)
class Facts:
    """One refresh: the fleet's statuses, when, how long it took, its exposition text."""

    fleet: FleetStatus
    at: float  # time.time() of the refresh's end
    seconds: float
    text: bytes


class Watch:
    """Every table's last status, refreshed every `refresh_seconds` by `run` (or by `refresh`
    once); scrapes, `/healthz` and `/readyz` read it."""

    def __init__(self, collect: Callable[[], FleetStatus], render: Callable[[FleetStatus, float], Iterator[Metric]],
                 refresh_seconds: float, scope: str = "") -> None:
        self.collect, self.render, self.refresh_seconds = collect, render, refresh_seconds
        self.facts: Facts | None = None
        self.beat = time.monotonic()  # the loop's last sign of life
        self.last_error: str | None = None
        self.refreshes = 0
        # table -> its points over time (the dashboard's charts): one a refresh, the newest last
        self.history: dict[str, deque[dict[str, Any]]] = {}
        self.log = get_logger("monitoring.watch", scope=scope)

    def refresh(self) -> Facts:
        started = time.monotonic()
        fleet = self.collect()
        seconds = round(time.monotonic() - started, 3)
        at = time.time()
        families = list(self.render(fleet, seconds))
        families.append(_gauge("streamberg_status_refreshed_timestamp_seconds",
                               "when the exporter last collected every table's facts (unix time): a scrape "
                               "serves that collection", at))
        families.append(_gauge("streamberg_status_refresh_seconds", "how long the last collection of every "
                               "table's facts took", seconds))

        class Rendered:
            def collect(self) -> list[Metric]:
                return families

        registry = CollectorRegistry(auto_describe=False)
        registry.register(Rendered())  # type: ignore[arg-type]
        self.facts = Facts(fleet, at, seconds, generate_latest(registry))
        self._remember(fleet, at)
        self.refreshes += 1
        self.beat = time.monotonic()
        return self.facts

    def _remember(self, fleet: FleetStatus, at: float) -> None:
        """One point a table for the charts: lag, files, snapshots, metadata, commits, layout."""
        seen = set()
        for _topic, s in fleet.tables:
            seen.add(s.table)
            commit = s.ingest.last_commit
            per_column = {column: h.get("files_per_point")
                          for column, h in (s.clustering.columns if s.clustering is not None else {}).items()}
            point = {"at": round(at, 1),
                     "lag": s.ingest.lag.total if s.ingest.lag is not None else None,
                     "lag_seconds": s.ingest.lag.seconds if s.ingest.lag is not None else None,
                     "data_files": s.files.data_files if s.files is not None else None,
                     "small_files": s.files.small_files if s.files is not None else None,
                     "snapshots": s.snapshots.count if s.snapshots is not None else None,
                     "metadata_bytes": s.snapshots.metadata_bytes if s.snapshots is not None else None,
                     "consumed_total": commit.consumed_total if commit is not None else None,
                     **{f"files_per_point:{c}": v for c, v in per_column.items() if v is not None}}
            self.history.setdefault(s.table, deque(maxlen=HISTORY_POINTS)).append(point)
        for gone in set(self.history) - seen:  # a table no longer kept
            del self.history[gone]

    def run(self, stop: threading.Event) -> None:
        """Refresh until `stop`; a failed collection is logged and kept for /readyz, the last
        facts stay served."""
        while not stop.is_set():
            try:
                self.refresh()
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - the exporter outlives one bad collection
                self.last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                self.beat = time.monotonic()
                self.log.warning("status collection failed; the last facts are served", error=self.last_error)
            stop.wait(self.refresh_seconds)

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="status-refresh", daemon=True)
        thread.start()
        return thread

    def alive(self) -> tuple[bool, str]:
        """Whether the refresh loop is alive: its last refresh ended recently enough."""
        last = self.facts.seconds if self.facts is not None else 0.0
        age = time.monotonic() - self.beat
        limit = STUCK_AFTER_INTERVALS * self.refresh_seconds + last + 30.0
        if age > limit:
            return False, f"no refresh for {age:.0f} s (> {limit:.0f} s): the collection is stuck"
        return True, f"refreshed {age:.0f} s ago"

    def ready(self) -> tuple[bool, str]:
        """Whether the last refresh reached the catalog and the broker for every table."""
        if self.facts is None:
            return False, "no collection finished yet"
        if self.last_error is not None:
            return False, f"the last collection failed: {self.last_error}"
        statuses = [s for _, s in self.facts.fleet.tables]
        catalog = [s.table for s in statuses if not s.catalog.reachable]
        broker = [s.table for s in statuses if not s.ingest.broker.reachable]
        if catalog or broker:
            return False, "; ".join(
                ([f"catalog not reached for {', '.join(catalog[:5])}"] if catalog else []) +
                ([f"broker not reached for {', '.join(broker[:5])}"] if broker else []))
        return True, f"{len(statuses)} tables, catalog and broker reached"

    def scrape(self) -> bytes:
        return self.facts.text if self.facts is not None else b""


def _gauge(name: str, doc: str, value: float) -> Metric:
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], value)
    return family
