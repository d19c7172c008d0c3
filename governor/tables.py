"""Which tables the governor keeps: the config's (common/tables.py: one table, or every table
of a config of many the broker's topics route to, with the tables a route field's values
made), and, opted in per namespace, every table whose properties carry `streamberg.*` policy
keys, whoever wrote it. Listed again every `govern.replan_seconds`.

A table opted in from a namespace is kept with the config's settings but not its destructive
ones (table_meta/policy.undeclared). A table found and not kept (a name no config can hold,
metadata that cannot be read, a forged route record) is reported under its own name and the
others are kept; a listing that fails keeps the last one, saying so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamberg.common.catalog import shared_catalog
from streamberg.common.catalog_open import first_line
from streamberg.common.config import StreambergConfig, config_from_dump
from streamberg.common.config.fleet import per_table_checkpoint
from streamberg.common.config.loading import dump_config
from streamberg.common.errors import ConfigError
from streamberg.common.tables import config_tables
from streamberg.table_meta.policy import carries_policy, undeclared


def opted_in(base: StreambergConfig, namespaces: list[str], have: set[str],
             refused: dict[str, str] | None = None,
             built: dict[str, StreambergConfig] | None = None) -> list[StreambergConfig]:
    """Tables of the opt-in namespaces that carry policy keys: the base config's settings
    without its destructive ones, the table's own schema (table.schema unset: the table is
    the truth). A table that cannot be kept goes into `refused` under its own name.

    `built`: the configs an earlier listing built from this same `base`, by table, reused
    (a table's config depends on the base and its name alone; its properties are its
    runtime's to read): building and validating one is a millisecond, every replan, for each
    of a thousand tables, and the same object again spares the keeper's comparison."""
    if not namespaces:
        return []
    refused = {} if refused is None else refused
    built = {} if built is None else built
    catalog = shared_catalog(base.catalog)  # every replan: a new one held its connections until a full collection
    found = []
    # A SQL catalog loads a namespace's tables from one SELECT (common/metadata_files.py);
    # other kinds list, then load each.
    load_all = getattr(catalog, "load_namespace_tables", None)
    for namespace in namespaces:
        try:
            entries: list[tuple[Any, Any]] = load_all(namespace) if load_all is not None else \
                [(identifier, None) for identifier in catalog.list_tables(namespace)]
        except Exception as exc:  # noqa: BLE001 - a namespace that is not there (yet) is this namespace's problem
            refused[f"{namespace}.*"] = f"namespace cannot be listed: {first_line(exc)[:200]}"
            continue
        for identifier, loaded in entries:
            name = ".".join(identifier)
            if name in have:
                continue
            try:
                if isinstance(loaded, Exception):
                    raise loaded
                properties = (loaded if loaded is not None else catalog.load_table(identifier)).properties
            except Exception as exc:  # noqa: BLE001 - dropped between the listing and the load, or unreadable
                if loaded is not None or catalog.table_exists(identifier):
                    refused[name] = f"cannot be read: {first_line(exc)[:200]}"
                continue
            if not carries_policy(properties):
                continue
            if name in built:
                found.append(built[name])
                continue
            document = dump_config(base)
            document["table"] = {"identifier": name}
            document["compactor"]["checkpoint_dir"] = per_table_checkpoint(base.compactor.checkpoint_dir, name)
            document["kafka"] = {**document["kafka"], "envelope": "none"}
            try:
                built[name] = undeclared(config_from_dump(document))
                found.append(built[name])
            except ConfigError as exc:
                refused[name] = f"not kept: {exc.problems[0] if exc.problems else first_line(exc)}"[:300]
    for gone in set(built) - {c.table.identifier for c in found}:
        del built[gone]  # dropped, or its policy keys removed: built again if it comes back
    return found


class GovernedTables:
    """The tables of one governor, listed again every `replan_seconds` (a listing is dear:
    the broker, the catalog's namespaces)."""

    def __init__(self, config_path: str | Path, namespaces: list[str], replan_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config_path, self.namespaces, self.replan_seconds, self.clock = config_path, namespaces, replan_seconds, clock
        self.refused: dict[str, dict[str, str]] = {"routed": {}, "listed": {}}
        self._routed: tuple[float, list[StreambergConfig]] | None = None
        self._listed: tuple[float, list[StreambergConfig]] | None = None
        self.base: StreambergConfig | None = None
        self._built: tuple[StreambergConfig | None, dict[str, StreambergConfig]] = (None, {})  # (from base, by table)

    def config_tables(self) -> list[StreambergConfig]:
        found = config_tables(self.config_path)
        self.base = found.run_settings
        self.refused["routed"] = {**found.refused_tables}
        return list(found.configs.values())

    def current(self) -> list[StreambergConfig]:
        """The config's tables first, then the opted-in ones, each once."""
        now = self.clock()
        if self._routed is None or now - self._routed[0] >= self.replan_seconds:
            try:
                self._routed = (now, self.config_tables())
            except Exception as exc:
                if self._routed is None:
                    raise
                self._routed = (now, self._routed[1])
                self.refused["routed"]["(config)"] = f"its tables could not be listed again: {first_line(exc)[:200]}"
        tables = self._routed[1]
        if self.namespaces and (self._listed is None or now - self._listed[0] >= self.replan_seconds):
            found: dict[str, str] = {}
            base = self.base or tables[0]
            if self._built[0] is None or self._built[0] != base:  # the config file changed: build them again
                self._built = (base, {})
            try:
                self._listed = (now, opted_in(base, self.namespaces, {c.table.identifier for c in tables}, found,
                                              self._built[1]))
            except Exception as exc:  # noqa: BLE001 - the catalog cannot be listed now: keep the last list
                self._listed = (now, self._listed[1] if self._listed else [])
                found = {**self.refused["listed"],
                         "(namespaces)": f"{', '.join(self.namespaces)} could not be listed: {first_line(exc)[:200]}"}
            self.refused["listed"] = found
        wanted = {c.table.identifier: c for c in tables}
        for c in (self._listed[1] if self._listed else []):
            wanted.setdefault(c.table.identifier, c)
        return list(wanted.values())

    def refusals(self) -> dict[str, str]:
        return {**self.refused["listed"], **self.refused["routed"]}

