"""Secrets out of everything streamberg prints or logs.

The configuration carries credentials in three places: the catalog URI
(``postgresql+psycopg2://user:PASSWORD@host/db``, or ``?password=...``), catalog properties
(``s3.secret-access-key``, ``s3.access-key-id``, ...) and Kafka consumer settings
(``sasl.password``). They reach output through URIs shown to the operator, property dicts in
logs, and exception text (SQLAlchemy, psycopg2, Spark/Java errors quote the JDBC URL or
the connection properties). Every such place passes its text through :func:`redact` (or a
dict through :func:`redact_mapping`); the structlog pipeline does it for every log line.

Two layers, because exception formats are not ours to predict:

1. patterns: a password in a URI's userinfo, and any ``key=value`` / ``key: value`` /
   ``"key": "value"`` whose key *name* looks secret (password, secret, token, access key,
   credential, ...);
2. literals: the secret values of the loaded configuration are registered
   (:func:`register_secret`, done by ``load_config``) and replaced wherever they appear,
   whatever text surrounds them.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

MASK = "***"

# Key names whose values are secrets. Matched anywhere in the key, case-insensitively, so
# "s3.secret-access-key", "jdbc.password", "sasl.password", "client.session-token",
# "ssl.key.password", "adls.account-key" and "AWS_SECRET_ACCESS_KEY" all match.
_SECRET_KEY_WORDS = (
    r"password|passwd|passphrase|pwd|secret|token|credential|"
    r"access[-_.]?key|account[-_.]?key|api[-_.]?key|private[-_.]?key|sas[-_.]?key|sse[-_.]?key|"
    r"signature|bearer|authorization|key[-_.]?pem|basic[-_.]?auth[-_.]?user[-_.]?info"
)
_SECRET_KEY = re.compile(rf"(?:{_SECRET_KEY_WORDS})", re.IGNORECASE)

# scheme://user:PASSWORD@host -- the password runs to the last "@" of the token (SQLAlchemy
# parses it that way), so a password containing "@" is masked whole.
# A password may hold spaces (psycopg2 and SQLAlchemy take them, percent-encoded or not):
# it runs to the last "@" on the line, which may mask more than the password, never less.
_USERINFO = re.compile(r"(?P<head>(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@'\"<>]*:)(?P<secret>[^\n'\"<>]*)(?=@)")
# An HTTP credential: `Authorization: Basic dXNlcjpwYXNz`, `Bearer eyJ...` (the scheme kept).
_AUTH_HEADER = re.compile(r"(?i)(?P<head>(?:proxy-)?authorization['\"]?[ \t]*[:=][ \t]*['\"]?"
                          r"(?:(?:basic|bearer|digest|negotiate|ntlm|aws4-hmac-sha256)[ \t]+)?)(?P<secret>[^\s'\"]+)")
# A private key in PEM form (ssl.key.pem, a key file quoted in an error), masked whole.
_PEM_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
                      re.DOTALL)

# key=value, key: value, "key": "value", 'key': 'value', key -> value (Scala maps), where
# the key name looks secret. The key starts only where a key token can start (the
# lookbehind): otherwise every position inside a long run of letters would be tried and
# the search would be quadratic. Whether the key is secret-named, and where its value ends,
# is decided after the match (_secret_values), for the same reason and so that a key that
# is not secret consumes no value ("sqlite:///x.db?password=..." still finds the password).
_KEY_SEP = re.compile(r"(?<![A-Za-z0-9_.\-])(?P<key>[A-Za-z0-9_.\-]+)(?P<sep>['\"]?[ \t]*(?:=|:|->)[ \t]*)")
# A quoted value, backslash escapes included (`"pass\"word"` is one value).
_QUOTED = re.compile(r"(['\"])((?:[^'\"\\\n]|\\.)*)\1")
_BARE = re.compile(r"[^\s&;,'\"}\])]+")


def _secret_values(text: str) -> list[tuple[int, int]]:
    """Spans of the values of secret-named keys in text (quotes excluded)."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for match in _KEY_SEP.finditer(text):
        if match.start() < pos or not is_secret_key(match.group("key")):
            continue
        quoted = _QUOTED.match(text, match.end())
        if quoted:
            spans.append((quoted.start(2), quoted.end(2)))
            pos = quoted.end()
            continue
        bare = _BARE.match(text, match.end())
        if bare:
            spans.append((bare.start(), bare.end()))
            pos = bare.end()
    return spans


# Values registered by load_config; shorter ones are too likely to occur by chance
# ("pw" in "pwd") and are masked by the patterns above only.
_MIN_LITERAL = 6
_literals: set[str] = set()
_literals_lock = threading.Lock()
_literal_re: re.Pattern[str] | None = None


# A name that says where a secret is kept (credential_file, ssl.truststore.location,
# token_path) holds a path, which is no secret: masking it hides what an operator must see.
_WHERE = re.compile(r"[-_.](?:file|path|location|dir|name|type|mode|method|uri_env)$", re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    """Whether a property/setting name holds a secret (by its name)."""
    return bool(_SECRET_KEY.search(key)) and not _WHERE.search(key)


def register_secret(value: str | None) -> None:
    """Mask this exact value (and its URL-decoded form) wherever it appears from now on."""
    if not value:
        return
    global _literal_re
    with _literals_lock:
        added = False
        for form in {value, unquote(value)}:
            if len(form) >= _MIN_LITERAL and form not in _literals:
                _literals.add(form)
                added = True
        if added:
            # Longest first, so a secret that contains another is masked whole.
            ordered = sorted(_literals, key=len, reverse=True)
            _literal_re = re.compile("|".join(re.escape(s) for s in ordered))


def register_uri_secrets(uri: str | None) -> None:
    """Register the password of a URI (userinfo or a secret-named query parameter)."""
    if not uri:
        return
    for match in _USERINFO.finditer(uri):
        register_secret(match.group("secret"))
    for begin, end in _secret_values(uri):
        register_secret(uri[begin:end])


def register_mapping_secrets(mapping: Mapping[str, Any] | None) -> None:
    """Register the values of the secret-named keys of a property dict, and URI passwords in the others."""
    for key, value in (mapping or {}).items():
        if isinstance(value, str):
            if is_secret_key(str(key)):
                register_secret(value)
            else:
                register_uri_secrets(value)


def _mask_key_values(text: str) -> str:
    out, pos = [], 0
    for begin, end in _secret_values(text):
        out += [text[pos:begin], MASK]
        pos = end
    out.append(text[pos:])
    return "".join(out)


def redact(text: str, key_values: bool = True) -> str:
    """The text with every secret we can recognise replaced by ``***``. `key_values=False`:
    leave `secret_key: text` alone, for text that never holds a value there by construction
    (`check`'s explanations of what is wrong with a secret's key, a file named my-secret.yaml)
    while the secrets themselves (registered values, URI passwords, keys) are still masked."""
    if not isinstance(text, str):
        text = str(text)
    pattern = _literal_re
    if pattern is not None:
        text = pattern.sub(MASK, text)
    text = _PEM_KEY.sub(MASK, text)
    text = _USERINFO.sub(lambda m: m.group("head") + MASK, text)
    text = _AUTH_HEADER.sub(lambda m: m.group("head") + MASK, text)
    return _mask_key_values(text) if key_values else text


def redact_value(value: Any) -> Any:
    """Redact strings inside any JSON-like value (dicts, lists, tuples); other values as they are."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return redact_mapping(value)
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v) for v in value)
    return value


def redact_mapping(mapping: Mapping[Any, Any]) -> dict[Any, Any]:
    """A copy of a property dict: secret-named keys masked whole, other strings redacted."""
    out: dict[Any, Any] = {}
    for key, value in mapping.items():
        if isinstance(key, str) and is_secret_key(key) and value not in (None, ""):
            out[key] = MASK
        else:
            out[key] = redact_value(value)
    return out


_PLAIN = (str, int, float, bool, type(None), Mapping, list, tuple)


def _loggable(value: Any) -> Any:
    """A log value the renderer would turn into text by itself (an exception, a path, any
    object), turned into text here, so that it is redacted too."""
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    if isinstance(value, Mapping):
        return {k: _loggable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_loggable(v) for v in value)
    return value if isinstance(value, _PLAIN) else str(value)


def redact_log_event(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: every value of a log line redacted (objects as their text),
    secret-named keys masked."""
    return redact_mapping({k: v if k == "exc_info" else _loggable(v) for k, v in event_dict.items()})
