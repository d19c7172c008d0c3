"""Decode cost of the registry formats against JSON, measured as ratios in one run.

    .venv/bin/python scripts/registry_decode_cost.py

The same 5,000 flat sample events written three ways: JSON, Confluent-framed Avro (the real
AvroSerializer) and Confluent-framed Protobuf (the real ProtobufSerializer), through the
registry stand-in of the tests (tests/fixtures/registry.py: no registry server is installable
here). The median time of the ingest's decoder for each (unknown="report", as the ingest
runs it) over 15 batches, and the ratio to JSON. Run it on an idle machine for figures to quote.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import time

from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType

EVENTS = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "ts", TimestamptzType(), required=True),
                NestedField(3, "user_id", StringType(), required=True), NestedField(4, "city", StringType()),
                NestedField(5, "amount", DoubleType()))
BATCH, RUNS = 5_000, 15


def main() -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf.descriptor_pool import DescriptorPool
    from google.protobuf.message_factory import GetMessageClass

    from streamberg.bench.harness import checkout_tests
    from streamberg.common.config.sections import SchemaRegistryConfig
    from streamberg.decode.avro_decode import AvroDecoder
    from streamberg.decode.avro_schema import avro_schema
    from streamberg.decode.json_decode import JsonDecoder
    from streamberg.decode.protobuf_decode import ProtobufDecoder
    from streamberg.decode.protobuf_schema import file_descriptor_proto
    from streamberg.decode.registry import WriterSchemas

    checkout_tests()  # tests.fixtures.registry: the registry stand-in
    from tests.fixtures.registry import start_registry

    registry, server = start_registry()
    try:
        client = SchemaRegistryClient({"url": registry.url})
        context = SerializationContext("cost", MessageField.VALUE)
        now = dt.datetime(2026, 11, 25, 10, tzinfo=dt.timezone.utc)
        events = [{"id": i, "ts": now + dt.timedelta(milliseconds=i), "user_id": f"u{i % 100}",
                   "city": f"city-{i % 1000:04d}", "amount": i * 0.5} for i in range(BATCH)]
        as_json = [json.dumps({**e, "ts": e["ts"].isoformat()}).encode() for e in events]
        avro = AvroSerializer(client, json.dumps(avro_schema(EVENTS)))
        as_avro = [avro(e, context) for e in events]
        pool = DescriptorPool()
        from confluent_kafka.schema_registry.common.protobuf import _init_pool

        _init_pool(pool)
        pool.Add(file_descriptor_proto(EVENTS, "Event", "cost"))
        message = GetMessageClass(pool.FindMessageTypeByName("cost.Event"))
        protobuf = ProtobufSerializer(message, client)
        as_protobuf = []
        for e in events:
            m = message(id=e["id"], user_id=e["user_id"], city=e["city"], amount=e["amount"])
            m.ts.FromDatetime(e["ts"])
            as_protobuf.append(protobuf(m, context))
        schemas = WriterSchemas(SchemaRegistryConfig(url=registry.url))
        decoders = {"JSON": (JsonDecoder(EVENTS, 1 << 20, unknown="report"), as_json),
                    "Avro": (AvroDecoder(EVENTS, 1 << 20, schemas, unknown="report"), as_avro),
                    "Protobuf": (ProtobufDecoder(EVENTS, 1 << 20, schemas, unknown="report"), as_protobuf)}
        medians = {}
        for name, (decoder, values) in decoders.items():
            result = decoder.decode(values)  # warm: the writer schema fetched and matched once
            assert len(result.kept) == BATCH, (name, result.rejected[:3])
            times = []
            for _ in range(RUNS):
                started = time.perf_counter()
                decoder.decode(values)
                times.append(time.perf_counter() - started)
            medians[name] = statistics.median(times)
        base = medians["JSON"]
        print(f"{BATCH:,} flat events, median of {RUNS}, unknown='report':")
        for name, seconds in medians.items():
            print(f"  {name:9} {seconds * 1000:7.1f} ms  {seconds / BATCH * 1e6:5.2f} µs a record  "
                  f"{seconds / base:5.2f}x the JSON decode's time")
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
