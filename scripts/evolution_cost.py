"""Cost of schema evolution in the decoder, measured as ratios in one run.

    .venv/bin/python scripts/evolution_cost.py

For 5,000-record batches of the sample events (flat) and of nested orders (structs, lists of
structs), the median decode time of the ingest's decoder (unknown="report": fields the schema
lacks found and typed in the same parse) against the plain one (unknown="ignore") on the same
batch: clean batches, batches where 10% and 100% of the records carry a field the schema lacks
(the first interval after a producer adds one, before the committer added it), and a batch
where 10% carry two values of different JSON types for a new field in one record each (each
parsed alone). Ratios inside one run; run it on an idle machine for figures to quote.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable

from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, ListType, LongType, NestedField, StringType, StructType, TimestamptzType

from streamberg.decode.json_decode import JsonDecoder

FLAT = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "ts", TimestamptzType(), required=True),
              NestedField(3, "user_id", StringType(), required=True), NestedField(4, "city", StringType()),
              NestedField(5, "amount", DoubleType()))
NESTED = Schema(
    NestedField(1, "id", LongType(), required=True), NestedField(2, "ts", TimestamptzType(), required=True),
    NestedField(3, "customer", StructType(NestedField(4, "cid", LongType()), NestedField(5, "city", StringType()))),
    NestedField(6, "items", ListType(7, StructType(NestedField(8, "sku", StringType()), NestedField(9, "qty", LongType())),
                                     element_required=False)))


def flat(rng: random.Random, i: int) -> dict:
    return {"id": i, "ts": f"2026-11-21T10:{i % 60:02d}:00Z", "user_id": f"u{rng.randint(0, 9999)}",
            "city": rng.choice(["Paris", "Oslo", "Lima"]), "amount": round(rng.uniform(0, 500), 2)}


def nested(rng: random.Random, i: int) -> dict:
    return {"id": i, "ts": f"2026-11-21T10:{i % 60:02d}:00Z", "customer": {"cid": i % 97, "city": "Oslo"},
            "items": [{"sku": f"s{k}", "qty": k + 1} for k in range(rng.randint(0, 4))]}


def with_new_field(record: dict, shape: str) -> dict:
    if shape == "flat":
        return {**record, "device": {"os": "android", "version": 14}}
    return {**record, "customer": {**record["customer"], "email": "a@b.c"},
            "items": [{**it, "color": "red"} for it in record["items"]]}


def median_seconds(fn: Callable[[], object], repeat: int = 15) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    for shape, schema, make in (("flat", FLAT, flat), ("nested", NESTED, nested)):
        rng = random.Random(0)
        records = [make(rng, i) for i in range(5000)]
        plain, report = JsonDecoder(schema, 1 << 20), JsonDecoder(schema, 1 << 20, unknown="report")
        batches = {
            "clean": [json.dumps(r).encode() for r in records],
            "10% carry a new field": [json.dumps(with_new_field(r, shape) if i % 10 == 0 else r).encode()
                                      for i, r in enumerate(records)],
            "100% carry a new field": [json.dumps(with_new_field(r, shape)).encode() for r in records],
            "10% mix two types in a new field": [json.dumps({**r, "odd": [1, "a"]} if i % 10 == 0 else r).encode()
                                                 for i, r in enumerate(records)],
        }
        base = None
        for name, batch in batches.items():
            t_plain = median_seconds(lambda batch=batch, plain=plain: plain.decode(batch))
            t_report = median_seconds(lambda batch=batch, report=report: report.decode(batch))
            base = base or t_plain
            print(f"{shape:6} {name:34} plain {t_plain * 1e3:7.2f} ms  report {t_report * 1e3:7.2f} ms  "
                  f"= {t_report / t_plain:.2f}x plain ({t_report / base:.2f}x the clean plain batch)")


if __name__ == "__main__":
    main()
