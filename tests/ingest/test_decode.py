"""The vectorised decoder: every record is decoded or dead-lettered with a reason."""

from __future__ import annotations

import json

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import BinaryType, DateType, DecimalType, LongType, NestedField, StringType, TimestamptzType

from streamberg.ingest.decode import JsonDecoder, UnsupportedSchemaError

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
    "not json": (b"not json", "Invalid value"),
    "wrong type": (json.dumps({"id": "x", "ts": TS}).encode(), "Column(/id) changed from number to string"),
    "missing required": (json.dumps({"ts": TS}).encode(), "missing required field 'id'"),
    "not an object": (b"[1, 2]", "changed from object to array"),
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
