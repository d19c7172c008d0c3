"""The change-order rule (table_meta/change_order.py) is one text run by two engines: Spark in the
merge (merge/order.py) and DuckDB in a fresh read of a primary-key table (fresh/keyed.py).
The same batches of changes and key states go through both, and each answer is compared with
the rule applied here, in plain Python, change by change: per key the change kept, and
whether it applies over the key state.

The batches are drawn by hypothesis: keys on several partitions, sequences missing or tied,
source times missing or tied, deletes, offsets equal across partitions (the last tie-break).
DuckDB sees every example; Spark a smaller number (a query costs it about a second), plus
the fixed cases each of which once decided a merge wrongly.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamberg.fresh.keyed import newest_against_stored
from streamberg.merge.order import WorkingNames, last_changes, newer_than_stored
from streamberg.table_meta.changelog import DELETE, OFFSET, OP, PARTITION, SOURCE_TS

SEQS = (None, "01", "02", "05", "10")  # ordered text, as table_meta/changelog.encode_sequence writes it
Change = dict[str, Any]


@st.composite
def batches(draw: Any) -> tuple[list[Change], dict[int, Change]]:
    changes: list[Change] = []
    next_offset = {p: draw(st.integers(0, 3)) for p in range(3)}  # offsets repeat across partitions
    for _ in range(draw(st.integers(1, 14))):
        partition = draw(st.integers(0, 2))
        changes.append({"k": draw(st.integers(0, 3)), "op": draw(st.sampled_from(["c", "u", DELETE])),
                        "part": partition, "off": next_offset[partition], "ts": draw(st.sampled_from([None, 1, 2, 3])),
                        "seq": draw(st.sampled_from(SEQS)), "v": len(changes)})
        next_offset[partition] += draw(st.integers(1, 2))
    stored = {}
    for key in range(4):
        if draw(st.booleans()):
            stored[key] = {"seq": draw(st.sampled_from(SEQS)), "part": draw(st.integers(0, 2)),
                           "off": draw(st.integers(0, 8)), "ts": draw(st.sampled_from([None, 1, 2, 3]))}
    return changes, stored


def _desc_nulls_last(value: Any) -> tuple[bool, Any]:
    return (value is not None, value if value is not None else 0)


def expected(changes: list[Change], stored: dict[int, Change], recovering: bool = False) -> dict[int, tuple]:
    """The rule, change by change: per key, (op, partition, offset, value, applies)."""
    filled: list[Change] = []
    for key_part in sorted({(c["k"], c["part"]) for c in changes}):
        last_seq = None
        for change in sorted((c for c in changes if (c["k"], c["part"]) == key_part), key=lambda c: c["off"]):
            last_seq = change["seq"] if change["seq"] is not None else last_seq
            filled.append({**change, "seq": last_seq})
    here = {}
    for change in filled:
        key = (change["k"], change["part"])
        order = (_desc_nulls_last(change["seq"]), change["off"])
        if key not in here or order > here[key][0]:
            here[key] = (order, change)
    newest: dict[int, tuple] = {}
    for _, change in here.values():
        order = (_desc_nulls_last(change["seq"]), _desc_nulls_last(change["ts"]), change["op"] == DELETE,
                 change["off"], change["part"])
        if change["k"] not in newest or order > newest[change["k"]][0]:
            newest[change["k"]] = (order, change)
    out = {}
    for key, (_, c) in newest.items():
        s = stored.get(key)
        if s is None:
            applies = True
        elif c["seq"] is not None and s["seq"] is not None and c["seq"] != s["seq"]:
            applies = c["seq"] > s["seq"]
        elif c["part"] == s["part"]:
            applies = c["off"] >= s["off"] if recovering else c["off"] > s["off"]
        elif c["ts"] is not None and s["ts"] is not None and c["ts"] != s["ts"]:
            applies = c["ts"] > s["ts"]
        else:
            applies = True
        out[key] = (c["op"], c["part"], c["off"], c["v"], applies)
    return out


def through_duckdb(changes: list[Change], stored: dict[int, Change]) -> dict[int, tuple]:
    table = pa.table({"k0": pa.array([c["k"] for c in changes], pa.int64()),
                      "v0": pa.array([c["v"] for c in changes], pa.int64()),
                      "op": pa.array([c["op"] for c in changes], pa.string()),
                      "part": pa.array([c["part"] for c in changes], pa.int32()),
                      "off": pa.array([c["off"] for c in changes], pa.int64()),
                      "ts": pa.array([c["ts"] for c in changes], pa.int64()),
                      "seq": pa.array([c["seq"] for c in changes], pa.string())})
    keys = sorted(stored)
    state = pa.table({"k0": pa.array(keys, pa.int64()), "seq": pa.array([stored[k]["seq"] for k in keys], pa.string()),
                      "part": pa.array([stored[k]["part"] for k in keys], pa.int32()),
                      "off": pa.array([stored[k]["off"] for k in keys], pa.int64()),
                      "ts": pa.array([stored[k]["ts"] for k in keys], pa.int64())})
    rows = newest_against_stored(table, state, ["k0"]).to_pylist()
    assert len(rows) == len({r["k0"] for r in rows})  # one change a key
    return {r["k0"]: (r["op"], r["part"], r["off"], r["v0"], r["apply"]) for r in rows}


def through_spark(spark: Any, changes: list[Change], stored: dict[int, Change], recovering: bool = False) -> dict[int, tuple]:
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, IntegerType, LongType, StringType, StructField, StructType

    # A key column named like the merge's own working column, and one with a brace: the names
    # the merge gives its columns, and the text's formatting, must not trip over either.
    key, value = "_streamberg_seq", "v{0}"
    names = WorkingNames([key, value, OP, PARTITION, OFFSET, SOURCE_TS])
    seq = names("seq")
    schema = StructType([StructField(key, LongType()), StructField(value, LongType()), StructField(OP, StringType()),
                         StructField(PARTITION, IntegerType()), StructField(OFFSET, LongType()),
                         StructField(SOURCE_TS, LongType()), StructField(seq, StringType())])
    frame = spark.createDataFrame([(c["k"], c["v"], c["op"], c["part"], c["off"], c["ts"], c["seq"]) for c in changes],
                                  schema)
    last = last_changes(frame, [key], names)
    columns = {c: names(f"stored_{c}") for c in ("seq", "partition", "offset", "source_ts")}
    state_schema = StructType([StructField(names("key"), LongType()), StructField(columns["seq"], StringType()),
                               StructField(columns["partition"], IntegerType()),
                               StructField(columns["offset"], LongType()), StructField(columns["source_ts"], LongType())])
    state = spark.createDataFrame([(k, s["seq"], s["part"], s["off"], s["ts"]) for k, s in stored.items()],
                                  state_schema)
    joined = last.join(state, on=F.col(f"`{key}`") == F.col(names("key")), how="left") \
        .withColumn(names("apply"), newer_than_stored(seq, columns, recovering).cast(BooleanType()))
    rows = joined.collect()
    assert len(rows) == len({r[key] for r in rows})
    return {r[key]: (r[OP], r[PARTITION], r[OFFSET], r[value], r[names("apply")]) for r in rows}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_duckdb_runs_the_rule(batch: tuple[list[Change], dict[int, Change]]) -> None:
    changes, stored = batch
    assert through_duckdb(changes, stored) == expected(changes, stored)


# Each once decided a key wrongly: a tombstone without a sequence on the partition of a newer
# sequence; a delete tied with an insert in time on another partition; a newer change on a
# lower partition number; a replayed older change against the key state; equal offsets on two
# partitions with every other fact tied.
FIXED = [
    ([{"k": 0, "op": "c", "part": 0, "off": 0, "ts": 1, "seq": "05", "v": 0},
      {"k": 0, "op": DELETE, "part": 0, "off": 1, "ts": None, "seq": None, "v": 1},
      {"k": 0, "op": "u", "part": 1, "off": 0, "ts": 2, "seq": "02", "v": 2}], {}),
    ([{"k": 1, "op": "c", "part": 0, "off": 3, "ts": 2, "seq": None, "v": 0},
      {"k": 1, "op": DELETE, "part": 1, "off": 1, "ts": 2, "seq": None, "v": 1}], {}),
    ([{"k": 2, "op": "u", "part": 2, "off": 0, "ts": 1, "seq": None, "v": 0},
      {"k": 2, "op": "u", "part": 0, "off": 0, "ts": 3, "seq": None, "v": 1}], {2: {"seq": None, "part": 1, "off": 9, "ts": 2}}),
    ([{"k": 3, "op": "c", "part": 0, "off": 4, "ts": 1, "seq": "01", "v": 0}],
     {3: {"seq": "02", "part": 0, "off": 2, "ts": 1}}),
    ([{"k": 0, "op": "u", "part": 0, "off": 5, "ts": None, "seq": None, "v": 0},
      {"k": 0, "op": "u", "part": 1, "off": 5, "ts": None, "seq": None, "v": 1}], {}),
]


@pytest.mark.slow
def test_spark_and_duckdb_run_the_same_rule(spark: Any) -> None:
    for changes, stored in FIXED:
        want = expected(changes, stored)
        assert through_spark(spark, changes, stored) == want == through_duckdb(changes, stored), (changes, stored)
    # Recovering (the table never got what the key state recorded): the equal change applies again.
    changes, stored = [{"k": 0, "op": "u", "part": 0, "off": 4, "ts": 1, "seq": None, "v": 0}], \
        {0: {"seq": None, "part": 0, "off": 4, "ts": 1}}
    assert through_spark(spark, changes, stored, recovering=True)[0][-1] is True
    assert through_spark(spark, changes, stored)[0][-1] is False

    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])
    @given(batches())
    def drawn(batch: tuple[list[Change], dict[int, Change]]) -> None:
        changes, stored = batch
        assert through_spark(spark, changes, stored) == expected(changes, stored) == through_duckdb(changes, stored)

    drawn()


def _encoding_cases() -> list[tuple[Any, pa.DataType, list[Any], list[int | None]]]:
    """(Iceberg type, Arrow type, values, the number each stands for)."""
    import datetime as dt

    from pyiceberg.types import DateType, IntegerType, LongType, TimestamptzType

    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    longs = [-(2**63), -1, 0, 1, 9, 10, 2**63 - 1, None, 123456789]
    ints = [-(2**31), -5, 0, 7, 2**31 - 1, None]
    days = [dt.date(1969, 12, 31), dt.date(1970, 1, 1), dt.date(2026, 11, 29), None, dt.date(1, 1, 1)]
    stamps = [dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone.utc), epoch,
              dt.datetime(2026, 11, 29, 12, 0, 0, 1, tzinfo=dt.timezone.utc), None]
    return [
        (LongType(), pa.int64(), longs, longs),
        (IntegerType(), pa.int32(), ints, ints),
        (DateType(), pa.date32(), days, [None if d is None else (d - dt.date(1970, 1, 1)).days for d in days]),
        (TimestamptzType(), pa.timestamp("us", "UTC"), stamps,
         [None if t is None else (t - epoch) // dt.timedelta(microseconds=1) for t in stamps]),
    ]


@pytest.mark.slow
def test_a_sequence_field_is_encoded_alike_by_both_engines(spark: Any) -> None:
    """The sequence_field's ordered text (table_meta/change_order.encoded_sequence_sql), by DuckDB
    (fresh/keyed.py) and Spark (merge/order.py), equals the ingest's own encoding
    (table_meta/changelog.encode_digits) and sorts as the values do."""
    from pyspark.sql.types import StructField, StructType
    from pyspark.sql.types import _parse_datatype_string as spark_type

    from streamberg.fresh.keyed import _encoded
    from streamberg.merge.order import encoded_sequence
    from streamberg.table_meta.change_order import SHIFT
    from streamberg.table_meta.changelog import encode_digits

    spark_types = {"int64": "bigint", "int32": "int", "date32[day]": "date", "timestamp[us, tz=UTC]": "timestamp"}
    for iceberg_type, arrow_type, values, numbers in _encoding_cases():
        want = [None if n is None else encode_digits(str(n + SHIFT)) for n in numbers]
        assert _encoded(pa.array(values, arrow_type), iceberg_type).to_pylist() == want, iceberg_type
        frame = spark.createDataFrame([(v,) for v in values],
                                      StructType([StructField("v{1}", spark_type(spark_types[str(arrow_type)]))]))
        got = [r[0] for r in frame.select(encoded_sequence("v{1}", iceberg_type)).collect()]
        assert got == want, (iceberg_type, got, want)
        known = [(n, e) for n, e in zip(numbers, want, strict=True) if n is not None]
        assert sorted(known) == sorted(known, key=lambda pair: pair[1])  # the text sorts as the numbers
