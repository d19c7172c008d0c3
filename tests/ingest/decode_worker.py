"""Child process for the decoder fuzz suite: decodes batches sent over a pipe.

A native crash or hang in the decoder then kills this process, not pytest: the test sees the
dead pipe, saves the batch and fails. Protocol: 8-byte length + pickle both ways; the request
is (schema name, batch), the reply (kept indexes, rejected (index, reason) pairs, rows).

Replay a saved batch in-process:
    .venv/bin/python -m tests.ingest.decode_worker --replay BATCH.pkl
"""

from __future__ import annotations

import pickle
import struct
import sys
from typing import BinaryIO

from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

# Two schemas: one with required fields, one where every field is optional (so `{}` and a
# stray `null` row would be accepted silently if the screen let them through).
SCHEMAS = {
    "events": Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "ts", TimestamptzType(), required=True),
        NestedField(3, "at", TimestampType()),
        NestedField(4, "t_us", TimestamptzType()),
        NestedField(5, "t_ns", TimestampType()),
        NestedField(6, "day", DateType()),
        NestedField(7, "amount", DecimalType(10, 2)),
        NestedField(8, "big", DecimalType(38, 6)),
        NestedField(9, "small", IntegerType()),
        NestedField(10, "ratio", FloatType()),
        NestedField(11, "score", DoubleType()),
        NestedField(12, "flag", BooleanType()),
        NestedField(13, "name", StringType()),
    ),
    "loose": Schema(
        NestedField(1, "id", LongType()),
        NestedField(2, "ts", TimestamptzType()),
        NestedField(3, "name", StringType()),
        NestedField(4, "amount", DecimalType(5, 0)),
    ),
    # The orders shape: structs in structs, a list of strings, a list of structs (with a
    # required field, a decimal and a timestamp inside its elements), and one whose elements
    # are required.
    "orders": Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "ts", TimestamptzType(), required=True),
        NestedField(3, "customer", StructType(
            NestedField(10, "cid", LongType(), required=True),
            NestedField(11, "since", TimestamptzType()),
            NestedField(12, "geo", StructType(NestedField(13, "city", StringType()), NestedField(14, "lat", DoubleType()))),
        )),
        NestedField(4, "tags", ListType(20, StringType(), element_required=False)),
        NestedField(5, "items", ListType(21, StructType(
            NestedField(30, "sku", StringType(), required=True),
            NestedField(31, "qty", IntegerType()),
            NestedField(32, "price", DecimalType(10, 2)),
            NestedField(33, "at", TimestampType()),
            NestedField(34, "day", DateType()),
        ), element_required=False)),
        NestedField(6, "flags", ListType(22, BooleanType(), element_required=True)),
        # Maps: at the top, inside a struct, with struct values (a timestamp inside).
        NestedField(7, "attrs", MapType(23, StringType(), 24, LongType(), value_required=False)),
        NestedField(8, "meta", StructType(
            NestedField(40, "labels", MapType(41, StringType(), 42, StringType(), value_required=True)),
            NestedField(43, "seen", MapType(44, StringType(), 45, StructType(
                NestedField(46, "at", TimestamptzType()), NestedField(47, "n", IntegerType(), required=True)),
                value_required=False)),
        )),
        # Maps inside lists: a list of structs holding a map, and a list of maps.
        NestedField(9, "lines", ListType(50, StructType(
            NestedField(51, "sku", StringType()),
            NestedField(52, "opts", MapType(53, StringType(), 54, IntegerType(), value_required=False))),
            element_required=False)),
        NestedField(15, "grid", ListType(55, MapType(56, StringType(), 57, DoubleType(), value_required=True),
                                         element_required=True)),
    ),
}
UNITS = {"events": {"ts": "ms", "at": "s", "t_us": "us", "t_ns": "ns"}, "loose": {"ts": "s"},
         "orders": {"customer.since": "s", "items.at": "us", "meta.seen.at": "ms"}}
MAX_RECORD_BYTES = 4 << 20


HEADER = struct.Struct("<Q")  # a message's length, before its pickle


def frame(obj: object) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def send(stream: BinaryIO, obj: object) -> None:
    stream.write(frame(obj))
    stream.flush()


def receive(stream: BinaryIO) -> object:
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        raise EOFError("pipe closed")
    (size,) = HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("pipe closed")
    return pickle.loads(data)


def decode(schema_name: str, batch: list[bytes | None]) -> tuple[list[int], list[tuple[int, str]], list[dict]]:
    from streamberg.decode.json_decode import JsonDecoder
    from tests.ingest.json_oracle import normalise_table

    if schema_name == "hang":  # a child that never answers, to show the harness stops waiting
        import time

        time.sleep(3600)
    if schema_name == "raw-pyarrow":  # the bare parser, to show the harness catches its crash
        import pyarrow as pa
        import pyarrow.json as pj

        pj.read_json(pa.BufferReader(b"\n".join(v or b"" for v in batch) + b"\n"))
        return [], [], []

    # "<schema>:report": the ingest's mode, which also names the fields the schema lacks; the
    # reply then carries the rows holding such fields as a fourth item.
    name, _, mode = schema_name.partition(":")
    decoder = JsonDecoder(SCHEMAS[name], MAX_RECORD_BYTES, UNITS[name], unknown="report" if mode else "ignore")
    result = decoder.decode(batch)
    reply = [int(i) for i in result.kept], result.rejected, normalise_table(result.table)
    if mode:
        return (*reply, [int(i) for i in result.rows_with_unknown()])  # type: ignore[return-value]
    return reply


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--replay":
        with open(sys.argv[2], "rb") as f:
            schema_name, batch = pickle.load(f)
        kept, rejected = decode(schema_name, batch)[:2]
        print(f"decoded {len(batch)} records: {len(kept)} kept, {len(rejected)} rejected")
        return
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the reply pipe
    while True:
        try:
            schema_name, batch = receive(stdin)
        except EOFError:
            return
        send(stdout, decode(schema_name, batch))


if __name__ == "__main__":
    main()
