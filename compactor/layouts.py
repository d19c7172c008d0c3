"""Row layouts: the order in which rewritten rows are written, computed in Spark SQL.

Public API (the compactor's runner uses it; the data-skipping benchmark builds on it)::

    apply_layout(df, strategy, columns, *, num_files, bits=10, sample_rows=20000,
                 row_count=None, seed=0) -> DataFrame

returns ``df`` with the same columns and rows, split into ``num_files`` Spark partitions
that each hold one contiguous range of the layout's order and are sorted within. Writing
the result with one file per partition (Iceberg does, given a large enough
``target-file-size-bytes``) gives ``num_files`` files whose min/max ranges overlap as little
as the layout allows. It works on any DataFrame (an Iceberg scan or ``spark.range(...)``).

Strategies (``STRATEGIES``):

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

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pyspark is imported lazily: the planner and CLI --help do not need a JVM
    from pyspark.sql import Column, DataFrame

STRATEGIES = ("zorder", "hilbert", "zorder-iceberg", "sort", "binpack")
CLUSTERING_STRATEGIES = ("zorder", "hilbert", "zorder-iceberg", "sort")
# The interleaved key is a signed 64-bit long: 63 usable bits shared by all columns.
KEY_BITS = 63
# Prefix of the helper columns added and dropped here (kept out of users' namespaces).
_TMP = "__sb_"


class LayoutError(ValueError):
    """The layout cannot be applied (unknown strategy, missing or unorderable column)."""


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

def _check_columns(df: "DataFrame", columns: Sequence[str]) -> None:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if not columns:
        raise LayoutError("this strategy needs at least one column")
    fields = {f.name: f for f in df.schema.fields}
    for name in columns:
        if name not in fields:
            raise LayoutError(f"column {name!r} is not in the data (columns: {', '.join(fields)})")
        if isinstance(fields[name].dataType, (ArrayType, MapType, StructType)):
            raise LayoutError(f"column {name!r} is {fields[name].dataType.simpleString()}: only orderable scalars can be clustered")


def rank_boundaries(df: "DataFrame", columns: Sequence[str], *, bits: int, sample_rows: int,
                    row_count: int | None = None, seed: int = 0) -> list["Column"]:
    """Per column, a literal sorted array of at most 2**bits - 1 rank boundaries.

    Few distinct values in the sample: all of them (exact dense ranks). Many: evenly spaced
    quantiles of the sample, de-duplicated. The sample is sorted and picked in Spark; the
    chosen values go from the JVM result row straight into typed literals (never through
    Python objects, so timestamps and decimals keep their exact values).
    """
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    max_bounds = (1 << bits) - 1
    total = row_count if row_count is not None else df.count()
    fraction = 1.0 if total <= sample_rows else sample_rows / total
    sample = df.select(*columns)
    if fraction < 1.0:
        sample = sample.sample(withReplacement=False, fraction=fraction, seed=seed)
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
            lambda j: F.element_at(arr, (F.floor(j * n / (max_bounds + 1)) + 1).cast("int")),
        ))
        chosen = F.when(F.size(distinct) <= max_bounds, distinct).otherwise(quantiles)
        picks.append(chosen.alias(f"{_TMP}b{i}"))
    result = sorted_values.select(*picks)
    jvm = df.sparkSession._jvm
    row = result._jdf.collect()[0]
    schema = result._jdf.schema()
    literal = jvm.org.apache.spark.sql.catalyst.expressions.Literal
    return [
        Column(jvm.org.apache.spark.sql.Column(literal.create(row.get(i), schema.apply(i).dataType())))
        for i in range(len(columns))
    ]


def with_scaled_ranks(df: "DataFrame", columns: Sequence[str], bounds: Sequence["Column"], bits: int) -> "DataFrame":
    """Add ``__sb_r<i>``: each column's rank among its boundaries, stretched to ``bits`` bits.

    rank(v) = number of boundaries <= v (nulls and values below the first boundary: 0), found
    by a fixed-depth binary search, one projection per bit so no expression is duplicated.
    Scaled rank = rank * 2**bits // (len(boundaries) + 1), in [0, 2**bits).
    """
    from pyspark.sql import functions as F

    n = len(columns)
    ranked = df.withColumns({f"{_TMP}r{i}": F.lit(0).cast("int") for i in range(n)})
    for step in (1 << k for k in reversed(range(bits))):
        updates = {}
        for i, c in enumerate(columns):
            r, b = F.col(f"{_TMP}r{i}"), bounds[i]
            cand = r + F.lit(step)
            updates[f"{_TMP}r{i}"] = (
                F.when(cand <= F.size(b), F.when(F.element_at(b, cand) <= F.col(c), cand).otherwise(r)).otherwise(r)
            )
        ranked = ranked.withColumns(updates)
    return ranked.withColumns({
        f"{_TMP}r{i}": F.floor(F.col(f"{_TMP}r{i}") * F.lit(float(1 << bits)) / (F.size(bounds[i]) + 1)).cast("long")
        for i in range(n)
    })


def zorder_expression(ranks: Sequence["Column"], bits: int) -> "Column":
    """Interleave the bits of ``ranks`` (longs < 2**bits); the first column is most significant."""
    from pyspark.sql import functions as F

    n = len(ranks)
    key = F.lit(0).cast("long")
    for b in range(bits):
        for i, r in enumerate(ranks):
            bit = F.shiftright(r, b).bitwiseAND(F.lit(1).cast("long"))
            key = key.bitwiseOR(F.shiftleft(bit, b * n + (n - 1 - i)))
    return key


def with_hilbert_transpose(df: "DataFrame", names: Sequence[str], bits: int) -> "DataFrame":
    """Rewrite the columns ``names`` (scaled ranks) in place into Skilling's transposed Hilbert form."""
    from pyspark.sql import functions as F

    n = len(names)
    x = [F.col(c) for c in names]
    q = 1 << (bits - 1)
    while q > 1:
        p = F.lit(q - 1).cast("long")
        for i in range(n):
            xi_has_q = F.col(names[i]).bitwiseAND(F.lit(q)) != 0
            x0, xi = F.col(names[0]), F.col(names[i])
            if i == 0:
                df = df.withColumn(names[0], F.when(xi_has_q, x0.bitwiseXOR(p)).otherwise(x0))
                continue
            t = x0.bitwiseXOR(xi).bitwiseAND(p)
            df = df.withColumns({
                names[0]: F.when(xi_has_q, x0.bitwiseXOR(p)).otherwise(x0.bitwiseXOR(t)),
                names[i]: F.when(xi_has_q, xi).otherwise(xi.bitwiseXOR(t)),
            })
        q >>= 1
    for i in range(1, n):  # Gray encode: prefix XOR, one projection each
        df = df.withColumn(names[i], F.col(names[i]).bitwiseXOR(F.col(names[i - 1])))
    t = F.lit(0).cast("long")
    q = 1 << (bits - 1)
    while q > 1:
        t = t.bitwiseXOR(F.when(F.col(names[n - 1]).bitwiseAND(F.lit(q)) != 0, F.lit(q - 1).cast("long")).otherwise(F.lit(0).cast("long")))
        q >>= 1
    df = df.withColumn(f"{_TMP}t", t)
    df = df.withColumns({c: F.col(c).bitwiseXOR(F.col(f"{_TMP}t")) for c in names})
    del x
    return df.drop(f"{_TMP}t")


def with_index(df: "DataFrame", strategy: str, columns: Sequence[str], *, bits: int = 10, sample_rows: int = 20000,
               row_count: int | None = None, seed: int = 0, key: str = f"{_TMP}key") -> "DataFrame":
    """``df`` plus a column ``key`` holding the ``zorder`` or ``hilbert`` index of ``columns``."""
    from pyspark.sql import functions as F

    if strategy not in ("zorder", "hilbert"):
        raise LayoutError(f"with_index computes zorder or hilbert keys, not {strategy!r}")
    _check_columns(df, columns)
    bits = effective_bits(len(columns), bits)
    bounds = rank_boundaries(df, columns, bits=bits, sample_rows=sample_rows, row_count=row_count, seed=seed)
    ranked = with_scaled_ranks(df, columns, bounds, bits)
    names = [f"{_TMP}r{i}" for i in range(len(columns))]
    if strategy == "hilbert" and len(columns) > 1:
        ranked = with_hilbert_transpose(ranked, names, bits)
    return ranked.withColumn(key, zorder_expression([F.col(c) for c in names], bits)).drop(*names)


def iceberg_zorder_column(df: "DataFrame", columns: Sequence[str], *, var_length_contribution: int = 8,
                          max_output_size: int = 2**31 - 1) -> "Column":
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


def apply_layout(df: "DataFrame", strategy: str, columns: Sequence[str], *, num_files: int, bits: int = 10,
                 sample_rows: int = 20000, row_count: int | None = None, seed: int = 0) -> "DataFrame":
    """``df`` laid out by ``strategy`` on ``columns`` into ``num_files`` partitions (see module doc).

    ``row_count`` (when known, e.g. from file metadata) saves a count to size the sample.
    """
    from pyspark.sql import functions as F

    if strategy not in STRATEGIES:
        raise LayoutError(f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    if num_files < 1:
        raise LayoutError(f"num_files must be >= 1, got {num_files}")
    if strategy == "binpack":
        return df.coalesce(num_files) if df.rdd.getNumPartitions() > num_files else df
    _check_columns(df, columns)
    key = f"{_TMP}key"
    if strategy == "sort":
        order = [F.col(c).asc_nulls_first() for c in columns]
        return df.repartitionByRange(num_files, *order).sortWithinPartitions(*order)
    if strategy == "zorder-iceberg":
        keyed = df.withColumn(key, iceberg_zorder_column(df, columns))
    else:
        keyed = with_index(df, strategy, columns, bits=bits, sample_rows=sample_rows, row_count=row_count,
                           seed=seed, key=key)
    return keyed.repartitionByRange(num_files, F.col(key)).sortWithinPartitions(F.col(key)).drop(key)
