"""`streamberg check`: every problem of a config, one a line; with --connect what the real
broker, catalog (SQLite and the REST stand-in) and registry stand-in answer, and exit codes
0 / 1 / 2 as documented in cli/check.py."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from tests.helpers import EVENT_SCHEMA, streamberg

SECRET = "hunter2-chk"


def _write(path: Path, document: dict) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_every_problem_one_a_line_exit_2_no_secret(tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.yaml", {
        "kafka": {"topic": "t", "consumer": {"sasl.password": SECRET}},
        "catalog": {"uri": f"postgresql://u:{SECRET}@h/db"},
        "table": {"identifier": "db.e", "schema": [{"name": "id", "type": "lng"}, {"name": "x", "type": "strin"}]},
        "ingest": {"parallelism": 0, "commit_interval_seconds": -1}})
    proc = streamberg("check", "--config", str(bad), check=False)
    assert proc.returncode == 2, proc.stderr
    problems = [line for line in proc.stdout.splitlines() if line.startswith("  - ")]
    assert [p.split(":")[0] for p in problems] == ["  - table.schema.0.type", "  - table.schema.1.type",
                                                   "  - ingest.commit_interval_seconds", "  - ingest.parallelism"]
    assert SECRET not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr

    # A config of many tables: every bad route is named, not only the first.
    fleet = _write(tmp_path / "fleet.yaml", {
        "kafka": {"bootstrap_servers": "127.0.0.1:1"}, "catalog": {"uri": "sqlite:///c.db", "warehouse": "wh"},
        "tables": [{"identifier": "a.one", "topics": ["one"], "schema": [{"name": "id", "type": "lng"}]},
                   {"identifier": "a.two", "topics": ["two"], "schema": [{"name": "id", "type": "long"}]},
                   {"identifier": "a.three", "topics": ["three"], "schema": [{"name": "id", "type": "nope"}]}]})
    report = json.loads(streamberg("check", "--config", str(fleet), "--json", check=False).stdout)
    assert report["exit_code"] == 2 and not report["valid"]
    assert [p.split(":")[0] for p in report["problems"]] == ["tables.0.schema.0.type", "tables.2.schema.0.type"]
    # Problems only a route's own table config shows (its partition source): every route named.
    spec = [{"source": "nope", "transform": "day"}]
    fleet = _write(tmp_path / "fleet2.yaml", {
        "kafka": {"bootstrap_servers": "127.0.0.1:1"}, "catalog": {"uri": "sqlite:///c.db", "warehouse": "wh"},
        "tables": [{"identifier": "a.one", "topics": ["one"], "schema": EVENT_SCHEMA, "partition_spec": spec},
                   {"identifier": "a.two", "topics": ["two"], "schema": EVENT_SCHEMA},
                   {"identifier": "a.three", "topics": ["three"], "schema": EVENT_SCHEMA, "partition_spec": spec}]})
    report = json.loads(streamberg("check", "--config", str(fleet), "--json", check=False).stdout)
    assert report["exit_code"] == 2
    assert [p.split(":")[0] for p in report["problems"]] == ["tables.0 (a.one)", "tables.2 (a.three)"], report


@pytest.mark.slow
def test_connect_reports_what_each_component_answered(tmp_path: Path, broker: str, registry, rest_catalog) -> None:
    topic = f"chk-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker, topic, 3)
    registry.register(f"{topic}-value", '{"type": "record", "name": "E", "fields": [{"name": "id", "type": "long"}]}')
    base = {"kafka": {"bootstrap_servers": broker, "topic": topic, "value_format": "avro",
                      "schema_registry": {"url": registry.url}},
            "catalog": {"name": "chk", "uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
            "table": {"identifier": "db.events", "schema": EVENT_SCHEMA},
            "monitoring": {"broker_timeout_seconds": 5}}
    path = _write(tmp_path / "one.yaml", base)

    # First run: no catalog database yet (the ingest makes it), nothing created by the check.
    first = json.loads(streamberg("check", "--config", str(path), "--connect", "--json").stdout)
    probes = {p["component"]: p for p in first["probes"]}
    assert first["exit_code"] == 0 and all(p["ok"] for p in probes.values())
    assert probes["broker"]["facts"]["partitions"] == {topic: 3}
    assert probes["registry"]["facts"]["subjects"] == len(registry.subjects) >= 1
    assert probes["catalog"]["facts"]["tables"] == {"db.events": False}
    assert not (tmp_path / "catalog.db").exists()

    # The table made: the check sees it.
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    catalog = load_catalog(load_config(path).catalog)
    catalog.create_namespace("db")
    catalog.create_table("db.events", Schema(NestedField(1, "id", LongType(), required=False)))
    second = json.loads(streamberg("check", "--config", str(path), "--connect", "--json").stdout)
    assert {p["component"]: p for p in second["probes"]}["catalog"]["facts"]["tables"] == {"db.events": True}

    # A topic the broker lacks and a registry that is down: exit 1, each named.
    registry.down = True
    missing = _write(tmp_path / "missing.yaml", {**base, "kafka": {**base["kafka"], "topic": "no-such-topic-x"}})
    proc = streamberg("check", "--config", str(missing), "--connect", check=False)
    registry.down = False
    assert proc.returncode == 1, proc.stdout
    assert "MISSING topic no-such-topic-x" in proc.stdout and "registry FAILED" in proc.stdout

    # A REST catalog with the wrong secret: refused, the secret not shown.
    rest = _write(tmp_path / "rest.yaml", {**base, "catalog": {
        "name": "chkrest", "type": "rest", "uri": rest_catalog.url, "warehouse": "tests",
        "credential": f"streamberg-tests:{SECRET}", "allow_insecure": True}})
    proc = streamberg("check", "--config", str(rest), "--connect", check=False)
    assert proc.returncode == 1 and "catalog  FAILED" in proc.stdout, proc.stdout
    assert SECRET not in proc.stdout + proc.stderr
    good = _write(tmp_path / "rest-ok.yaml", {**base, "catalog": {
        "name": "chkrest", "type": "rest", "uri": rest_catalog.url, "warehouse": "tests",
        "credential": rest_catalog.credential, "allow_insecure": True}})
    assert streamberg("check", "--config", str(good), "--connect").returncode == 0
