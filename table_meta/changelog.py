"""The change log of a primary-key table (docs/cdc.md): its name, its columns, the ingest's
configuration for it, and where the merge stage stands in it.

With `kafka.envelope` debezium or upsert, the ingest does not write the table itself: it
appends every change, exactly-once as any append, to `<table>_changelog`. That table holds
the table's columns (every one optional but the key: a delete's before-image may carry only
the key) and the change log's own:

- `_op`: c, u, d or r (Debezium's create, update, delete, snapshot read); an upsert record is
  `u`, its tombstone `d`;
- `_before_key`: the key before an update that changed it (Debezium `u` whose before and after
  keys differ), else null;
- `_kafka_partition`, `_kafka_offset`: where the change was read; the merge orders the changes
  of a key by them (a key lives in one partition);
- `_source_ts`: Debezium's `source.ts_ms`, when the change happened in the source;
- `_source_seq`: the change's position in the source (a Debezium connector's log position,
  decode/envelopes/source_position.py), as text whose order is the source's order (`encode_sequence`).

The merge decides which of two changes of a key is the newer by their sequence
(docs/cdc.md#order): `table.sequence_field` when set, else `_source_seq`, else the Kafka
offset, which orders only within one partition.

The merge stage (merge/) applies the change log to the table and records the change-log
snapshot it applied in its own snapshot's summary (SummaryKeys.CHANGELOG_APPLIED); monitoring
reads the lag from the same place (`merge_position`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.types import StringType, TimestamptzType

from streamberg.common.config import (
    CHANGELOG_COLUMNS,
    CHANGELOG_TARGET_PROPERTY,
    FieldConfig,
    StreambergConfig,
    TableConfig,
)
from streamberg.table_meta.offsets import ancestry, summary_properties
from streamberg.table_meta.summary_keys import SummaryKeys

# _source_id: the source a change's position belongs to (a MySQL server and binlog name), so
# the merge knows when positions start over (table_meta/source_epochs.py).
OP, BEFORE_KEY, PARTITION, OFFSET, SOURCE_TS, SOURCE_SEQ, SOURCE_ID = CHANGELOG_COLUMNS
OPS = ("c", "u", "d", "r")
DELETE = "d"
# Change-log table properties: the table it feeds, and the table's required columns (the
# change log relaxes them, the ingest still holds a row image to them).
TARGET_PROPERTY = CHANGELOG_TARGET_PROPERTY
REQUIRED_PROPERTY = "streamberg.changelog.required-columns"
# The merge's key state (merge/key_state.py) and its columns: the contract between the merge,
# which writes it, and a fresh read (fresh/keyed.py), which reads it.
KEY_STATE_COLUMNS = ("key", "seq", "kafka_partition", "kafka_offset", "source_ts", "deleted", "applied_at")
# `streamberg.operation` of maintenance's commit that trims merged changes from the change log.
TRIM_OPERATION = "changelog-trim"


def has_changelog(config: StreambergConfig) -> bool:
    """Whether the config's table is a primary-key table fed through a change log (the one
    place that asks: kafka.envelope debezium or upsert)."""
    return config.kafka.envelope != "none"


def changelog_identifier(config: StreambergConfig) -> str:
    return config.merge.changelog_table or f"{config.table.identifier}_changelog"


def key_state_identifier(config: StreambergConfig) -> str:
    """The merge's key state (merge/key_state.py): the last sequence applied per key."""
    return config.merge.key_state_table or f"{config.table.identifier}_merge_keys"


# Sequences are text whose byte order is the order of what they encode, so Spark, pyiceberg and
# any reader compare them as strings. A sequence is a tuple of non-negative integers, each
# written as its decimal digits after a two-digit count of them ("0212" is 12, "03100" is
# 100): a longer number sorts after a shorter one, and the tuples of one source all have the
# same length. A text sequence (a string sequence_field) is the text itself.
SEQUENCE_DIGITS_MAX = 99


def encode_sequence(*parts: int) -> str | None:
    """The ordered text of a tuple of non-negative integers; None when a part is not one."""
    out = []
    for part in parts:
        # (type() first: called for every change event; a bool is an int subclass, refused.)
        if type(part) is not int and (isinstance(part, bool) or not isinstance(part, int)) or part < 0:
            return None
        digits = str(part)
        if len(digits) > SEQUENCE_DIGITS_MAX:
            return None
        out.append(digits)
    return encode_digits(*out) if out else None


def encode_digits(*digits: str) -> str:
    """The ordered text of numbers already written in decimal without leading zeros, each at
    most SEQUENCE_DIGITS_MAX digits (encode_sequence checks that; a fast path may know it)."""
    return "".join(f"{len(d):02d}{d}" for d in digits)


def ingest_config(config: StreambergConfig) -> StreambergConfig:
    """What the ingest writes: the table itself, or a primary-key table's change log."""
    if not has_changelog(config) or TARGET_PROPERTY in config.table.properties:
        return config
    return changelog_config(config)


def changelog_config(config: StreambergConfig) -> StreambergConfig:
    """The ingest's configuration for a primary-key table: the same job, consumer group, dead
    letters and state, writing the change log instead of the table.

    Every name the ingest derives from the table identifier is pinned to the table's own, so
    `status`, replay and the runbooks see one ingest per table whichever table it appends to.
    """
    table = config.table
    assert table.schema_ is not None and table.primary_key  # the config's own validator
    keys = set(table.primary_key)
    columns = [_field({**f.model_dump(by_alias=True, exclude_none=True), "required": f.name in keys})
               for f in table.schema_]
    key_fields = [f.model_dump(by_alias=True, exclude_none=True) for f in table.schema_ if f.name in keys]
    columns += [
        _field({"name": OP, "type": "string", "required": True}),
        _field({"name": BEFORE_KEY, "type": "struct", "fields": key_fields}),
        _field({"name": PARTITION, "type": "int", "required": True}),
        _field({"name": OFFSET, "type": "long", "required": True}),
        _field({"name": SOURCE_TS, "type": "timestamptz"}),
        _field({"name": SOURCE_SEQ, "type": "string"}),
        _field({"name": SOURCE_ID, "type": "string"}),
    ]
    required = [f.name for f in table.schema_ if f.required and f.name not in keys]
    properties = {**table.properties, TARGET_PROPERTY: table.identifier, REQUIRED_PROPERTY: json.dumps(required)}
    changelog = table.model_copy(update={
        "identifier": changelog_identifier(config), "schema_": columns, "partition_spec": [], "primary_key": [],
        "sequence_field": None, "properties": properties})
    target = config.ingest_target
    return config.model_copy(update={
        "table": changelog,
        "ingest": config.ingest.model_copy(update={"job_id": target.job_id}),
        "kafka": config.kafka.model_copy(update={"group_id": target.consumer_group}),
        "dead_letter": config.dead_letter.model_copy(update={"table": target.dead_letter_table}),
    })


def add_own_columns(catalog: Catalog, changelog: TableConfig) -> None:
    """Add to an existing change log the change log's own columns it lacks (optional ones: a
    change log made by an earlier release has no `_source_seq`); the ingest calls it before it
    checks the change log against its configuration."""
    try:
        table = catalog.load_table(changelog.identifier)
    except NoSuchTableError:
        return
    have = {f.name for f in table.schema().fields}
    missing = [f for f in changelog.schema_ or () if f.name in CHANGELOG_COLUMNS and f.name not in have
               and not f.required]
    if not missing:
        return
    with table.update_schema() as update:
        for f in missing:
            update.add_column(f.name, StringType() if f.type == "string" else TimestamptzType())


def _field(spec: dict[str, Any]) -> FieldConfig:
    return FieldConfig.model_validate(spec)


def required_columns(properties: dict[str, str]) -> list[str]:
    """The table's required non-key columns, as the change log's properties record them."""
    try:
        names = json.loads(properties.get(REQUIRED_PROPERTY, "[]"))
    except ValueError:
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


@dataclass(frozen=True)
class MergePosition:
    """Where the merge stands: the change-log snapshot it applied last, and what is newer."""

    applied_snapshot_id: int | None  # None: nothing applied yet
    changelog_snapshot_id: int | None  # the change log's current snapshot (None: empty)
    pending_snapshots: int  # change-log snapshots with records, newer than the applied one
    pending_records: int
    oldest_pending_ms: int | None  # commit time of the oldest of them

    @property
    def up_to_date(self) -> bool:
        return self.pending_records == 0


def is_merge(snapshot: Snapshot) -> bool:
    """Whether a snapshot of the table is a merge (it records the change-log snapshot applied)."""
    return SummaryKeys.CHANGELOG_APPLIED in summary_properties(snapshot)


def last_merge(target: Table) -> Snapshot | None:
    """The newest merge on the table's lineage: a merge snapshot is an ancestor of every later
    one (the compactor's, maintenance's), and the newest merge's position is the one that counts."""
    return next((s for s in ancestry(target) if is_merge(s)), None)


def applied_snapshot_id(target: Table | None) -> int | None:
    """The change-log snapshot the newest merge recorded in the table (None: none yet)."""
    merge = last_merge(target) if target is not None else None
    return int(summary_properties(merge)[SummaryKeys.CHANGELOG_APPLIED]) if merge is not None else None


def unapplied_snapshots(changelog: Table, applied: int | None) -> list[Snapshot]:
    """The change-log snapshots after `applied`, oldest first (all of them when None).

    ValueError when `applied` is not an ancestor of the change log's current snapshot: it was
    expired, or the change log was dropped and made again (docs/runbooks/upsert-table-behind.md)."""
    lineage = ancestry(changelog)
    ids = [s.snapshot_id for s in lineage]
    if applied is not None and applied not in ids:
        raise ValueError(f"the change-log snapshot {applied} the table last applied is not in the change log's "
                         "history (expired, or the change log was recreated)")
    return lineage[:ids.index(applied) if applied is not None else len(lineage)][::-1]


def merge_position(changelog: Table, target: Table | None) -> MergePosition:
    applied = applied_snapshot_id(target)
    newer = unapplied_snapshots(changelog, applied)
    with_records = [s for s in newer if _added_records(s) > 0]
    current = changelog.current_snapshot()
    return MergePosition(
        applied_snapshot_id=applied, changelog_snapshot_id=current.snapshot_id if current is not None else None,
        pending_snapshots=len(with_records), pending_records=sum(_added_records(s) for s in with_records),
        oldest_pending_ms=with_records[0].timestamp_ms if with_records else None)


def _added_records(snapshot: Snapshot) -> int:
    try:
        return int(summary_properties(snapshot).get("added-records", 0))
    except ValueError:
        return 0
