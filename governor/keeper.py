"""One table as the governor keeps it: its probe (what is due, by the table's own policy) and
its runner, over the components' executors (common/keeping.py) on the one shared session.

A keeper lives across rounds. Each probe loads the table once, reads its `streamberg.*`
policy (common/policy.policy_for: the table's settings over the config's, each checked by its
section's own model) and asks every enabled executor what is due by that effective config;
an executor's failure to answer is that table's problem, named, never the round's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamberg.common.catalog import first_line, load_catalog, state_engine
from streamberg.common.changelog import changelog_identifier, has_changelog
from streamberg.common.config import StreambergConfig
from streamberg.common.keeping import Due, Executor
from streamberg.common.policy import policy_for


class SharedCatalogs:
    """One catalog (and state database) per catalog config for the whole service: a round
    probes every table, and opening a catalog is far dearer than reading a table. The
    product's own tables are made once, when a catalog is first opened, before any action:
    concurrent actions on a fresh catalog would otherwise race to create them."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[Any, Any]] = {}

    def get(self, config: StreambergConfig) -> tuple[Any, Any]:
        key = config.catalog.model_dump_json()
        if key not in self._open:
            # Importing them declares the private tables (maintenance runs, leases, slots).
            import streamberg.common.maintenance_runs
            import streamberg.common.table_slots  # noqa: F401
            from streamberg.common.private_tables import ensure_private_tables

            catalog = load_catalog(config.catalog)
            engine = state_engine(config.catalog, catalog)
            ensure_private_tables(engine)
            self._open[key] = (catalog, engine)
        return self._open[key]


class TableKeeper:
    """Probe and runner of one table: the components' executors, the one shared session."""

    def __init__(self, config: StreambergConfig, executors: list[Executor], session: Any,
                 catalogs: SharedCatalogs) -> None:
        self.config, self.executors, self.session, self.catalogs = config, executors, session, catalogs
        self.effective = config
        self.by_action: dict[str, Executor] = {e.action: e for e in executors}

    @property
    def identifier(self) -> str:
        return self.config.table.identifier

    def probe(self) -> tuple[list[Due], list[str]]:
        catalog, engine = self.catalogs.get(self.config)
        if has_changelog(self.config) and not catalog.table_exists(self.identifier) \
                and catalog.table_exists(changelog_identifier(self.config)):
            table = None  # a primary-key table its first merge makes: only the merge can be due
        else:
            table = catalog.load_table(self.identifier)
        policy, config = policy_for(self.config, table.properties if table is not None else {})
        self.effective = config
        problems, due = list(policy.problems), []
        for executor in self.executors:
            if not executor.enabled(policy):
                continue
            try:
                found = executor.due(config, table, catalog, engine)
            except Exception as exc:  # noqa: BLE001 - e.g. a clustering column the table lacks: this table's problem
                problems.append(f"{executor.action}: {first_line(exc)[:300]}")
                continue
            if found is not None:
                due.append(Due(found.table, found.action, found.urgency, found.why, policy.min_interval_seconds))
        return due, problems

    def run(self, action: str) -> dict[str, Any]:
        return self.by_action[action].run(self.effective, self.session)


def refused_keeper(why: str) -> tuple[Callable[[], tuple[list[Due], list[str]]], Callable[[str], dict[str, Any]]]:
    """(probe, run) of a table found and not kept: its problem reported every round, nothing run."""

    def never(action: str) -> dict[str, Any]:
        raise RuntimeError(f"{action}: the table is not kept (see its problem)")

    return (lambda: ([], [why])), never
