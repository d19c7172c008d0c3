"""Hostile configs of many tables (common/config/fleet.py): each refused at load in one line
naming the key, no secret in it; and the name rules fuzzed: whatever a topic is called or a
record's route field holds, the table name made of it is a valid identifier part, or the
record is refused with a reason (never an exception of another kind, never a path, never
another table's side table)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from streamberg.common.config import load_fleet
from streamberg.common.config.fleet import (
    SIDE_TABLE_ENDINGS,
    UNROUTED,
    RouteConfig,
    route_value,
    topic_identifier,
)
from streamberg.common.errors import ConfigError

SECRET = "hunter2-Fl33t"
BASE: dict[str, Any] = {
    "kafka": {"bootstrap_servers": "127.0.0.1:1", "value_format": "json", "consumer": {"sasl.password": SECRET}},
    "catalog": {"name": "c1", "uri": f"postgresql+psycopg2://u:{SECRET}@127.0.0.1:1/db", "warehouse": "warehouse"},
    "defaults": {"ingest": {"state_dir": "state"}},
    "tables": [{"identifier": "web.clicks_{region}", "topics": ["clicks"], "route_field": "region",
                "schema": "infer"},
               {"identifier": "raw.{topic}", "topic_pattern": "events\\..*", "schema": "infer"}],
}


def _route(**change: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["tables"][0] = {**doc["tables"][0], **change}
    doc["tables"][0] = {k: v for k, v in doc["tables"][0].items() if v is not None}
    return doc


CASES: dict[str, tuple[dict[str, Any], str]] = {
    "route field on Avro values": (_route(value_format="avro", schema=None), "route_field"),
    "route field not in the identifier": (_route(identifier="web.clicks"), "needs {region}"),
    "route field only in the namespace": (_route(identifier="web_{region}.clicks"), "table part"),
    "route field on a change stream": (_route(envelope="debezium", primary_key=["id"]), "envelope none"),
    "route field on the fleet's change stream": ({**copy.deepcopy(BASE), "kafka": {**BASE["kafka"], "envelope": "debezium"},
                                                  "tables": [{**BASE["tables"][0], "primary_key": ["id"]}]},
                                                 "kafka.envelope is debezium"),
    "route field keeping its tail": (_route(keep_tail=True), "keep_tail"),
    "route field a dotted path": (_route(route_field="a.b", identifier="web.clicks_{a.b}"), "route_field"),
    "route field with a quote": (_route(route_field="x'y"), "route_field"),
    "unknown placeholder": (_route(identifier="web.clicks_{user}"), "identifier"),
    "a long value overflows the name": (_route(identifier="web." + "c" * 100 + "_{region}"), "tables.0"),
    "two routes can make one table": ({**copy.deepcopy(BASE), "tables": [
        BASE["tables"][0], {"identifier": "web.clicks_{topic}", "topic_pattern": "x.*", "schema": "infer"}]},
        "can name the same tables"),
    "max tables per route zero": ({**copy.deepcopy(BASE), "defaults": {"ingest": {"state_dir": "state",
                                                                                 "max_tables_per_route": 0}}},
                                  "max_tables_per_route"),
    "max tables per route a string": ({**copy.deepcopy(BASE), "defaults": {"ingest": {
        "state_dir": "state", "max_tables_per_route": "many"}}}, "max_tables_per_route"),
    "a fleet naming kafka.topic": ({**copy.deepcopy(BASE), "kafka": {**BASE["kafka"], "topic": "t"}}, "kafka.topic"),
    "pattern route without a placeholder": ({**copy.deepcopy(BASE), "tables": [
        {"identifier": "raw.events", "topic_pattern": "events\\..*", "schema": "infer"}]}, "topic_pattern"),
    "both topics and a pattern": (_route(topic_pattern="c.*"), "exactly one"),
    "no routes": ({**copy.deepcopy(BASE), "tables": []}, "tables"),
}


def test_the_base_fleet_is_valid(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(BASE))
    fleet = load_fleet(tmp_path / "fleet.yaml")
    assert fleet.tables[0].table_identifier("clicks", "eu") == "web.clicks_eu"
    assert fleet.tables[0].table_identifier("clicks") == f"web.clicks_{UNROUTED}"
    # Each table keeps its own compactor checkpoint: a shared one hands a table another's snapshot ids.
    from streamberg.common.config import config_from_dump

    made = [config_from_dump(fleet.document(fleet.tables[1], topic)) for topic in ("events.a", "events.b")]
    folders = [m.compactor.checkpoint_dir for m in made]
    assert folders[0] != folders[1] and folders[0].endswith("/raw.events_a")


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_fleet_config_is_refused_in_one_line_naming_the_key(name: str, tmp_path: Path) -> None:
    document, expect = CASES[name]
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError) as error:
        load_fleet(tmp_path / "fleet.yaml")
    message = str(error.value)
    assert expect in message, message
    assert SECRET not in message and "Traceback" not in message and "\n" not in message.strip(), message


SAFE_PART = re.compile(r"[a-z0-9][a-z0-9_]{0,62}")
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=80),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=8)


@settings(max_examples=3000, deadline=None)
@given(JSON)
def test_a_route_value_is_a_safe_name_part_or_refused_with_a_reason(value: Any) -> None:
    route = RouteConfig.model_validate({"identifier": "web.clicks_{region}", "topics": ["clicks"],
                                        "route_field": "region"})
    try:
        part = route_value(value)
    except ValueError as exc:
        assert str(exc), value
        return
    assert SAFE_PART.fullmatch(part) and not part.endswith(SIDE_TABLE_ENDINGS), (value, part)
    assert part == str(value).lower()
    made = route.table_identifier("clicks", part)
    assert route.value_of("clicks", made) == part  # `--table web.clicks_<v>` finds its value again


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet="abcXYZ019._-", min_size=1, max_size=249))
def test_any_kafka_topic_name_makes_a_valid_identifier_part(topic: str) -> None:
    part = topic_identifier(topic)
    assert re.fullmatch(r"[a-z_][a-z0-9_]{0,127}", part), (topic, part)
