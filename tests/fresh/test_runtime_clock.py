"""The runtime's topic ids and pooled consumers (common/runtime.py): a read of the kept tail
never waits on the broker for an id it holds, a topic deleted and made again is seen within
the bound, and a consumer kept idle past its bound is closed rather than lent (its connection
may have died meanwhile). The runtime's clock is the test's: time passes without sleeping.

A real broker; the topic really deleted and made again (it gets a new id)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka.admin import AdminClient

from streamberg.common.broker import ensure_topic
from streamberg.common.runtime import POOL_IDLE_SECONDS, TOPIC_ID_SECONDS, Runtime
from tests.helpers import FakeClock, wait_for


def test_a_held_id_answers_at_once_and_a_recreated_topic_is_seen_within_the_bound(broker: str) -> None:
    topic = f"tid-{time.time_ns()}"
    ensure_topic(broker, topic, 1)
    settings = {"bootstrap.servers": broker}
    clock = FakeClock()
    runtime = Runtime(clock=clock)
    admin = AdminClient(settings)
    try:
        first = runtime.topic_id(settings, topic)
        assert first  # tansu gives topic ids
        admin.delete_topics([topic])[topic].result(10)
        wait_for(lambda: topic not in admin.list_topics(timeout=5).topics, 30, "the topic deleted")
        ensure_topic(broker, topic, 1)
        clock.advance(TOPIC_ID_SECONDS - 0.1)
        assert runtime.topic_id(settings, topic) == first  # held, younger than the bound: no question asked
        clock.advance(0.2)
        # Past the bound: the held id answers at once, and is asked again in the background.
        assert runtime.topic_id(settings, topic) == first
        second = wait_for(lambda: (found := runtime.topic_id(settings, topic)) != first and found, 10,
                          "the recreated topic's id")
        assert second and second != first
        clock.advance(2 * TOPIC_ID_SECONDS + 0.1)
        # Past twice the bound: asked before answering (the same topic: the same id), so held
        # as asked now, not as asked before.
        assert runtime.topic_id(settings, topic) == second
        assert runtime._topic_ids[(broker, topic)][0] == clock()
    finally:
        runtime.close()


def test_a_kept_consumer_is_lent_again_until_idle_past_the_bound(broker: str) -> None:
    clock = FakeClock()
    runtime = Runtime(clock=clock)
    settings = {"bootstrap.servers": broker, "group.id": "pool-test"}
    try:
        with runtime.consumer(settings) as first:
            pass
        clock.advance(POOL_IDLE_SECONDS - 0.1)
        with runtime.consumer(settings) as again:
            assert again is first  # kept, idle less than the bound: lent again
        clock.advance(POOL_IDLE_SECONDS + 0.1)
        with runtime.consumer(settings) as later:
            assert later is not first
        with pytest.raises(RuntimeError):  # the one idle too long was closed
            first.assignment()
        assert runtime.opened["consumers"] == 2
    finally:
        runtime.close()
