"""What every maintenance step shares: the table it works on, and a typed result.

A step (``expire.py``, ``orphans.py``, ``manifests.py``, ``retention.py``) owns its plan,
decided from metadata alone with pyiceberg, its execution through Spark, and its result. The
maintainer (``maintainer.py``) runs the steps in order, retries a lost commit race, and
records the run; it knows each step only through :class:`Step`.

A result is a dataclass, so a step's figures have names and types. The run's JSON object
(what ``streamberg maintain --json`` prints and ``streamberg_maintenance_runs`` records) is
made from them by :meth:`StepResult.as_json`: a field marked ``DETAIL`` appears only when it
was filled in (a disabled step reports its reason and zero counts, not empty details).
"""

from __future__ import annotations

import dataclasses
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from streamberg.common.config import MaintenanceConfig, TableTarget
from streamberg.common.jvm import IcebergFailure, iceberg_failure, load_table
from streamberg.common.spark import activate

# Field metadata: leave the key out of the JSON object while the value is None.
DETAIL: dict[str, bool] = {"detail": True}


def detail() -> Any:
    """A result field that is only reported once known (None until then)."""
    return field(default=None, metadata=DETAIL)


@dataclass
class StepResult:
    """The outcome of one step. This base alone reports a step that did not get to run
    (stopped before it, or failed: then ``error`` says why)."""

    ran: bool = False
    reason: str | None = detail()
    error: str | None = detail()
    # Set when the step was planned and run again after losing a commit race.
    attempts: int | None = detail()

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.metadata.get("detail"):
                continue
            out[f.name] = value
        return out


def lost_commit_race(exc: BaseException) -> bool:
    """Iceberg gave up committing because other commits kept winning (CommitFailedException)."""
    return iceberg_failure(exc) is IcebergFailure.COMMIT_FAILED


class SparkTable:
    """The table as Spark sees it: Iceberg's stored procedures, SQL and the Java table."""

    def __init__(self, spark: Any, target: TableTarget) -> None:
        self.spark = spark
        self.catalog = target.catalog.name
        self.identifier = target.identifier
        self.name = target.spark_name

    def call(self, procedure: str, **args: str) -> dict[str, Any]:
        """``CALL <catalog>.system.<procedure>(table => ..., **args)``; its first row."""
        activate(self.spark)
        rendered = ", ".join([f"table => '{self.identifier}'", *(f"{k} => {v}" for k, v in args.items())])
        rows = self.spark.sql(f"CALL {self.catalog}.system.{procedure}({rendered})").collect()
        return rows[0].asDict() if rows else {}

    def sql(self, statement: str) -> list[Any]:
        activate(self.spark)
        return list(self.spark.sql(statement).collect())

    def java_table(self) -> Any:
        activate(self.spark)
        return load_table(self.spark, self.name)


@dataclass
class StepContext:
    """What a step works with: its settings, the table through pyiceberg and through Spark."""

    settings: MaintenanceConfig
    target: TableTarget
    # The Kafka topic whose committed offsets expiry must keep reachable.
    topic: str
    catalog: Catalog
    spark: SparkTable
    clock: Callable[[], float] = time.time
    # A primary-key table's change log (maintenance/changelog.py trims it); None: none.
    changelog: str | None = None
    # The ingest's dead-letter table: snapshots naming dead-letter files it does not hold yet
    # are never expired (table_meta/dead_letter_outbox.py).
    dead_letter_table: str | None = None
    # A primary-key table's key state (merge/key_state.py; maintenance/side_tables.py bounds it).
    key_state: str | None = None

    def load_dead_letters(self) -> Table | None:
        if self.dead_letter_table is None:
            return None
        try:
            return self.catalog.load_table(self.dead_letter_table)
        except NoSuchTableError:
            return None

    def load(self) -> Table:
        return self.catalog.load_table(self.target.identifier)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)


class Step(ABC):
    """One maintenance step: plan against the table as it is now, then execute (or not, in a
    dry run). A template: :meth:`run` reports a step switched off
    (``maintenance.<section>.enabled: false``) with zero counts; subclasses name their key in
    the run's JSON object, their section and result type, and implement :meth:`_run`."""

    key: ClassVar[str]
    # The settings section whose `enabled` switches this step (None: always on).
    section: ClassVar[str | None] = None
    result_type: ClassVar[type[StepResult]] = StepResult

    def __init__(self, context: StepContext) -> None:
        self.context = context

    def run(self, dry_run: bool, log: Any) -> StepResult:
        """Plan and (unless `dry_run`) execute; raise when the step fails."""
        if self.section is not None and not getattr(self.context.settings, self.section).enabled:
            return self.result_type(reason=f"maintenance.{self.section}.enabled is false")
        return self._run(dry_run, log)

    @abstractmethod
    def _run(self, dry_run: bool, log: Any) -> StepResult: ...
