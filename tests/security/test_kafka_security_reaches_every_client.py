"""The cluster's security settings (the SASL/TLS part of `kafka.consumer`) reach every Kafka
client the product makes, not only the ingest's consumers.

A broker with SASL could not be brought up here: the tansu build of the toolchain has
`--authentication`, but its users live in its memory storage and `tansu user create` must
itself authenticate first (it fails with "early eof"), so no user can ever exist. Two proofs
instead: a real client given a TLS setting that cannot work (a CA file that is not there)
fails on it, through the real `streamberg produce`, so the setting was applied; and at the
client-construction boundary, every producer and admin client is built with the SASL keys
and without the consumer-only ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import streamberg, write_config

SECRET = "scram-Pw-7731"
SASL = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "streamberg",
        "sasl.password": SECRET, "ssl.ca.location": "/etc/kafka/ca.pem"}
CONSUMER_ONLY = {"fetch.min.bytes": 1, "isolation.level": "read_committed"}


def test_produce_applies_the_tls_settings_and_says_why_it_cannot_connect(tmp_path: Path, broker: str) -> None:
    missing_ca = tmp_path / "no-such-ca.pem"
    path = write_config(tmp_path, broker, extra={})
    document = yaml.safe_load(path.read_text())
    document["kafka"]["consumer"] = {"security.protocol": "SSL", "ssl.ca.location": str(missing_ca),
                                     "sasl.password": SECRET}
    path.write_text(yaml.safe_dump(document))

    proc = streamberg("produce", "--config", str(path), "--count", "10", "--quiet", check=False, timeout=120)

    # Without the settings the producer would have reached the plaintext broker and exited 0.
    assert proc.returncode != 0, proc.stdout
    assert "ssl.ca.location" in proc.stderr or "no-such-ca.pem" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert SECRET not in proc.stderr + proc.stdout


class _Recorder:
    """Stands in for confluent-kafka's client classes: records the settings it is given and
    answers as a broker with no topics would."""

    made: list[tuple[str, dict[str, Any]]] = []

    def __init__(self, settings: dict[str, Any], *_: Any, **__: Any) -> None:
        _Recorder.made.append((type(self).__name__, dict(settings)))

    def list_topics(self, topic: str | None = None, **_: Any) -> Any:
        # No topics until one is asked for by name: then it has the two partitions created.
        found = {} if topic is None else {topic: type("Topic", (), {"error": None, "partitions": {0: 0, 1: 1}})()}
        return type("Metadata", (), {"topics": found})()


class _Admin(_Recorder):
    def create_topics(self, topics: list[Any], **_: Any) -> dict[str, Any]:
        class Done:
            def result(self, *_: Any) -> None:
                return None
        return {t.topic: Done() for t in topics}


class _Producer(_Recorder):
    def produce(self, *_: Any, **__: Any) -> None:
        return None

    def poll(self, *_: Any) -> int:
        return 0

    def flush(self, *_: Any) -> int:
        return 0

    def __len__(self) -> int:
        return 0


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    import confluent_kafka.admin

    import streamberg.cli.sample_events
    import streamberg.common.broker

    _Recorder.made = []
    monkeypatch.setattr(streamberg.common.broker, "AdminClient", _Admin)
    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", _Admin)  # imported where used
    monkeypatch.setattr(streamberg.cli.sample_events, "Producer", _Producer)
    return _Recorder.made


def _assert_secured(made: list[tuple[str, dict[str, Any]]], kinds: set[str]) -> None:
    assert {kind for kind, _ in made} == kinds, made
    for kind, settings in made:
        for key, value in SASL.items():
            assert settings.get(key) == value, (kind, key, settings)
        assert not set(CONSUMER_ONLY) & set(settings), (kind, settings)
        assert settings["bootstrap.servers"] == "b1.example:9096"


def test_producer_and_topic_admin_of_produce(tmp_path: Path, recorded: list) -> None:
    from streamberg.cli.sample_events import produce_events
    from streamberg.common.broker import ensure_topic
    from tests.helpers import config_at

    path = write_config(tmp_path, "b1.example:9096")
    document = yaml.safe_load(path.read_text())
    document["kafka"]["consumer"] = {**SASL, **CONSUMER_ONLY}
    path.write_text(yaml.safe_dump(document))
    config = config_at(path)

    ensure_topic(config.kafka.bootstrap_servers, config.kafka.topic, 2, connection=config.kafka.consumer)
    produce_events(config, 3)
    _assert_secured(recorded, {"_Admin", "_Producer"})


def test_admin_clients_of_a_config_of_many_tables(tmp_path: Path, recorded: list) -> None:
    import argparse

    from streamberg.cli.configs import config_of
    from streamberg.common.config import config_from_dump, load_fleet
    from streamberg.common.tables import broker_topics

    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": "b1.example:9096", "consumer": {**SASL, **CONSUMER_ONLY}},
        "catalog": {"name": "c1", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": str(tmp_path / "wh")},
        "defaults": {"ingest": {"state_dir": str(tmp_path / "state")}},
        "tables": [{"identifier": "raw.{topic}", "topic_pattern": "events\\..*", "schema": "infer"},
                   {"identifier": "shop.orders", "topics": ["orders"],
                    "schema": [{"name": "id", "type": "long", "required": True}]}],
    }))
    config_of(argparse.Namespace(config=path, table="shop.orders"))
    fleet = load_fleet(path)
    broker_topics(fleet, config_from_dump(fleet.document(fleet.tables[1], "orders")))
    _assert_secured(recorded, {"_Admin"})
    assert len(recorded) == 2
    assert SECRET not in json.dumps([kind for kind, _ in recorded])
