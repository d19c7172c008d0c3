"""Dead letters: their rows, and how they join the dead-letter table exactly once.

The dead-letter table and the main table cannot commit together (Iceberg has no
multi-table transaction in pyiceberg or a SQL catalog), so the main commit decides for both,
as an outbox:

1. The committer checks the fence, then writes the interval's dead letters into a Parquet
   file in the dead-letter table's location. No table references it yet.
2. The main table's append names that file in its snapshot summary
   (`streamberg.dead-letter-file`), beside the offsets it covers.
3. Only then is the file appended to the dead-letter table, with a table property recording
   the newest main snapshot whose file it now holds (`streamberg.dlq-applied.<table>`). A
   crash between 2 and 3 is repaired by the next committer's open, which appends every file
   the main lineage names beyond that mark.

So a fenced instance, or one that crashed before its main commit, leaves no dead-letter row
(its file is deleted, or an orphan that maintenance removes), and a record re-read after a
crash is judged again from scratch: raising `max_record_bytes` and restarting lands it in the
table, never in both.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import BinaryType, IntegerType, LongType, NestedField, StringType, TimestamptzType

from streamberg.common.catalog import ensure_namespace, shared_catalog
from streamberg.common.config import CHANGELOG_TARGET_PROPERTY, StreambergConfig
from streamberg.common.errors import RegistryUnavailable, SideTableTaken, UnsupportedSchemaError
from streamberg.common.log import get_logger
from streamberg.common.metadata_files import BOUNDED_METADATA, bound_metadata
from streamberg.common.retry import commit_retrying, is_instance
from streamberg.decode.formats import format_of
from streamberg.decode.registry import value_subject
from streamberg.ingest.files import PartitionedFileWriter, WrittenFile
from streamberg.ingest.units import DeadLetter
from streamberg.table_meta.changelog import add_own_columns
from streamberg.table_meta.dead_letter_outbox import applied_key, pending_files
from streamberg.table_meta.declared import ensure_table
from streamberg.table_meta.summary_keys import SummaryKeys

# The dead-letter table: one row per record the ingest could not write, with its reason.
DEAD_LETTER_SCHEMA = Schema(
    NestedField(1, "topic", StringType(), required=True),
    NestedField(2, "partition", IntegerType(), required=True),
    NestedField(3, "offset", LongType(), required=True),
    NestedField(4, "kafka_timestamp", TimestamptzType(), required=False),
    NestedField(5, "key", BinaryType(), required=False),
    NestedField(6, "value", BinaryType(), required=False),
    NestedField(7, "reason", StringType(), required=True),
    NestedField(8, "job_id", StringType(), required=True),
    NestedField(9, "dead_lettered_at", TimestamptzType(), required=True),
)


def ensure_dead_letter_table(catalog: Catalog, identifier: str) -> Table:
    """The dead-letter table, made when absent; an existing table of another shape (another
    topic's data table that took the name) is refused, never written into."""
    from streamberg.common.config.fleet import ROUTE_TOPIC_PROPERTY

    ensure_namespace(catalog, identifier.rsplit(".", 1)[0])
    try:
        table = catalog.load_table(identifier)
        owner = table.properties.get(ROUTE_TOPIC_PROPERTY)
        missing = {f.name for f in DEAD_LETTER_SCHEMA.fields if f.required} - {f.name for f in table.schema().fields}
        if owner is not None or missing:
            raise SideTableTaken(f"dead-letter table {identifier} is not a dead-letter table ("
                                 + (f"it is topic {owner!r}'s data table" if owner is not None else
                                    f"it lacks {', '.join(sorted(missing))}")
                                 + "); rename or drop it, or set dead_letter.table")
        return table
    except NoSuchTableError:
        try:
            return catalog.create_table(identifier, schema=DEAD_LETTER_SCHEMA, properties=BOUNDED_METADATA)
        except TableAlreadyExistsError:
            return catalog.load_table(identifier)


def open_tables(config: StreambergConfig, made_with: Mapping[str, str] | None = None) -> tuple[Catalog, Table, Table]:
    """Catalog, main table and dead-letter table, created where absent (what an ingest opens);
    `made_with`: properties a main table made here starts with (common/catalog.ensure_table)."""
    catalog = shared_catalog(config.catalog)
    if CHANGELOG_TARGET_PROPERTY in config.table.properties:
        add_own_columns(catalog, config.table)
    fmt, _ = format_of(config)
    derive = (lambda: registry_schema(config)) if fmt.needs_registry else None
    # Tables made by an earlier release get the properties that bound their metadata.
    return (catalog, bound_metadata(ensure_table(catalog, config.table, derive, made_with)),
            bound_metadata(ensure_dead_letter_table(catalog, config.ingest_target.dead_letter_table)))


def registry_schema(config: StreambergConfig) -> Schema:
    """The table's schema from the registry: the latest writer schema of the topic's values."""
    fmt, registry = format_of(config)
    assert registry is not None  # only a registry format derives its table
    subject = value_subject(config.kafka.topic)
    kind = fmt.name.upper()  # the registry's schema type
    schema_id, registered = registry.latest_schema(subject, kind)
    get_logger("ingest", table=config.table.identifier).info(
        "table schema derived from the registry", subject=subject, schema_id=schema_id)
    try:
        return fmt.table_schema(registered, lambda subject, version: registry.version(subject, version, kind))
    except (UnsupportedSchemaError, RegistryUnavailable):
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the registry answered: a clear refusal, not a traceback
        raise UnsupportedSchemaError(f"schema id {schema_id} (the latest of subject {subject!r}) has no table form: "
                                     f"{type(exc).__name__}: {str(exc)[:200]}") from None


def dead_letter_rows(dead: Sequence[DeadLetter], topic: str, job_id: str) -> pa.Table:
    """The dead-letter table's rows for `dead`, all stamped now."""
    now = dt.datetime.now(dt.timezone.utc)
    return pa.Table.from_pylist([
        {"topic": topic, "partition": d.partition, "offset": d.offset,
         "kafka_timestamp": dt.datetime.fromtimestamp(d.timestamp_ms / 1000, dt.timezone.utc) if d.timestamp_ms else None,
         "key": d.key, "value": d.value, "reason": d.reason, "job_id": job_id, "dead_lettered_at": now}
        for d in dead
    ], schema=schema_to_pyarrow(DEAD_LETTER_SCHEMA))


def dead_letter_from_message(message: Any, reason: str) -> DeadLetter:
    """A DeadLetter from a confluent-kafka Message."""
    kind, ts = message.timestamp()
    return DeadLetter(partition=message.partition(), offset=message.offset(), timestamp_ms=ts if kind else None,
                      key=message.key(), value=message.value(), reason=reason)


def write_dead_letter_file(dlq: Table, rows: pa.Table, name_prefix: str) -> str:
    """Write `rows` as one Parquet data file in the dead-letter table's location; no table
    references it yet. Returns its path."""
    if not dlq.spec().is_unpartitioned():
        raise ValueError(f"dead-letter table {dlq.name()} is partitioned; streamberg writes it unpartitioned")
    writer = PartitionedFileWriter(io=dlq.io, location=dlq.location(), schema=dlq.schema(), spec=dlq.spec(),
                                   properties=dlq.properties, target_file_size=1 << 62,
                                   row_group_rows=max(1, rows.num_rows), name_prefix=f"{name_prefix}-{uuid.uuid4().hex[:8]}")
    writer.write(rows)
    (written,) = writer.flush()
    return written.path


def _file_at(dlq: Table, path: str) -> WrittenFile:
    """A dead-letter file described from its own footer (the committer that wrote it may be gone)."""
    schema = dlq.schema()
    with dlq.io.new_input(path).open() as stream:
        metadata = pq.read_metadata(stream)
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata, stats_columns=compute_statistics_plan(schema, dlq.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema))
    return WrittenFile(path=path, record_count=metadata.num_rows, size_bytes=len(dlq.io.new_input(path)),
                       spec_id=dlq.spec().spec_id, partition=(), stats=statistics.to_serialized_dict())


def apply_dead_letter_files(catalog: Catalog, main_identifier: str, dlq_identifier: str, retries: int,
                            run_id: str, log: Any) -> int:
    """Append to the dead-letter table every file the main lineage committed and it lacks;
    return the rows added. A lost race (another committer applying, a replay deleting) is
    re-read and retried; the property written with the files makes it idempotent."""
    for attempt in commit_retrying(retries, is_instance(CommitFailedException), log=log,
                                   event="dead-letter commit conflict, retrying"):
        with attempt:
            main, dlq = catalog.load_table(main_identifier), catalog.load_table(dlq_identifier)
            pending = pending_files(main, dlq, main_identifier)
            if not pending:
                return 0
            files = []
            for item in pending:
                if not dlq.io.new_input(item.path).exists():
                    # Never silent: the records stay counted in the main table's consumed total.
                    log.error("a committed dead-letter file is missing; its dead letters are lost",
                              path=item.path, snapshot=item.snapshot_id, dead_letters=item.records)
                    continue
                files.append(_file_at(dlq, item.path))
            tx = dlq.transaction()
            tx.set_properties({applied_key(main_identifier): str(pending[-1].order)})
            if files:
                with tx.update_snapshot(snapshot_properties={
                        SummaryKeys.RUN_ID: run_id, SummaryKeys.OPERATION: "dead-letters"}).merge_append() as append:
                    for f in files:
                        append.append_data_file(f.to_data_file())
            tx.commit_transaction()
            added = sum(f.record_count for f in files)
            log.info("dead letters added to the dead-letter table", rows=added, files=len(files),
                     main_snapshots=[p.snapshot_id for p in pending])
            return added
    raise AssertionError("unreachable: the last attempt returns or raises")
