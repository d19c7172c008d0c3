"""The Kafka consumer of a fresh read: borrowed from the runtime's pool (common/runtime.py)
for one read and given back, so a process's reads pay a consumer's start (its broker
connections, the topic's metadata) once. Consumers never join a group and never commit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from confluent_kafka import Consumer

from streamberg.common.config import StreambergConfig
from streamberg.common.kafka_settings import consumer_settings
from streamberg.common.runtime import current

# How long the broker may hold a fetch that finds nothing new. Not lower: against tansu, a
# partition of many small batches (tens of thousands, as a steady producer makes) answered
# reads of a few thousand records in up to 15 s at 10 ms and never in more than 0.31 s at 50
# or 100 ms, two busy cores beside it (bench/fresh_fetch_wait.py; docs/performance.md). Not
# higher: a read's last fetch, at the partition's end, waits this long for its end.
FETCH_WAIT_MS = 50


def read_settings(connection: dict[str, Any], group: str) -> dict[str, Any]:
    """A fresh read's consumer settings over the cluster's `connection` settings."""
    return {**connection, "group.id": group, "enable.partition.eof": True, "isolation.level": "read_committed",
            "fetch.wait.max.ms": FETCH_WAIT_MS, "log_level": 0, "socket.keepalive.enable": True}


def settings_of(config: StreambergConfig) -> dict[str, Any]:
    return read_settings(consumer_settings(config), f"streamberg-fresh-{config.table.identifier}")


@contextmanager
def borrowed(config: StreambergConfig, fresh: bool = False) -> Iterator[Consumer]:
    """A consumer for one read (`fresh`: a new one, never a kept one)."""
    with current().consumer(settings_of(config), fresh=fresh) as consumer:
        yield consumer
