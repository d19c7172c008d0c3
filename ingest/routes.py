"""The tables an ingest writes (ingest/writer.py): the routes applied to the broker's topics
(common/config/resolve.resolve_fleet: one table per topic, each refusal that topic's alone),
and each routed table made when absent (declared, from the registry's writer schema, or
inferred from its first records), recording the topic (and route value) it is fed from.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer
from pyiceberg.exceptions import NoSuchTableError

from streamberg.common.catalog import shared_catalog
from streamberg.common.config import FleetConfig, StreambergConfig
from streamberg.common.config.fleet import ROUTE_TOPIC_PROPERTY, ROUTE_VALUE_PROPERTY
from streamberg.common.config.resolve import resolve_fleet
from streamberg.common.log import get_logger
from streamberg.common.tables import run_settings


@dataclass
class Routes:
    """The routes applied to the broker's topics: topic -> its table's configuration."""

    fleet: FleetConfig
    by_topic: dict[str, StreambergConfig] = field(default_factory=dict)  # the ingest's view (change logs)
    raw: dict[str, StreambergConfig] = field(default_factory=dict)  # the tables' own configurations
    refused: dict[str, str] = field(default_factory=dict)  # topic -> why it is not read
    waiting: dict[str, str] = field(default_factory=dict)  # topic -> what it waits for (routed again later)
    _catalog: Any = field(default=None, repr=False)

    def update(self, topics: list[str]) -> list[str]:
        """Take the topics the broker has now; return the ones newly routed."""
        before = set(self.refused)
        new = resolve_fleet(self.fleet, topics, self.raw, self.refused, owner_of=self._recorded)
        for topic in new:
            self.by_topic[topic] = ingest_view(self.raw[topic])
            self.waiting.pop(topic, None)
        for topic in set(self.refused) - before:
            get_logger("ingest.routes").error("topic not read", topic=topic, reason=self.refused[topic])
        return new


    def wait(self, topic: str, reason: str) -> None:
        """Route `topic` again at the next look (its table cannot be made yet)."""
        self.raw.pop(topic, None)
        self.by_topic.pop(topic, None)
        if topic not in self.waiting:
            get_logger("ingest.routes").info("topic waits for its table", topic=topic, reason=reason)
        self.waiting[topic] = reason

    def _recorded(self, identifier: str) -> str | None:
        try:
            if self._catalog is None:  # opened once: every new topic's owner is looked up here
                self._catalog = shared_catalog(run_settings(self.fleet).catalog)
            return self._catalog.load_table(identifier).properties.get(ROUTE_TOPIC_PROPERTY)
        except Exception:  # noqa: BLE001 - no table yet
            return None


def ingest_view(config: StreambergConfig) -> StreambergConfig:
    from streamberg.table_meta.changelog import ingest_config

    return ingest_config(config)


class TableOwnedElsewhere(Exception):
    """A routed topic's table records another topic as its own: the topic is not read."""


class TableCapReached(Exception):
    """A new table would be past ingest.max_tables_per_route or ingest.max_tables."""


def exc_reason(exc: BaseException) -> str:
    """One line for status and logs: the error's class and the first line of its text, redacted."""
    from streamberg.common.catalog_open import first_line

    return first_line(exc)[:500]


def ensure_route_table(config: StreambergConfig, topic: str, value: str | None = None,
                       sample: list[bytes] | None = None, anchor_field: str | None = None,
                       infer: bool = True) -> None:
    """Create the table of a routed topic (and route value) when absent (a race with another
    writer is won by one, the other loads theirs): declared, from the registry, or inferred
    from its records (`sample`, else the topic's first ones). A field-routed topic's unrouted
    table (`anchor_field`) never holds rows: its one column is the route field. `infer`
    False (a config of one table): a table without a declared schema must exist already."""
    from streamberg.decode.formats import value_format
    from streamberg.ingest.dead_letters import open_tables

    if infer and config.table.schema_ is None and value_format(config.kafka.value_format).infers_table:
        catalog = shared_catalog(config.catalog)
        try:
            catalog.load_table(config.table.identifier)
        except NoSuchTableError:
            if anchor_field is not None:
                create_inferred(config, [json.dumps({anchor_field: ""}).encode()], partitioned=False)
            else:
                create_inferred(config, sample if sample else sample_values(config, topic), value=value)
    # A table made here records its topic (and route value) in the commit that makes it, and
    # where it begins reading (fresh reads are exact from its first second: table_meta/offsets).
    made = {ROUTE_TOPIC_PROPERTY: topic, **({ROUTE_VALUE_PROPERTY: value} if value is not None else {})}
    if value is None and anchor_field is None:
        made.update(_starts_at_creation(config, topic))
    catalog, table, _ = open_tables(config, made)
    _check_table(config, table)
    owner, owner_value = table.properties.get(ROUTE_TOPIC_PROPERTY), table.properties.get(ROUTE_VALUE_PROPERTY)
    if owner is None:  # the topic (and route value) this table is fed from, recorded once
        owner, owner_value = _record_route(catalog, config, topic, value)
    if owner != topic:
        raise TableOwnedElsewhere(f"table {config.table.identifier} is fed from topic {owner!r}, not {topic!r}")
    elif owner_value != value:
        raise TableOwnedElsewhere(f"table {config.table.identifier} holds topic {topic!r}'s records of route value "
                                  f"{owner_value!r}, not {value!r}")


def _starts_at_creation(config: StreambergConfig, topic: str) -> dict[str, str]:
    """For a table about to be made that reads its whole topic from `earliest`: where each
    partition begins (its low watermark), recorded in the commit that makes the table, so a
    fresh read is exact from the table's first second, before any lane opened (the lanes then
    begin there: table_meta/offsets.fresh_start_offsets). Nothing where the table exists, the
    start is "latest" or a time (the lanes record theirs when they open), or the broker does
    not answer now."""
    from streamberg.common.watermarks import WatermarkReader
    from streamberg.ingest.positions import positions_settings
    from streamberg.table_meta.offsets import START_OFFSETS_PREFIX, encode_offsets

    if config.kafka.start_offset != "earliest" or shared_catalog(config.catalog).table_exists(config.table.identifier):
        return {}
    try:
        with WatermarkReader(positions_settings(config), 10.0) as reader:
            marks = reader.read(topic)
    except Exception as exc:  # noqa: BLE001 - the lanes record their starts when they open
        get_logger("ingest.routes", table=config.table.identifier, topic=topic).info(
            "start offsets not recorded at creation; the lanes record them", error=str(exc)[:200])
        return {}
    if not marks.exists or not marks.partitions:
        return {}
    return {START_OFFSETS_PREFIX + topic: encode_offsets({p: low for p, (low, _) in marks.partitions.items()})}


def _record_route(catalog: Any, config: StreambergConfig, topic: str,
                  value: str | None) -> tuple[str, str | None]:
    """Record the topic (and route value) the table is fed from; a lost race (another
    writer, a concurrent commit) is re-read and retried. Returns what the table records."""
    from pyiceberg.exceptions import CommitFailedException

    from streamberg.common.retry import commit_retrying, is_instance

    log = get_logger("ingest.routes", table=config.table.identifier, topic=topic)
    for attempt in commit_retrying(config.ingest.commit_retries, is_instance(CommitFailedException), log=log,
                                   event="recording the table's topic lost a race; retrying"):
        with attempt:
            table = catalog.load_table(config.table.identifier)
            owner = table.properties.get(ROUTE_TOPIC_PROPERTY)
            if owner is not None:  # another writer recorded it first
                return str(owner), table.properties.get(ROUTE_VALUE_PROPERTY)
            with table.transaction() as tx:
                tx.set_properties({ROUTE_TOPIC_PROPERTY: topic,
                                   **({ROUTE_VALUE_PROPERTY: value} if value is not None else {})})
            return topic, value
    raise AssertionError("unreachable: the last attempt returns or raises")


def _check_table(config: StreambergConfig, table: Any) -> None:
    """What the records need of the table beyond its columns: the key field's column, the
    value format's own rules (a table a registry format cannot fill)."""
    from streamberg.decode.formats import format_of
    from streamberg.decode.records import check_key_field

    fmt, _ = format_of(config)
    check_key_field(table.schema(), config.kafka.key_field, config.kafka.key_format)
    fmt.check_table(table.schema())


def sample_values(config: StreambergConfig, topic: str, limit: int = 500, timeout: float = 10.0) -> list[bytes]:
    """Up to `limit` values from the start of the topic's partitions (what the table is
    inferred from); empty when the topic holds none yet."""
    from streamberg.common.kafka_read import PartitionReader
    from streamberg.common.kafka_settings import consumer_settings
    from streamberg.common.watermarks import topic_partitions

    consumer = Consumer({**consumer_settings(config), "group.id": f"streamberg-infer-{topic}",
                         "auto.offset.reset": "earliest"})
    try:
        partitions = topic_partitions(consumer, topic)
        reader = PartitionReader(consumer, topic, {p: OFFSET_BEGINNING for p in partitions})
        values: list[bytes] = []
        for records in reader.batches(time.monotonic() + timeout, max_records=limit):
            values.extend(m.value() for m in records if m.value() is not None)
            if values:
                break
        return values[:limit]
    finally:
        consumer.close()


def create_inferred(config: StreambergConfig, values: list[bytes], partitioned: bool = True,
                    value: str | None = None) -> None:
    """Create the table of `schema: infer` from its first records' fields (typed as schema
    evolution types them: every column optional); the route's partition spec when its
    sources are among them with a type it fits, else unpartitioned (said in the log)."""
    from pyiceberg.exceptions import TableAlreadyExistsError
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
    from pyiceberg.schema import Schema, assign_fresh_schema_ids
    from pyiceberg.types import NestedField

    from streamberg.common.catalog import ensure_namespace
    from streamberg.common.metadata_files import BOUNDED_METADATA
    from streamberg.common.schema import partition_spec_from_config
    from streamberg.decode.formats import value_format

    log = get_logger("ingest.routes", table=config.table.identifier, topic=config.kafka.topic)
    top = value_format(config.kafka.value_format).infer_fields(values, config.ingest.max_record_bytes)
    if not top:
        raise NoSuchTableError(f"{config.table.identifier}: schema infer and no JSON object record yet to infer it from")
    schema = assign_fresh_schema_ids(Schema(*[NestedField(i + 1, name, t, required=False)
                                              for i, (name, t) in enumerate(top.items())]))
    try:
        spec = partition_spec_from_config(config.table, schema) if partitioned else UNPARTITIONED_PARTITION_SPEC
        for part in spec.fields:  # day(ts) needs ts a timestamp: JSON infers a string
            source = schema.find_type(part.source_id)
            if not part.transform.can_transform(source):
                raise ValueError(f"{part.transform} cannot partition {schema.find_column_name(part.source_id)} "
                                 f"({source})")
    except (ValueError, KeyError) as exc:
        log.warning("the route's partition spec does not fit the inferred columns; the table is unpartitioned",
                    problem=str(exc)[:200])
        spec = UNPARTITIONED_PARTITION_SPEC
    catalog = shared_catalog(config.catalog)
    ensure_namespace(catalog, config.table.namespace)
    properties = {**BOUNDED_METADATA, **config.table.properties, ROUTE_TOPIC_PROPERTY: config.kafka.topic,
                  **({ROUTE_VALUE_PROPERTY: value} if value is not None else {})}
    try:
        catalog.create_table(config.table.identifier, schema=schema, partition_spec=spec, properties=properties)
        log.info("table created from its first records", columns=list(top), records=len(values), spec=str(spec))
    except TableAlreadyExistsError:
        pass  # another writer made it first


def prepare_routes(fleet: FleetConfig, log: Any) -> list[str]:
    """The tables of the topics the broker has now, made or checked before any worker starts
    (a schema that cannot take the records fails here, not in every worker). A table that
    cannot be made is that topic's problem (the writers refuse it and say why); when every
    topic there is refused, the job has nothing it could write: the first reason is raised."""
    from streamberg.common.errors import BrokerUnreachable
    from streamberg.common.tables import broker_topics, run_settings

    tables = Routes(fleet)
    found, error = broker_topics(fleet, run_settings(fleet))
    if error is not None:
        raise BrokerUnreachable(f"the broker did not answer: {error}")
    # A topic a route names is prepared before the broker has it: its table's problems (no
    # schema to create it, a schema the records cannot fill) are known at once, not when the
    # first record comes.
    named = {topic for route in fleet.tables for topic in (route.topics or [])}
    topics = tables.update(sorted(set(found) | named))
    failures: list[BaseException] = []
    for topic in topics:
        route = fleet.route_of(topic)
        try:
            ensure_route_table(tables.by_topic[topic], topic, anchor_field=route.route_field if route else None,
                               infer=fleet.many)
        except NoSuchTableError as exc:  # schema: infer, no record yet: the writers route it once there is
            tables.wait(topic, str(exc))
        except Exception as exc:  # noqa: BLE001 - that topic's table alone (the writers refuse it and say why)
            failures.append(exc)
            log.error("topic not read", topic=topic, reason=exc_reason(exc))
    if failures and len(failures) == len(topics):
        raise failures[0]
    if not topics:
        log.warning("no topic of the config's routes on the broker yet: the writers look again every "
                    "ingest.topic_discovery_seconds", routes=[r.identifier for r in fleet.tables],
                    refused=tables.refused)
    return topics
