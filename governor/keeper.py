"""One table as the governor keeps it: its probe (what is due, by the table's own policy) and
its runner, over the components' executors (table_meta/keeping.py) on the one shared session.

A keeper lives across rounds and holds the table's runtime (table_meta/table_runtime.py: its
effective settings, parsed once per version of its metadata: the table's settings over the
config's, each checked by its section's own model, `auto` clustering resolved). Each probe
loads the table once and asks every enabled executor what is due on that runtime; an
executor's failure to answer is that table's problem, named, never the round's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from streamberg.common.catalog import shared_catalog, state_engine
from streamberg.common.catalog_open import first_line
from streamberg.common.config import StreambergConfig
from streamberg.table_meta.changelog import changelog_identifier, has_changelog
from streamberg.table_meta.keeping import Due, Executor
from streamberg.table_meta.table_runtime import TableRuntime

# How often the service folds the reported commits (one fold serves every table's probe).
COMMITS_EVERY_SECONDS = 1.0


class SharedCatalogs:
    """One catalog (and state database) per catalog config for the whole service: a round
    probes every table, and opening a catalog is far dearer than reading a table. The
    product's own tables are made once, when a catalog is first opened, before any action:
    concurrent actions on a fresh catalog would otherwise race to create them."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[Any, Any]] = {}
        self._commits: dict[str, tuple[float, dict[str, Any]]] = {}  # folder -> (read at, commits)
        self._lock = threading.Lock()

    def commits(self, config: StreambergConfig) -> dict[str, Any] | None:
        """The commits reported per table in the config's report folder (None: no folder),
        folded at most once every COMMITS_EVERY_SECONDS for the whole service."""
        folder = config.catalog.scan_reports_dir
        if not folder:
            return None
        from streamberg.table_meta.query_stats import commits

        with self._lock:
            read_at, found = self._commits.get(folder, (0.0, {}))
            if time.monotonic() - read_at >= COMMITS_EVERY_SECONDS:
                try:
                    found = commits(folder, config.catalog.name)
                except OSError:
                    return None  # no channel now: every probe reads the catalog
                self._commits[folder] = (time.monotonic(), found)
            return found

    def get(self, config: StreambergConfig) -> tuple[Any, Any]:
        key = config.catalog.model_dump_json()
        if key not in self._open:
            # Importing them declares the private tables (maintenance runs, leases, slots).
            import streamberg.table_meta.maintenance_runs
            import streamberg.table_meta.table_slots  # noqa: F401
            from streamberg.table_meta.private_tables import ensure_private_tables

            catalog = shared_catalog(config.catalog)  # the replan's listing uses the same one
            engine = state_engine(config.catalog, catalog)
            ensure_private_tables(engine)
            self._open[key] = (catalog, engine)
        return self._open[key]


class TableKeeper:
    """Probe and runner of one table: the components' executors, the one shared session.

    With a report folder (catalog.scan_reports_dir) the table is read from the catalog only
    when a commit was reported for it since the last read, after one of the governor's own
    actions, or `govern.poll_seconds` after the last read: a thousand idle tables cost no
    catalog call a round. Without one, every probe reads it."""

    def __init__(self, config: StreambergConfig, executors: list[Executor], session: Any,
                 catalogs: SharedCatalogs) -> None:
        self.config, self.executors, self.session, self.catalogs = config, executors, session, catalogs
        self.runtime = TableRuntime.of(config, None)  # replaced at each probe (parsed again only when the table changed)
        self.by_action: dict[str, Executor] = {e.action: e for e in executors}
        self._table: Any = None
        self._read_at = 0.0
        self._commits_seen: int | None = None
        self.catalog_reads = 0  # tables read from the catalog (bench/govern_events.py counts them)

    def _table_now(self, catalog: Any) -> Any:
        commits = self.catalogs.commits(self.config)
        seen = int((commits or {}).get(self.identifier, {}).get("total", 0)) if commits is not None else None
        fresh_enough = time.monotonic() - self._read_at < self.config.govern.poll_seconds
        if seen is not None and self._table is not None and seen == self._commits_seen and fresh_enough:
            return self._table  # no commit reported since it was read: its metadata is the same
        self._table = catalog.load_table(self.identifier)
        self.catalog_reads += 1
        self._read_at, self._commits_seen = time.monotonic(), seen
        return self._table

    @property
    def identifier(self) -> str:
        return self.config.table.identifier

    def probe(self) -> tuple[list[Due], list[str]]:
        catalog, engine = self.catalogs.get(self.config)
        if has_changelog(self.config) and not catalog.table_exists(self.identifier) \
                and catalog.table_exists(changelog_identifier(self.config)):
            table = None  # a primary-key table its first merge makes: only the merge can be due
        else:
            table = self._table_now(catalog)
        # The one path (the table's runtime): `auto` clustering resolved to its choice before
        # any executor reads the columns (a column drop protects what is chosen).
        self.runtime = runtime = self.runtime.refreshed(table)
        policy, problems = runtime.policy, list(runtime.problems)
        due: list[Due] = []
        for executor in self.executors:
            if not executor.enabled(runtime):
                continue
            try:
                found = executor.due(runtime, catalog, engine)
            except Exception as exc:  # noqa: BLE001 - e.g. a clustering column the table lacks: this table's problem
                problems.append(f"{executor.action}: {first_line(exc)[:300]}")
                continue
            if found is not None:
                due.append(Due(found.table, found.action, found.urgency, found.why, policy.min_interval_seconds))
        return due, problems

    @property
    def effective(self) -> StreambergConfig:
        """The settings the table is kept with now."""
        return self.runtime.settings

    def run(self, action: str) -> dict[str, Any]:
        self._table = None  # the action may have committed: read the table again at the next probe
        return self.by_action[action].run(self.runtime, self.session)


def refused_keeper(why: str) -> tuple[Callable[[], tuple[list[Due], list[str]]], Callable[[str], dict[str, Any]]]:
    """(probe, run) of a table found and not kept: its problem reported every round, nothing run."""

    def never(action: str) -> dict[str, Any]:
        raise RuntimeError(f"{action}: the table is not kept (see its problem)")

    return (lambda: ([], [why])), never
