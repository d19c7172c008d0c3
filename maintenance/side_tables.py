"""The tables beside the main one, kept bounded: the dead-letter table and a primary-key
table's key state (merge/key_state.py) commit as often as the ingest and the merge do, and
their snapshots would pile up like the main table's.

Each keeps at most `maintenance.expire.max_snapshots` snapshots, never fewer than it needs:
- the dead-letter table: nothing (the dead letters' ingest position is a table property of
  the dead-letter table, `streamberg.dlq-applied.*`, which expiry cannot forget);
- the key state: its newest snapshot that records a change-log snapshot (the merge's
  recovery reads it, merge/key_state.recorded) and everything newer.
The change log is the change-log step's (maintenance/changelog.py), which expires it to the
merge's position with the same helper, `expire_to`.

`expire_to` is how every side table is expired: Iceberg's predicted retention, the files only
the expired snapshots reference listed first, a file outside the table's location refusing
the expiry (deletes never leave a table's location), then `expire_snapshots`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from streamberg.common.config import TableTarget
from streamberg.common.errors import LocationRefused
from streamberg.common.redact import redact
from streamberg.maintenance.confine import outside_reason
from streamberg.maintenance.expire import predict_expired, timestamp_literal
from streamberg.maintenance.reachability import only_referenced_by
from streamberg.maintenance.step import SparkTable, Step, StepContext, StepResult
from streamberg.table_meta.offsets import ancestry, summary_properties
from streamberg.table_meta.summary_keys import SummaryKeys


@dataclass(frozen=True)
class Expired:
    snapshots: int
    bytes_freed: int


def expire_to(context: StepContext, identifier: str, table: Table, older_than_ms: int, retain_last: int,
              dry_run: bool, log: Any) -> Expired:
    """Expire `table`'s snapshots older than `older_than_ms` beyond the newest `retain_last`."""
    expired = predict_expired(table, older_than_ms, retain_last, context.now_ms())
    kept = [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id not in expired]
    doomed = only_referenced_by(table, expired, kept)
    location = table.location()
    if outside := {p: r for p in doomed if (r := outside_reason(p, location))}:
        example = next(iter(outside))
        raise LocationRefused(f"expiry of {identifier} would delete {len(outside)} file(s) not safely inside "
                              f"{redact(location)}, e.g. {redact(example)} ({outside[example]}); expire by hand")
    out = Expired(len(expired), sum(r.size_bytes for r in doomed.values()))
    if expired and not dry_run:
        spark = SparkTable(context.spark.spark, TableTarget(context.target.catalog, context.target.table.model_copy(
            update={"identifier": identifier})))
        spark.call("expire_snapshots", older_than=timestamp_literal(older_than_ms), retain_last=str(retain_last))
        log.info("snapshots expired", table=identifier, expired=out.snapshots, bytes_freed=out.bytes_freed)
    return out


def bounded_expiry(table: Table, max_snapshots: int, keep: list[Snapshot]) -> tuple[int, int] | None:
    """(older_than_ms, retain_last) keeping the newest `max_snapshots` and every snapshot of
    `keep` (a chain from the current one back); None when nothing is over the bound."""
    lineage = list(ancestry(table))
    if len(table.metadata.snapshots) <= max_snapshots or not lineage:
        return None
    retain = min(len(lineage), max(max_snapshots, len(keep), 1))
    return lineage[retain - 1].timestamp_ms, retain


def recorded_chain(table: Table) -> list[Snapshot]:
    """The current snapshot back to the newest one recording a change-log snapshot."""
    chain = []
    for snapshot in ancestry(table):
        chain.append(snapshot)
        if SummaryKeys.CHANGELOG_APPLIED in summary_properties(snapshot):
            return chain
    return []


@dataclass
class SideTablesResult(StepResult):
    snapshots_expired: int = 0
    bytes_freed: int = 0
    # table -> snapshots it holds after this step
    snapshots: dict[str, int] = field(default_factory=dict)


class SideTablesStep(Step):
    key = "side_tables"
    section = "expire"
    result_type = SideTablesResult

    def _run(self, dry_run: bool, log: Any) -> SideTablesResult:
        context = self.context
        out = SideTablesResult(ran=not dry_run)
        tables = [(context.dead_letter_table, lambda t: []), (context.key_state, recorded_chain)]
        for identifier, chain in tables:
            if identifier is None:
                continue
            try:
                table = context.catalog.load_table(identifier)
            except NoSuchTableError:
                continue
            bounds = bounded_expiry(table, context.settings.expire.max_snapshots, chain(table))
            if bounds is not None:
                done = expire_to(context, identifier, table, *bounds, dry_run, log.bind(step=self.key))
                out.snapshots_expired += done.snapshots
                out.bytes_freed += done.bytes_freed
                if not dry_run:
                    table = table.refresh()
            out.snapshots[identifier] = len(table.metadata.snapshots)
        return out
