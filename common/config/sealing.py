"""No secret in a job graph: the config a Flink job carries has its secrets sealed.

A PyFlink job ships its operators pickled, configuration included, to every TaskManager and
into Flink's HA and checkpoint storage. So the dump the job carries holds, in place of each
secret (a secret-named key's value, a URI with a password), a marker naming the environment
variable the workers read it from: the same `STREAMBERG_<SECTION>__<KEY>` name an operator
sets to override the config (`STREAMBERG_CATALOG__CREDENTIAL`,
`STREAMBERG_KAFKA__CONSUMER__SASL.PASSWORD`). On a cluster the TaskManagers are given those
variables (`deploy k8s` puts the Secret in every pod); a local run exports them before its
workers start (`export`), whichever way the driver got them (file or environment).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping
from typing import Any

from streamberg.common.config.model import ENV_PREFIX
from streamberg.common.errors import ConfigError
from streamberg.common.redact import is_secret_key, redact

MARK = "$streamberg-secret:"


def _env_name(path: tuple[str, ...]) -> str:
    return ENV_PREFIX + "__".join(part.upper() for part in path)


def carried_name(name: str) -> str:
    """The name a secret travels under to the workers: only letters, digits and `_`, because
    a POSIX shell between the JVM and a Python worker (PyFlink's runner script) drops
    variables whose names hold `.` or `-` (STREAMBERG_KAFKA__CONSUMER__SASL.PASSWORD)."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return name
    return "STREAMBERG_SEALED__" + re.sub(r"[^A-Za-z0-9]", lambda m: f"_{ord(m.group()):02X}_", name.removeprefix(
        ENV_PREFIX)).upper()


def _is_secret(key: str, value: Any) -> bool:
    if not isinstance(value, str) or not value or value.startswith(MARK):
        return False
    return is_secret_key(key) or redact(value) != value  # a secret-named key, or a URI with a password


def _walk(node: Any, path: tuple[str, ...], found: dict[str, str]) -> Any:
    if isinstance(node, Mapping):
        out = {}
        for key, value in node.items():
            here = (*path, str(key))
            if _is_secret(str(key), value):
                name = _env_name(here)
                found[name] = value
                out[key] = MARK + name
            else:
                out[key] = _walk(value, here, found)
        return out
    if isinstance(node, list):
        return [_walk(item, path, found) for item in node]
    return node


def seal(dump: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The dump with every secret replaced by its marker, and {environment variable: value}."""
    found: dict[str, str] = {}
    return _walk(dump, (), found), found


def export(dump: Mapping[str, Any], environ: MutableMapping[str, str] | None = None) -> dict[str, Any]:
    """Seal `dump` and put its secrets in this process's environment, for the local workers
    started after (they inherit it); returns the sealed dump."""
    sealed, found = seal(dump)
    target = os.environ if environ is None else environ
    for name, value in found.items():
        target[carried_name(name)] = value
    return sealed


def unseal(dump: Any, environ: Mapping[str, str] | None = None) -> Any:
    """The dump with each marker replaced by its variable's value from this worker's
    environment; a variable missing is a clear refusal, never a silent empty secret."""
    source = os.environ if environ is None else environ
    lowered = {k.upper(): v for k, v in source.items()}
    if isinstance(dump, Mapping):
        return {k: unseal(v, source) for k, v in dump.items()}
    if isinstance(dump, list):
        return [unseal(v, source) for v in dump]
    if isinstance(dump, str) and dump.startswith(MARK):
        name = dump.removeprefix(MARK)
        for candidate in (carried_name(name), name):
            if candidate.upper() in lowered:
                return lowered[candidate.upper()]
        also = "" if carried_name(name) == name else f" (or {carried_name(name)}: a shell drops names with . or -)"
        raise ConfigError(f"the secret {name} is not in this worker's environment{also}: give the TaskManagers the "
                          "same STREAMBERG_* variables as the job's client (the job graph carries no secret)")
    return dump


def job_document(fleet: Any) -> dict[str, Any]:
    """The configuration a job's operators are built from, as data (its secrets not sealed
    yet): what `export` and `seal` take. Here, not beside the job graph, so a driver can
    export it before importing PyFlink's job API (ingest/driver.py starts the JVM first)."""
    return dict(fleet.model_dump(mode="json", by_alias=True))
