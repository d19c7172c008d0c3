"""What a record is, chosen by name in one place (`record_decoder`): `kafka.envelope`.

- `none`: a row to append (decode/records.py: the value, and the key where the config
  keeps it);
- `debezium` and `upsert`: a change of a primary-key table's row, appended to its change log
  (decode/envelopes/changes.py: one class per kind over one shared assembly; Debezium's
  rules written once over an Arrow table of envelopes each format fills in
  decode/envelopes/debezium.py, a change's source position in
  decode/envelopes/source_position.py).

Adding an envelope is one class (an EnvelopeDecoder with its `_changes`) and one entry in
ENVELOPES, with the value formats it reads; reading Debezium in another format is one entry in
debezium.ENVELOPE_READERS.
"""

from __future__ import annotations

from typing import Literal

from pyiceberg.schema import Schema

from streamberg.common.config import StreambergConfig
from streamberg.common.errors import ConfigError
from streamberg.decode.envelopes.changes import DebeziumDecoder, EnvelopeDecoder, UpsertDecoder
from streamberg.decode.envelopes.debezium import ENVELOPE_READERS
from streamberg.decode.formats import format_of
from streamberg.decode.interface import RecordBatchDecoder
from streamberg.decode.json_decode import epoch_units
from streamberg.decode.records import RecordDecoder
from streamberg.table_meta.changelog import required_columns

Unknown = Literal["ignore", "report"]
# kind -> (its decoder class; None: rows, RecordDecoder), and the value formats it reads.
ENVELOPES: dict[str, tuple[type[EnvelopeDecoder] | None, frozenset[str]]] = {
    "none": (None, frozenset({"json", "avro", "protobuf"})),
    "debezium": (DebeziumDecoder, frozenset(ENVELOPE_READERS)),
    "upsert": (UpsertDecoder, frozenset({"json", "avro"})),
}


def record_decoder(config: StreambergConfig, schema: Schema, unknown: Unknown = "report") -> RecordBatchDecoder:
    """The ingest's decoder for `schema`: the config's envelope over its value format. With an
    envelope the table is the change log (table_meta/changelog.py)."""
    kind = config.kafka.envelope
    if kind not in ENVELOPES:
        raise ConfigError(f"kafka.envelope: unknown envelope {kind!r}; known: {', '.join(sorted(ENVELOPES))}")
    decoder_class, formats = ENVELOPES[kind]
    fmt, registry = format_of(config)
    if fmt.name not in formats:
        raise ConfigError(f"kafka.envelope {kind}: value_format {fmt.name} is not read with it yet; use "
                          f"{' or '.join(sorted(formats))}")
    if decoder_class is None:
        return RecordDecoder.for_config(config, schema, unknown)
    return decoder_class(schema, config.ingest.max_record_bytes, fmt, epoch_units=epoch_units(config.table.schema_),
                         key_format=config.kafka.key_format, required=required_columns(config.table.properties),
                         unknown=unknown, registry=registry)


