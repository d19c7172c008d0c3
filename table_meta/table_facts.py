"""Facts about an ingest table, read from the catalog (what `streamberg table` prints).

Read-only: the catalog is opened without creating anything, so a mistyped path or database
fails with a message instead of leaving a new, empty catalog and warehouse behind.
"""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table import Table

from streamberg.common.catalog import open_catalog_readonly
from streamberg.common.config import StreambergConfig
from streamberg.table_meta.changelog import ingest_config
from streamberg.table_meta.offsets import committed_position, summary_properties
from streamberg.table_meta.summary_keys import SummaryKeys, TablePropertyKeys
from streamberg.table_meta.table_files import snapshot_entries


def summary_total(table: Table, key: str) -> int:
    """A running total of the table's current snapshot summary (0 before its first commit)."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return 0
    return int(summary_properties(snapshot).get(key, 0))


def dead_letter_records(catalog: Catalog, identifier: str) -> int | None:
    """Records in the dead-letter table (its summary's running total); None when it does not exist."""
    try:
        return summary_total(catalog.load_table(identifier), "total-records")
    except NoSuchTableError:
        return None


# The dead letters a table's page lists (the newest first) and how far back it looks for them.
RECENT_DEAD_LETTERS = 5
RECENT_SNAPSHOTS_READ = 3
_DEAD_LETTER_COLUMNS = ("topic", "partition", "offset", "reason", "dead_lettered_at")


def recent_dead_letters(table: Table, limit: int = RECENT_DEAD_LETTERS) -> list[dict[str, Any]]:
    """The newest dead letters of a dead-letter table, with their reasons: read from the files its
    last few commits added (never the whole table: it grows for as long as the ingest runs)."""
    rows: list[dict[str, Any]] = []
    snapshot = table.current_snapshot()
    for _ in range(RECENT_SNAPSHOTS_READ):
        if snapshot is None or len(rows) >= limit:
            break
        for _, data_file in snapshot_entries(table.io, snapshot, ManifestEntryStatus.ADDED):
            with table.io.new_input(data_file.file_path).open() as stream:
                read = pq.read_table(stream, columns=list(_DEAD_LETTER_COLUMNS))
            rows.extend(read.to_pylist())
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    rows.sort(key=lambda r: (r["dead_lettered_at"], r["partition"], r["offset"]), reverse=True)
    return [{"topic": r["topic"], "partition": r["partition"], "offset": r["offset"], "reason": r["reason"],
             "at": r["dead_lettered_at"].isoformat(timespec="seconds") if r["dead_lettered_at"] else None}
            for r in rows[:limit]]


def table_facts(config: StreambergConfig) -> dict[str, Any]:
    """The table's facts; {"exists": False} when the catalog has no such table.

    Raises CatalogUnreachable when the catalog database is missing or does not answer. A
    primary-key table's ingest facts are its change log's (docs/cdc.md).
    """
    config = ingest_config(config)
    catalog = open_catalog_readonly(config.catalog)
    try:
        table = catalog.load_table(config.table.identifier)
    except NoSuchTableError:
        return {"table": config.table.identifier, "exists": False}
    position = committed_position(table, config.kafka.topic)
    dlq_records = dead_letter_records(catalog, config.ingest_target.dead_letter_table) or 0
    current = table.current_snapshot()
    records = summary_total(table, "total-records")
    consumed = position.consumed_total  # counted by the writers, recorded by each commit
    # A primary-key table's change log (table_meta/changelog.py): tombstones the ingest skipped,
    # and rows maintenance trimmed once merged, are neither rows nor dead letters.
    recorded = table.snapshot_by_id(position.snapshot_id) if position.snapshot_id is not None else None
    skipped = int(summary_properties(recorded).get(SummaryKeys.SKIPPED_TOMBSTONES_TOTAL, 0)) if recorded else 0
    trimmed = int(table.properties.get(TablePropertyKeys.CHANGELOG_TRIMMED_RECORDS, 0))
    accounted = records + trimmed + dlq_records + skipped
    return {
        "table": config.table.identifier,
        "exists": True,
        "location": table.location(),
        "current_snapshot_id": current.snapshot_id if current else None,
        "snapshots": len(table.metadata.snapshots),
        "data_files": summary_total(table, "total-data-files"),
        "records": records,
        "total_size_bytes": summary_total(table, "total-files-size"),
        "committed_offsets": {
            "topic": config.kafka.topic,
            "partitions": {str(p): o for p, o in sorted(position.offsets.items())},
            "snapshot_id": position.snapshot_id,
            "job_id": position.job_id,
            "committed_at_ms": position.timestamp_ms,
        },
        "dead_letter_table": config.ingest_target.dead_letter_table,
        "dead_letters": dlq_records,
        "consumed": consumed,
        # Offsets Kafka no longer had when the ingest came to them (on_lost_offsets:
        # skip-and-record), and every such jump: the table then holds less than the topic did.
        "lost_offsets": position.lost_total,
        "offset_skips": [{"partition": s.partition, "from": s.from_offset, "to": s.to_offset, "kind": s.kind,
                          "lost": s.lost, "at_ms": s.at_ms} for s in position.skips],
        "skipped_tombstones": skipped,
        "trimmed_records": trimmed,
        "counts_match": accounted == consumed,
        "reconciles": accounted == consumed and not position.skips,
    }
