"""The bench's reference: consume -> pyarrow.json -> one Parquet file. No commit, no
catalog, no dead letters: the floor any ingest is measured against."""

from __future__ import annotations

import argparse
import io

import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

# kafka_backlog: this folder is the script's own, first on the import path when it runs
from kafka_backlog import batches


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "topic", "out"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--records", type=int, required=True)
    args = parser.parse_args()
    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("user_id", pa.string()),
                        ("city", pa.string()), ("amount", pa.float64())])
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    writer = pq.ParquetWriter(args.out, schema)
    pending: list[pa.Table] = []
    for values in batches(args.bootstrap, args.topic, args.partitions, args.records):
        pending.append(pj.read_json(io.BytesIO(b"\n".join(values)), parse_options=options))
        if sum(t.num_rows for t in pending) >= 131072:
            writer.write_table(pa.concat_tables(pending))
            pending = []
    if pending:
        writer.write_table(pa.concat_tables(pending))
    writer.close()


if __name__ == "__main__":
    main()
