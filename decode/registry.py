"""The schema registry, as streamberg asks it: writer schemas by id, the latest by subject.

confluent-kafka's `SchemaRegistryClient` speaks the registry's REST API and caches what it
fetched (a schema id never changes meaning); this module builds it from
`kafka.schema_registry` and puts the one retry policy around it: a registry that is down,
slow, or answers an error is asked again with exponential backoff, then the caller gets a
RegistryUnavailable naming the registry (credentials redacted) and the last answer. Nothing
is skipped meanwhile: the records wait in Kafka. The one exception is a schema the registry
says it does not have (HTTP 404, taken at once) with
`kafka.schema_registry.on_unknown_schema: dead-letter`: the caller gets SchemaNotFound, and
the records naming that id become dead letters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from streamberg.common.config.sections import SchemaRegistryConfig
from streamberg.common.errors import RegistryUnavailable, SchemaNotFound
from streamberg.common.redact import redact
from streamberg.common.retry import BACKGROUND_MAX_BACKOFF_SECONDS, commit_retrying

T = TypeVar("T")


def registry_client(config: SchemaRegistryConfig):  # noqa: ANN201 - confluent_kafka's own type, imported lazily
    """A SchemaRegistryClient for the configured registry (imported here: only Avro needs it)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": config.url, **config.properties})


class WriterSchemas:
    """Writer schemas from one registry, cached by the client, each lookup retried."""

    def __init__(self, config: SchemaRegistryConfig, max_backoff_seconds: float = BACKGROUND_MAX_BACKOFF_SECONDS) -> None:
        self.config, self.retries, self.max_backoff = config, config.retries, max_backoff_seconds
        self.client = registry_client(config)

    def _ask(self, what: str, call: Callable[[], T]) -> T:
        try:
            # A 404 is an answer, not an outage: with dead-letter it is taken at once (a hostile
            # stream naming unknown ids must not hold the writer in backoff).
            dead_letter = self.config.on_unknown_schema == "dead-letter"
            retry = lambda exc: not (dead_letter and _not_found(exc))  # noqa: E731 - one predicate
            for attempt in commit_retrying(self.retries, retry, max_backoff_seconds=self.max_backoff,
                                           event="schema registry did not answer; retrying"):
                with attempt:
                    return call()
        except Exception as exc:  # noqa: BLE001 - any failure to answer is the registry's, after the retries
            if self.config.on_unknown_schema == "dead-letter" and _not_found(exc):
                raise SchemaNotFound(f"the schema registry has no {what} (HTTP 404: {redact(str(exc))[:200]}; "
                                     "kafka.schema_registry.on_unknown_schema: dead-letter)") from None
            raise RegistryUnavailable(
                f"schema registry {redact(self.config.url)}: {what} failed {self.retries + 1} times; last: "
                f"{type(exc).__name__}: {redact(str(exc))[:300]}") from None
        raise AssertionError("unreachable: the last attempt returns or raises")

    def by_id(self, schema_id: int) -> str:
        """The Avro schema text registered under `schema_id`."""
        return self.schema(schema_id, "AVRO").schema_str

    def schema(self, schema_id: int, kind: str):  # noqa: ANN201 - confluent_kafka's Schema
        """The schema registered under `schema_id`, of type `kind` (AVRO or PROTOBUF; a
        Protobuf schema in the serialized form, a base64 FileDescriptorProto, as
        confluent-kafka's own deserializer asks for it). Another type refuses the records."""
        fmt = "serialized" if kind == "PROTOBUF" else None
        schema = self._ask(f"schema id {schema_id}", lambda: self.client.get_schema(schema_id, fmt=fmt))
        if (schema.schema_type or "AVRO") != kind:
            raise ValueError(f"schema id {schema_id} is a {schema.schema_type} schema, not {kind.title()} "
                             f"(kafka.value_format: {kind.lower()})")
        return schema

    def version(self, subject: str, version: int, kind: str):  # noqa: ANN201 - confluent_kafka's Schema
        """A subject's version (what a schema reference names), in the form `schema` gives."""
        fmt = "serialized" if kind == "PROTOBUF" else None
        return self._ask(f"version {version} of subject {subject!r}",
                         lambda: self.client.get_version(subject, version, True, fmt)).schema

    def latest(self, subject: str) -> tuple[int, str]:
        """(id, schema text) of the subject's latest version."""
        schema_id, schema = self.latest_schema(subject, "AVRO")
        return schema_id, schema.schema_str

    def latest_schema(self, subject: str, kind: str):  # noqa: ANN201 - (id, confluent_kafka's Schema)
        """(id, schema) of the subject's latest version, in the form `schema` gives."""
        fmt = "serialized" if kind == "PROTOBUF" else None
        registered = self._ask(f"the latest version of subject {subject!r}",
                               lambda: self.client.get_latest_version(subject, fmt))
        return registered.schema_id, registered.schema


def _not_found(exc: BaseException) -> bool:
    """The registry's answer that it has no such schema, subject or version."""
    return getattr(exc, "http_status_code", None) == 404


def value_subject(topic: str) -> str:
    """The subject of a topic's values under the default TopicNameStrategy."""
    return f"{topic}-value"
