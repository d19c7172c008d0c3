"""Protobuf messages as Iceberg types and back: what a registry's Protobuf schema means for the table.

A registry holds a Protobuf schema as a file (its messages, its imports by reference to other
subjects). `message_descriptor` builds the file into a descriptor pool of its own, with
protobuf's well-known types and confluent-kafka's (the same pool its deserializer builds),
and finds the message a record's indexes name.

Protobuf -> Iceberg (a visitor over the message descriptor):
- message -> struct; repeated -> list (elements never null); map<K,V> -> map<K,V>;
- int32, sint32, sfixed32 -> int; int64, sint64, sfixed64, uint32, fixed32 -> long; uint64,
  fixed64 -> long (a value past 2^63-1 does not fit and refuses its record); float, double,
  bool, string; bytes -> binary; enum -> string (the value's name; an unknown number as its
  digits);
- google.protobuf.Timestamp -> timestamptz; google.type.Date -> date; the wrappers
  (google.protobuf.Int64Value, StringValue, ...) -> their primitive;
- a message that contains itself (google.protobuf.Struct, a tree) has no column type and is
  refused with its path, as is nesting past 16 levels;
- every column is optional: proto3 has no required fields, and a field a later version
  removes must read as absent. A field with presence (a message, `optional`, a `oneof`
  member) that is unset is null; a field without presence reads as its default, as protobuf
  itself reads it.

Iceberg -> Protobuf (`file_descriptor_proto`) is the inverse, for `streamberg produce --format
protobuf` and the tests: an optional primitive becomes a proto3 `optional` field.
"""

from __future__ import annotations

import base64
import datetime as dt
import itertools
from collections.abc import Callable
from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DoubleType,
    FloatType,
    IcebergType,
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

from streamberg.common.config.types import MAX_FIELD_NAME, MAX_SCHEMA_FIELDS
from streamberg.common.errors import UnsupportedSchemaError

# How deep a message may nest (the table's own bound, common/config/types.py), and how many
# files a schema's imports may bring.
MAX_PROTOBUF_DEPTH = 16
MAX_REFERENCES = 64

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_WRAPPERS = {
    "google.protobuf.DoubleValue": DoubleType(), "google.protobuf.FloatValue": FloatType(),
    "google.protobuf.Int64Value": LongType(), "google.protobuf.UInt64Value": LongType(),
    "google.protobuf.Int32Value": IntegerType(), "google.protobuf.UInt32Value": LongType(),
    "google.protobuf.BoolValue": BooleanType(), "google.protobuf.StringValue": StringType(),
    "google.protobuf.BytesValue": BinaryType(),
}
TIMESTAMP = "google.protobuf.Timestamp"
DATE = "google.type.Date"


def _scalar_types() -> dict[int, IcebergType]:
    from google.protobuf.descriptor import FieldDescriptor as F

    return {
        F.TYPE_INT32: IntegerType(), F.TYPE_SINT32: IntegerType(), F.TYPE_SFIXED32: IntegerType(),
        F.TYPE_INT64: LongType(), F.TYPE_SINT64: LongType(), F.TYPE_SFIXED64: LongType(),
        F.TYPE_UINT32: LongType(), F.TYPE_FIXED32: LongType(), F.TYPE_UINT64: LongType(), F.TYPE_FIXED64: LongType(),
        F.TYPE_FLOAT: FloatType(), F.TYPE_DOUBLE: DoubleType(), F.TYPE_BOOL: BooleanType(),
        F.TYPE_STRING: StringType(), F.TYPE_BYTES: BinaryType(), F.TYPE_ENUM: StringType(),
    }


# -- the registry's file, built ------------------------------------------------------------
def message_descriptor(schema_str: str, references: list[Any], indexes: tuple[int, ...],
                       fetch: Callable[[str, int], Any]) -> Any:
    """The message descriptor `indexes` name in the file `schema_str` (base64 serialized
    FileDescriptorProto), its references fetched with `fetch(subject, version)` (each a
    confluent-kafka Schema in the same form), all in a pool of its own."""
    from confluent_kafka.schema_registry.common.protobuf import _init_pool
    from google.protobuf import descriptor_pb2
    from google.protobuf.descriptor_pool import DescriptorPool

    pool = DescriptorPool()
    _init_pool(pool)  # protobuf's and Google's well-known files, as confluent-kafka's reader has them
    added: set[str] = set()

    def add_references(refs: list[Any], depth: int) -> None:
        for ref in refs:
            if ref.name in added:
                continue
            if len(added) >= MAX_REFERENCES or depth > MAX_PROTOBUF_DEPTH:
                raise UnsupportedSchemaError(f"Protobuf schema: more than {MAX_REFERENCES} imported files")
            added.add(ref.name)
            referenced = fetch(ref.subject, ref.version)
            add_references(list(referenced.references or []), depth + 1)
            pool.Add(_file_proto(ref.name, referenced.schema_str, descriptor_pb2))

    add_references(list(references or []), 0)
    main = _file_proto("streamberg-writer.proto", schema_str, descriptor_pb2)
    pool.Add(main)
    return message_at(pool.FindFileByName(main.name), indexes)


def _file_proto(name: str, text: str, descriptor_pb2: Any) -> Any:
    proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text.encode("ascii"), validate=True))
    proto.name = name
    return proto


def message_at(file: Any, indexes: tuple[int, ...]) -> Any:
    """The message of `file` that Confluent's message indexes name ([] or [0]: the first)."""
    path = list(indexes) or [0]
    if len(path) > MAX_PROTOBUF_DEPTH:
        raise UnsupportedSchemaError(f"Protobuf: {len(path)} message indexes")
    messages = list(file.message_types_by_name.values())
    message = None
    for index in path:
        if not 0 <= index < len(messages):
            raise UnsupportedSchemaError(f"Protobuf: message index {index} out of range ({len(messages)} messages)")
        message = messages[index]
        messages = list(message.nested_types)
    return message


# -- Protobuf -> Iceberg -----------------------------------------------------------------------
class _Converter:
    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.scalars = _scalar_types()

    def message(self, desc: Any, path: str, seen: tuple[str, ...]) -> IcebergType:
        name = desc.full_name
        if name == TIMESTAMP:
            return TimestamptzType()
        if name == DATE:
            return DateType()
        if name in _WRAPPERS:
            return _WRAPPERS[name]
        if name in seen:
            raise UnsupportedSchemaError(f"Protobuf schema: {path or 'the message'} is a {name}, which contains "
                                         "itself; a table column cannot hold a recursive type")
        if len(seen) >= MAX_PROTOBUF_DEPTH:
            raise UnsupportedSchemaError(f"Protobuf schema: {path} nests more than {MAX_PROTOBUF_DEPTH} levels")
        return StructType(*[NestedField(next(self.ids), f.name, self.field(f, f"{path}.{f.name}" if path else f.name,
                                                                      (*seen, name)), required=False)
                            for f in desc.fields])

    def value(self, fd: Any, path: str, seen: tuple[str, ...]) -> IcebergType:
        if fd.message_type is not None:
            return self.message(fd.message_type, path, seen)
        return self.scalars[fd.type]

    def field(self, fd: Any, path: str, seen: tuple[str, ...]) -> IcebergType:
        if is_map(fd):
            key, value = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
            return MapType(next(self.ids), self.value(key, path, seen), next(self.ids),
                           self.value(value, f"{path}{{}}", seen), value_required=True)
        if is_repeated(fd):
            return ListType(next(self.ids), self.value(fd, f"{path}[]", seen), element_required=True)
        return self.value(fd, path, seen)


def is_map(fd: Any) -> bool:
    return is_repeated(fd) and fd.message_type is not None and fd.message_type.GetOptions().map_entry


def is_repeated(fd: Any) -> bool:
    from google.protobuf.descriptor import FieldDescriptor

    return fd.label == FieldDescriptor.LABEL_REPEATED


def _measure(desc: Any, sizes: dict[str, tuple[int, int]], visiting: tuple[str, ...]) -> tuple[int, int]:
    """(fields, depth) of a message with its message fields expanded, each message measured
    once: a schema reusing one message at every level is measured in its own size, not its
    expansion's (a 1 KB schema can expand to millions of fields)."""
    name = desc.full_name
    if name in (TIMESTAMP, DATE) or name in _WRAPPERS:
        return 0, 0
    if name in sizes:
        return sizes[name]
    if name in visiting:
        return 0, 0  # recursion: the conversion refuses it with its path
    fields, depth = 0, 0
    for fd in desc.fields:
        if len(fd.name) > MAX_FIELD_NAME:
            raise UnsupportedSchemaError(f"Protobuf schema: a field name of {len(fd.name):,} characters in {name}; at "
                                         f"most {MAX_FIELD_NAME}")
        inner = fd.message_type
        if inner is not None and is_map(fd):
            inner = inner.fields_by_name["value"].message_type
        sub_fields, sub_depth = _measure(inner, sizes, (*visiting, name)) if inner is not None else (0, 0)
        fields += 1 + sub_fields
        depth = max(depth, sub_depth)
        if fields > MAX_SCHEMA_FIELDS:
            raise UnsupportedSchemaError(f"Protobuf schema: {name} holds more than {MAX_SCHEMA_FIELDS:,} fields once "
                                         "its messages are expanded (a message reused many times over)")
    sizes[name] = (fields, depth + 1)
    return sizes[name]


def iceberg_schema(message: Any) -> Schema:
    """The Iceberg schema of a Protobuf message descriptor (its size bounded before it is
    expanded)."""
    _measure(message, {}, ())
    struct = _Converter().message(message, "", ())
    if not isinstance(struct, StructType):
        raise UnsupportedSchemaError(f"Protobuf schema: a table is made from a message of fields, not a {message.full_name}")
    return Schema(*struct.fields)


# -- a message as a row ------------------------------------------------------------------------
def reader(message: Any) -> Callable[[Any], dict]:
    """A function from a parsed message of `message` to its row (a dict in the table's
    shape), planned once per descriptor. A timestamp is read as its microseconds since the
    epoch (the table's Arrow column takes them as they are: a datetime made here only to be
    taken apart again was a fifth of a record's decode); a plain scalar field (no presence,
    not repeated, no enum) is read by attribute alone."""
    plans: dict[str, tuple[tuple[str, ...], list[tuple[str, Callable[[Any, Any, str], Any]]]]] = {}

    def plan(desc: Any) -> tuple[tuple[str, ...], list[tuple[str, Callable[[Any, Any, str], Any]]]]:
        # Planned at a message's first read (a nested message's reader plans it when first
        # called); a recursive message is refused before any reader is made.
        if desc.full_name not in plans:
            plans[desc.full_name] = (tuple(f.name for f in desc.fields if _plain(f)),
                                     [(f.name, field_reader(f)) for f in desc.fields if not _plain(f)])
        return plans[desc.full_name]

    def record_reader(desc: Any) -> Callable[[Any], dict]:
        def read_record(m: Any) -> dict:
            plain, special = plan(desc)
            out = {name: getattr(m, name) for name in plain}
            for name, read in special:
                out[name] = read(getattr(m, name), m, name)
            return out
        return read_record

    def value_reader(fd: Any) -> Callable[[Any], Any]:
        desc = fd.message_type
        if desc is None:
            if fd.enum_type is not None:
                names = {v.number: v.name for v in fd.enum_type.values}
                return lambda v: names.get(v, str(v))
            return lambda v: v
        if desc.full_name == TIMESTAMP:
            return lambda m: m.seconds * 1_000_000 + m.nanos // 1000
        if desc.full_name == DATE:
            return lambda m: dt.date(m.year, m.month, m.day)
        if desc.full_name in _WRAPPERS:
            return lambda m: m.value
        return record_reader(desc)

    def field_reader(fd: Any) -> Callable[[Any, Any, str], Any]:
        if is_map(fd):
            key = fd.message_type.fields_by_name["key"]
            read_value = value_reader(fd.message_type.fields_by_name["value"])
            read_key = value_reader(key)
            return lambda v, m, name: [(read_key(k), read_value(x)) for k, x in v.items()]
        read = value_reader(fd)
        if is_repeated(fd):
            return lambda v, m, name: [read(x) for x in v]
        if fd.has_presence:
            return lambda v, m, name: read(v) if m.HasField(name) else None
        return lambda v, m, name: read(v)

    return record_reader(message)


def _plain(fd: Any) -> bool:
    """A field whose attribute is its value: a scalar, not repeated, no presence, no enum."""
    return fd.message_type is None and fd.enum_type is None and not fd.has_presence and not is_repeated(fd)


# -- Iceberg -> Protobuf -----------------------------------------------------------------------
def file_descriptor_proto(schema: Schema, name: str = "Record", package: str = "streamberg") -> Any:
    """A proto3 file with one message `name` for records of `schema`."""
    from google.protobuf import descriptor_pb2

    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name=f"{package.replace('.', '/')}/{name.lower()}.proto",
                                              package=package, syntax="proto3")
    names = itertools.count()
    primitive: dict[type, int] = {IntegerType: F.TYPE_INT32, LongType: F.TYPE_INT64, FloatType: F.TYPE_FLOAT, DoubleType: F.TYPE_DOUBLE,
                 BooleanType: F.TYPE_BOOL, StringType: F.TYPE_STRING, BinaryType: F.TYPE_BYTES}
    wellknown: dict[type, tuple[str, str]] = {TimestamptzType: (TIMESTAMP, "google/protobuf/timestamp.proto"),
                 TimestampType: (TIMESTAMP, "google/protobuf/timestamp.proto"), DateType: (DATE, "google/type/date.proto")}

    def set_type(field: Any, t: IcebergType, owner: Any, scope: str, hint: str) -> None:
        if type(t) in primitive:
            field.type = primitive[type(t)]
        elif type(t) in wellknown:
            full, dependency = wellknown[type(t)]
            field.type, field.type_name = F.TYPE_MESSAGE, f".{full}"
            if dependency not in file.dependency:
                file.dependency.append(dependency)
        elif isinstance(t, StructType):
            nested = owner.nested_type.add(name=f"{hint.title().replace('_', '')}{next(names)}")
            fill(nested, t, f"{scope}.{nested.name}")
            field.type, field.type_name = F.TYPE_MESSAGE, f"{scope}.{nested.name}"
        else:
            raise UnsupportedSchemaError(f"column type {t} has no Protobuf counterpart here")

    def fill(message: Any, struct: StructType, scope: str) -> None:
        for number, f in enumerate(struct.fields, start=1):
            field = message.field.add(name=f.name, number=number, label=F.LABEL_OPTIONAL)
            t = f.field_type
            if isinstance(t, ListType):
                if isinstance(t.element_type, (ListType, MapType)):
                    raise UnsupportedSchemaError(f"{f.name}: a list of {t.element_type} has no Protobuf counterpart")
                field.label = F.LABEL_REPEATED
                set_type(field, t.element_type, message, scope, f.name)
            elif isinstance(t, MapType):
                entry = message.nested_type.add(name=f"{f.name.title().replace('_', '')}Entry{next(names)}")
                entry.options.map_entry = True
                key = entry.field.add(name="key", number=1, label=F.LABEL_OPTIONAL)
                set_type(key, t.key_type, entry, f"{scope}.{entry.name}", "key")
                value = entry.field.add(name="value", number=2, label=F.LABEL_OPTIONAL)
                if isinstance(t.value_type, (ListType, MapType)):
                    raise UnsupportedSchemaError(f"{f.name}: a map of {t.value_type} has no Protobuf counterpart")
                set_type(value, t.value_type, entry, f"{scope}.{entry.name}", f.name)
                field.label, field.type, field.type_name = F.LABEL_REPEATED, F.TYPE_MESSAGE, f"{scope}.{entry.name}"
            else:
                set_type(field, t, message, scope, f.name)
                if not f.required and field.type != F.TYPE_MESSAGE:
                    field.proto3_optional = True  # presence: null stays null
                    field.oneof_index = len(message.oneof_decl)
                    message.oneof_decl.add(name=f"_{f.name}")

    root = file.message_type.add(name=name)
    fill(root, schema.as_struct(), f".{package}.{name}")
    return file
