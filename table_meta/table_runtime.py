"""One table as the product keeps it: the config that declares it, the table handle its
settings were read from, and its effective settings parsed once (the config's, with the
table's own `streamberg.*` properties over them, `auto` clustering resolved), with where each
value came from and what is wrong with them. Amoro's `TableRuntime` and Iceberg's Flink
Dynamic Sink (a table's settings read once per write target) are the models.

Every component, the governor, `status` and the metrics take a table's settings from here:
nothing else parses policy (the architecture test refuses it). A runtime is a value for one
version of the table's metadata; `refreshed(table)` gives the next one, or the same object
while the metadata is unchanged (the parse is not paid again).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from streamberg.common.config import StreambergConfig
from streamberg.table_meta.column_usage import ColumnFacts
from streamberg.table_meta.policy import AUTO, POLICY_KEYS, TablePolicy, policy_for, table_settings

Origin = Literal["table property", "config", "default"]
AUTO_KEY = "streamberg.cluster.columns"


@dataclass
class TableRuntime:
    config: StreambergConfig  # as the config declares the table
    table: Any | None  # the pyiceberg table its settings were read from (None: not made yet)
    policy: TablePolicy  # the table's own switches (enabled actions, intervals, column lifecycle)
    settings: StreambergConfig  # the effective config every action runs with
    problems: list[str] = field(default_factory=list)  # values ignored, clustering columns missing
    read_at: float = field(default_factory=time.monotonic)
    # The metadata its settings were parsed from (a pyiceberg Table changes in place when a
    # transaction commits through it: its own location is not a record of what was read).
    metadata_location: str | None = None
    # Its columns' facts (table_meta/column_usage.py), derived once from that metadata.
    _column_facts: ColumnFacts | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.metadata_location is None and self.table is not None:
            self.metadata_location = getattr(self.table, "metadata_location", None)

    @classmethod
    def of(cls, config: StreambergConfig, table: Any | None) -> TableRuntime:
        """The table's settings, parsed once (table_meta/policy.table_settings: the one path)."""
        if table is None:
            policy, settings = policy_for(config, {})
            return cls(config, None, policy, settings, list(policy.problems))
        policy, settings, problems = table_settings(config, table)
        return cls(config, table, policy, settings, problems)

    @classmethod
    def proposed(cls, config: StreambergConfig, properties: Mapping[str, str]) -> TableRuntime:
        """The settings a table would have with these properties (`table --set` checks a change
        before writing it; no table is read)."""
        policy, settings = policy_for(config, properties)
        return cls(config, None, policy, settings, list(policy.problems))

    def refreshed(self, table: Any | None) -> TableRuntime:
        """This table's runtime for `table` as loaded now: itself while the metadata (and so its
        properties) is the same, else parsed anew. `auto` clustering follows the scan
        statistics, not the metadata: such a table's settings are always resolved anew."""
        if table is not None and self.metadata_location is not None and not self._follows_queries() and \
                getattr(table, "metadata_location", None) == self.metadata_location:
            return self
        return TableRuntime.of(self.config, table)

    def _follows_queries(self) -> bool:
        stated = (self.table.properties if self.table is not None else {}).get(AUTO_KEY, "")
        return str(stated).strip().lower() == AUTO

    def column_facts(self) -> ColumnFacts:
        """The table's column facts (what usage judges columns by), read now: derived once a
        metadata version (every schema walked, every snapshot's schema), dated now (the
        metadata they come from was this runtime's when it was handed out: `refreshed`). A
        table handle a transaction moved on in place is read afresh, never cached."""
        if self.table is None:
            raise ValueError(f"{self.identifier}: no table yet, no columns")
        if getattr(self.table, "metadata_location", None) != self.metadata_location:
            return ColumnFacts.of_table(self.table)
        if self._column_facts is None:
            self._column_facts = ColumnFacts.of_table(self.table)
            return self._column_facts
        return dataclasses.replace(self._column_facts, loaded_at=time.time())

    @property
    def identifier(self) -> str:
        return self.config.table.identifier

    def origins(self) -> list[dict[str, Any]]:
        """Every policy key's effective value and where it came from (a table property, the
        config, or the product's default), as the dashboard and `status` show them."""
        properties = dict(self.table.properties) if self.table is not None else {}
        out = []
        for key in POLICY_KEYS:
            if "." in key.target:
                value: Any = _at(self.settings, key.target)
                origin: Origin = "table property" if key.target in self.policy.settings and \
                    _same(value, self.policy.settings[key.target]) else \
                    "config" if _set_in(self.config, key.target) else "default"
            else:
                value = getattr(self.policy, key.target)
                origin = "table property" if key.name in properties and not any(
                    p.startswith(key.name + ":") for p in self.problems) else "default"
            out.append({"key": key.name, "setting": key.target, "value": value, "origin": origin})
        return out


def _at(config: Any, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _same(effective: Any, stated: Any) -> bool:
    return effective == stated or (isinstance(effective, (list, tuple)) and list(effective) == list(stated))


def _set_in(config: Any, dotted: str) -> bool:
    """Whether the config file set this setting (pydantic's fields set, at every level)."""
    node = config
    for part in dotted.split("."):
        if part not in getattr(node, "model_fields_set", set()):
            return False
        node = getattr(node, part)
    return True
