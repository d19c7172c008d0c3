"""Many tables from one real `streamberg ingest` (PyFlink), killed with SIGKILL twice in the
middle of an interval, then drained: every table holds each of its records once.

28 tables from one config: a named topic with a declared schema, 21 topics of a pattern whose
tables are inferred from their first records, a Debezium topic whose change log a pattern
route makes, a topic split by its records' `region` into three tables (route_field; hostile
values dead letters of its `_unrouted` table), and an Avro topic through the registry stand-in (tests/fixtures/registry.py:
no registry server is installable here; records written by confluent-kafka's real
AvroSerializer). Producers keep writing into every topic while the job is killed; a topic
created between the kills gets its table without a restart. Each table is then read by
pyiceberg and DuckDB: rows and distinct ids equal what was produced into its topic, dead
letters equal the malformed records sent to it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.common.config import CatalogConfig
from streamberg.common.config.fleet import UNROUTED
from tests.cdc.helpers import rows_by_duckdb

pytestmark = pytest.mark.flink

PATTERN_TOPICS = 21
REGIONS = ("eu", "us", "ap")
AVRO = {"type": "record", "name": "Click", "namespace": "web", "fields": [
    {"name": "id", "type": "long"}, {"name": "page", "type": "string"}]}


class Producers:
    """Keeps writing into every topic in the background; remembers what went where."""

    def __init__(self, broker: str, registry_url: str, prefix: str) -> None:
        self.broker, self.prefix = broker, prefix
        self.producer = Producer({"bootstrap.servers": broker, "linger.ms": 5})
        self.avro = AvroSerializer(SchemaRegistryClient({"url": registry_url}), json.dumps(AVRO))
        self.valid: dict[str, list[int]] = {}
        self.bad: dict[str, int] = {}
        self.topics: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.next_id = 0

    def add(self, topic: str) -> None:
        ensure_topic(self.broker, topic, 2)
        for key in ([f"{topic}/{r}" for r in REGIONS] if topic.endswith("visits") else [topic]):
            self.valid.setdefault(key, [])
            self.bad.setdefault(key, 0)
        if topic.endswith("visits"):
            self.bad.setdefault(f"{topic}/{UNROUTED}", 0)
        self.topics.append(topic)

    def _value(self, topic: str, i: int) -> bytes:
        if topic.endswith("clicks"):
            return self.avro({"id": i, "page": f"/p{i % 9}"}, SerializationContext(topic, MessageField.VALUE))
        if ".inventory." in topic:
            return json.dumps({"op": "c", "after": {"id": i, "name": f"n{i}"}, "source": {"ts_ms": i}}).encode()
        if topic.endswith("visits"):
            return json.dumps({"id": i, "region": REGIONS[i % 3] if i % 89 else "../x"}).encode()
        return json.dumps({"id": i, "ts": "2026-11-26T01:00:00+00:00", "v": i % 7}).encode()

    def _key(self, topic: str, i: int) -> str:
        """Where record i of `topic` belongs: its topic, or its region's (a field-routed topic)."""
        if not topic.endswith("visits"):
            return topic
        return f"{topic}/{REGIONS[i % 3]}" if i % 89 else f"{topic}/{UNROUTED}"

    def round(self, per_topic: int) -> None:
        for topic in list(self.topics):
            for _ in range(per_topic):
                i = self.next_id
                self.next_id += 1
                if i % 97 == 0 and not topic.endswith("clicks"):
                    self.producer.produce(topic, value=b"{broken", partition=i % 2)
                    self.bad[f"{topic}/{UNROUTED}" if topic.endswith("visits") else topic] += 1
                else:
                    self.producer.produce(topic, value=self._value(topic, i), partition=i % 2)
                    key = self._key(topic, i)
                    if key.endswith(UNROUTED):
                        self.bad[key] += 1
                    else:
                        self.valid[key].append(i)
        assert self.producer.flush(30) == 0

    def _run(self) -> None:
        while not self.stop.is_set():
            self.round(20)
            time.sleep(0.25)


def _fleet(tmp_path: Path, broker: str, registry_url: str, prefix: str) -> Path:
    document = {
        "kafka": {"bootstrap_servers": broker},
        "catalog": {"name": "cfleet", "uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "defaults": {"ingest": {"commit_interval_seconds": 1, "state_dir": "state", "parallelism": 2,
                                "topic_discovery_seconds": 2}},
        "tables": [
            {"identifier": "shop.orders", "topics": [f"{prefix}orders"],
             "schema": [{"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamptz"},
                        {"name": "v", "type": "long"}]},
            {"identifier": "raw.{topic}", "topic_pattern": f"{prefix}events\\..*", "schema": "infer"},
            {"identifier": "cdc.{source_table}", "topic_pattern": f"{prefix}db\\.inventory\\..*",
             "envelope": "debezium", "primary_key": ["id"],
             "schema": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"}]},
            {"identifier": "web.clicks", "topics": [f"{prefix}clicks"], "value_format": "avro"},
            {"identifier": "web.visits_{region}", "topics": [f"{prefix}visits"], "route_field": "region",
             "schema": "infer"},
        ],
    }
    document["kafka"]["schema_registry"] = {"url": registry_url, "retries": 2}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _table_of(prefix: str, topic: str) -> str:
    """The table of a topic, or of `topic/region` for the field-routed one."""
    if "/" in topic:
        return f"web.visits_{topic.rsplit('/', 1)[1]}"
    if topic.endswith("orders"):
        return "shop.orders"
    if topic.endswith("clicks"):
        return "web.clicks"
    if ".inventory." in topic:
        return f"cdc.{topic.rsplit('.', 1)[-1]}_changelog"
    return "raw." + topic.replace("-", "_").replace(".", "_").lower()


def _uncommitted(warehouse: Path, catalog) -> set[str]:
    """Parquet files under the warehouse no table references: written, never committed."""
    live = set()
    for namespace in catalog.list_namespaces():
        for identifier in catalog.list_tables(namespace):
            table = catalog.load_table(identifier)
            live |= {t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()}
    return {str(p) for p in warehouse.rglob("*.parquet") if "dead_letters" not in str(p)} - live


def _start(path: Path, log: Path) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "streamberg"
    return subprocess.Popen([str(exe), "ingest", "--config", str(path), "--quiet"], stdout=log.open("ab"),
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "STREAMBERG_LOG_FORMAT": "json"})


def test_many_tables_survive_kill_9_twice(tmp_path: Path, broker: str, registry) -> None:
    prefix = f"k{int(time.time() * 1000) % 100000}-"
    path = _fleet(tmp_path, broker, registry.url, prefix)
    producers = Producers(broker, registry.url, prefix)
    for topic in ([f"{prefix}orders", f"{prefix}clicks", f"{prefix}db.inventory.customers", f"{prefix}visits"]
                  + [f"{prefix}events.t{t:02d}" for t in range(PATTERN_TOPICS)]):
        producers.add(topic)
    producers.round(50)
    producers.thread.start()
    catalog = load_catalog(CatalogConfig(name="cfleet", uri=f"sqlite:///{tmp_path}/catalog.db",
                                         warehouse=f"file://{tmp_path}/warehouse"))
    log = tmp_path / "ingest.log"
    left: list[set[str]] = []
    try:
        for attempt in range(2):
            proc = _start(path, log)
            deadline = time.monotonic() + 240
            seen = len(left[-1]) if left else 0
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    pytest.fail(f"ingest exited early ({proc.returncode}):\n{log.read_text()[-4000:]}")
                if catalog.table_exists("shop.orders") and catalog.load_table("shop.orders").current_snapshot() \
                        and len(_uncommitted(tmp_path / "warehouse", catalog)) > seen:
                    break
                time.sleep(0.5)
            else:
                pytest.fail(f"no commit and no file in flight within 240 s:\n{log.read_text()[-4000:]}")
            if attempt == 0:  # a topic made between the kills gets its table without a restart
                producers.add(f"{prefix}events.late")
                time.sleep(6)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            left.append(_uncommitted(tmp_path / "warehouse", catalog))
    finally:
        producers.stop.set()
        producers.thread.join(60)
    producers.round(10)  # a last round, after the kills
    assert left[0], "the first kill left no uncommitted file behind"
    assert left[1] - left[0], "the second kill left no uncommitted file behind"

    # Drain: bounded runs read what is left of every topic.
    def counts() -> dict[str, tuple[int, int]]:
        out = {}
        for topic in producers.valid:
            table = _table_of(prefix, topic)
            rows = catalog.load_table(table).scan(selected_fields=("id",)).to_arrow().num_rows \
                if catalog.table_exists(table) else 0
            out[topic] = (rows, len(producers.valid[topic]))
        return out

    exe = Path(sys.executable).parent / "streamberg"
    for _ in range(6):
        if all(have == want for have, want in counts().values()):
            break
        finish = subprocess.run([str(exe), "ingest", "--config", str(path), "--duration", "20", "--quiet"],
                                capture_output=True, text=True, timeout=300)
        assert finish.returncode == 0, finish.stderr[-4000:]
    missing = {t: c for t, c in counts().items() if c[0] != c[1]}
    assert not missing, (missing, finish.stderr[-3000:])

    for topic in producers.valid:
        table = _table_of(prefix, topic)
        ids = catalog.load_table(table).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
        assert len(ids) == len(producers.valid[topic]) and len(set(ids)) == len(ids), (table, len(ids))
        assert sorted(ids) == sorted(producers.valid[topic]), table
    for key, bad in producers.bad.items():  # every malformed record and hostile route value once
        letters = f"{_table_of(prefix, key).removesuffix('_changelog')}_dead_letters"
        assert catalog.load_table(letters).scan().to_arrow().num_rows == bad, letters
    assert producers.bad[f"{prefix}visits/{UNROUTED}"] > 0
    # An independent reader agrees on two of them.
    from streamberg.common.config import fleet_table, load_fleet

    fleet = load_fleet(path)
    for table in ("shop.orders", _table_of(prefix, f"{prefix}events.late")):
        config = fleet_table(fleet, table, producers.topics)
        assert sorted(rows_by_duckdb(config)) == sorted(producers.valid[
            next(t for t in producers.topics if _table_of(prefix, t) == table)])

    # One governor keeps every table of this config: the route field's tables too (found by the
    # catalog's record of them), each with a compactor checkpoint of its own.
    from streamberg.common.tables import config_tables

    kept = config_tables(path).configs
    assert {f"web.visits_{r}" for r in REGIONS} <= set(kept), sorted(kept)
    assert {"shop.orders", _table_of(prefix, f"{prefix}events.late")} <= set(kept)
    assert len({c.compactor.checkpoint_dir for c in kept.values()}) == len(kept)
