"""Kafka consumers kept between fresh reads of one process: a consumer's start (its broker
connections, the topic's metadata) costs more than a small tail's read, so each is borrowed
for one read and given back unassigned (its paused partitions resumed first).

One consumer serves one read at a time; a pool per table and settings, at most POOL_SIZE
kept idle. Consumers never join a group and never commit.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from confluent_kafka import Consumer

from streamberg.common.config import StreambergConfig
from streamberg.ingest.source import consumer_settings

POOL_SIZE = 4
_pools: dict[str, list[Consumer]] = {}
_lock = threading.Lock()


def settings_of(config: StreambergConfig) -> dict[str, Any]:
    return {**consumer_settings(config), "group.id": f"streamberg-fresh-{config.table.identifier}",
            "enable.partition.eof": True, "isolation.level": "read_committed", "fetch.wait.max.ms": 10,
            "log_level": 0}


@contextmanager
def borrowed(config: StreambergConfig) -> Iterator[Consumer]:
    settings = settings_of(config)
    key = repr(sorted(settings.items()))
    with _lock:
        pool = _pools.setdefault(key, [])
        consumer = pool.pop() if pool else None
    if consumer is None:
        consumer = Consumer(settings)
    healthy = False
    try:
        yield consumer
        healthy = True
    finally:
        kept = False
        if healthy:
            try:
                assigned = consumer.assignment()
                if assigned:
                    consumer.resume(assigned)
                consumer.unassign()
                with _lock:
                    if len(_pools[key]) < POOL_SIZE:
                        _pools[key].append(consumer)
                        kept = True
            except Exception:  # noqa: BLE001 - a consumer in doubt is closed, not kept
                kept = False
        if not kept:
            consumer.close()
