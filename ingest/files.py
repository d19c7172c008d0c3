"""Parquet data files for one writer: one open file per table partition, rolled by size.

Rows are buffered per partition and written as whole row groups (a poll batch is far
smaller than a good row group). A file is closed when it reaches the target size or when
the writer flushes at the end of a commit interval; each closed file is described by a
`WrittenFile`, everything the committer needs to add it to the table without reading it.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    _get_parquet_writer_kwargs,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    TruncateTransform,
    VoidTransform,
    YearTransform,
)
from pyiceberg.typedef import Record
from pyiceberg.types import DateType, TimestampType, TimestamptzType, TimeType

# Which pyiceberg-core kernel computes each transform over an Arrow array.
_CORE_KERNELS = {
    YearTransform: "year", MonthTransform: "month", DayTransform: "day", HourTransform: "hour",
}


@dataclass(frozen=True)
class WrittenFile:
    """A closed Parquet data file, described for the committer (picklable, engine-neutral)."""

    path: str
    record_count: int
    size_bytes: int
    spec_id: int
    partition: tuple  # partition values in Iceberg's internal representation
    stats: dict[str, Any]  # column sizes, value/null counts, lower/upper bounds (serialized)

    def to_data_file(self) -> DataFile:
        return DataFile(
            content=DataFileContent.DATA,
            file_path=self.path,
            file_format=FileFormat.PARQUET,
            partition=Record(*self.partition),
            file_size_in_bytes=self.size_bytes,
            sort_order_id=None,
            spec_id=self.spec_id,
            equality_ids=None,
            key_metadata=None,
            **self.stats,
        )


def _transform_column(transform: Any, source_type: Any, column: pa.Array) -> pa.Array:
    """Apply an Iceberg partition transform to a column, vectorised."""
    from pyiceberg_core import transform as core

    if isinstance(transform, IdentityTransform):
        if isinstance(source_type, (TimestampType, TimestamptzType, TimeType)):
            return column.cast(pa.int64())  # micros, as Iceberg stores them
        if isinstance(source_type, DateType):
            return column.cast(pa.int32())  # days
        return column
    if isinstance(transform, BucketTransform):
        return core.bucket(column, transform.num_buckets)
    if isinstance(transform, TruncateTransform):
        return core.truncate(column, transform.width)
    if isinstance(transform, VoidTransform):
        return pa.nulls(len(column))
    kernel = _CORE_KERNELS.get(type(transform))
    if kernel is None:
        raise ValueError(f"unsupported partition transform {transform}")
    result = getattr(core, kernel)(column)
    return result.cast(pa.int32()) if pa.types.is_date(result.type) else result


def source_column(table: pa.Table, schema: Schema, field_id: int) -> pa.Array:
    """A partition source's values: a column, or a field inside structs (null where a struct
    on its path is null)."""
    name = schema.find_column_name(field_id)
    if name is None:
        raise ValueError(f"partition source {field_id} is not a field of the schema")
    parts = name.split(".")
    column = table.column(parts[0]).combine_chunks()
    for part in parts[1:]:
        column = pc.struct_field(column, [column.type.get_field_index(part)])
    return column


def split_by_partition(table: pa.Table, spec: PartitionSpec, schema: Schema) -> list[tuple[tuple, pa.Table]]:
    """Group rows by their partition values; one (values, rows) pair per partition present."""
    if spec.is_unpartitioned() or table.num_rows == 0:
        return [((), table)] if table.num_rows else []
    keys = []
    for field in spec.fields:
        source = schema.find_field(field.source_id)
        keys.append(_transform_column(field.transform, source.field_type, source_column(table, schema, field.source_id)))
    # Dense codes per key column, combined into one integer code per row; rows are then
    # sorted by code and cut at code changes: O(n log n), no per-row Python.
    combined = np.zeros(table.num_rows, dtype=np.int64)
    uniques = []
    for key in keys:
        encoded = pc.dictionary_encode(key, null_encoding="encode")
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        uniques.append(encoded.dictionary)
        combined = combined * len(encoded.dictionary) + codes
    order = np.argsort(combined, kind="stable")
    sorted_codes = combined[order]
    cuts = np.flatnonzero(np.diff(sorted_codes)) + 1
    groups = []
    for rows in np.split(order, cuts):
        first = int(rows[0])
        values = tuple(key[first].as_py() for key in keys)
        groups.append((values, table.take(pa.array(rows))))
    return groups


class _OpenFile:
    def __init__(self, io: FileIO, path: str, arrow_schema: pa.Schema, writer_kwargs: dict[str, Any]):
        self.path = path
        self._output = io.new_output(path).create(overwrite=True)
        self._writer = pq.ParquetWriter(self._output, schema=arrow_schema, **writer_kwargs)
        self.rows = 0
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.pending_bytes = 0
        self.last_write = 0  # monotonic ns of this file's last write (least recent first)

    def bytes_written(self) -> int:
        return self._output.tell()

    def write_row_group(self) -> None:
        if self.pending_rows:
            self._writer.write_table(pa.concat_tables(self.pending), row_group_size=self.pending_rows)
            self.rows += self.pending_rows
            self.pending, self.pending_rows, self.pending_bytes = [], 0, 0

    def close(self) -> pq.FileMetaData:
        self.write_row_group()
        self._writer.close()
        metadata = self._writer.writer.metadata
        self._output.close()
        return metadata


class PartitionedFileWriter:
    """Writes a stream of Arrow tables into Parquet data files of one Iceberg table."""

    def __init__(self, io: FileIO, location: str, schema: Schema, spec: PartitionSpec, properties: dict[str, str],
                 target_file_size: int, row_group_rows: int, name_prefix: str):
        self.io, self.location, self.schema, self.spec = io, location.rstrip("/"), schema, spec
        self.target_file_size, self.row_group_rows, self.name_prefix = target_file_size, row_group_rows, name_prefix
        self._writer_kwargs = _get_parquet_writer_kwargs(properties)
        self._stats_plan = compute_statistics_plan(schema, properties)
        self._column_mapping = parquet_path_to_id_mapping(schema)
        self._open: dict[tuple, _OpenFile] = {}
        self._finished: list[WrittenFile] = []
        self._seq = 0

    def _path_for(self, partition: tuple) -> str:
        self._seq += 1
        name = f"{self.name_prefix}-{self._seq:05d}-{uuid.uuid4().hex[:12]}.parquet"
        if self.spec.is_unpartitioned():
            return f"{self.location}/data/{name}"
        return f"{self.location}/data/{self.spec.partition_to_path(Record(*partition), self.schema)}/{name}"

    def write(self, table: pa.Table) -> None:
        for partition, rows in split_by_partition(table, self.spec, self.schema):
            current = self._open.get(partition)
            if current is None:
                current = self._open[partition] = _OpenFile(self.io, self._path_for(partition), table.schema, self._writer_kwargs)
            current.pending.append(rows)
            current.pending_rows += rows.num_rows
            current.pending_bytes += rows.nbytes
            current.last_write = time.monotonic_ns()  # comparable across the writers of many tables
            if current.pending_rows >= self.row_group_rows:
                current.write_row_group()
                if current.bytes_written() >= self.target_file_size:
                    self._close(partition)

    def _close(self, partition: tuple) -> None:
        current = self._open.pop(partition)
        metadata = current.close()
        if current.rows == 0:
            self.io.delete(current.path)
            return
        statistics = data_file_statistics_from_parquet_metadata(
            parquet_metadata=metadata, stats_columns=self._stats_plan, parquet_column_mapping=self._column_mapping,
        )
        self._finished.append(WrittenFile(
            path=current.path, record_count=current.rows, size_bytes=len(self.io.new_input(current.path)),
            spec_id=self.spec.spec_id, partition=partition, stats=statistics.to_serialized_dict(),
        ))

    # -- bounds (a writer keeps its open files and buffers bounded over its lanes, ingest/writer.py) --
    @property
    def open_files(self) -> int:
        return len(self._open)

    @property
    def buffered_bytes(self) -> int:
        return sum(f.pending_bytes for f in self._open.values())

    def oldest_write(self) -> int | None:
        """When the least recently written open file was written (None: none open)."""
        return min((f.last_write for f in self._open.values()), default=None)

    def close_oldest(self) -> None:
        """Close the least recently written open file (a smaller file; the compactor merges it)."""
        partition = min(self._open, key=lambda p: self._open[p].last_write)
        self._close(partition)

    def flush(self) -> list[WrittenFile]:
        """Close every open file; return all files finished since the last flush."""
        for partition in list(self._open):
            self._close(partition)
        finished, self._finished = self._finished, []
        return finished

    def abort(self) -> None:
        """Close open files without reporting them (they become orphans, never committed)."""
        for current in self._open.values():
            try:
                current.close()
            except Exception:  # noqa: BLE001 - best effort on shutdown
                pass
        self._open.clear()
