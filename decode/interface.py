"""What every value format's decoder gives back, and the one interface they share.

A decoder per format: JSON (decode/json_decode.py), Avro and Protobuf through a schema
registry (decode/registry_decode.py with decode/avro_decode.py and decode/protobuf_decode.py).
Each takes a batch of Kafka values and returns a DecodeResult: the rows in the table's Arrow
schema, the dead letters with their reasons, and the fields the schema lacks (for schema
evolution, ingest/evolution.py, which all formats share).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa
from pyiceberg.schema import Schema

from streamberg.decode.unknown_fields import UnknownField


@dataclass
class DecodeResult:
    table: pa.Table  # decoded rows, in the table's Arrow schema (with field ids)
    kept: np.ndarray  # indexes (into the input batch) of the decoded rows, in order
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (index, reason)
    # unknown="report": fields the schema lacks that decoded rows (indexes in `kept`) carry
    unknown: list[UnknownField] = field(default_factory=list)
    # Records that are neither a row nor a dead letter: the tombstone Kafka sends after a
    # Debezium delete (decode/envelopes/changes.py), counted in the commit that covers it.
    skipped: int = 0

    def rows_with_unknown(self) -> np.ndarray:
        """Indexes (into the batch) of the decoded rows that carry a field the schema lacks."""
        if not self.unknown:
            return np.empty(0, dtype=np.int64)
        return np.unique(np.concatenate([u.rows for u in self.unknown]))


class ValueDecoder(Protocol):
    """What every value format's decoder is: a batch of Kafka values in, a DecodeResult out."""

    schema: Schema

    def decode(self, values: list[bytes | None]) -> DecodeResult: ...


class RecordBatchDecoder(Protocol):
    """What the writer, the replays and the committer's evolution decode with: a batch of
    Kafka records (values, keys, positions) into the table's (or change log's) rows."""

    schema: Schema
    file_schema: pa.Schema

    @property
    def needs_keys(self) -> bool: ...

    def decode(self, values: list[bytes | None], keys: Sequence[bytes | None] | None = None,
               positions: tuple[Sequence[int], Sequence[int]] | None = None) -> DecodeResult: ...
