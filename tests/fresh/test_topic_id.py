"""The runtime's topic ids (common/runtime.py): a read of the kept tail never waits on the
broker for an id it holds, and a topic deleted and made again is seen within the bound.

A real broker; the topic really deleted and made again (it gets a new id)."""

from __future__ import annotations

import time

from confluent_kafka.admin import AdminClient

import streamberg.common.runtime as runtime_module
from streamberg.common.broker import ensure_topic
from streamberg.common.runtime import Runtime
from tests.helpers import wait_for


def test_a_held_id_answers_at_once_and_a_recreated_topic_is_seen_within_the_bound(broker: str, monkeypatch) -> None:
    monkeypatch.setattr(runtime_module, "TOPIC_ID_SECONDS", 1.0)
    topic = f"tid-{time.time_ns()}"
    ensure_topic(broker, topic, 1)
    settings = {"bootstrap.servers": broker}
    runtime = Runtime()
    admin = AdminClient(settings)
    try:
        first = runtime.topic_id(settings, topic)
        assert first  # tansu gives topic ids
        admin.delete_topics([topic])[topic].result(10)
        wait_for(lambda: topic not in admin.list_topics(timeout=5).topics, 30, "the topic deleted")
        ensure_topic(broker, topic, 1)
        assert runtime.topic_id(settings, topic) == first  # held, younger than the bound: no question asked
        time.sleep(1.1)
        # Past the bound: the held id answers at once, and is asked again in the background.
        assert runtime.topic_id(settings, topic) == first
        second = wait_for(lambda: (found := runtime.topic_id(settings, topic)) != first and found, 10,
                          "the recreated topic's id")
        assert second and second != first
        time.sleep(2.1)  # past twice the bound: asked before answering (the same topic: the same id)
        assert runtime.topic_id(settings, topic) == second
    finally:
        runtime.close()
