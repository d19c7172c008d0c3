"""Routes applied to topics: which table each topic (and route value) makes, and which are
refused, for every reader of a config of many (the ingest's writers, status, the governor:
common/tables.py). A refusal is that topic's alone, never the job's.
"""

from __future__ import annotations

from collections.abc import Callable

from streamberg.common.config.fleet import UNROUTED, FleetConfig
from streamberg.common.config.loading import config_from_dump
from streamberg.common.config.model import StreambergConfig
from streamberg.common.errors import ConfigError


def resolve_fleet(fleet: FleetConfig, topics: list[str], known: dict[str, StreambergConfig] | None = None,
                  refused: dict[str, str] | None = None,
                  owner_of: Callable[[str], str | None] | None = None) -> list[str]:
    """Route `topics` (the broker's) into `known` (topic -> its table's configuration) and
    `refused` (topic -> why it is not read); return the topics newly routed. A refusal is
    that topic's alone, never the job's:

    - two topics whose names make one identifier: the table's recorded topic keeps it
      (`owner_of(identifier)`, the table property the ingest writes, `streamberg.route.topic`),
      else the one routed first (names in sorted order at one look); the other is refused;
    - a table whose name ends like a side table's (`_dead_letters`, `_changelog`,
      `_merge_keys`, `_unrouted`), or that is a side table of another routed table, or whose
      own side tables would be another's table: refused whichever topic came first;
    - a name no table can have (past 128 characters once filled in): refused;
    - past `ingest.max_tables_per_route` topics of one route: refused (tables recorded first
      keep their places, then sorted order, so every writer and status count the same)."""
    known = {} if known is None else known
    refused = {} if refused is None else refused
    owners = {c.table.identifier.lower(): t for t, c in known.items()}
    sides = {side.lower(): t for t, c in known.items() for side in c.side_tables}
    # Tables of each topic route (a field's route counts its values' tables where they are
    # made, table_meta/table_slots.py; its topics' unrouted tables hold no rows).
    per_route: dict[int, int] = {}
    for topic in known:
        route = fleet.route_of(topic)
        if route is not None and route.route_field is None:
            per_route[id(route)] = per_route.get(id(route), 0) + 1
    new = []
    candidates = sorted(topics)
    if owner_of is not None:  # the topics tables record first: they keep their tables
        recorded = set()
        for topic in candidates:
            route = fleet.route_of(topic)
            if route is not None and owner_of(route.table_identifier(topic)) == topic:
                recorded.add(topic)
        candidates = sorted(recorded) + [t for t in candidates if t not in recorded]
    for topic in candidates:
        if topic in known or topic in refused or topic.startswith("__") or topic in ("_schemas",):
            continue
        route = fleet.route_of(topic)
        if route is None:
            continue
        try:
            config = config_from_dump(fleet.document(route, topic))
        except ConfigError as exc:
            refused[topic] = f"it makes no valid table: {exc.problems[0] if exc.problems else exc}"[:500]
            continue
        # A config of one table names its own table (checked when it loaded): no rule of the
        # names a topic makes applies to it.
        why = None if not fleet.many else _refusal(config, route.route_field is not None, owners, sides)
        cap = config.ingest.max_tables_per_route
        if why is None and fleet.many and route.route_field is None and per_route.get(id(route), 0) >= cap:
            why = (f"its route already has ingest.max_tables_per_route ({cap}) tables; raise it to read this topic")
        if why is not None:
            refused[topic] = why
            continue
        owners[config.table.identifier.lower()] = topic
        sides.update({side.lower(): topic for side in config.side_tables})
        per_route[id(route)] = per_route.get(id(route), 0) + 1
        known[topic] = config
        new.append(topic)
    return new


def _refusal(config: StreambergConfig, anchor: bool, owners: dict[str, str], sides: dict[str, str]) -> str | None:
    """Why a routed topic's table cannot be kept beside the tables routed already (None: it can)."""
    from streamberg.common.config.fleet import side_table_clash

    identifier = config.table.identifier
    if (why := side_table_clash(identifier, anchor)) is not None:
        return why
    if identifier.lower() in owners:
        return (f"its table {identifier} is already topic {owners[identifier.lower()]!r}'s (names that differ only in "
                "characters an identifier cannot hold); rename the topic or give it a route of its own")
    if identifier.lower() in sides:
        return f"its table {identifier} is a side table of topic {sides[identifier.lower()]!r}'s table"
    for side in config.side_tables:
        if side.lower() in owners or side.lower() in sides:
            other = owners.get(side.lower()) or sides[side.lower()]
            return f"its side table {side} would be topic {other!r}'s table"
    return None


def fleet_table(fleet: FleetConfig, identifier: str, topics: list[str] | None = None) -> StreambergConfig:
    """The single-table configuration of one table of a fleet, by its identifier: a route's
    fixed one, or one a topic makes (`topics`: the broker's, for pattern routes)."""
    for route in fleet.tables:
        for topic in (route.topics or [t for t in topics or () if route.claims(t)]):
            if route.table_identifier(topic).lower() == identifier.lower():
                return config_from_dump(fleet.document(route, topic))
            value = route.value_of(topic, identifier)  # a table a route value makes
            if value is not None:
                return config_from_dump(fleet.document(route, topic, None if value == UNROUTED else value))
    raise ConfigError(f"table {identifier}: no route of {fleet.config_path} makes it"
                      + ("" if topics is not None else " from its named topics (a pattern route's table needs the "
                                                         "broker's topics)"))


