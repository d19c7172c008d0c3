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
``zorder_reference`` and ``hilbert_reference`` are plain-Python versions of the same index
functions, used by the tests to check the Spark expressions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from streamberg.common.config import LAYOUT_STRATEGIES
from streamberg.common.errors import LayoutError

if TYPE_CHECKING:  # pyspark is imported lazily: the planner and CLI --help do not need a JVM
    from pyspark.sql import Column, DataFrame

# The interleaved key is a signed 64-bit long: 63 usable bits shared by all columns.
KEY_BITS = 63
# Prefix of the helper columns added and dropped here (kept out of users' namespaces).
_TMP = "__sb_"




def effective_bits(num_columns: int, bits: int) -> int:
    """Bits per column that fit in the 63-bit key: ``min(bits, 63 // num_columns)``."""
    if num_columns < 1:
        raise LayoutError("an index needs at least one column")
    return max(1, min(bits, KEY_BITS // num_columns))


# --------------------------------------------------------------------------- reference

def zorder_reference(ranks: Sequence[int], bits: int) -> int:
    """Z-order index of scaled ranks (each < 2**bits): bit b of column i lands at b*n + (n-1-i)."""
    n = len(ranks)
    key = 0
    for b in range(bits):
        for i, r in enumerate(ranks):
            key |= ((r >> b) & 1) << (b * n + (n - 1 - i))
    return key


def hilbert_transpose_reference(ranks: Sequence[int], bits: int) -> list[int]:
    """Skilling's AxesToTranspose (AIP Conf. Proc. 707, 2004): coordinates -> transposed index."""
    x = list(ranks)
    n = len(x)
    m = 1 << (bits - 1)
    q = m
    while q > 1:  # inverse undo
        p = q - 1
        for i in range(n):
            if x[i] & q:
                x[0] ^= p
            else:
                t = (x[0] ^ x[i]) & p
                x[0] ^= t
                x[i] ^= t
        q >>= 1
    for i in range(1, n):  # Gray encode
        x[i] ^= x[i - 1]
    t = 0
    q = m
    while q > 1:
        if x[n - 1] & q:
            t ^= q - 1
        q >>= 1
    return [v ^ t for v in x]


def hilbert_reference(ranks: Sequence[int], bits: int) -> int:
    """Hilbert index of scaled ranks: the transposed form read out most significant bit first."""
    return zorder_reference(hilbert_transpose_reference(ranks, bits), bits)


# --------------------------------------------------------------------------- Spark side

def _check_columns(df: DataFrame, columns: Sequence[str]) -> None:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if not columns:
        raise LayoutError("this strategy needs at least one column")
    fields = {f.name: f for f in df.schema.fields}
    for name in columns:
        if name not in fields:
            raise LayoutError(f"column {name!r} is not in the data (columns: {', '.join(fields)})")
        if isinstance(fields[name].dataType, (ArrayType, MapType, StructType)):
            raise LayoutError(f"column {name!r} is {fields[name].dataType.simpleString()}: only orderable scalars can be clustered")


def sample_columns(df: DataFrame, columns: Sequence[str], *, sample_rows: int, row_count: int | None = None,
                   seed: int = 0, materialize: bool = True) -> DataFrame:
    """About `sample_rows` rows of `columns` (a read of those columns only).

    `materialize` keeps the sample (local checkpoint) for callers that use it more than once.
    """
    total = row_count if row_count is not None else df.count()
    sample = df.select(*columns)
    if total > sample_rows:
        sample = sample.sample(withReplacement=False, fraction=sample_rows / total, seed=seed)
    return sample.localCheckpoint(eager=True) if materialize else sample


def boundaries_from_sample(sample: DataFrame, columns: Sequence[str], bits: int) -> list[Column]:
    """Per column, a literal sorted array of at most 2**bits - 1 rank boundaries.

    Few distinct values in the sample: all of them (exact dense ranks). Many: evenly spaced
    quantiles of the sample, de-duplicated. The sample is sorted and picked in Spark; the
    chosen values go from the JVM result row straight into typed literals (never through
    Python objects, so timestamps and decimals keep their exact values).
    """
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    max_bounds = (1 << bits) - 1
    sorted_values = sample.agg(*[
        F.sort_array(F.collect_list(F.col(c))).alias(f"{_TMP}s{i}") for i, c in enumerate(columns)
    ])
    picks = []
    for i in range(len(columns)):
        arr = F.col(f"{_TMP}s{i}")
        distinct = F.array_distinct(arr)
        n = F.size(arr)
        # the j-th of max_bounds evenly spaced quantiles of the sorted sample (1-based position)
        quantiles = F.array_distinct(F.transform(
            F.sequence(F.lit(1), F.lit(max_bounds)),
            # F.transform calls the lambda now, inside this iteration, so it sees this
            # iteration's arr and n (it counts the lambda's parameters: they cannot be defaults).
            lambda j: F.element_at(arr, (F.floor(j * n / (max_bounds + 1)) + 1).cast("int")),  # noqa: B023 - called now
        ))
        chosen = F.when(F.size(distinct) <= max_bounds, distinct).otherwise(quantiles)
        picks.append(chosen.alias(f"{_TMP}b{i}"))
    result = sorted_values.select(*picks)
    jvm = sample.sparkSession._jvm
    row = result._jdf.collect()[0]
    schema = result._jdf.schema()
    literal = jvm.org.apache.spark.sql.catalyst.expressions.Literal
    return [
        Column(jvm.org.apache.spark.sql.Column(literal.create(row.get(i), schema.apply(i).dataType())))
        for i in range(len(columns))
    ]


def rank_boundaries(df: DataFrame, columns: Sequence[str], *, bits: int, sample_rows: int,
                    row_count: int | None = None, seed: int = 0) -> list[Column]:
    """Sample `df` and return the per-column boundary literals (see boundaries_from_sample)."""
    sample = sample_columns(df, columns, sample_rows=sample_rows, row_count=row_count, seed=seed, materialize=False)
    return boundaries_from_sample(sample, columns, bits)


def _count_le(df: DataFrame, targets: dict[str, tuple[str, Column]], depth: int) -> DataFrame:
    """For each out column: how many elements of a sorted literal array are <= the value.

    A branch-free binary search of fixed depth (arrays up to 2**depth - 1 long), one
    projection per step for all columns at once, so no expression is ever duplicated.
    Nulls compare as unknown and count 0.
    """
    from pyspark.sql import functions as F

    df = df.withColumns({out: F.lit(0).cast("int") for out in targets})
    for step in (1 << k for k in reversed(range(depth))):
        updates = {}
        for out, (value, array) in targets.items():
            pos = F.col(out)
            cand = pos + F.lit(step)
            updates[out] = F.when(
                cand <= F.size(array), F.when(F.element_at(array, cand) <= F.col(value), cand).otherwise(pos)
            ).otherwise(pos)
        df = df.withColumns(updates)
    return df


def with_scaled_ranks(df: DataFrame, columns: Sequence[str], bounds: Sequence[Column], bits: int) -> DataFrame:
    """Add ``__sb_r<i>``: each column's rank among its boundaries, stretched to ``bits`` bits.

    rank(v) = number of boundaries <= v (nulls and values below the first boundary: 0).
    Scaled rank = rank * 2**bits // (len(boundaries) + 1), in [0, 2**bits).
    """
    from pyspark.sql import functions as F

    n = len(columns)
    ranked = _count_le(df, {f"{_TMP}r{i}": (c, bounds[i]) for i, c in enumerate(columns)}, bits)
    return ranked.withColumns({
        f"{_TMP}r{i}": F.floor(F.col(f"{_TMP}r{i}") * F.lit(float(1 << bits)) / (F.size(bounds[i]) + 1)).cast("long")
        for i in range(n)
    })


def zorder_expression(ranks: Sequence[Column], bits: int) -> Column:
    """Interleave the bits of ``ranks`` (longs < 2**bits); the first column is most significant."""
    from pyspark.sql import functions as F

    n = len(ranks)
    key = F.lit(0).cast("long")
    for b in range(bits):
        for i, r in enumerate(ranks):
            bit = F.shiftright(r, b).bitwiseAND(F.lit(1).cast("long"))
            key = key.bitwiseOR(F.shiftleft(bit, b * n + (n - 1 - i)))
    return key


def with_hilbert_transpose(df: DataFrame, names: Sequence[str], bits: int) -> DataFrame:
    """Rewrite the columns ``names`` (scaled ranks) in place into Skilling's transposed Hilbert form.

    One projection per bit level: within a level the n sequential updates are inlined (x0's
    expression doubles per column, so n columns cost 2**n nodes; Spark's subexpression
    elimination evaluates the shared parts once). Fewer projections keep the plan cheap to
    analyse, which matters because every group builds its own plan.
    """
    from pyspark.sql import functions as F

    n = len(names)
    zero = F.lit(0).cast("long")
    q = 1 << (bits - 1)
    while q > 1:
        p = F.lit(q - 1).cast("long")
        x0 = F.col(names[0])
        updates: dict[str, Column] = {}
        for i in range(n):
            xi = F.col(names[i]) if i > 0 else x0
            has_q = xi.bitwiseAND(F.lit(q)) != 0
            if i == 0:
                x0 = F.when(has_q, x0.bitwiseXOR(p)).otherwise(x0)
                continue
            t = F.when(has_q, zero).otherwise(x0.bitwiseXOR(xi).bitwiseAND(p))
            updates[names[i]] = xi.bitwiseXOR(t)
            x0 = x0.bitwiseXOR(F.when(has_q, p).otherwise(t))
        updates[names[0]] = x0
        df = df.withColumns(updates)
        q >>= 1
    gray = {names[0]: F.col(names[0])}
    for i in range(1, n):  # Gray encode: x[i] ^= x[i-1] in order, i.e. prefix XORs
        gray[names[i]] = gray[names[i - 1]].bitwiseXOR(F.col(names[i]))
    df = df.withColumns(gray)
    t = zero
    q = 1 << (bits - 1)
    while q > 1:
        t = t.bitwiseXOR(F.when(F.col(names[n - 1]).bitwiseAND(F.lit(q)) != 0, F.lit(q - 1).cast("long")).otherwise(zero))
        q >>= 1
    df = df.withColumn(f"{_TMP}t", t)
    return df.withColumns({c: F.col(c).bitwiseXOR(F.col(f"{_TMP}t")) for c in names}).drop(f"{_TMP}t")


def _with_key(df: DataFrame, strategy: str, columns: Sequence[str], bounds: Sequence[Column], bits: int,
              key: str) -> DataFrame:
    from pyspark.sql import functions as F

    ranked = with_scaled_ranks(df, columns, bounds, bits)
    names = [f"{_TMP}r{i}" for i in range(len(columns))]
    if strategy == "hilbert" and len(columns) > 1:
        ranked = with_hilbert_transpose(ranked, names, bits)
    return ranked.withColumn(key, zorder_expression([F.col(c) for c in names], bits)).drop(*names)


def with_index(df: DataFrame, strategy: str, columns: Sequence[str], *, bits: int = 10, sample_rows: int = 20000,
               row_count: int | None = None, seed: int = 0, key: str = f"{_TMP}key") -> DataFrame:
    """``df`` plus a column ``key`` holding the ``zorder`` or ``hilbert`` index of ``columns``."""
    if strategy not in ("zorder", "hilbert"):
        raise LayoutError(f"with_index computes zorder or hilbert keys, not {strategy!r}")
    _check_columns(df, columns)
    bits = effective_bits(len(columns), bits)
    bounds = rank_boundaries(df, columns, bits=bits, sample_rows=sample_rows, row_count=row_count, seed=seed)
    return _with_key(df, strategy, columns, bounds, bits, key)


_M32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix_k1(k1: int) -> int:
    return (_rotl32((k1 * 0xCC9E2D51) & _M32, 15) * 0x1B873593) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotl32(h1 ^ k1, 13) * 5 + 0xE6546B64) & _M32


def spark_hash_long(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of a LongType value (Murmur3_x86_32.hashLong), as a signed int."""
    v = value & 0xFFFFFFFFFFFFFFFF
    h1 = _mix_h1(seed & _M32, _mix_k1(v & _M32))
    h1 = _mix_h1(h1, _mix_k1(v >> 32))
    h1 ^= 8
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def partition_routing_keys(num_partitions: int) -> list[int]:
    """For each partition p, a long v with ``pmod(hash(v), n) == p``.

    ``repartition(n, col)`` sends a row to ``pmod(hash(col), n)``; a column holding
    ``keys[p]`` therefore puts the row exactly in partition p. This routes rows to the
    partitions chosen from the sampled key quantiles without Spark's range partitioner,
    which would read the whole input once more just to sample it.
    """
    keys: dict[int, int] = {}
    candidate = 0
    while len(keys) < num_partitions:
        keys.setdefault(spark_hash_long(candidate) % num_partitions, candidate)
        candidate += 1
    return [keys[p] for p in range(num_partitions)]


def split_points(sorted_keys: Sequence[int], num_files: int) -> list[int]:
    """Up to num_files - 1 ascending cut points splitting the sampled keys into equal parts."""
    if not sorted_keys or num_files <= 1:
        return []
    cuts = [sorted_keys[(i * len(sorted_keys)) // num_files] for i in range(1, num_files)]
    return sorted(set(cuts))


def _index_layout(df: DataFrame, strategy: str, columns: Sequence[str], *, num_files: int, bits: int,
                  sample_rows: int, row_count: int | None, seed: int, keep_key: bool = False) -> DataFrame:
    """zorder/hilbert: key every row, route it to the file owning its key range, sort within.

    Jobs: one pruned read of the clustered columns for the sample, small jobs on the sample
    (boundaries; sample keys -> file cut points), then the rewrite itself reads the input once.
    """
    from pyspark.sql import functions as F

    bits = effective_bits(len(columns), bits)
    key, part = f"{_TMP}key", f"{_TMP}part"
    # One output file needs only the boundaries; more files also need the sample's keys.
    sample = sample_columns(df, columns, sample_rows=sample_rows, row_count=row_count, seed=seed,
                            materialize=num_files > 1)
    bounds = boundaries_from_sample(sample, columns, bits)
    keyed = _with_key(df, strategy, columns, bounds, bits, key)
    drop = [] if keep_key else [key]
    if num_files == 1:
        return keyed.repartition(1).sortWithinPartitions(key).drop(*drop)
    sample_keys = sorted(r[0] for r in _with_key(sample, strategy, columns, bounds, bits, key).select(key).collect())
    cuts = split_points(sample_keys, num_files)
    cut_array = F.array(*[F.lit(c).cast("long") for c in cuts]) if cuts else F.array().cast("array<long>")
    depth = max(1, len(cuts).bit_length())
    routed = _count_le(keyed, {part: (key, cut_array)}, depth)
    routes = F.array(*[F.lit(v).cast("long") for v in partition_routing_keys(num_files)])
    routed = routed.withColumn(part, F.element_at(routes, F.col(part) + 1))
    return routed.repartition(num_files, F.col(part)).sortWithinPartitions(key).drop(*drop, part)


def iceberg_zorder_column(df: DataFrame, columns: Sequence[str], *, var_length_contribution: int = 8,
                          max_output_size: int = 2**31 - 1) -> Column:
    """Iceberg's z-value column, built by Iceberg's own SparkZOrderUDF.

    The class is package-private in the runtime jar, so it is constructed by reflection; the
    defaults are those of Iceberg 1.10's rewrite action (``var-length-contribution`` 8,
    ``max-output-size`` unbounded).
    """
    from pyspark.sql import Column, SparkSession

    spark = SparkSession.getActiveSession() or df.sparkSession
    jvm = spark._jvm
    gateway = spark.sparkContext._gateway
    loader = jvm.org.apache.iceberg.spark.actions.SparkActions.get().getClass().getClassLoader()
    cls = jvm.java.lang.Class.forName("org.apache.iceberg.spark.actions.SparkZOrderUDF", True, loader)
    int_type = jvm.java.lang.Integer.TYPE
    ctor_types = gateway.new_array(jvm.java.lang.Class, 3)
    for i in range(3):
        ctor_types[i] = int_type
    ctor = cls.getDeclaredConstructor(ctor_types)
    ctor.setAccessible(True)
    args = gateway.new_array(jvm.java.lang.Object, 3)
    args[0], args[1], args[2] = len(columns), var_length_contribution, max_output_size
    udf = ctor.newInstance(args)
    column_cls = jvm.java.lang.Class.forName("org.apache.spark.sql.Column", True, loader)
    datatype_cls = jvm.java.lang.Class.forName("org.apache.spark.sql.types.DataType", True, loader)
    sort_types = gateway.new_array(jvm.java.lang.Class, 2)
    sort_types[0], sort_types[1] = column_cls, datatype_cls
    sorted_lex = cls.getDeclaredMethod("sortedLexicographically", sort_types)
    sorted_lex.setAccessible(True)
    interleave_types = gateway.new_array(jvm.java.lang.Class, 1)
    interleave_types[0] = column_cls
    interleave = cls.getDeclaredMethod("interleaveBytes", interleave_types)
    interleave.setAccessible(True)
    jdf = df._jdf
    byte_columns = gateway.new_array(jvm.org.apache.spark.sql.Column, len(columns))
    for i, name in enumerate(columns):
        call = gateway.new_array(jvm.java.lang.Object, 2)
        call[0] = jdf.col(name)
        call[1] = jdf.schema().apply(name).dataType()
        byte_columns[i] = sorted_lex.invoke(udf, call)
    array_col = jvm.org.apache.spark.sql.functions.array(byte_columns)
    call = gateway.new_array(jvm.java.lang.Object, 1)
    call[0] = array_col
    return Column(interleave.invoke(udf, call))


@dataclass(frozen=True)
class LayoutOptions:
    """Knobs of the index layouts; the others ignore them.

    ``row_count`` (when known, e.g. from file metadata) saves a count to size the sample.
    ``keep_key`` keeps the ordering key as column ``__sb_key`` (zorder, hilbert,
    zorder-iceberg) for inspection; leave it off when writing the result to a table.
    """

    bits: int = 10
    sample_rows: int = 20000
    row_count: int | None = None
    seed: int = 0
    keep_key: bool = False


class Layout(ABC):
    """One row layout: how rewritten rows are ordered and cut into files."""

    name: ClassVar[str]
    clusters: ClassVar[bool] = True  # orders by the clustering columns (binpack does not)

    def apply(self, df: DataFrame, columns: Sequence[str], num_files: int, options: LayoutOptions) -> DataFrame:
        if num_files < 1:
            raise LayoutError(f"num_files must be >= 1, got {num_files}")
        if self.clusters:
            _check_columns(df, columns)
        return self._apply(df, columns, num_files, options)

    @abstractmethod
    def _apply(self, df: DataFrame, columns: Sequence[str], num_files: int, options: LayoutOptions) -> DataFrame: ...


class BinPack(Layout):
    """No reordering; only ``coalesce(num_files)``."""

    name = "binpack"
    clusters = False

    def _apply(self, df: DataFrame, columns: Sequence[str], num_files: int, options: LayoutOptions) -> DataFrame:
        return df.coalesce(num_files) if df.rdd.getNumPartitions() > num_files else df


class LinearSort(Layout):
    """Linear order by the columns: range-partitioned on them, sorted within."""

    name = "sort"

    def _apply(self, df: DataFrame, columns: Sequence[str], num_files: int, options: LayoutOptions) -> DataFrame:
        from pyspark.sql import functions as F

        order = [F.col(c).asc_nulls_first() for c in columns]
        return df.repartitionByRange(num_files, *order).sortWithinPartitions(*order)


class IcebergZOrder(Layout):
    """Iceberg's own z-value; as Iceberg's action does: range-partition on it, sort within."""

    name = "zorder-iceberg"

    def _apply(self, df: DataFrame, columns: Sequence[str], num_files: int, options: LayoutOptions) -> DataFrame:
        from pyspark.sql import functions as F

        key = f"{_TMP}key"
        keyed = df.withColumn(key, iceberg_zorder_column(df, columns))
        laid = keyed.repartitionByRange(num_files, F.col(key)).sortWithinPartitions(F.col(key))
        return laid if options.keep_key else laid.drop(key)


class ZOrder(Layout):
    """Boundary-based Z-order over rank-scaled columns, routed by sampled key cut points."""

    name = "zorder"

    def _apply(self, df: DataFrame, columns: Sequence[str], num_files: int, options: LayoutOptions) -> DataFrame:
        return _index_layout(df, self.name, columns, num_files=num_files, bits=options.bits,
                             sample_rows=options.sample_rows, row_count=options.row_count, seed=options.seed,
                             keep_key=options.keep_key)


class Hilbert(ZOrder):
    """The same ranks on an n-dimensional Hilbert curve (Skilling's transpose)."""

    name = "hilbert"


LAYOUTS: dict[str, Layout] = {layout.name: layout
                              for layout in (ZOrder(), Hilbert(), IcebergZOrder(), LinearSort(), BinPack())}
CLUSTERING_STRATEGIES = tuple(name for name, layout in LAYOUTS.items() if layout.clusters)


@dataclass(frozen=True)
class ResolvedLayout:
    """The layout a compactor run uses, and its clustering columns (checked against the table)."""

    layout: Layout
    columns: tuple[str, ...]

    @property
    def strategy(self) -> str:
        return self.layout.name


def layout_for(strategy: str) -> Layout:
    try:
        return LAYOUTS[strategy]
    except KeyError:
        raise LayoutError(f"unknown strategy {strategy!r}; use one of {', '.join(LAYOUT_STRATEGIES)}") from None


def apply_layout(df: DataFrame, strategy: str, columns: Sequence[str], *, num_files: int, bits: int = 10,
                 sample_rows: int = 20000, row_count: int | None = None, seed: int = 0,
                 keep_key: bool = False) -> DataFrame:
    """``df`` laid out by ``strategy`` on ``columns`` into ``num_files`` partitions (see module doc)."""
    return layout_for(strategy).apply(df, columns, num_files, LayoutOptions(bits, sample_rows, row_count, seed, keep_key))
