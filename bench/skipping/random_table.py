"""The benchmark's Iceberg tables: the random baseline written as exactly N files.

The baseline is written with pyiceberg's own Parquet writer (``write_file``, the code path
behind ``Table.append``) but with one write task per file slot, so the table has exactly the
N files the generator cut, each a random sample of the rows; all N land in one commit.
Iceberg computes each file's column bounds from the Parquet footer, as it does for any write.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError
from pyiceberg.io.pyarrow import pyarrow_to_schema, write_file
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table, WriteTask

from streamberg.common.log import get_logger

# Properties every benchmark table gets, so that all layouts are measured under one regime.
TABLE_PROPERTIES: dict[str, str] = {
    # Spark must write the partitions the layout produced, not re-shuffle them by its own
    # distribution rules (the default for a table with a sort order is 'range').
    "write.distribution-mode": "none",
    # Files are cut by the layout's partition count, never by size.
    "write.target-file-size-bytes": str(1 << 40),
    # Iceberg's default metrics mode, stated so nobody wonders: string bounds are truncated to
    # 16 characters, which keeps every SSB city (10) and brand (9) exact.
    "write.metadata.metrics.default": "truncate(16)",
}

# How many files are written concurrently before the next group is read (bounds memory).
WRITE_GROUP = 16


@dataclass(frozen=True)
class WrittenTable:
    identifier: str
    files: int
    rows: int


def ensure_namespace(catalog: Catalog, namespace: str) -> None:
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass


def recreate_table(catalog: Catalog, identifier: str, schema: Schema | pa.Schema) -> Table:
    """Drop ``identifier`` if present (with its data files) and create it empty."""
    ensure_namespace(catalog, identifier.rsplit(".", 1)[0])
    try:
        old = catalog.load_table(identifier)
    except NoSuchTableError:
        old = None
    if old is not None:
        catalog.purge_table(identifier)
    return catalog.create_table(identifier, schema=schema, properties=TABLE_PROPERTIES)


def write_files(
    table: Table,
    files: Iterable[tuple[int, pa.Table]],
    progress: Callable[[int], None] | None = None,
    snapshot_properties: dict[str, str] | None = None,
) -> WrittenTable:
    """Write each Arrow table in ``files`` as one Parquet data file; commit them all at once."""
    log = get_logger("bench.random_table", table=".".join(table.name()[-2:]))
    metadata = table.metadata
    task_schema = None
    write_uuid = uuid.uuid4()
    written: list[DataFile] = []
    rows = 0

    def flush(group: list[tuple[int, pa.Table]]) -> None:
        nonlocal rows
        tasks = iter([
            WriteTask(write_uuid=write_uuid, task_id=slot, schema=task_schema, record_batches=rows_.to_batches())
            for slot, rows_ in group
        ])
        for data_file in write_file(io=table.io, table_metadata=metadata, tasks=tasks):
            written.append(data_file)
            rows += data_file.record_count
            if progress:
                progress(1)

    group: list[tuple[int, pa.Table]] = []
    for slot, rows_ in files:
        if task_schema is None:
            task_schema = pyarrow_to_schema(rows_.schema, name_mapping=metadata.schema().name_mapping)
        group.append((slot, rows_))
        if len(group) >= WRITE_GROUP:
            flush(group)
            group = []
    if group:
        flush(group)
    with table.transaction() as tx:
        with tx.update_snapshot(snapshot_properties=snapshot_properties or {}).fast_append() as append:
            for data_file in written:
                append.append_data_file(data_file)
    log.info("random layout committed", files=len(written), rows=rows)
    return WrittenTable(identifier=".".join(table.name()[-2:]), files=len(written), rows=rows)
