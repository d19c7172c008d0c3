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


def settings_of(config: StreambergConfig) -> dict[str, Any]:
    return {**consumer_settings(config), "group.id": f"streamberg-fresh-{config.table.identifier}",
            "enable.partition.eof": True, "isolation.level": "read_committed", "fetch.wait.max.ms": 10,
            "log_level": 0, "socket.keepalive.enable": True}


@contextmanager
def borrowed(config: StreambergConfig, fresh: bool = False) -> Iterator[Consumer]:
    """A consumer for one read (`fresh`: a new one, never a kept one)."""
    with current().consumer(settings_of(config), fresh=fresh) as consumer:
        yield consumer
