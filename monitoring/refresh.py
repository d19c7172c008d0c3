"""Many tables' statuses kept between collections (the dashboard's model under `govern`, the
metrics exporter's of a fleet), so a pass over a thousand tables costs what changed.

Every pass shares one read-only catalog per catalog config, one watermark reader per broker
and one read of govern.json (collect.CollectionPass). A table's own facts (its metadata,
files, snapshots, dead letters, maintenance) are read again only when they may have changed:

- it was never collected, or its last collection is FULL_EVERY_SECONDS old (what no report
  announces, a compaction or an expiry by another engine, shows within that bound);
- a commit was reported for it since (catalog.scan_reports_dir: the ingest reports each
  commit); without a report folder nothing says so, and every table is read every pass;
- its last status was not ok, or a part of it could not be read: a table in trouble is
  watched every pass;
- under `govern`, its keeper read a version of its metadata the model has not (`known`: the
  keeper's table runtime, the one object per table both read): an action the governor ran, or
  a change the keeper's own read found, shows at the next pass, not up to a minute later.

Otherwise its status is the last one with its lag read again from the broker against the
offsets the table recorded (the broker moves without a commit; the table did not commit, or a
report would say so), its ages moved on, and its health judged again.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from streamberg.common.config import StreambergConfig
from streamberg.common.errors import BrokerUnreachable
from streamberg.common.log import get_logger
from streamberg.common.metadata_files import ParsedMetadata
from streamberg.common.times import iso_from_ms
from streamberg.monitoring.catalog_probe import first_line
from streamberg.monitoring.collect import CollectionPass, collect_status, governor_state, table_key
from streamberg.monitoring.health import with_health
from streamberg.monitoring.model import Reachability, Status
from streamberg.table_meta.table_files import ManifestCache
from streamberg.table_meta.table_runtime import TableRuntime

# A table's own facts are read again at least this often (seconds), whatever was reported.
FULL_EVERY_SECONDS = 60.0


@dataclass
class _Kept:
    status: Status  # as last collected in full (no verdict)
    at: float  # time.monotonic() of that collection
    commits: int | None  # commits reported for it then (None: no report folder)
    verdict: str  # its verdict at the last pass (full or not)


class StatusModel:
    """Each table's last status, refreshed by `collect` (one pass over the tables given)."""

    def __init__(self, full_every_seconds: float = FULL_EVERY_SECONDS, cache: ManifestCache | None = None,
                 known: Callable[[StreambergConfig], TableRuntime | None] | None = None) -> None:
        self.full_every_seconds = full_every_seconds
        self.cache = cache or ManifestCache()
        self.parsed = ParsedMetadata()  # the tables' metadata parsed once a version, across passes
        self.runtimes: dict[str, TableRuntime] = {}  # each table's runtime (its settings), by key
        # A table's runtime as its owner keeps it (govern: the keeper's), or None: read, never
        # written; the model takes it for the table while its metadata is the one it loads.
        self.known = known
        self._kept: dict[str, _Kept] = {}
        self.full_reads = 0  # tables read in full, over the model's life (bench/dashboard.py reports them)
        self.lag_reads = 0  # tables whose lag alone was read again
        self.log = get_logger("monitoring.refresh")

    def collect(self, configs: Iterable[StreambergConfig]) -> list[Status]:
        """Every table's status, judged, in the order given."""
        out: list[Status] = []
        seen: set[str] = set()
        reported: dict[str, dict[str, Any] | None] = {}  # report folder -> its commits, folded once a pass
        with CollectionPass(self.parsed, self.runtimes) as shared:
            for config in configs:
                key = table_key(config)
                seen.add(key)
                commits = self._commits(config, reported, shared)
                kept = self._kept.get(key)
                newer = self._keeper_read_newer(key, config, kept)
                status = self._again(config, kept, shared) if not newer and self._unchanged(kept, commits) else None
                if status is None:
                    started = time.monotonic()  # its facts are as of then (a keeper's read after it is newer)
                    status = collect_status(config, cache=self.cache, shared=shared)
                    kept = self._kept[key] = _Kept(status, started, commits, "ok")
                    self.full_reads += 1
                else:
                    self.lag_reads += 1
                judged = with_health(status, config)
                assert kept is not None and judged.health is not None
                kept.verdict = judged.health.verdict
                out.append(judged)
        for gone in set(self._kept) - seen:  # no longer kept: forgotten
            del self._kept[gone]
        for gone in set(self.runtimes) - seen:
            del self.runtimes[gone]
        return out

    def _keeper_read_newer(self, key: str, config: StreambergConfig, kept: _Kept | None) -> bool:
        """Whether the owner's runtime of the table was read from a metadata version since the
        model's last full collection that is not the model's (read it in full). The owner's
        becomes the model's runtime for the table whenever it is at least as new (one object,
        one parse)."""
        theirs = self.known(config) if self.known is not None else None
        if theirs is None or theirs.config is not config or theirs.metadata_location is None:
            return False
        mine = self.runtimes.get(key)
        if mine is None or theirs.read_at >= mine.read_at:
            self.runtimes[key] = theirs  # CollectionPass.runtime keeps it while the metadata loaded is its
        return kept is not None and theirs.read_at > kept.at and \
            (mine is None or theirs.metadata_location != mine.metadata_location)

    def _commits(self, config: StreambergConfig, reported: dict[str, dict[str, Any] | None],
                 shared: CollectionPass) -> int | None:
        folder = config.catalog.scan_reports_dir
        if not folder:
            return None
        key = f"{folder}|{config.catalog.name}"
        if key not in reported:
            from streamberg.table_meta.query_stats import commits_in

            try:  # folded once a pass: its statistics answer the pass's tables' queries too
                reported[key] = commits_in(shared.folded(str(folder), config.catalog.name))
            except OSError as exc:
                self.log.warning("commit reports not read; every table read in full", folder=str(folder),
                                 error=first_line(exc))
                reported[key] = None
        found = reported[key]
        if found is None:
            return None
        return int(found.get(config.table.identifier, {}).get("total", 0))

    def _unchanged(self, kept: _Kept | None, commits: int | None) -> bool:
        """Whether the table's own facts may be taken from its last collection."""
        if kept is None or commits is None or kept.commits != commits:
            return False
        if time.monotonic() - kept.at >= self.full_every_seconds:
            return False
        status = kept.status
        return kept.verdict == "ok" and bool(status.table_exists) and status.catalog.reachable \
            and not status.errors and status.ingest.lag is not None

    def _again(self, config: StreambergConfig, kept: _Kept | None, shared: CollectionPass) -> Status | None:
        """The last status with the lag read again and its ages moved on; None: read it in full
        (the broker did not answer: the full collection says how)."""
        assert kept is not None and kept.status.ingest.lag is not None
        status = kept.status
        recorded = {int(p): v.committed for p, v in status.ingest.lag.partitions.items() if v.committed is not None}
        now_ms = int(time.time() * 1000)
        try:
            marks, lag = shared.lag(config, recorded, config.monitoring.broker_timeout_seconds, now_ms)
        except BrokerUnreachable:
            return None
        except Exception as exc:  # noqa: BLE001 - the full collection reports it as the table's
            self.log.warning("lag not read again; the table is read in full", table=config.table.identifier,
                             error=first_line(exc))
            return None
        elapsed = round(time.monotonic() - kept.at, 1)
        ingest = dataclasses.replace(status.ingest, lag=lag, broker=Reachability(True), topic_exists=marks.exists,
                                     last_commit=dataclasses.replace(status.ingest.last_commit,
                                                                     age_seconds=round(
                                                                         status.ingest.last_commit.age_seconds
                                                                         + elapsed, 1))
                                     if status.ingest.last_commit is not None else None)
        return dataclasses.replace(status, checked_at=iso_from_ms(now_ms, timespec="seconds"), ingest=ingest,
                                   governor=governor_state(config, shared))
