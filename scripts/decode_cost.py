"""Cost of the JSON decoder's byte screen, and of bad records, measured as ratios in one run.

    .venv/bin/python scripts/decode_cost.py

Prints, for a clean 5,000-record batch of the sample events (timestamps as ISO strings and as
epoch ms), the median time of `JsonDecoder.screen` against the whole `JsonDecoder.decode`
(which includes the screen), then the decode time of batches with 1% and 50% bad records
relative to the clean one. Ratios inside one run, so a loaded machine skews them less than
absolute times; still, run it on an idle machine for figures to quote.
"""

from __future__ import annotations

import json
import random
import statistics
import time

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType

from streamberg.decode.json_decode import JsonDecoder

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "ts", TimestamptzType(), required=True),
                NestedField(3, "user_id", StringType(), required=True), NestedField(4, "city", StringType()),
                NestedField(5, "amount", DoubleType()))


def event(rng: random.Random, i: int, form: str) -> bytes:
    ts = f"2026-11-21T10:{i % 60:02d}:00.{i % 1000:03d}Z" if form == "iso" else 1_763_719_200_000 + i
    return json.dumps({"id": i, "ts": ts, "user_id": f"u{rng.randint(0, 9999)}",
                       "city": rng.choice(["Paris", "Oslo", "Lima"]), "amount": round(rng.uniform(0, 500), 2)}).encode()


def median_seconds(fn, repeat: int = 30) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    rng = random.Random(0)
    decoder = JsonDecoder(SCHEMA, 1 << 20)
    for form in ("iso", "epoch-ms"):
        batch = [event(rng, i, form) for i in range(5000)]
        raw = pa.array(batch, pa.binary())
        screen = median_seconds(lambda raw=raw: decoder.screen(raw))
        decode = median_seconds(lambda batch=batch: decoder.decode(batch))
        print(f"clean batch, ts as {form}: screen {screen * 1e3:.2f} ms / decode {decode * 1e3:.2f} ms = {screen / decode:.3f}")
        for share in (0.01, 0.5):
            # Same timestamp form as the batch, so the bad records share its parse block.
            bad = json.dumps({"id": "x", "ts": json.loads(batch[0])["ts"], "user_id": "u"}).encode()
            every = round(1 / share)
            mixed = [bad if i % every == 0 else v for i, v in enumerate(batch)]
            slow = median_seconds(lambda mixed=mixed: decoder.decode(mixed), repeat=3)
            print(f"  {share:.0%} wrong-type records: decode {slow * 1e3:.1f} ms = {slow / decode:.1f}x the clean batch, "
                  f"{slow / (len(batch) * share) * 1e3:.2f} ms per bad record")


if __name__ == "__main__":
    main()
