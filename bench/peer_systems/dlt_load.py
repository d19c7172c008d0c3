"""dlt with the dlt-iceberg destination (its documented local SQLite catalog): the topic's
backlog as one dlt resource, loaded in one run (one commit). `--arrow` yields pyarrow
tables (dlt's fast path), else one dict per record (dlt's common path)."""

from __future__ import annotations

import argparse
import io
import json

# kafka_backlog: this folder is the script's own, first on the import path when it runs
from kafka_backlog import batches


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "topic", "catalog", "warehouse", "pipelines"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--arrow", action="store_true")
    args = parser.parse_args()

    import dlt
    import pyarrow as pa
    import pyarrow.json as pj
    from dlt_iceberg import iceberg_rest

    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("user_id", pa.string()),
                        ("city", pa.string()), ("amount", pa.float64())])
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")

    @dlt.resource(name="events", write_disposition="append")
    def events():
        for values in batches(args.bootstrap, args.topic, args.partitions, args.records):
            if args.arrow:
                yield pj.read_json(io.BytesIO(b"\n".join(values)), parse_options=options)
            else:
                yield [json.loads(v) for v in values]

    pipeline = dlt.pipeline(pipeline_name="peer_bench", pipelines_dir=args.pipelines, destination=iceberg_rest(
        catalog_uri=f"sqlite:///{args.catalog}", warehouse=f"file://{args.warehouse}", namespace="bench"))
    pipeline.run(events())


if __name__ == "__main__":
    main()
