"""The ingest job's one committer: a table Committer per table (ingest/committer.py), each
table's failures kept apart: retried with backoff, paused after ingest.table_failures_to_pause
in a row (named in the run folder's paused-tables.json, which `status` reads), resumed at the
next start. A table a writer could not open is paused with the writer's reason. It records
the records this run committed (the driver's bound and outcome) and marks the run drained once
every writer's last unit of every table is committed.
"""

from __future__ import annotations

import json
import time
from typing import Any

from streamberg.common.config import FleetConfig, config_from_dump
from streamberg.common.config.fleet import PAUSED_TABLES_FILE
from streamberg.common.errors import FencedError
from streamberg.common.log import get_logger
from streamberg.common.tables import run_folder, run_settings
from streamberg.ingest.routes import ingest_view
from streamberg.ingest.run_folder import RunFolder
from streamberg.ingest.units import FlushUnit
from streamberg.table_meta.keeping import backoff as commit_backoff


class Committers:
    """The one committer of an ingest job: a Committer per table, failures kept apart."""

    def __init__(self, fleet: FleetConfig, parallelism: int, run_id: str) -> None:
        self.fleet, self.parallelism, self.run_id = fleet, parallelism, run_id
        self.committers: dict[str, Any] = {}  # table identifier -> Committer
        self.failing: dict[str, tuple[int, float, list[FlushUnit]]] = {}  # table -> (failures, retry at, units)
        self.paused: dict[str, str] = {}
        self.failures: dict[str, int] = {}  # table -> commit failures in a row
        self.finished_writers: set[int] = set()
        self.drained = False
        self.log = get_logger("ingest.committers", run=run_id)
        self.pause_after = fleet.defaults.ingest.table_failures_to_pause
        self.commit_times: list[float] = []
        self._next_report = time.monotonic() + 60
        self.committed = 0  # records (rows and dead letters) this run committed, every table
        self._folder = RunFolder(run_folder(run_settings(fleet).ingest.state_dir, run_id))
        self._baselines: dict[str, dict[str, Any]] = {}
        self._to_warm: list[tuple[str, str]] | None = None  # warm_up's tables left to open

    def open(self) -> None:
        """Each table's committer opens at its first unit. After a restart of the same run
        (Flink restarted the job), the records it committed before are counted again from the
        tables themselves: each table's consumed total now less the one it had when this run
        first opened it (recorded in the run folder before the run's first commit to it)."""
        self._baselines = self._folder.baselines()
        for table, base in self._baselines.items():
            try:
                committer = self._open(table, base["topic"], base.get("route_value"))
                self.committed += committer.consumed_total - int(base["total"])
            except FencedError:
                raise
            except Exception as exc:  # noqa: BLE001 - that table is retried at its first unit
                self.log.warning("could not count a table's committed records after the restart", table=table,
                                 reason=f"{type(exc).__name__}: {str(exc)[:200]}")
        if self._baselines:
            self._folder.record_committed(self.committed)
            self.log.info("run restarted: committed records counted from the tables", committed=self.committed,
                          tables=len(self._baselines))

    def warm_up(self) -> bool:
        """Open one more table's committer before its first unit comes; False once none is
        left. For an engine whose committer waits for units in a loop of its own (the
        processes engine): a job of many tables then does not open them all at the end of its
        first interval, in the final commit round of a short run (each opening reads the
        table: ~7 ms). A table that cannot be opened now is left to its first unit, where
        its failure is handled as always."""
        if self._to_warm is None:
            self._to_warm = self._known_tables()
        while self._to_warm:
            table, topic = self._to_warm.pop()
            if table in self.committers or table in self.paused or table in self.failing:
                continue
            try:
                self._open(table, topic, None)
            except Exception as exc:  # noqa: BLE001 - its first unit opens it again, failures handled there
                self.log.debug("committer not opened ahead of its first unit", table=table, reason=str(exc)[:200])
            return True
        return False

    def _known_tables(self) -> list[tuple[str, str]]:
        """The (table, topic) pairs of the topics the routes take now (a field route's tables
        are made as values come: not known ahead)."""
        from streamberg.common.tables import broker_topics
        from streamberg.ingest.routes import Routes

        routes = Routes(self.fleet)
        found, _ = broker_topics(self.fleet, run_settings(self.fleet))
        named = {topic for route in self.fleet.tables for topic in (route.topics or [])}
        pairs = []
        for topic in routes.update(sorted(set(found) | named)):
            route = self.fleet.route_of(topic)
            config = routes.by_topic.get(topic)
            if config is not None and route is not None and route.route_field is None:
                pairs.append((config.table.identifier, topic))
        return pairs[::-1]  # popped from the end: the first topics first

    def _committer(self, unit: FlushUnit) -> Any:
        found = self.committers.get(unit.table)
        if found is None:
            found = self._open(unit.table, unit.topic, unit.route_value)
        return found

    def _open(self, table: str, topic: str, route_value: str | None) -> Any:
        from streamberg.ingest.committer import Committer

        route = self.fleet.route_of(topic)
        config = ingest_view(config_from_dump(self.fleet.document(route, topic, route_value)))
        committer = Committer(config, self.parallelism, self.run_id)
        committer.open()
        self.committers[table] = committer
        if table not in self._baselines:  # before this run's first commit to it
            self._baselines[table] = {"topic": topic, "route_value": route_value, "total": committer.consumed_total}
            self._folder.record_baselines(self._baselines)
        return committer

    def offer(self, unit: FlushUnit) -> int:
        """Take one table's unit; return the records committed (any table) now."""
        if unit.final:
            self.finished_writers.add(unit.writer)
        if unit.refused is not None:  # a writer could not open the table: paused, named in the run folder
            if self.paused.get(unit.table) != unit.refused:
                self.paused[unit.table] = unit.refused
                self.log.error("table paused: a writer could not open it; the others go on", table=unit.table,
                               topic=unit.topic, reason=unit.refused)
                self._write_paused()
            return 0
        if unit.table in self.paused:
            return 0
        records = 0
        try:
            committer = self._committer(unit)
            retry = self.failing.get(unit.table)
            if retry is not None and time.monotonic() < retry[1]:
                retry[2].append(unit)
                return 0
            if retry is not None:  # the backoff passed: the held units first, in order
                del self.failing[unit.table]
                for held in retry[2]:
                    if _landed(held, committer.expected):
                        continue  # the failed commit did land (its answer was lost): not twice
                    result = self._offer(committer, held)
                    records += result.records if result is not None else 0
            result = self._offer(committer, unit)
            records += result.records if result is not None else 0
            if result is not None:
                self.failures.pop(unit.table, None)
                self._count_commit()
        except FencedError:
            raise  # per job: another instance writes this table
        except Exception as exc:  # noqa: BLE001 - one table's trouble must not stop the others
            self._failed(unit, exc)
        self._maybe_drained()
        return records

    def _offer(self, committer: Any, unit: FlushUnit) -> Any:
        before = committer.consumed_total
        result = committer.offer(unit)
        if committer.consumed_total != before:
            self.committed += committer.consumed_total - before
            self._folder.record_committed(self.committed)
        return result

    def _count_commit(self) -> None:
        """Catalog commits per minute, all tables together, logged once a minute."""
        now = time.monotonic()
        self.commit_times.append(now)
        while self.commit_times and self.commit_times[0] < now - 60:
            self.commit_times.pop(0)
        if now >= self._next_report:
            self._next_report = now + 60
            self.log.info("catalog commits in the last minute", commits=len(self.commit_times),
                          tables=len(self.committers), failing=sorted(self.failing), paused=sorted(self.paused))

    def _failed(self, unit: FlushUnit, exc: BaseException) -> None:
        _, _, units = self.failing.get(unit.table, (0, 0.0, []))
        # Failures in a row, kept across the retries (only a commit that lands clears them).
        failures = self.failures.get(unit.table, 0) + 1
        self.failures[unit.table] = failures
        committer = self.committers.pop(unit.table, None)  # re-opened from the table at the retry
        pending = (committer.pending.units if committer is not None else []) + units + [unit]
        reason = f"{type(exc).__name__}: {str(exc)[:300]}"
        if failures >= self.pause_after:
            self.paused[unit.table] = reason
            self.failing.pop(unit.table, None)
            self.log.error("table paused after repeated commit failures; the others go on; it resumes at the next "
                           "start", table=unit.table, failures=failures, reason=reason)
            self._write_paused()
            return
        backoff = commit_backoff(failures, 2.0, 60.0)
        self.failing[unit.table] = (failures, time.monotonic() + backoff, pending)
        self.log.warning("table commit failed; retried after a backoff while the others go on", table=unit.table,
                         failures=failures, retry_in_seconds=backoff, reason=reason)

    def _write_paused(self) -> None:
        self._folder.path.mkdir(parents=True, exist_ok=True)
        (self._folder.path / PAUSED_TABLES_FILE).write_text(json.dumps(self.paused, indent=1))

    def _maybe_drained(self) -> None:
        if self.drained or len(self.finished_writers) < self.parallelism:
            return
        if any(not c.writers_finished for c in self.committers.values()):
            return
        self.drained = True
        self._folder.record_committed(self.committed)
        self._folder.mark_drained({})
        self.log.info("all writers finished and every table committed", tables=len(self.committers),
                      committed=self.committed, paused=sorted(self.paused))

    def close(self) -> None:
        for committer in self.committers.values():
            committer.close()


def _landed(unit: FlushUnit, committed: dict[int, int]) -> bool:
    """Whether the table's committed offsets already cover every range of `unit`: a commit
    whose answer was lost (a 5xx, a timeout) may have landed; a table's units commit together
    or not at all, so a unit is either wholly in the table or not at all."""
    return bool(unit.ranges) and all(committed.get(p, -1) >= end for p, (_, end) in unit.ranges.items())
