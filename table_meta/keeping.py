"""What keeping a table means, shared by the components and the governor (Amoro's executors
are the model): each component exports, beside its action, its own rule of whether the action
is due on a table now and how urgent it is; its own loop and the governor ask the same rule.

- `Due`: one action due on one table, its urgency in comparable units (how many times its
  trigger is passed: >= 1 is due) and why, in words an operator reads.
- `Executor`: a component's action on one table, one shape for all (compact, merge,
  maintain, drop columns): `enabled(table)` by the table's policy, `due(table, ...)` (no
  Spark: metadata reads only) and `run(table, spark)`, each given the table's runtime
  (table_meta/table_runtime.py: its effective settings, parsed once).
- `backoff`: the one rule for waiting after failures (the governor's actions, a paused
  table's retries, the supervisor's restarts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from streamberg.table_meta.table_runtime import TableRuntime


@dataclass(frozen=True)
class Due:
    table: str
    action: str  # compact | merge | maintain | drop-columns
    urgency: float  # times its trigger is passed (>= 1 is due)
    why: str
    min_interval_seconds: float = 60.0


class Executor(Protocol):
    """A component's action on one table (compactor/executor.py, merge/executor.py,
    maintenance/executor.py). Made once per table and kept across probes: it may cache what
    is dear to compute while the table is unchanged."""

    action: str

    def enabled(self, table: TableRuntime) -> bool:
        """Whether the table's policy (table.policy) lets it run."""

    def due(self, table: TableRuntime, catalog: Any, engine: Any) -> Due | None:
        """What is due now on the table (table.table: loaded once a probe, None when it does
        not exist yet), by its effective settings (table.settings)."""

    def run(self, table: TableRuntime, spark: Any) -> dict[str, Any]:
        """Run the action once on the given session, with table.settings; a failure raises."""


def backoff(failures: int, base_seconds: float, max_seconds: float) -> float:
    """The wait after `failures` failures in a row: base, doubled each time, at most max."""
    if failures <= 0:
        return 0.0
    return min(max_seconds, base_seconds * 2 ** (failures - 1))
