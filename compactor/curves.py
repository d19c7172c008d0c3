"""The curves of the index layouts, as Spark SQL expressions, and their plain-Python references.

Ranks: a sample of rows gives, per column, up to ``2**bits - 1`` boundaries; each value maps
to its rank among them (branch-free binary search over a broadcast array, one projection
per bit), stretched to ``bits`` bits so every column contributes evenly. Z-order interleaves
the ranks' bits into one 63-bit key; Hilbert first maps them onto an n-dimensional Hilbert
curve (Skilling's transpose). ``zorder_reference`` and ``hilbert_reference`` are the same
index functions in plain Python, used by the tests to check the Spark expressions.
``iceberg_zorder_column`` is Iceberg's own z-value (its ``SparkZOrderUDF``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from streamberg.common.errors import LayoutError

if TYPE_CHECKING:  # pyspark is imported lazily: the planner and CLI --help do not need a JVM
    from pyspark.sql import Column, DataFrame

# The interleaved key is a signed 64-bit long: 63 usable bits shared by all columns.
KEY_BITS = 63
# Prefix of the helper columns added and dropped here (kept out of users' namespaces).
TMP_PREFIX = "__sb_"


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

def check_columns(df: DataFrame, columns: Sequence[str]) -> None:
    """Every column is in the data (a nested field by its dotted path, through structs only)
    and an orderable scalar."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if not columns:
        raise LayoutError("this strategy needs at least one column")
    for name in columns:
        data_type: Any = df.schema
        for depth, part in enumerate(name.split(".")):
            if not isinstance(data_type, StructType):
                inside = ".".join(name.split(".")[:depth])
                raise LayoutError(f"column {name!r}: {inside!r} is {data_type.simpleString()}; only fields reached "
                                  "through structs can be clustered")
            fields = {f.name: f for f in data_type.fields}
            if part not in fields:
                raise LayoutError(f"column {name!r} is not in the data (columns: {', '.join(fields)})")
            data_type = fields[part].dataType
        if isinstance(data_type, (ArrayType, MapType, StructType)):
            raise LayoutError(f"column {name!r} is {data_type.simpleString()}: only orderable scalars can be clustered")


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
        F.sort_array(F.collect_list(F.col(c))).alias(f"{TMP_PREFIX}s{i}") for i, c in enumerate(columns)
    ])
    picks = []
    for i in range(len(columns)):
        arr = F.col(f"{TMP_PREFIX}s{i}")
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
        picks.append(chosen.alias(f"{TMP_PREFIX}b{i}"))
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


def count_le(df: DataFrame, targets: dict[str, tuple[str, Column]], depth: int) -> DataFrame:
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
    ranked = count_le(df, {f"{TMP_PREFIX}r{i}": (c, bounds[i]) for i, c in enumerate(columns)}, bits)
    return ranked.withColumns({
        f"{TMP_PREFIX}r{i}": F.floor(F.col(f"{TMP_PREFIX}r{i}") * F.lit(float(1 << bits)) / (F.size(bounds[i]) + 1)).cast("long")
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
    df = df.withColumn(f"{TMP_PREFIX}t", t)
    return df.withColumns({c: F.col(c).bitwiseXOR(F.col(f"{TMP_PREFIX}t")) for c in names}).drop(f"{TMP_PREFIX}t")


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
