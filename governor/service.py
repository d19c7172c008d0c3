"""`streamberg govern` as a service: the governed tables, a keeper each over the components'
executors, the governor's rounds on one Spark session (cli/govern.py parses the command line
and wires the executors in; components never import each other, so they are handed in).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamberg.common.config import GovernConfig, StreambergConfig
from streamberg.governor.app import Governor, Keeper, RoundReport
from streamberg.governor.keeper import SharedCatalogs, TableKeeper, refused_keeper
from streamberg.governor.tables import GovernedTables
from streamberg.table_meta.keeping import Executor
from streamberg.table_meta.schedule import Scheduler
from streamberg.table_meta.table_runtime import TableRuntime


@dataclass
class Service:
    governor: Governor
    tables: GovernedTables
    kept: dict[str, TableKeeper] = field(default_factory=dict)  # table -> its keeper (and its runtime)

    def runtime_of(self, config: StreambergConfig) -> TableRuntime | None:
        """The table's runtime as its keeper holds it now, for the config it keeps it with
        (the dashboard's model reads it on its own thread: a reference, replaced whole)."""
        keeper = self.kept.get(config.table.identifier)
        return keeper.runtime if keeper is not None and keeper.config is config else None

    def round(self, dry_run: bool = False) -> RoundReport:
        return self.governor.round(dry_run=dry_run)

    def run(self, stop: threading.Event, interval_seconds: float) -> int:
        return self.governor.run(stop, interval_seconds)


def build_service(config_path: str | Path, settings: GovernConfig, base: StreambergConfig, session: Any,
                  executors: Callable[[StreambergConfig], list[Executor]], jobs: Any = None,
                  tables: GovernedTables | None = None) -> Service:
    """The governor of the config at `config_path`: `executors(config)` makes a table's
    executors once (they keep what they cache across rounds); `jobs` cancels a timed-out
    action's Spark work (common/spark.JobGroups)."""
    tables = tables or GovernedTables(config_path, list(settings.namespaces), settings.replan_seconds)
    catalogs = SharedCatalogs()
    kept: dict[str, TableKeeper] = {}

    def keepers() -> list[Keeper]:
        wanted = {c.table.identifier: c for c in tables.current()}
        for gone in set(kept) - set(wanted):
            del kept[gone]
        for identifier, config in wanted.items():
            # The listing hands back the same object while nothing changed: identity first.
            if identifier not in kept or (kept[identifier].config is not config and kept[identifier].config != config):
                kept[identifier] = TableKeeper(config, executors(config), session, catalogs)
        out = [Keeper(k.identifier, k.probe, k.run, streams=f"streamberg-compactor-{k.identifier}") for k in kept.values()]
        # A table found and not kept is reported under its own name every round (status, the plan).
        for name, why in sorted(tables.refusals().items()):
            if name not in kept:
                probe, run = refused_keeper(why)
                out.append(Keeper(name, probe, run))
        return out

    governor = Governor(keepers, Scheduler(max_wait_seconds=settings.max_wait_seconds), budget=settings.max_concurrent,
                        concurrent=settings.max_concurrent, state_dir=base.ingest.state_dir,
                        timeout_seconds=settings.action_timeout_seconds, jobs=jobs)
    return Service(governor, tables, kept)
