"""Row layouts: the order in which rewritten rows are written, computed in Spark SQL.

Public API (the compactor's runner uses it; the data-skipping benchmark builds on it)::

    apply_layout(df, strategy, columns, *, num_files, bits=10, sample_rows=20000,
                 row_count=None, seed=0, keep_key=False) -> DataFrame

returns ``df`` with the same columns and rows, split into ``num_files`` Spark partitions
that each hold one contiguous range of the layout's order and are sorted within. Writing
the result with one file per partition (Iceberg does, given a large enough
``target-file-size-bytes``) gives ``num_files`` files whose min/max ranges overlap as little
as the layout allows. It works on any DataFrame (an Iceberg scan or ``spark.range(...)``).

Strategies, one ``Layout`` class each in the ``LAYOUTS`` registry (their names are the
config's ``compactor.strategy`` values, ``LAYOUT_STRATEGIES``):

- ``binpack``: no reordering; only ``coalesce(num_files)``.
- ``sort``: linear order by ``columns`` (range-partitioned on them, sorted within). Clusters
  the first column perfectly and the others barely.
- ``zorder``: boundary-based Z-order. A sample of ``sample_rows`` rows gives, per column, up
  to ``2**bits - 1`` boundaries (all distinct values when there are few, quantiles
  otherwise). Each value maps to its rank among the boundaries (a dense integer for any
  orderable type: strings, timestamps, decimals), ranks are stretched to ``bits`` bits so
  every column contributes evenly whatever its cardinality, and the bits are interleaved
  into one 63-bit key. Unlike Iceberg's byte-prefix z-value, strings with a long common
  prefix (URLs) still spread over the whole rank range.
- ``hilbert``: the same ranks mapped onto an n-dimensional Hilbert curve (Skilling's
  transpose algorithm), whose consecutive cells are always neighbours, so files overlap
  less than with Z-order.
- ``zorder-iceberg``: Iceberg's own z-value (``SparkZOrderUDF``, as used by
  ``rewrite_data_files(strategy => 'sort', sort_order => 'zorder(...)')``): interleaves
  the first bytes of an order-preserving byte encoding of each column.

Everything runs as JVM expressions (no Python UDF): the boundaries stay in a one-row
DataFrame broadcast to the executors, ranks are found by a branch-free binary search over
that array (one projection per bit), and the curve arithmetic is shifts and XORs.
The curves and their plain-Python references are in compactor/curves.py, the routing of
rows to files in compactor/routing.py; this module holds one class per layout (a template
method: ``Layout.apply`` checks, each class's ``_apply`` lays out; ``Hilbert`` overrides
only ``ZOrder``'s ``_curve`` hook; ``BinPack`` owns its read options). A ``Layout``
instance is the one value a compactor run carries: strategy, columns and knobs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from streamberg.common.config import LAYOUT_STRATEGIES, CompactorConfig
from streamberg.common.errors import ConfigError, LayoutError
from streamberg.common.schema import field_through_structs
from streamberg.compactor.curves import (
    TMP_PREFIX,
    boundaries_from_sample,
    check_columns,
    count_le,
    effective_bits,
    iceberg_zorder_column,
    sample_columns,
    with_hilbert_transpose,
    with_scaled_ranks,
    zorder_expression,
)
from streamberg.compactor.iceberg_scan import FILE_OPEN_COST, SPLIT_SIZE
from streamberg.compactor.routing import partition_routing_keys, split_points

if TYPE_CHECKING:  # pyspark is imported lazily: the planner and CLI --help do not need a JVM
    from pyiceberg.table import Table
    from pyspark.sql import Column, DataFrame


class Layout(ABC):
    """One row layout, configured for a run: how rewritten rows are ordered and cut into files.

    ``columns``: the clustering columns; ``bits`` and ``sample_rows``: the index layouts'
    knobs (the others ignore them). Per call: ``row_count`` (when known, e.g. from file
    metadata) saves a count to size the sample, ``seed`` varies the sample, and ``keep_key``
    keeps the ordering key as column ``__sb_key`` (zorder, hilbert, zorder-iceberg) for
    inspection; leave it off when writing the result to a table.
    """

    name: ClassVar[str]
    clusters: ClassVar[bool] = True  # orders by the clustering columns (binpack does not)

    def __init__(self, columns: Sequence[str] = (), *, bits: int = 10, sample_rows: int = 20000) -> None:
        self.columns = tuple(columns)
        self.bits = bits
        self.sample_rows = sample_rows

    @property
    def strategy(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}(columns={self.columns!r}, bits={self.bits}, sample_rows={self.sample_rows})"

    def apply(self, df: DataFrame, num_files: int, *, row_count: int | None = None, seed: int = 0,
              keep_key: bool = False) -> DataFrame:
        if num_files < 1:
            raise LayoutError(f"num_files must be >= 1, got {num_files}")
        if self.clusters:
            check_columns(df, self.columns)
        if not any("." in c for c in self.columns):
            return self._apply(df, num_files, row_count=row_count, seed=seed, keep_key=keep_key)
        # Nested fields (dotted paths through structs) are laid out as top-level copies made
        # for the layout and dropped after it: the curves work on plain columns.
        from pyspark.sql import functions as F

        copies = {f"{TMP_PREFIX}c{i}": F.col(path) for i, path in enumerate(self.columns)}
        flat = type(self)(tuple(copies), bits=self.bits, sample_rows=self.sample_rows)
        laid = flat._apply(df.withColumns(copies), num_files, row_count=row_count, seed=seed, keep_key=keep_key)
        return laid.drop(*copies)

    def read_options(self, size_bytes: int, num_files: int) -> dict[str, str]:
        """Options for Iceberg's read of one group of `size_bytes` becoming `num_files` files."""
        return {}

    @abstractmethod
    def _apply(self, df: DataFrame, num_files: int, *, row_count: int | None, seed: int,
               keep_key: bool) -> DataFrame: ...


class BinPack(Layout):
    """No reordering; only ``coalesce(num_files)``."""

    name = "binpack"
    clusters = False

    def read_options(self, size_bytes: int, num_files: int) -> dict[str, str]:
        # Iceberg's bin-pack: one read split per output file, so no shuffle is needed.
        return {SPLIT_SIZE: str(max(1, -(-size_bytes // num_files))), FILE_OPEN_COST: "0"}

    def _apply(self, df: DataFrame, num_files: int, *, row_count: int | None, seed: int,
               keep_key: bool) -> DataFrame:
        return df.coalesce(num_files) if df.rdd.getNumPartitions() > num_files else df


class LinearSort(Layout):
    """Linear order by the columns: range-partitioned on them, sorted within."""

    name = "sort"

    def _apply(self, df: DataFrame, num_files: int, *, row_count: int | None, seed: int,
               keep_key: bool) -> DataFrame:
        from pyspark.sql import functions as F

        order = [F.col(c).asc_nulls_first() for c in self.columns]
        return df.repartitionByRange(num_files, *order).sortWithinPartitions(*order)


class IcebergZOrder(Layout):
    """Iceberg's own z-value; as Iceberg's action does: range-partition on it, sort within."""

    name = "zorder-iceberg"

    def _apply(self, df: DataFrame, num_files: int, *, row_count: int | None, seed: int,
               keep_key: bool) -> DataFrame:
        from pyspark.sql import functions as F

        key = f"{TMP_PREFIX}key"
        keyed = df.withColumn(key, iceberg_zorder_column(df, self.columns))
        laid = keyed.repartitionByRange(num_files, F.col(key)).sortWithinPartitions(F.col(key))
        return laid if keep_key else laid.drop(key)


class ZOrder(Layout):
    """Boundary-based Z-order over rank-scaled columns, routed by sampled key cut points.

    A template for the index layouts: key every row, route it to the file owning its key
    range, sort within. Subclasses change only how the ranks become the key (`_curve`).
    """

    name = "zorder"

    def _curve(self, ranked: DataFrame, rank_columns: list[str], bits: int) -> DataFrame:
        """The rank columns as the coordinates whose bits are interleaved (Z-order: as they are)."""
        return ranked

    def _with_key(self, df: DataFrame, columns: Sequence[str], bounds: Sequence[Column], bits: int,
                  key: str) -> DataFrame:
        from pyspark.sql import functions as F

        names = [f"{TMP_PREFIX}r{i}" for i in range(len(columns))]
        ranked = self._curve(with_scaled_ranks(df, columns, bounds, bits), names, bits)
        return ranked.withColumn(key, zorder_expression([F.col(c) for c in names], bits)).drop(*names)

    def _apply(self, df: DataFrame, num_files: int, *, row_count: int | None, seed: int,
               keep_key: bool) -> DataFrame:
        """Jobs: one pruned read of the clustered columns for the sample, small jobs on the
        sample (boundaries; sample keys -> file cut points), then the rewrite itself reads the
        input once."""
        from pyspark.sql import functions as F

        columns = self.columns
        bits = effective_bits(len(columns), self.bits)
        key, part = f"{TMP_PREFIX}key", f"{TMP_PREFIX}part"
        # One output file needs only the boundaries; more files also need the sample's keys.
        sample = sample_columns(df, columns, sample_rows=self.sample_rows, row_count=row_count,
                                seed=seed, materialize=num_files > 1)
        bounds = boundaries_from_sample(sample, columns, bits)
        keyed = self._with_key(df, columns, bounds, bits, key)
        drop = [] if keep_key else [key]
        if num_files == 1:
            return keyed.repartition(1).sortWithinPartitions(key).drop(*drop)
        sample_keys = sorted(r[0] for r in self._with_key(sample, columns, bounds, bits, key).select(key).collect())
        cuts = split_points(sample_keys, num_files)
        cut_array = F.array(*[F.lit(c).cast("long") for c in cuts]) if cuts else F.array().cast("array<long>")
        depth = max(1, len(cuts).bit_length())
        routed = count_le(keyed, {part: (key, cut_array)}, depth)
        routes = F.array(*[F.lit(v).cast("long") for v in partition_routing_keys(num_files)])
        routed = routed.withColumn(part, F.element_at(routes, F.col(part) + 1))
        return routed.repartition(num_files, F.col(part)).sortWithinPartitions(key).drop(*drop, part)


class Hilbert(ZOrder):
    """The same ranks on an n-dimensional Hilbert curve (Skilling's transpose), whose
    consecutive cells are always neighbours, so files overlap less than with Z-order."""

    name = "hilbert"

    def _curve(self, ranked: DataFrame, rank_columns: list[str], bits: int) -> DataFrame:
        return with_hilbert_transpose(ranked, rank_columns, bits) if len(rank_columns) > 1 else ranked


LAYOUTS: dict[str, type[Layout]] = {layout.name: layout for layout in (ZOrder, Hilbert, IcebergZOrder, LinearSort, BinPack)}
CLUSTERING_STRATEGIES = tuple(name for name, layout in LAYOUTS.items() if layout.clusters)


def layout_for(strategy: str, columns: Sequence[str] = (), *, bits: int = 10, sample_rows: int = 20000) -> Layout:
    try:
        cls = LAYOUTS[strategy]
    except KeyError:
        raise LayoutError(f"unknown strategy {strategy!r}; use one of {', '.join(LAYOUT_STRATEGIES)}") from None
    return cls(columns, bits=bits, sample_rows=sample_rows)


def resolve_layout(settings: CompactorConfig, strategy: str | None, columns: list[str] | None,
                   table: Table | None = None, identifier: str = "") -> Layout:
    """The layout a compactor run uses: strategy and columns from CLI overrides or the
    settings, checked against the table (named `identifier` in the error)."""
    chosen_columns = tuple(columns if columns is not None else settings.columns)
    chosen = strategy or settings.strategy
    if chosen not in LAYOUTS:
        raise ConfigError(f"compactor.strategy: unknown strategy {chosen!r}; use one of {', '.join(LAYOUT_STRATEGIES)}")
    if LAYOUTS[chosen].clusters and not chosen_columns:
        chosen = BinPack.name  # documented: without columns every strategy bin-packs
    if table is not None:
        names = [f.name for f in table.schema().fields]
        missing = [c for c in chosen_columns if field_through_structs(table.schema(), c)[0] is None]
        if missing:
            raise ConfigError(f"compactor.columns: {missing} not in table {identifier} "
                              f"(columns: {', '.join(names)})")
        for c in chosen_columns:
            if problem := clusterable(table, c):
                raise ConfigError(f"compactor.columns: {c!r} in table {identifier}: {problem}")
    return layout_for(chosen, chosen_columns, bits=settings.index_bits, sample_rows=settings.sample_rows)


def clusterable(table: Table, path: str) -> str | None:
    """Why the field cannot be a clustering column, or None."""
    found, _ = field_through_structs(table.schema(), path)
    if found is None:
        return "not a field reached through structs"
    if not found.field_type.is_primitive:
        return f"it is {found.field_type}; only orderable scalars can be clustered"
    return None


def apply_layout(df: DataFrame, strategy: str, columns: Sequence[str], *, num_files: int, bits: int = 10,
                 sample_rows: int = 20000, row_count: int | None = None, seed: int = 0,
                 keep_key: bool = False) -> DataFrame:
    """``df`` laid out by ``strategy`` on ``columns`` into ``num_files`` partitions (see module doc)."""
    layout = layout_for(strategy, columns, bits=bits, sample_rows=sample_rows)
    return layout.apply(df, num_files, row_count=row_count, seed=seed, keep_key=keep_key)
