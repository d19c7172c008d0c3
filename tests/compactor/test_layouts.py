"""Layout index expressions, computed by Spark, checked against plain-Python references."""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import random

import pytest

from streamberg.common.errors import LayoutError
from streamberg.compactor.curves import (
    hilbert_reference,
    rank_boundaries,
    with_hilbert_transpose,
    with_scaled_ranks,
    zorder_expression,
    zorder_reference,
)
from streamberg.compactor.layouts import apply_layout
from streamberg.compactor.routing import partition_routing_keys, spark_hash_long

pytestmark = pytest.mark.spark


def test_zorder_and_hilbert_match_the_reference_on_a_full_grid(spark) -> None:
    from pyspark.sql import functions as F

    bits = 3
    points = list(itertools.product(range(1 << bits), repeat=3))
    df = spark.createDataFrame(points, "a long, b long, c long")
    names = ["a", "b", "c"]
    z = df.withColumn("z", zorder_expression([F.col(c) for c in names], bits))
    h = with_hilbert_transpose(df.withColumns({f"x{i}": F.col(c) for i, c in enumerate(names)}), ["x0", "x1", "x2"], bits)
    h = h.withColumn("h", zorder_expression([F.col("x0"), F.col("x1"), F.col("x2")], bits))
    z_by_point = {(r.a, r.b, r.c): r.z for r in z.collect()}
    h_by_point = {(r.a, r.b, r.c): r.h for r in h.collect()}
    assert all(z_by_point[p] == zorder_reference(p, bits) for p in points)
    assert all(h_by_point[p] == hilbert_reference(p, bits) for p in points)
    # A Hilbert curve visits every cell once and each step moves to a neighbouring cell;
    # Z-order visits every cell once but jumps.
    by_index = {v: p for p, v in h_by_point.items()}
    assert sorted(by_index) == list(range(len(points)))
    steps = [sum(abs(x - y) for x, y in zip(by_index[i], by_index[i + 1])) for i in range(len(points) - 1)]
    assert set(steps) == {1}
    z_order = [p for p, _ in sorted(z_by_point.items(), key=lambda kv: kv[1])]
    assert max(sum(abs(x - y) for x, y in zip(a, b)) for a, b in zip(z_order, z_order[1:])) > 1


def test_ranks_are_dense_and_order_preserving_for_any_orderable_type(spark) -> None:
    rng = random.Random(3)
    base = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    rows = [(f"https://shop.example.com/catalogue/item/{rng.randrange(3000):06d}",
             base + dt.timedelta(microseconds=rng.randrange(10**12)),
             decimal.Decimal(rng.randrange(10**6)) / 100,
             rng.choice(["north", "south", "east"]))
            for _ in range(5000)]
    df = spark.createDataFrame(rows, "url string, ts timestamp, price decimal(12,2), region string")
    columns = ["url", "ts", "price", "region"]
    bits = 8
    bounds = rank_boundaries(df, columns, bits=bits, sample_rows=2000, row_count=len(rows), seed=1)
    ranked = with_scaled_ranks(df, columns, bounds, bits).collect()
    for i, column in enumerate(columns):
        pairs = sorted((r[column], r[f"__sb_r{i}"]) for r in ranked)
        ranks = [rank for _, rank in pairs]
        assert ranks == sorted(ranks), f"{column}: rank order differs from value order"
        assert min(ranks) >= 0 and max(ranks) < (1 << bits)
    # URLs share a 40-character prefix, yet their ranks spread over the whole range ...
    url_ranks = {r["__sb_r0"] for r in ranked}
    assert len(url_ranks) > (1 << bits) // 2
    # ... and a 3-value column gets exactly 3 ranks, stretched across the range.
    region_ranks = sorted({r["__sb_r3"] for r in ranked})
    assert len(region_ranks) == 3 and region_ranks[-1] >= (1 << bits) // 2


@pytest.mark.slow  # 9-12 s alone on 2 cores (make test-fast --durations, 2026-11-29)
def test_apply_layout_keeps_rows_and_makes_disjoint_ordered_partitions(spark) -> None:
    from pyspark.sql import functions as F

    rng = random.Random(5)
    rows = [(i, f"u{rng.randrange(500):04d}", f"c{rng.randrange(30):02d}") for i in range(6000)]
    df = spark.createDataFrame(rows, "id long, user_id string, city string").repartition(5)
    for strategy in ("zorder", "hilbert", "sort", "zorder-iceberg", "binpack"):
        out = apply_layout(df, strategy, ["user_id", "city"], num_files=4, row_count=len(rows), sample_rows=1000)
        assert out.columns == df.columns
        assert out.rdd.getNumPartitions() == 4, strategy
        assert sorted(tuple(r) for r in out.collect()) == sorted(rows), strategy
        if strategy in ("zorder", "hilbert"):
            # Each output partition holds one contiguous key range, and all are used.
            keyed = apply_layout(df, strategy, ["user_id", "city"], num_files=4, row_count=len(rows),
                                 sample_rows=1000, keep_key=True)
            ranges = (keyed.groupBy(F.spark_partition_id().alias("p"))
                      .agg(F.min("__sb_key").alias("lo"), F.max("__sb_key").alias("hi"), F.count("*").alias("n"))
                      .orderBy("p").collect())
            assert len(ranges) == 4 and all(r.n > len(rows) / 8 for r in ranges), ranges
            assert all(a.hi < b.lo for a, b in zip(ranges, ranges[1:])), ranges


def test_rows_are_routed_to_the_partition_spark_hashes_them_to(spark) -> None:
    from pyspark.sql import functions as F

    values = [0, 1, -1, 42, 2**31, -(2**40) + 7, 2**62 + 12345]
    got = spark.createDataFrame([(v,) for v in values], "v long").select("v", F.hash("v").alias("h")).collect()
    assert {r.v: r.h for r in got} == {v: spark_hash_long(v) for v in values}
    n = 7
    keys = partition_routing_keys(n)
    routed = (spark.range(n).withColumn("k", F.element_at(F.array(*[F.lit(k).cast("long") for k in keys]), F.col("id").cast("int") + 1))
              .repartition(n, "k").select("id", F.spark_partition_id().alias("p")).collect())
    assert all(r.id == r.p for r in routed)


def test_layout_errors_name_the_problem(spark) -> None:
    df = spark.createDataFrame([(1, [1, 2])], "id long, tags array<long>")
    with pytest.raises(LayoutError, match="'missing' is not in the data"):
        apply_layout(df, "zorder", ["missing"], num_files=1)
    with pytest.raises(LayoutError, match="only orderable scalars"):
        apply_layout(df, "hilbert", ["tags"], num_files=1)
    with pytest.raises(LayoutError, match="unknown strategy"):
        apply_layout(df, "spiral", ["id"], num_files=1)


def test_one_layout_class_per_configurable_strategy() -> None:
    """The registry and the config's strategy names are the same set: a strategy the config
    accepts always has a class, and a class is always reachable from the config."""
    from streamberg.common.config import LAYOUT_STRATEGIES
    from streamberg.compactor.layouts import LAYOUTS, layout_for

    assert set(LAYOUTS) == set(LAYOUT_STRATEGIES)
    assert len(set(LAYOUTS.values())) == len(LAYOUTS)
    assert [name for name, layout in LAYOUTS.items() if not layout.clusters] == ["binpack"]
    with pytest.raises(LayoutError, match="unknown strategy"):
        layout_for("spiral")


def test_a_layout_carries_its_columns_and_owns_its_read_options() -> None:
    """One value per run: the configured layout. Bin-pack alone asks Iceberg's read for one
    split per output file (no shuffle); the clustering layouts read as Iceberg plans."""
    from streamberg.common.config import CompactorConfig
    from streamberg.compactor.layouts import BinPack, Hilbert, layout_for, resolve_layout

    hilbert = resolve_layout(CompactorConfig(strategy="hilbert", columns=["a", "b"], index_bits=12, sample_rows=500),
                             None, None)
    assert isinstance(hilbert, Hilbert) and hilbert.strategy == "hilbert"
    assert (hilbert.columns, hilbert.bits, hilbert.sample_rows) == (("a", "b"), 12, 500)
    assert hilbert.read_options(1000, 4) == {}
    # Without columns every strategy bin-packs (documented).
    assert isinstance(resolve_layout(CompactorConfig(strategy="zorder", columns=[]), None, None), BinPack)
    split = layout_for("binpack").read_options(1001, 4)
    assert split == {"split-size": "251", "file-open-cost": "0"}
