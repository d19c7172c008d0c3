"""The dead-letter outbox, as every component reads it: which dead-letter files a table's
lineage committed and the dead-letter table does not hold yet.

The ingest names each interval's dead-letter file in its own snapshot's summary
(`streamberg.dead-letter-file`) and appends it to the dead-letter table only after that commit
(ingest/dead_letters.py); the dead-letter table's property `streamberg.dlq-applied.<table>`
records the newest snapshot whose file it holds. Until a file is applied, the snapshot
naming it is its only record: maintenance must not expire it (maintenance/expire.py and the
change-log trim keep every snapshot from the oldest pending one on).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from streamberg.table_meta.offsets import ancestry, summary_properties
from streamberg.table_meta.summary_keys import SummaryKeys, TablePropertyKeys


def snapshot_order(table: Table, snapshot: Snapshot) -> int:
    # Sequence numbers grow along a v2 lineage; a v1 table has none, and its single
    # committer's timestamps grow too.
    return snapshot.sequence_number if table.format_version >= 2 and snapshot.sequence_number else snapshot.timestamp_ms


@dataclass(frozen=True)
class PendingFile:
    order: int  # of the main snapshot that named it
    snapshot_id: int
    path: str
    records: int


def applied_key(main_identifier: str) -> str:
    return f"{TablePropertyKeys.DLQ_APPLIED_PREFIX}{main_identifier}"


def pending_files(main: Table, dlq: Table | None, main_identifier: str) -> list[PendingFile]:
    """Dead-letter files the main lineage committed and the dead-letter table lacks, oldest
    first (every one the lineage names when there is no dead-letter table yet)."""
    applied = int(dlq.properties.get(applied_key(main_identifier), -1)) if dlq is not None else -1
    pending = []
    for snapshot in ancestry(main):
        order = snapshot_order(main, snapshot)
        if order <= applied:
            break
        props = summary_properties(snapshot)
        path = props.get(SummaryKeys.DEAD_LETTER_FILE)
        if path:
            pending.append(PendingFile(order, snapshot.snapshot_id, path, int(props.get(SummaryKeys.DEAD_LETTERS, 0))))
    return pending[::-1]


def outbox_chain(main: Table, dlq: Table | None, main_identifier: str) -> list[Snapshot]:
    """The current snapshot back to and including the oldest one naming a dead-letter file the
    dead-letter table lacks (empty when none is pending)."""
    pending = pending_files(main, dlq, main_identifier)
    if not pending:
        return []
    chain = []
    for snapshot in ancestry(main):
        chain.append(snapshot)
        if snapshot.snapshot_id == pending[0].snapshot_id:
            return chain
    return []
