"""The vectorised decoder: every record is decoded or dead-lettered with a reason."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    DateType,
    DecimalType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
)

from streamberg.common.errors import UnsupportedSchemaError
from streamberg.decode.json_decode import JsonDecoder

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "ts", TimestamptzType(), required=True),
    NestedField(3, "day", DateType()),
    NestedField(4, "amount", DecimalType(10, 2)),
    NestedField(5, "name", StringType()),
)
TS = "2026-11-21T10:00:00Z"


def good(i: int) -> bytes:
    return json.dumps({"id": i, "ts": TS, "day": "2026-11-21", "amount": 1.25, "name": f"n{i}"}).encode()


CASES = {
    "not json": (b"not json", "not valid JSON"),
    "wrong type": (json.dumps({"id": "x", "ts": TS}).encode(), "Column(/id) changed from number to string"),
    "missing required": (json.dumps({"ts": TS}).encode(), "missing required field 'id'"),
    "not an object": (b"[1, 2]", "not a JSON object: the record is an array"),
    "empty": (b"", "empty or blank value"),
    "blank": (b" \n\t ", "empty or blank value"),
    "two values": (good(1) + b" " + good(2), "more than one JSON value"),
    "bad utf-8": (b'{"id": 1, "ts": "' + TS.encode() + b'", "name": "\xff"}', "not valid UTF-8"),
    "bad date": (json.dumps({"id": 1, "ts": TS, "day": "2026-13-45"}).encode(), "field 'day'"),
    "decimal overflow": (json.dumps({"id": 1, "ts": TS, "amount": 123456789012.5}).encode(), "precision"),
    "oversized": (json.dumps({"id": 1, "ts": TS, "name": "x" * 5000}).encode(), "oversized"),
    "tombstone": (None, "null value"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_record_is_isolated_with_its_reason(case: str) -> None:
    value, reason = CASES[case]
    batch = [good(0), good(1), value, good(3), good(4)]
    result = JsonDecoder(SCHEMA, max_record_bytes=4096).decode(batch)
    assert result.table.column("id").to_pylist() == [0, 1, 3, 4]
    assert list(result.kept) == [0, 1, 3, 4]
    assert [i for i, _ in result.rejected] == [2]
    assert reason in result.rejected[0][1]


def test_many_bad_records_in_one_batch_all_accounted_for() -> None:
    batch = [good(i) for i in range(3000)]
    bad_positions = list(range(7, 3000, 97))
    kinds = [v for v, _ in CASES.values()]
    for n, i in enumerate(bad_positions):
        batch[i] = kinds[n % len(kinds)]
    result = JsonDecoder(SCHEMA, max_record_bytes=4096).decode(batch)
    assert sorted(i for i, _ in result.rejected) == bad_positions
    assert result.table.num_rows + len(result.rejected) == len(batch)
    assert result.table.column("id").to_pylist() == [i for i in range(3000) if i not in set(bad_positions)]


def test_a_blank_and_a_double_record_in_one_block_do_not_misalign_rows() -> None:
    # One record yields no row, another two: the counts cancel out, the rows must not shift.
    batch = [good(0), b"", good(2), good(3) + b" " + good(33), good(4)]
    result = JsonDecoder(SCHEMA, max_record_bytes=4096).decode(batch)
    assert result.table.column("id").to_pylist() == [0, 2, 4]
    assert [i for i, _ in result.rejected] == [1, 3]


def test_values_are_typed_and_newlines_inside_records_are_whitespace() -> None:
    value = b'{"id": 9,\n "ts": "2026-11-21T10:00:00+02:00",\r\n "day": "2026-01-02", "amount": 3.5}'
    row = JsonDecoder(SCHEMA, 4096).decode([value]).table.to_pylist()[0]
    assert row["id"] == 9 and row["ts"].hour == 8 and str(row["day"]) == "2026-01-02" and str(row["amount"]) == "3.50"


def test_decoded_table_carries_iceberg_field_ids() -> None:
    table = JsonDecoder(SCHEMA, 4096).decode([good(1)]).table
    assert [f.metadata[b"PARQUET:field_id"] for f in table.schema] == [b"1", b"2", b"3", b"4", b"5"]


def test_schema_json_cannot_carry_is_refused() -> None:
    with pytest.raises(UnsupportedSchemaError, match="'blob' has type binary"):
        JsonDecoder(Schema(NestedField(1, "blob", BinaryType())), 4096)


def test_maps_with_other_keys_are_refused_before_any_record() -> None:
    from pyiceberg.types import ListType, LongType, MapType, StringType, StructType

    in_list = ListType(3, MapType(4, LongType(), 5, LongType()))  # maps inside lists are read; keys are strings
    with pytest.raises(UnsupportedSchemaError, match="'tags' is map<long, long>: a map read from JSON has string keys"):
        JsonDecoder(Schema(NestedField(1, "id", LongType()), NestedField(2, "tags", in_list)), 4096)
    assert JsonDecoder(Schema(NestedField(2, "tags", ListType(3, MapType(4, StringType(), 5, LongType())))), 4096)
    with pytest.raises(UnsupportedSchemaError, match="'counts' is map<long, long>: a map read from JSON has string keys"):
        JsonDecoder(Schema(NestedField(2, "counts", MapType(4, LongType(), 5, LongType()))), 4096)
    with pytest.raises(UnsupportedSchemaError, match="'meta.blob' has type binary"):
        JsonDecoder(Schema(NestedField(2, "meta", StructType(NestedField(3, "blob", BinaryType())))), 4096)


def test_maps_follow_the_value_rules_and_name_the_map_in_every_refusal() -> None:
    from pyiceberg.types import IntegerType, LongType, MapType, StringType, StructType, TimestamptzType

    seen = MapType(12, StringType(), 13, StructType(NestedField(14, "at", TimestamptzType()),
                                                     NestedField(15, "n", IntegerType(), required=True)))
    schema = Schema(NestedField(1, "id", LongType(), required=True),
                    NestedField(2, "attrs", MapType(10, StringType(), 11, LongType(), value_required=False)),
                    NestedField(3, "meta", StructType(NestedField(4, "seen", seen), NestedField(5, "name", StringType()))))
    decoder = JsonDecoder(schema, 1 << 20, {"meta.seen.at": "s"})
    values = [
        b'{"id": 1, "attrs": {"a": 1, "b": null}, "meta": {"seen": {"x": {"at": 1700000000, "n": 3}, '
        b'"y": {"at": "2026-01-01T00:00:00Z", "n": 4}}, "name": "m", "zz": {"q": 1}}}',
        b'{"id": 2, "attrs": {}, "meta": null}',
        b'{"id": 3, "attrs": {"a": 1, "a": 2}}',
        b'{"id": 4, "attrs": {"a": "x"}}',
        b'{"id": 5, "attrs": [1]}',
        b'{"id": 6, "meta": {"seen": {"z": {"n": 99999999999}}}}',
        b'{"id": 7, "meta": {"seen": {"z": {"at": 5}}}}',
        b'{"id": 8, "attrs": {"a": 1}, "attrs": {"b": 2}}',
        b'{"id": 9, "attrs": {"k": 1.0}}',
    ]
    result = decoder.decode(values)
    rows = {r["id"]: r for r in result.table.to_pylist()}
    assert set(rows) == {1, 2}
    assert rows[1]["attrs"] == [("a", 1), ("b", None)]
    at = {k: v["at"].timestamp() for k, v in rows[1]["meta"]["seen"]}
    assert at == {"x": 1_700_000_000, "y": 1_767_225_600}  # each value its own epoch-or-ISO form
    assert rows[2]["attrs"] == [] and rows[2]["meta"] is None
    reasons = dict(result.rejected)
    assert reasons[2] == "field 'attrs': key 'a' twice in one map"
    assert "Column(/attrs) changed from number to string" in reasons[3]
    assert reasons[4] == "field 'attrs': not a JSON object (a map is read from an object)"
    assert reasons[5] == "field 'meta.seen.n': integer out of range for int"
    assert reasons[6] == "missing required field 'meta.seen.n'"
    assert reasons[7] == "not valid JSON for the schema: field 'attrs' twice"
    assert "1.0" in reasons[8]
    assert result.table.schema.field("attrs").type.key_field.name == "key"


# -- epoch timestamps ----------------------------------------------------------------------
EPOCH_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "ts", TimestamptzType(), required=True),
    NestedField(3, "local", TimestampType()),
)
WHEN = datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=timezone.utc)
WHEN_US = (WHEN - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)


@pytest.mark.parametrize(("unit", "value", "expected_us"), [
    ("s", WHEN_US // 10**6, WHEN_US // 10**6 * 10**6),
    ("ms", WHEN_US // 10**3, WHEN_US // 10**3 * 10**3),
    ("us", WHEN_US, WHEN_US),
    ("ns", WHEN_US * 1000 + 999, WHEN_US),  # floored to microseconds
    ("ms", -1, -1000),  # before 1970
])
def test_integer_epochs_are_read_in_the_fields_unit(unit: str, value: int, expected_us: int) -> None:
    decoder = JsonDecoder(EPOCH_SCHEMA, 4096, {"ts": unit, "local": unit})
    result = decoder.decode([json.dumps({"id": 1, "ts": value, "local": value}).encode()])
    assert result.rejected == []
    row = result.table.cast(pa.schema([("id", pa.int64()), ("ts", pa.int64()), ("local", pa.int64())])).to_pylist()[0]
    assert row == {"id": 1, "ts": expected_us, "local": expected_us}


def test_epoch_ms_is_the_default_and_iso_strings_mix_with_epochs_in_one_batch() -> None:
    ms = WHEN_US // 1000
    batch = [json.dumps({"id": i, "ts": ms if i % 2 else "2026-11-21T10:00:00.123Z", "local": i % 3 and ms or None}).encode()
             for i in range(10)]
    # A key spelled with an escape defeats the byte-level guess of which fields hold numbers.
    batch.append(b'{"id": 10, "t\\u0073": ' + str(ms).encode() + b'}')
    batch.append(b'{"id": 11, "ts": "2026-11-21T10:00:00.123Z", "meta": {"ts": 5}}')  # a nested "ts" key
    result = JsonDecoder(EPOCH_SCHEMA, 4096).decode(batch)
    assert result.rejected == []
    assert result.table.column("id").to_pylist() == list(range(12))
    assert set(result.table.column("ts").to_pylist()) == {WHEN.replace(microsecond=123000)}


@pytest.mark.parametrize(("value", "reason"), [
    (253402300800000, "epoch (ms) outside years 0001-9999"),
    (-62135596800001, "epoch (ms) outside years 0001-9999"),
    (2 ** 63, "couldn't parse"),
    (1.7e12, "couldn't parse"),
    (True, "changed from string to boolean"),
    ("2026-02-30T00:00:00Z", "not an ISO-8601 timestamp"),
    ("0000-12-31T23:00:00Z", "not an ISO-8601 timestamp"),
    ("0001-01-01T00:30:00+01:00", "not an ISO-8601 timestamp"),  # before year 1 in UTC
    ("2026-11-21T10:00:00+24:00", "not an ISO-8601 timestamp"),
])
def test_out_of_range_or_malformed_timestamps_are_dead_lettered(value: object, reason: str) -> None:
    batch = [json.dumps({"id": 0, "ts": 0}).encode(), json.dumps({"id": 1, "ts": value}).encode()]
    result = JsonDecoder(EPOCH_SCHEMA, 4096).decode(batch)
    assert result.table.column("id").to_pylist() == [0]
    assert len(result.rejected) == 1 and reason in result.rejected[0][1], result.rejected


def test_unknown_epoch_unit_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown epoch unit 'millis'"):
        JsonDecoder(EPOCH_SCHEMA, 4096, {"ts": "millis"})


# -- what the screen takes out before the parse ----------------------------------------------
@pytest.mark.parametrize(("value", "reason"), [
    (b"  null  ", "not a JSON object: the record is null"),
    (b"true", "not a JSON object: the record is a boolean"),
    (b"-1.5", "not a JSON object: the record is a number"),
    (b'"x"', "not a JSON object: the record is a string"),
    (b"\xef\xbb\xbf" + good(2), "byte order mark"),
    (good(2)[:-1] + b', "x": "a\x00b"}', "NUL byte"),
    (good(2)[:-1] + b', "amount": NaN}', "NaN and Infinity"),
    (good(2)[:-1] + b', "extra": [-Infinity]}', "NaN and Infinity"),
    (good(2) + b" x", "not a single JSON object"),
    (good(2)[:-1], "not a single JSON object"),
    (good(2)[:-1] + b', "note": "\\ud800"}', "surrogate"),
    (good(2)[:-1] + b', "name": "\xed\xa0\x80"}', "not valid UTF-8"),
    (good(2)[:-1] + b', "id": 3}', "specified twice"),
    (good(2)[:-1] + b', "name": "a\nb"}', "not valid JSON"),  # a raw line end inside a string
])
def test_screened_records_are_isolated_with_their_reason(value: bytes, reason: str) -> None:
    batch = [good(0), good(1), value, good(3)]
    result = JsonDecoder(SCHEMA, 4096).decode(batch)
    assert result.table.column("id").to_pylist() == [0, 1, 3]
    assert [i for i, _ in result.rejected] == [2] and reason in result.rejected[0][1], result.rejected


def test_nan_inside_strings_and_unknown_duplicates_are_fine() -> None:
    value = json.dumps({"id": 2, "ts": TS, "name": 'NaN " Infinity'}).encode()[:-1] + b', "zz": 1, "zz": {"a": 1, "a": 2}}'
    result = JsonDecoder(SCHEMA, 4096).decode([value])
    assert result.rejected == [] and result.table.column("name").to_pylist() == ['NaN " Infinity']


def test_values_pyarrow_would_let_through_are_checked_per_row() -> None:
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "amount", DecimalType(10, 2)),
                    NestedField(3, "ratio", FloatType()), NestedField(4, "n", IntegerType()))
    batch = [b'{"id": 0, "amount": 1234567890}',  # pyarrow reads it into decimal(10,2) unchecked
             b'{"id": 1, "amount": 99999999.990}',  # written with 11 digits, fits at scale 2
             b'{"id": 2, "ratio": 1e39}',  # infinite as a 32-bit float
             b'{"id": 3, "n": 2147483648}',
             b'{"id": 4, "amount": "12.50", "ratio": 0.5, "n": -2147483648}']
    result = JsonDecoder(schema, 4096).decode(batch)
    assert result.table.column("id").to_pylist() == [1, 4]
    assert [str(v) for v in result.table.column("amount").to_pylist()] == ["99999999.99", "12.50"]
    reasons = dict(result.rejected)
    assert "precision" in reasons[0] and "finite float" in reasons[2] and "out of range for int" in reasons[3]


@pytest.mark.parametrize(("unknown", "per_bad"), [("ignore", 4), ("report", 6)])
def test_many_bad_records_cost_a_few_parses_each(unknown: str, per_bad: int) -> None:
    # Reporting fields the schema lacks, a refused record is parsed alone once more without
    # inference (to tell whether the inference refused it): a few parses each still.
    decoder = JsonDecoder(SCHEMA, 4096, unknown=unknown)
    calls = []
    parse = decoder._parse
    decoder._parse = lambda lines, numbers, infer=True: calls.append(len(lines)) or parse(lines, numbers, infer)  # count
    batch = [good(i) if i % 4 else json.dumps({"id": "x", "ts": TS}).encode() for i in range(2000)]
    result = decoder.decode(batch)
    assert len(result.rejected) == 500
    assert len(calls) <= per_bad * 500 + 10
    assert sum(calls) <= 20 * len(batch)  # records parsed, summed over all attempts: not quadratic


@pytest.mark.parametrize("batch", [[], [b""], [None], [b"", None, b"  "]])
def test_degenerate_batches(batch: list) -> None:
    result = JsonDecoder(SCHEMA, 4096).decode(batch)
    assert result.table.num_rows == 0 and [i for i, _ in result.rejected] == list(range(len(batch)))


def test_rows_stay_in_input_order_when_records_are_retried_with_the_other_timestamp_type() -> None:
    ms = WHEN_US // 1000
    batch = [json.dumps({"id": 0, "ts": ms}).encode(),
             b'{"id": 1, "t\\u0073": ' + str(ms).encode() + b'}',  # guessed string, retried as a number
             json.dumps({"id": 2, "ts": ms}).encode(),
             b'{"id": 3, "t\\u0073": ' + str(ms).encode() + b'}']
    result = JsonDecoder(EPOCH_SCHEMA, 4096).decode(batch)
    assert result.rejected == []
    assert result.table.column("id").to_pylist() == [0, 1, 2, 3] and list(result.kept) == [0, 1, 2, 3]


def test_valid_records_that_only_look_like_huge_exponents_are_taken() -> None:
    """Hex ids ("9fe12345ab"), escaped characters and many line items (600 brackets in all,
    3 levels deep) in a schema with a decimal field: all valid, all kept. Each used to be a
    "huge exponent" suspect, and suspects with over 500 brackets in total were refused."""
    decoder = JsonDecoder(SCHEMA, max_record_bytes=1 << 22)
    items = [{"sku": f"sku-{i:x}e12345", "qty": i, "note": "[{"} for i in range(600)]
    batch = [
        json.dumps({"id": 1, "ts": TS, "amount": 1.25, "name": "9fe12345ab"}).encode(),
        json.dumps({"id": 2, "ts": TS, "amount": 2.5, "name": "caf\u00e9 \\u0065"}, ensure_ascii=True).encode(),
        json.dumps({"id": 3, "ts": TS, "amount": 3.75, "order": {"items": items}, "name": "x"}).encode(),
        json.dumps({"id": 4, "ts": TS, "amount": 4, "order": {"items": items}, "ref": "\\u0065"}).encode(),
    ]
    result = decoder.decode(batch)
    assert result.rejected == [] and result.table.column("id").to_pylist() == [1, 2, 3, 4]


def test_a_huge_exponent_is_still_refused_at_any_depth_and_deep_suspects_unchecked() -> None:
    decoder = JsonDecoder(SCHEMA, max_record_bytes=1 << 22)
    deep = b'{"id": 3, "ts": "' + TS.encode() + b'", "x": ' + b"[" * 600 + b'"1e99999"' + b"]" * 600 + b"}"
    brackets_in_strings = json.dumps({"id": 4, "ts": TS, "name": "[" * 600, "ref": "1e99999"}).encode()
    batch = [json.dumps({"id": 1, "ts": TS, "a": {"b": [{"c": 1e-5, "d": "-1.5E+100000"}]}}).encode(),
             b'{"id": 2, "ts": "' + TS.encode() + b'", "a": [{"b" : 2e-100000 }]}', deep, brackets_in_strings]
    result = decoder.decode(batch)
    reasons = dict(result.rejected)
    assert sorted(reasons) == [0, 1, 2, 3]
    assert "exponent of 10,000 or more" in reasons[0] and "exponent of 10,000 or more" in reasons[1]
    assert "nested too deeply" in reasons[2] or "nest" in reasons[2]
    assert "exponent of 10,000 or more" in reasons[3]  # checked (3 levels), not refused as deep


def test_a_new_field_holding_lists_of_nulls_is_no_crash() -> None:
    """pyarrow 16 infers a list of several JSON nulls with values shorter than its offsets; the
    search for fields the schema lacks used to fail on it and stop the ingest (found by the
    change-event fuzz, tests/cdc/test_envelopes.py)."""
    schema = Schema(NestedField(1, "id", LongType(), required=True))
    decoder = JsonDecoder(schema, 1 << 20, unknown="report")
    result = decoder.decode([b'{"id": 1, "x": [null, null]}', b'{"id": 2, "y": {"z": [null, null, null]}}',
                             b'{"id": 3, "w": [{"a": [null, null], "b": 5}]}', b'{"id": 4}'])
    assert result.kept.tolist() == [0, 1, 2, 3] and not result.rejected
    # Nulls carry no type (nothing to add); the struct beside them does.
    assert [(u.path, u.rows.tolist()) for u in result.unknown] == [(("w",), [2])]
