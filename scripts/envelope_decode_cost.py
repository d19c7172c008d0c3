"""Decode cost of Debezium change events against the append decode of the same bytes, in one run.

    .venv/bin/python scripts/envelope_decode_cost.py [--connector none|postgresql|mysql]

5,000 Debezium update events (bare JSON, about 280 bytes each; `source` as the connector
writes it: none is a source without a `connector`, ordered by ts_ms) decoded by the change-log
decoder (decode/envelopes/changes.py, kafka.envelope debezium) and by the JSON decoder an append table
of the same events uses (decode/json_decode.py); the median time of each over 15 batches, per
record, and the ratio. Run it on an idle machine for figures to quote.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from streamberg.common.config import StreambergConfig
from streamberg.common.schema import schema_from_config
from streamberg.decode.envelopes import record_decoder
from streamberg.decode.json_decode import JsonDecoder
from streamberg.table_meta.changelog import changelog_config

USERS = [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string", "required": True},
         {"name": "score", "type": "long"}, {"name": "city", "type": "string"}, {"name": "updated", "type": "long"}]
ROW = "struct<id:long,name:string,score:long,city:string,updated:long>"
EVENTS = [{"name": "before", "type": ROW}, {"name": "after", "type": ROW},
          {"name": "op", "type": "string", "required": True}, {"name": "ts_ms", "type": "long"},
          {"name": "source", "type": "struct<ts_ms:long,lsn:long,db:string,table:string,connector:string,"
                                    "sequence:string,server_id:long,file:string,pos:long,row:long>"}]
BATCH, RUNS = 5_000, 15


def _median_seconds(run) -> float:
    times = []
    for _ in range(RUNS):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _source(connector: str, i: int) -> dict:
    source = {"ts_ms": 1_764_000_000_000 + i, "lsn": i, "db": "shop", "table": "users"}
    if connector == "postgresql":  # Debezium's own `sequence`: [last committed LSN, LSN] as text
        source.update(connector="postgresql", sequence=json.dumps([str(1000 + i), str(1001 + i)]))
    elif connector == "mysql":
        source.update(connector="mysql", server_id=1, file="mysql-bin.000003", pos=4 + i, row=0)
    return source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connector", choices=("none", "postgresql", "mysql"), default="postgresql")
    args = parser.parse_args()
    cdc = StreambergConfig(kafka={"topic": "t", "envelope": "debezium"},
                           table={"identifier": "db.users", "primary_key": ["id"], "schema": USERS})
    view = changelog_config(cdc)
    changes = record_decoder(view, schema_from_config(view.table))
    append = StreambergConfig(kafka={"topic": "t"}, table={"identifier": "db.events", "schema": EVENTS})
    rows = JsonDecoder(schema_from_config(append.table), 1 << 20, unknown="report")
    events = []
    for i in range(BATCH):
        before = {"id": i, "name": f"user-{i}", "score": i * 7, "city": "ams", "updated": i}
        events.append(json.dumps({"before": before, "after": {**before, "score": 1, "updated": i + 1}, "op": "u",
                                  "ts_ms": 1_764_000_000_000 + i,
                                  "source": _source(args.connector, i)},
                                 separators=(",", ":")).encode())
    positions = ([0] * BATCH, list(range(BATCH)))
    assert changes.decode(events, None, positions).table.num_rows == BATCH
    assert rows.decode(events).table.num_rows == BATCH
    change_s = _median_seconds(lambda: changes.decode(events, None, positions))
    append_s = _median_seconds(lambda: rows.decode(events))
    print(f"{BATCH:,} Debezium events ({args.connector} source), {sum(map(len, events)) / BATCH:.0f} bytes each, "
          f"median of {RUNS}:")
    print(f"  change-log decode  {change_s / BATCH * 1e6:6.2f} us a record")
    print(f"  append decode      {append_s / BATCH * 1e6:6.2f} us a record (the same events as rows of their own)")
    print(f"  ratio              {change_s / append_s:.2f}x")


if __name__ == "__main__":
    main()
