"""A sample JSON event generator for demos, tests and benchmarks.

Events follow the table schema in the config: a field named `id` gets a unique, increasing
number (so tests can compare id multisets), temporal fields get the produce time (so
freshness can be measured), strings come from small vocabularies (so clustering has
something to work with). A fraction of records can be made malformed on purpose, cycling
through the kinds of bad input the ingest must dead-letter.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from streamberg.common.config import FieldConfig, StreambergConfig
from streamberg.common.config.types import FieldSpec, ListOf, MapOf, StructOf, TypeSpec
from streamberg.common.kafka_settings import connection_settings

# The event shape of the demo (examples/demo.yaml), the tests and the benchmarks.
SAMPLE_EVENT_SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "ts", "type": "timestamptz", "required": True},
    {"name": "user_id", "type": "string", "required": True},
    {"name": "city", "type": "string"},
    {"name": "amount", "type": "double"},
]

BAD_KINDS = ("not_json", "wrong_type", "missing_required", "oversized", "not_an_object")
# Registry-framed (Avro, Protobuf) events: another magic byte, a record cut in half.
FRAMED_BAD_KINDS = ("bad_magic", "truncated")


@dataclass
class ProduceResult:
    produced: int = 0
    bytes: int = 0  # the values' bytes, for MB/s figures
    valid_ids: list[int] = field(default_factory=list)
    bad: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "produced": self.produced,
            "valid": self.produced - sum(self.bad.values()),
            "malformed": dict(self.bad),
            "seconds": round(self.seconds, 3),
            "records_per_second": round(self.produced / self.seconds) if self.seconds else None,
        }


def _value_maker(f: FieldConfig | FieldSpec, rng: random.Random) -> Callable[[int, float], Any]:
    return _maker(f.name, (f.field_spec if isinstance(f, FieldConfig) else f).type, rng)


def event_fields(config: StreambergConfig) -> tuple[FieldSpec, ...]:
    """The fields events carry: the config's schema, or the table's when the config has none."""
    if config.table.field_specs:
        return config.table.field_specs
    from streamberg.common.catalog import shared_catalog
    from streamberg.common.schema import field_specs

    return field_specs(shared_catalog(config.catalog).load_table(config.table.identifier).schema().fields)


def _maker(name: str, spec: TypeSpec, rng: random.Random) -> Callable[[int, float], Any]:
    """Values of one type: nested types are built from their parts (a struct's fields, up to
    three list elements or map entries)."""
    if isinstance(spec, StructOf):
        parts = {f.name: _maker(f.name, f.type, rng) for f in spec.fields}
        return lambda i, now: {k: make(i, now) for k, make in parts.items()}
    if isinstance(spec, ListOf):
        element = _maker(name, spec.element, rng)
        return lambda i, now: [element(i, now) for _ in range(rng.randrange(4))]
    if isinstance(spec, MapOf):
        value = _maker(name, spec.value, rng)
        return lambda i, now: {f"{name}-{rng.randrange(20):02d}": value(i, now) for _ in range(rng.randrange(4))}
    kind = str(spec)
    if name == "id" and kind in ("long", "int"):
        return lambda i, now: i
    if kind in ("int", "long"):
        return lambda i, now: rng.randrange(0, 10_000)
    if kind in ("float", "double"):
        return lambda i, now: round(rng.uniform(0, 1000), 3)
    if kind.startswith("decimal"):
        scale = int(kind[kind.index(",") + 1 : -1])
        return lambda i, now: round(rng.uniform(0, 1000), scale)
    if kind == "boolean":
        return lambda i, now: rng.random() < 0.5
    if kind == "date":
        return lambda i, now: dt.datetime.fromtimestamp(now, dt.timezone.utc).date().isoformat()
    if kind == "timestamptz":
        return lambda i, now: dt.datetime.fromtimestamp(now, dt.timezone.utc).isoformat(timespec="microseconds")
    if kind == "timestamp":
        return lambda i, now: dt.datetime.fromtimestamp(now, dt.timezone.utc).replace(tzinfo=None).isoformat(timespec="microseconds")
    # strings: a vocabulary of 1000 values sharing a prefix (like URLs or city names)
    vocab = [f"{name}-{k:04d}" for k in range(1000)]
    return lambda i, now: rng.choice(vocab)


def _registry_writer(config: StreambergConfig, fields: tuple[FieldSpec, ...],
                     value_format: str) -> Callable[[dict[str, Any]], bytes]:
    """Events (as the makers build them for JSON) as Confluent-framed Avro or Protobuf bytes,
    written by confluent-kafka's own serializers (the writer schema registered under
    `<topic>-value`)."""
    from confluent_kafka.serialization import MessageField, SerializationContext
    from pyiceberg.schema import Schema
    from pyiceberg.types import StructType

    from streamberg.common.schema import iceberg_type
    from streamberg.decode.registry import registry_client

    if config.kafka.schema_registry is None:
        raise ValueError(f"--format {value_format} needs kafka.schema_registry in the config")
    struct = iceberg_type(StructOf(tuple(fields)))
    assert isinstance(struct, StructType)
    schema = Schema(*struct.fields)
    client = registry_client(config.kafka.schema_registry)
    context = SerializationContext(config.kafka.topic, MessageField.VALUE)
    specs = StructOf(tuple(fields))
    if value_format == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
        from google.protobuf import json_format
        from google.protobuf.descriptor_pool import DescriptorPool
        from google.protobuf.message_factory import GetMessageClass

        from streamberg.decode.protobuf_schema import file_descriptor_proto

        pool = DescriptorPool()
        from confluent_kafka.schema_registry.common.protobuf import _init_pool

        _init_pool(pool)  # the well-known files the message imports (Timestamp, Date)
        file = file_descriptor_proto(schema, "Event", "streamberg.sample")
        pool.Add(file)
        message_class = GetMessageClass(pool.FindMessageTypeByName("streamberg.sample.Event"))
        proto_serializer = ProtobufSerializer(message_class, client)
        return lambda event: proto_serializer(
            json_format.ParseDict(_shaped(event, specs, _protobuf_leaf), message_class()), context)
    from confluent_kafka.schema_registry.avro import AvroSerializer

    from streamberg.decode.avro_schema import avro_schema

    serializer = AvroSerializer(client, json.dumps(avro_schema(schema, "Event")))
    return lambda event: serializer(_shaped(event, specs, _avro_leaf), context)


def _shaped(value: Any, spec: TypeSpec, leaf: Callable[[str, Any], Any]) -> Any:
    """A JSON-shaped sample value with every primitive given to `leaf(type name, value)`;
    structs keep only the fields that hold a value (null and absent read alike)."""
    if value is None:
        return None
    if isinstance(spec, StructOf):
        return {f.name: _shaped(value[f.name], f.type, leaf) for f in spec.fields if value.get(f.name) is not None}
    if isinstance(spec, ListOf):
        return [_shaped(v, spec.element, leaf) for v in value]
    if isinstance(spec, MapOf):
        return {k: _shaped(v, spec.value, leaf) for k, v in value.items()}
    return leaf(str(spec), value)


def _protobuf_leaf(kind: str, value: Any) -> Any:
    """A primitive in protobuf's JSON mapping."""
    if kind == "date":
        day = dt.date.fromisoformat(value)
        return {"year": day.year, "month": day.month, "day": day.day}
    if kind in ("timestamptz", "timestamp"):
        moment = dt.datetime.fromisoformat(value)
        moment = moment.astimezone(dt.timezone.utc) if moment.tzinfo else moment
        return moment.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"
    return value


def _avro_leaf(kind: str, value: Any) -> Any:
    """A primitive as the Python value Avro's serializer takes for its type."""
    if kind == "date":
        return dt.date.fromisoformat(value)
    if kind in ("timestamptz", "timestamp"):
        return dt.datetime.fromisoformat(value)
    if kind.startswith("decimal"):
        return decimal.Decimal(str(value)).quantize(decimal.Decimal(1).scaleb(-int(kind[kind.index(",") + 1: -1])))
    return value


def _malformed(kind: str, good: dict[str, Any], config: StreambergConfig, fields: tuple[FieldSpec, ...]) -> bytes:
    if kind == "not_json":
        return b"this is not json {" + str(good.get("id")).encode()
    if kind == "wrong_type":
        first_number = next((f.name for f in fields if str(f.type) in ("int", "long", "double", "float")), None)
        bad = dict(good)
        bad[first_number or fields[0].name] = "not-a-number"
        return json.dumps(bad).encode()
    if kind == "missing_required":
        required = [f.name for f in fields if f.required]
        bad = {k: v for k, v in good.items() if k != (required[0] if required else "id")}
        if not required:  # nothing is required: fall back to a type error
            return _malformed("wrong_type", good, config, fields)
        return json.dumps(bad).encode()
    if kind == "oversized":
        bad = dict(good)
        bad["padding"] = "x" * (config.ingest.max_record_bytes + 1)
        return json.dumps(bad).encode()
    return json.dumps([good]).encode()  # not_an_object


def produce_events(
    config: StreambergConfig,
    count: int,
    rate: float | None = None,
    bad_fraction: float = 0.0,
    start_id: int = 0,
    seed: int = 7,
    progress: Callable[[int], None] | None = None,
    producer_config: dict[str, Any] | None = None,
    value_format: str | None = None,
) -> ProduceResult:
    """Produce `count` events to the configured topic; return what was produced.

    `value_format` (default: the config's kafka.value_format): `json`, or `avro` or `protobuf`
    written with confluent-kafka's AvroSerializer or ProtobufSerializer through
    kafka.schema_registry (the writer schema made from the table's schema, registered under
    `<topic>-value`)."""
    rng = random.Random(seed)
    fields = event_fields(config)
    makers = {f.name: _value_maker(f, rng) for f in fields}
    value_format = value_format or config.kafka.value_format
    framed = _registry_writer(config, fields, value_format) if value_format != "json" else None
    producer = Producer({
        # The cluster's security settings (kafka.consumer's SASL/TLS part) reach this client too.
        **connection_settings(config.kafka.bootstrap_servers, config.kafka.consumer),
        "linger.ms": 20, "batch.num.messages": 10000, "queue.buffering.max.messages": 500000,
        "message.max.bytes": max(2 * config.ingest.max_record_bytes + 1024, 1_000_000),
        "log_level": 3,  # errors only: a broker gone mid-run is reported once, by the delivery errors
        **(producer_config or {}),
    })
    errors: list[str] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(str(err))

    result = ProduceResult()
    bad_every = int(round(1 / bad_fraction)) if bad_fraction > 0 else 0
    started = time.monotonic()
    step = 5000
    for i in range(start_id, start_id + count):
        now = time.time()
        event = {name: make(i, now) for name, make in makers.items()}
        n = i - start_id
        if bad_every and n % bad_every == bad_every - 1:
            if framed is not None:
                kind = FRAMED_BAD_KINDS[(n // bad_every) % len(FRAMED_BAD_KINDS)]
                good_bytes = framed(event)
                # Cut inside an Avro body; a Protobuf body cut at a field boundary would still
                # parse (fewer fields), so a Protobuf record is cut inside its header.
                cut = max(6, len(good_bytes) // 2) if value_format == "avro" else 3
                value = bytes([5]) + good_bytes[1:] if kind == "bad_magic" else good_bytes[:cut]
            else:
                kind = BAD_KINDS[(n // bad_every) % len(BAD_KINDS)]
                value = _malformed(kind, event, config, fields)
            result.bad[kind] += 1
        else:
            value = framed(event) if framed is not None else json.dumps(event, separators=(",", ":")).encode()
            result.valid_ids.append(i)
        while True:
            try:
                producer.produce(config.kafka.topic, value=value, key=str(i).encode(), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        result.produced += 1
        result.bytes += len(value)
        if result.produced % step == 0:
            producer.poll(0)
            if progress:
                progress(step)
        # Pace in small steps, so produce times are spread evenly (freshness is measured on them).
        if rate and result.produced % 50 == 0:
            ahead = result.produced / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
    remaining = producer.flush(60)
    if progress and result.produced % step:
        progress(result.produced % step)
    result.seconds = time.monotonic() - started
    if remaining or errors:
        raise RuntimeError(f"{remaining} records undelivered, {len(errors)} delivery errors (first: {errors[:1]})")
    return result
