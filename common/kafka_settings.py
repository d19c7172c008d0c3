"""The settings every Kafka client of the product shares: where the brokers are and how to
reach them.

`kafka.consumer` holds any librdkafka setting for the ingest's consumers. The part of it
that says how to connect (the security protocol, SASL, TLS, sockets, DNS) applies to every
other client too: the producer of `streamberg produce`, the admin client that creates or
lists topics, and the probes of `status`/`metrics`. Consumer-only settings (fetch sizes,
isolation level) stay with the consumers: a producer given them would warn or refuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamberg.common.config import StreambergConfig

# librdkafka's global properties about the connection, by prefix (CONFIGURATION.md of
# librdkafka 2.x): every client needs them to reach a secured cluster.
CONNECTION_PREFIXES = ("security.", "sasl.", "ssl.", "ssl_", "socket.", "enable.ssl.", "https.")
CONNECTION_KEYS = frozenset({"client.id", "client.dns.lookup", "client.rack", "broker.address.family",
                             "broker.address.ttl", "connections.max.idle.ms", "reconnect.backoff.ms",
                             "reconnect.backoff.max.ms", "oauthbearer_token_refresh_cb"})


def is_connection_setting(key: str) -> bool:
    return key in CONNECTION_KEYS or key.startswith(CONNECTION_PREFIXES)


def connection_settings(bootstrap_servers: str, consumer: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`bootstrap.servers` and the connection part of `kafka.consumer`: the base of every
    producer, admin client and probe the product makes."""
    return {"bootstrap.servers": bootstrap_servers,
            **{key: value for key, value in (consumer or {}).items() if is_connection_setting(key)}}


def consumer_settings(config: StreambergConfig) -> dict:
    """A consumer's settings for the table's topic: the ingest's, a fresh read's and the tail keeper's
    (each names its own group id over this one)."""
    return {
        "bootstrap.servers": config.kafka.bootstrap_servers,
        # librdkafka wants a group id even for assign(); offsets are never auto-committed.
        "group.id": config.ingest_target.consumer_group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # Never a silent jump: librdkafka would reset an out-of-range fetch to earliest or
        # latest without telling consume() (librdkafka#4224); with "error" it reports it, and
        # the writer applies ingest.on_lost_offsets. kafka.start_offset is resolved to a number
        # by the writer itself, for partitions the table has never recorded.
        "auto.offset.reset": "error",
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": max(8 * 1024 * 1024, 2 * config.ingest.max_record_bytes),
        "receive.message.max.bytes": max(100 * 1024 * 1024, 4 * config.ingest.max_record_bytes),
        **config.kafka.consumer,
    }
