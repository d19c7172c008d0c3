"""Quix Streams' IcebergSink (AWS Glue with S3 only; moto's server stands in for both, as in
the product's Glue tests): the topic read by a Quix application with JSON values, sunk into an
unpartitioned table, one append per partition per checkpoint (`--interval` seconds)."""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "topic", "endpoint", "bucket", "table"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args()

    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import NestedField, Schema
    from pyiceberg.types import StringType, TimestampType
    from quixstreams import Application
    from quixstreams.sinks.community.iceberg import AWSIcebergConfig, IcebergSink

    config = AWSIcebergConfig(aws_s3_uri=f"s3://{args.bucket}/{args.table.replace('.', '/')}", aws_region="us-east-1",
                              aws_access_key_id="bench", aws_secret_access_key="bench-secret")
    config.auth.update({"glue.endpoint": args.endpoint, "s3.endpoint": args.endpoint, "s3.path-style-access": "true",
                        "s3.region": "us-east-1", "s3.access-key-id": "bench", "s3.secret-access-key": "bench-secret"})
    schema = Schema(NestedField(1, "_timestamp", TimestampType(), required=False),
                    NestedField(2, "_key", StringType(), required=False))
    sink = IcebergSink(table_name=args.table, config=config, data_catalog_spec="aws_glue", schema=schema,
                       partition_spec=PartitionSpec())
    # tansu answers JoinGroup after about half the session timeout (TOOLCHAIN.md).
    app = Application(broker_address=args.bootstrap, consumer_group="peer-bench-quix", auto_offset_reset="earliest",
                      commit_interval=args.interval, consumer_extra_config={"session.timeout.ms": 6000},
                      loglevel="WARNING")
    frame = app.dataframe(topic=app.topic(args.topic, value_deserializer="json"))
    frame.sink(sink)
    app.run(count=args.records)


if __name__ == "__main__":
    main()
