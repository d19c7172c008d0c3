"""A writer subtask of the ingest job: one Kafka source, a lane per table (ingest/lane.py).

A config of one table is a config of one route (common/config/loading.as_fleet): one path
for one table or many (docs/fleet.md).

- **Routing.** Every topic the broker has is matched against the routes once at start and
  every `ingest.topic_discovery_seconds` (ingest/routes.py): a named topic or one matching a
  pattern gets its table configuration, a table per topic (one refused is that topic's alone,
  with its reason). A table new to the catalog is made by the first lane that needs it: from
  the route's schema, the registry's writer schema, or (`schema: infer`) its first records.
- **Lanes.** The source reads every partition the writer owns (`partition % parallelism`) of
  every routed topic with one consumer, and the writer hands each polled batch's records to
  their table's lane. A lane that cannot be opened refuses its table (the committer pauses it
  and `status` says why); a lost Kafka position under `on_lost_offsets: fail` and a fence stop
  the job, as they must.
- **A topic routed by a record field** feeds several lanes: its route's `_unrouted` table (the
  anchor: it takes the records no table can, as dead letters with the reason) and one lane per
  field value. They share the topic's partitions: the source reads each partition from the
  lowest position of its lanes, every lane skips the records below its own (what its table
  committed already) and moves on past the records of the others (`TableLane.advance`). A lane
  opened mid-run (a value first seen) starts where the writer has examined the topic to.
"""

from __future__ import annotations

import time
from typing import Any

from pyiceberg.exceptions import NoSuchTableError

from streamberg.common.catalog import routed_values, shared_catalog
from streamberg.common.config import FleetConfig, StreambergConfig, config_from_dump
from streamberg.common.errors import CatalogUnreachable, ConfigError, FencedError, LostOffsetsError
from streamberg.common.log import get_logger
from streamberg.common.tables import run_settings
from streamberg.ingest.lane import TableLane
from streamberg.ingest.routes import Routes, TableCapReached, ensure_route_table, exc_reason, ingest_view
from streamberg.ingest.source import KafkaSource
from streamberg.ingest.units import FlushUnit

# Errors a lane's opening may raise that stop the job, whatever the other tables: a position
# Kafka lost under on_lost_offsets=fail (a restart would find it lost again), a fence.
JOB_STOPPING = (LostOffsetsError, FencedError)


def passing_failure(exc: BaseException) -> bool:
    """A failure another moment may not have: the catalog or its database busy or out of
    reach: SQLAlchemy's OperationalError (SQLite locked, PostgreSQL's lost connection), a REST
    catalog's 503, no answer at all."""
    import sqlalchemy
    from pyiceberg.exceptions import ServiceUnavailableError

    return isinstance(exc, (sqlalchemy.exc.OperationalError, ServiceUnavailableError, CatalogUnreachable,
                            ConnectionError, TimeoutError))


class Writer:
    """One writer subtask: one source, a lane per table (see the module's notes)."""

    def __init__(self, fleet: FleetConfig, index: int, parallelism: int, run_id: str) -> None:
        self.fleet, self.index, self.parallelism, self.run_id = fleet, index, parallelism, run_id
        self.tables = Routes(fleet)
        self.lanes: dict[str, TableLane] = {}  # table identifier (the ingest's view) -> its lane
        self.by_topic: dict[str, list[str]] = {}  # topic -> its lanes, a field-routed topic's anchor first
        self.split: dict[str, Any] = {}  # a field-routed topic -> its route
        self.known: dict[str, set[str]] = {}  # ... -> the values its tables were made for (catalog's, ours)
        self.refused_values: dict[tuple[str, str], str] = {}  # (topic, value) -> why no table takes it
        self.refused_tables: dict[str, str] = {}  # a table whose route record does not validate -> why
        self.log = get_logger("ingest.writer", writer=index, run=run_id)
        self.source: KafkaSource | None = None
        self.finished = False
        self._next_discovery = 0.0
        self._in_batch = self._reassign_pending = False
        self._blocked: set[str] = set()  # lanes holding records for a schema change, skipping their records
        self.closed_early = 0  # files closed before their interval's end to bound memory
        self._engine: Any = None  # the catalog's database: the tables' slots (table_meta/table_slots.py)
        self.reports: list[FlushUnit] = []  # tables this writer could not open, for the committer
        self._open_failures: dict[str, int] = {}  # topic -> failed openings of its table (passing ones retried)

    @property
    def position(self) -> dict[str, int]:
        """How far each topic's partitions were read, `topic/partition` -> next offset (run
        progress: a field-routed topic's records count once, whatever its tables)."""
        out: dict[str, int] = {}
        for topic, names in self.by_topic.items():
            for name in names:
                for p, o in self.lanes[name].position.items():
                    key = f"{topic}/{p}"
                    out[key] = max(out.get(key, 0), o)
        return out

    def open(self) -> None:
        self.source = KafkaSource(run_settings(self.fleet), self.run_id)
        self.discover(force=True)

    def discover(self, force: bool = False) -> None:
        """Route the topics the broker has now; open a lane for each new one. A route whose
        tables reached ingest.max_tables_per_route learns the ones other writers made."""
        now = time.monotonic()
        if not force and now < self._next_discovery:
            return
        interval = self.fleet.defaults.ingest.topic_discovery_seconds
        if not self.lanes:  # nothing to read yet: a topic made after the job started is read within a second
            interval = min(interval, 1.0)
        self._next_discovery = now + interval
        assert self.source is not None
        new = self.tables.update(self.source.topics())
        opened = []
        for topic in new:
            try:
                self._open_topic(topic)
                opened.append(topic)
            except NoSuchTableError as exc:  # schema: infer, and no record yet to infer the table from
                self._forget(topic)
                self.tables.wait(topic, str(exc))
            except JOB_STOPPING:
                raise
            except Exception as exc:  # noqa: BLE001 - one topic's table cannot be opened: that topic alone stops
                self._forget(topic)
                reason = exc_reason(exc)
                if self._try_again(topic, exc, reason):
                    continue
                self.tables.refused[topic] = reason
                self._report_refused(topic, self.tables.by_topic[topic].table.identifier, reason)
                self.log.error("topic not read: its table could not be opened; the other tables go on", topic=topic,
                               reason=reason)
        # The positions consumer served this round's tables; closed until it is asked again
        # (a refused position, the next new topic): no idle broker connection between rounds.
        self.source.marks.close()
        if opened:
            self.reassign()
            self.log.info("tables routed", new_topics=opened, tables=len(self.lanes))

    def _try_again(self, topic: str, exc: BaseException, reason: str) -> bool:
        """Whether a topic whose table could not be opened is routed again soon (True), not
        refused: a failure another moment may not have (the catalog's database locked or out
        of reach), ingest.table_failures_to_pause times at most, with backoff."""
        tries = self._open_failures[topic] = self._open_failures.get(topic, 0) + 1
        if not passing_failure(exc) or tries >= self.tables.by_topic[topic].ingest.table_failures_to_pause:
            return False
        self.tables.wait(topic, reason)
        self._next_discovery = min(self._next_discovery, time.monotonic() + min(2.0 ** (tries - 1), 30.0))
        self.log.warning("table not opened yet; tried again at the next look", topic=topic, attempt=tries,
                         reason=reason)
        return True

    def _report_refused(self, topic: str, table: str, reason: str) -> None:
        """Tell the committer (and so `status`, through the run folder) why a table is not written."""
        self.reports.append(FlushUnit(run_id=self.run_id, writer=self.index, epoch=0, topic=topic, table=table,
                                      refused=reason))

    def _forget(self, topic: str) -> None:
        """Close whatever lanes a topic opened before its failure (none of them read yet)."""
        for name in self.by_topic.pop(topic, []):
            lane = self.lanes.pop(name, None)
            if lane is not None:
                lane.close()
        self.split.pop(topic, None)
        self.known.pop(topic, None)

    def _claim(self, config: StreambergConfig, route: Any) -> str | None:
        """Take the new table's slots (table_meta/table_slots.py): one of its route's (a field's
        values) and one of the job's. None: taken; else why not."""
        from streamberg.common.catalog import state_engine
        from streamberg.table_meta.table_slots import claim, scope_of

        if self._engine is None:
            self._engine = state_engine(config.catalog)
        identifier, catalog_name = config.table.identifier, config.catalog.name
        if route is not None and route.route_field is not None:
            cap = config.ingest.max_tables_per_route
            if not claim(self._engine, catalog_name, scope_of("route", route.identifier), identifier, cap):
                return (f"route field {route.route_field!r} would make table {identifier} past "
                        f"ingest.max_tables_per_route ({cap})")
        cap = config.ingest.max_tables
        if not claim(self._engine, catalog_name, scope_of("job", *sorted(r.identifier for r in self.fleet.tables)),
                     identifier, cap):
            return f"table {identifier} would be past ingest.max_tables ({cap}) of this job"
        return None

    def _value_refusal(self, config: StreambergConfig) -> str | None:
        """Why a route value's table cannot be made (None: it can): a name ending like a side
        table's, or a side table of (or sharing one with) a table this writer has."""
        from streamberg.common.config.fleet import side_table_clash

        identifier = config.table.identifier
        if (why := side_table_clash(identifier)) is not None:
            return why
        mine = {name.lower() for name in self.lanes}
        sides = {side.lower() for lane in self.lanes.values() for side in lane.config.side_tables}
        if identifier.lower() in sides or {s.lower() for s in config.side_tables} & (mine | sides):
            return f"its table {identifier} would share a name with another table's side table"
        return None

    def _value_config(self, topic: str, value: str) -> StreambergConfig:
        return ingest_view(config_from_dump(self.fleet.document(self.split[topic], topic, value)))

    def _open_topic(self, topic: str) -> None:
        route = self.fleet.route_of(topic)
        config = self.tables.by_topic[topic]
        if route is None or route.route_field is None:
            self._open_lane(topic, config, None)
            return
        self._open_lane(topic, config, None, route_field=route.route_field)
        self.split[topic] = route
        self.known[topic] = set()
        for value in self._recorded_values(topic, config):
            self.known[topic].add(value)  # the values earlier runs made tables for: from their own offsets
            try:
                self._open_lane(topic, self._value_config(topic, value), value)
            except JOB_STOPPING:
                raise
            except Exception as exc:  # noqa: BLE001 - that value's table alone: its records become dead letters
                reason = exc_reason(exc)
                self.refused_values[(topic, value)] = reason
                self._report_refused(topic, self._value_config(topic, value).table.identifier, reason)
                self.log.error("route value not routed", topic=topic, value=value, reason=reason)

    def _recorded_values(self, topic: str, config: StreambergConfig) -> list[str]:
        """The values earlier runs made tables for, as far as the tables' record of them
        validates (anyone can write table properties): a bad record is logged under its
        table's own name and skipped."""
        route = self.split[topic]
        refused: dict[str, str] = {}
        values = routed_values(shared_catalog(config.catalog), config.table.namespace, topic,
                               lambda value: route.table_identifier(topic, value), refused)
        for table, why in refused.items():
            if table not in self.refused_tables:
                self.refused_tables[table] = why
                self.log.error("table not taken as a route's", table=table, reason=why)
        return values

    def _open_value(self, topic: str, value: str, sample: list[bytes] | None) -> Any:
        """A lane for a value first seen in this run, from where the topic was examined to;
        None when the table is another topic's or value's (the reason kept for its records)."""
        names = self.by_topic[topic]
        examined: dict[int, int] = {}
        for name in names:
            for p, o in self.lanes[name].position.items():
                examined[p] = min(examined.get(p, o), o)
        try:
            lane = self._open_lane(topic, self._value_config(topic, value), value, sample=sample, start=examined)
        except JOB_STOPPING:
            raise
        except Exception as exc:  # noqa: BLE001 - this value's table alone: its records are dead letters with the reason
            reason = exc_reason(exc)
            if len(self.refused_values) < 10_000:
                self.refused_values[(topic, value)] = reason
                self._report_refused(topic, self._value_config(topic, value).table.identifier, reason)
            self.log.error("route value not routed", topic=topic, value=value, reason=reason)
            return None
        self.known[topic].add(value)
        self.reassign()
        self.log.info("table made for a route value", topic=topic, value=value, table=lane.config.table.identifier)
        return lane

    def _open_lane(self, topic: str, config: StreambergConfig, value: str | None,
                   sample: list[bytes] | None = None, start: dict[int, int] | None = None,
                   route_field: str | None = None) -> TableLane:
        assert self.source is not None
        if route_field is None:  # (a route's unrouted table counts for nothing: it holds no rows)
            why = self._claim(config, self.fleet.route_of(topic) if value else None)
            # A table this lane would make is refused past a cap; one an earlier run made keeps
            # being written (it holds its slot when one is free).
            if why is not None and not shared_catalog(config.catalog).table_exists(config.table.identifier):
                raise TableCapReached(why)
        ensure_route_table(config, topic, value, sample, anchor_field=route_field, infer=self.fleet.many)
        lane = TableLane(config, self.index, self.parallelism, self.run_id, reassign=self.reassign, route_value=value)
        lane.open(self.source)
        if start is not None:
            for p in lane.unrecorded:  # a table its records were never committed to: they begin here
                if p in start:
                    lane.position[p] = start[p]
            lane.unit_start = dict(lane.position)
            lane.expect_first = {}
        lane.record_starts()
        self.lanes[config.table.identifier] = lane
        self.by_topic.setdefault(topic, []).append(config.table.identifier)
        return lane

    def reassign(self) -> None:
        """Every lane's partitions, each read from the lowest position of the lanes sharing it.

        Asked while a batch is being handed out (a table made for a route value, a refused
        position), it waits for the batch's end: assigning then would fetch again the records
        of the batch's other topics not handed out yet, and they would be written twice."""
        if self._in_batch:
            self._reassign_pending = True
            return
        assert self.source is not None
        lowest: dict[tuple[str, int], int] = {}
        for lane in self.lanes.values():
            for tp in lane.assignment():
                key = (tp.topic, tp.partition)
                lowest[key] = min(lowest.get(key, tp.offset), tp.offset)
        self.source.assign(lowest)

    def poll(self) -> list[FlushUnit]:
        """Read one batch across every table; every table's units when the interval ended."""
        assert self.source is not None
        if self.finished:
            return []
        self.discover()
        lanes = list(self.lanes.values())
        settings = self.fleet.defaults.ingest
        if not lanes:  # no topic of the routes on the broker yet: looked for again at every discovery
            time.sleep(settings.poll_timeout_seconds)
            units, self.reports = self.reports, []
            return units
        self._follow_blocked()
        batch = self.source.read(settings.max_poll_records, settings.poll_timeout_seconds)
        if batch:
            by_topic: dict[str, list] = {}
            for message in batch:
                by_topic.setdefault(message.topic(), []).append(message)
            self._in_batch = True
            try:
                for topic, messages in by_topic.items():
                    names = self.by_topic.get(topic)
                    if not names:
                        continue
                    if topic in self.split:
                        self._split(topic, messages)
                    elif names[0] not in self._blocked:
                        self.lanes[names[0]].process(messages)
            finally:
                self._in_batch = False
            if self._reassign_pending:
                self._reassign_pending = False
                self.reassign()
            self._bound_memory(lanes[0].config)
        units, self.reports = self.reports, []
        for lane in list(self.lanes.values()):  # each table on its own interval (a route may set its own)
            if lane.spool is not None:
                lane.spool.tick()
            epoch = lane.epoch_now()
            if epoch != lane.epoch:
                # Empty units too: a table's committer commits an interval once every writer reported it.
                # (A value table that only moved past the others' records: its committer's
                # ingest.commit_min_bytes makes that position wait, ingest/committer.py.)
                units.append(lane.flush(final=False))
                lane.epoch = epoch
        return units

    def _split(self, topic: str, messages: list) -> None:
        """A field-routed topic's batch: each record to its value's table, or a dead letter of
        the route's unrouted table with the reason; every lane then moves past the batch."""
        import orjson

        from streamberg.common.config.fleet import route_value
        from streamberg.ingest.dead_letters import dead_letter_from_message

        route = self.split[topic]
        anchor = self.lanes[self.by_topic[topic][0]]
        good = [m for m in messages if m.error() is None]
        errors = [m for m in messages if m.error() is not None]
        ends: dict[int, int] = {}
        for m in good:
            ends[m.partition()] = m.offset() + 1
        groups: dict[str, list] = {}
        refused: list[tuple[Any, str]] = []
        for m in good:
            try:
                record = orjson.loads(m.value()) if m.value() is not None else None
            except orjson.JSONDecodeError:
                refused.append((m, "not JSON"))
                continue
            if not isinstance(record, dict):
                refused.append((m, f"route field {route.route_field!r}: the record is not a JSON object"))
                continue
            try:
                value = route_value(record.get(route.route_field))
            except ValueError as exc:
                refused.append((m, f"route field {route.route_field!r} is {exc}"))
                continue
            groups.setdefault(value, []).append(m)
        for value, group in groups.items():
            why = self.refused_values.get((topic, value))
            try:
                lane = self.lanes.get(self._value_config(topic, value).table.identifier)
            except ConfigError as exc:  # e.g. a name past 128 characters with this value
                lane, why = None, f"route field {route.route_field!r} = {value!r} makes no valid table: {exc}"[:500]
            if lane is None and why is None:
                why = self._value_refusal(self._value_config(topic, value))
                if why is None:
                    lane = self._open_value(topic, value, sample=[m.value() for m in group])
                    why = self.refused_values.get((topic, value), "its table could not be opened")
                elif len(self.refused_values) < 10_000:
                    self.refused_values[(topic, value)] = why
            if lane is None:
                refused.extend((m, why or "its table could not be opened") for m in group)
                continue
            if lane.config.table.identifier in self._blocked:
                continue  # fetched again from its position once its schema change landed
            mine = [m for m in group if m.offset() >= lane.position.get(m.partition(), 0)]
            if mine:
                lane.process(mine)
        refused = [(m, why) for m, why in refused if m.offset() >= anchor.position.get(m.partition(), 0)]
        if refused:
            anchor.messages += len(refused)
            anchor.dead_letters.extend(dead_letter_from_message(m, why) for m, why in refused)
        for name in self.by_topic[topic]:
            if name not in self._blocked:
                self.lanes[name].advance(ends)
        if errors:  # out of range and the like, after the records before them: every table of the topic
            for name in list(self.by_topic[topic]):
                self.lanes[name].process(errors)

    def _bound_memory(self, settings: StreambergConfig) -> None:
        """Past ingest.max_open_files or max_buffered_bytes over all tables, close the least
        recently written files (each lane's files join its next unit)."""
        limit_files, limit_bytes = settings.ingest.max_open_files, settings.ingest.max_buffered_bytes
        while True:
            writers = [lane.files for lane in self.lanes.values() if lane.files.open_files]
            if (sum(w.open_files for w in writers) <= limit_files
                    and sum(w.buffered_bytes for w in writers) <= limit_bytes):
                return
            oldest = min(writers, key=lambda w: w.oldest_write() or 0)
            oldest.close_oldest()
            self.closed_early += 1

    def _follow_blocked(self) -> None:
        """A lane holding enough records for its committer's schema change takes no more (its
        records in a batch are dropped unread, its position kept); once the change landed, the
        source is assigned again, so they are fetched again from its position."""
        blocked = {name for name, lane in self.lanes.items() if lane.blocked}
        if self._blocked - blocked:
            self.reassign()
        self._blocked = blocked

    def finish(self) -> list[FlushUnit]:
        self.finished = True
        return [lane.finish() for lane in self.lanes.values()]

    def close(self) -> None:
        for lane in self.lanes.values():
            lane.close()
        if self.source is not None:
            self.source.close()
            self.source = None
