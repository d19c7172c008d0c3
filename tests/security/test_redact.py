"""common/redact.py: the shapes secrets take in driver, Spark and our own text, and what stays readable."""

from __future__ import annotations

import io
import json

import pytest
import structlog

from streamberg.common.redact import MASK, redact, redact_log_event, redact_mapping, register_secret

MASKED = [
    # (text, the secret that must disappear)
    ("postgresql+psycopg2://ingest:pa55-word@db.internal:5432/catalog", "pa55-word"),
    ("postgresql://ingest:p@ss@word@db/catalog", "ss@word"),  # "@" in the password: masked to the last "@"
    ("postgresql+psycopg2://ingest:p%40ssw0rd@db/catalog", "p%40ssw0rd"),
    ("sqlite:///x.db?password=qwerty123&mode=ro", "qwerty123"),
    ("jdbc:postgresql://db:5432/catalog?user=ingest&password=qwerty123", "qwerty123"),
    ("jdbc:sqlserver://db;user=ingest;password=qwerty123;encrypt=true", "qwerty123"),
    ("host=db user=ingest password=qwerty123 dbname=catalog", "qwerty123"),
    ("{'s3.secret-access-key': 'wJalr XUtnF', 's3.endpoint': 'http://minio:9000'}", "wJalr XUtnF"),
    ('{"s3.access-key-id": "AKIAIOSFODNN7", "warehouse": "s3://b/p"}', "AKIAIOSFODNN7"),
    ("spark.sql.catalog.c.jdbc.password=hunter2xx, spark.app.name=x", "hunter2xx"),
    ("Map(jdbc.password -> hunter2xx, uri -> jdbc:postgresql://db/c)", "hunter2xx"),
    ("sasl.password: kafka-secret-1", "kafka-secret-1"),
    ("AWS_SECRET_ACCESS_KEY=abcdEFGH1234", "abcdEFGH1234"),
    ("client.session-token=FQoGZXIvYXdzE", "FQoGZXIvYXdzE"),
    ("adls.account-key=bWFkZS11cA==", "bWFkZS11cA=="),
    # Each of these reached output before (issue 18, part 4).
    ('{"sasl.password": "ab\\"cd-efgh-secret"}', 'cd-efgh-secret'),  # an escaped quote in the value
    ("postgresql://ingest:pass word here@db/catalog", "word here"),  # spaces in a URI password
    ("GET /v1/config Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
    ("headers={'Authorization': 'Bearer eyJhbGciOi.secret'}", "eyJhbGciOi.secret"),
    ("ssl.key.pem=-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkq\n-----END PRIVATE KEY-----", "MIIEvQIBADANBgkq"),
    ("could not load -----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIFHzBJBgkq", "MIIFHzBJBgkq"),
]

KEPT = [
    'connection to server at "127.0.0.1", port 5432 failed: FATAL:  password authentication failed for user "ingest"',
    "sqlite:////var/lib/streamberg/catalog.db",
    "postgresql+psycopg2://ingest@db.internal:5432/catalog",
    "http://minio:9000/bucket/key",
    "table db.events: 3 data files, 1,024 records",
]


@pytest.mark.parametrize(("text", "secret"), MASKED)
def test_secret_shapes_are_masked(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and MASK in out, out


@pytest.mark.parametrize("text", KEPT)
def test_text_without_secrets_is_unchanged(text: str) -> None:
    assert redact(text) == text


def test_uri_keeps_user_host_and_database() -> None:
    assert redact("postgresql+psycopg2://ingest:pa55-word@db:5432/catalog") == "postgresql+psycopg2://ingest:***@db:5432/catalog"


def test_registered_secret_is_masked_in_any_surrounding() -> None:
    register_secret("Zr7-registered-value")
    # A format no pattern knows: only the registered literal catches it.
    assert redact("login as ingest/Zr7-registered-value failed") == "login as ingest/*** failed"
    # Short values are not registered: they would mask ordinary words.
    register_secret("abc")
    assert redact("abc def") == "abc def"


def test_log_values_that_are_objects_are_redacted_as_their_text() -> None:
    from pathlib import Path

    error = RuntimeError("connect to postgresql://ingest:obj-secret-9@db/c failed")
    event = redact_log_event(None, "error", {"event": "x", "error": error, "where": Path("/tmp/x"),
                                             "nested": {"errors": [ValueError("password=zzz-secret-1")]}})
    text = json.dumps(event)
    assert "obj-secret-9" not in text and "zzz-secret-1" not in text
    assert event["error"].startswith("RuntimeError: connect to postgresql://ingest:***@db/c") and event["where"] == "/tmp/x"


def test_mapping_masks_secret_keys_and_redacts_the_rest() -> None:
    props = {"s3.secret-access-key": "k1", "s3.access-key-id": "k2", "s3.endpoint": "http://x:9000",
             "uri": "postgresql://u:pw-in-uri@h/d", "retries": 3, "nested": {"jdbc.password": "k3"}}
    out = redact_mapping(props)
    assert out == {"s3.secret-access-key": MASK, "s3.access-key-id": MASK, "s3.endpoint": "http://x:9000",
                   "uri": "postgresql://u:***@h/d", "retries": 3, "nested": {"jdbc.password": MASK}}
    assert props["s3.secret-access-key"] == "k1"  # a copy: the caller's dict is untouched


def test_structlog_lines_are_redacted() -> None:
    out = io.StringIO()
    logger = structlog.wrap_logger(structlog.WriteLogger(out), processors=[
        structlog.processors.format_exc_info, redact_log_event, structlog.processors.JSONRenderer()])
    try:
        raise RuntimeError("cannot connect to postgresql://u:exc-secret-1@h/d")
    except RuntimeError:
        logger.error("failed", uri="postgresql://u:field-secret-2@h/d", **{"sasl.password": "kw-secret-3"},
                     exc_info=True)
    line = json.loads(out.getvalue())
    text = out.getvalue()
    for secret in ("exc-secret-1", "field-secret-2", "kw-secret-3"):
        assert secret not in text
    assert line["uri"] == "postgresql://u:***@h/d" and line["sasl.password"] == MASK
    assert "RuntimeError" in line["exception"]
