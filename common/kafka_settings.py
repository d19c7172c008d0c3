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
from typing import Any

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
