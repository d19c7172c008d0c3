"""The value formats and envelopes are chosen by name in one place each
(decode/formats.py, decode/envelopes/__init__.py).

Adding a format is one module and one registry entry: a toy format (each value `id;name`, a
semicolon-separated row) is registered here and decodes through the ingest's own record
decoder, keys included, with no other change. Unknown names are refused by name.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from streamberg.common.config import StreambergConfig
from streamberg.common.config.sections import SchemaRegistryConfig
from streamberg.common.errors import ConfigError
from streamberg.common.schema import schema_from_config
from streamberg.decode import formats
from streamberg.decode.envelopes import record_decoder
from streamberg.decode.interface import DecodeResult
from streamberg.decode.records import RecordDecoder
from streamberg.table_meta.changelog import changelog_config


class _SemicolonDecoder:
    """The toy format's decoder: `id;name` per value, a dead letter otherwise."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.arrow = schema_to_pyarrow(schema)

    def decode(self, values: list[bytes | None]) -> DecodeResult:
        rows, kept, rejected = [], [], []
        for i, value in enumerate(values):
            parts = (value or b"").decode(errors="replace").split(";")
            if len(parts) != 2 or not parts[0].isdigit():
                rejected.append((i, "not id;name"))
                continue
            rows.append({"id": int(parts[0]), "name": parts[1]})
            kept.append(i)
        return DecodeResult(table=pa.Table.from_pylist(rows, schema=self.arrow), kept=np.asarray(kept, dtype=np.int64),
                            rejected=rejected)


class SemicolonFormat(formats.ValueFormat):
    name = "semicolon"
    needs_registry = False

    def decoder(self, schema, max_record_bytes, unknown, *, epoch_units=None, registry=None, wrap=None):
        return _SemicolonDecoder(schema)


SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()),
                NestedField(3, "k", StringType()))


def test_a_format_is_one_module_and_one_registry_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(formats.FORMATS, SemicolonFormat.name, SemicolonFormat())
    decoder = RecordDecoder(SCHEMA, 4096, key_field="k", value_format="semicolon")
    result = decoder.decode([b"1;one", b"nope", b"2;two"], [b"a", b"b", b"c"])
    assert result.table.to_pylist() == [{"id": 1, "name": "one", "k": "a"}, {"id": 2, "name": "two", "k": "c"}]
    assert result.rejected == [(1, "not id;name")]


def test_unknown_formats_and_envelopes_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="unknown format 'xml'; known: avro, json, protobuf"):
        formats.value_format("xml")
    config = StreambergConfig(kafka={"topic": "t", "envelope": "upsert", "key_format": "value"},
                              table={"identifier": "db.t", "primary_key": ["id"],
                                     "schema": [{"name": "id", "type": "long", "required": True}]})
    view = changelog_config(config)
    schema = schema_from_config(view.table)
    assert record_decoder(view, schema).needs_keys
    # The envelope's own list of the formats it reads (Protobuf changes are not read yet).
    wrong = view.model_copy(update={"kafka": view.kafka.model_copy(update={
        "value_format": "protobuf", "schema_registry": SchemaRegistryConfig(url="http://127.0.0.1:9")})})
    with pytest.raises(ConfigError, match="kafka.envelope upsert: value_format protobuf is not read with it yet"):
        record_decoder(wrong, schema)
    odd = view.model_copy(update={"kafka": view.kafka.model_copy(update={"envelope": "cloudevents"})})
    with pytest.raises(ConfigError, match="unknown envelope 'cloudevents'"):
        record_decoder(odd, schema)
