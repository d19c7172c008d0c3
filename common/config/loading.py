"""Reading the file: a regular UTF-8 file of at most 1 MiB, strict YAML (duplicate keys,
non-string keys, deep nesting and alias floods refused before validation), relative paths
resolved against the file's folder, environment overrides, and the dump workers rebuild from.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any, TypeGuard

import yaml
from pydantic import (
    ValidationError,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource
from pydantic_settings.exceptions import SettingsError

from streamberg.common.catalog_kinds import AVAILABLE_CATALOGS, DEFAULT_STATE_URI
from streamberg.common.config.bounds import (
    MAX_CONFIG_BYTES,
    MAX_TEXT,
    MAX_YAML_ALIASES,
    MAX_YAML_DEPTH,
)
from streamberg.common.config.components import (
    CompactorConfig,
)
from streamberg.common.config.fleet import FleetConfig
from streamberg.common.config.messages import (
    _MAX_SHOWN,
    _key_shown,
    _one_line,
    config_error,
)
from streamberg.common.config.model import (
    ENV_PREFIX,
    StreambergConfig,
)
from streamberg.common.config.sections import (
    IngestConfig,
)
from streamberg.common.config.table import (
    CatalogConfig,
)
from streamberg.common.errors import ConfigError
from streamberg.common.redact import register_mapping_secrets, register_secret, register_uri_secrets


def _is_path(value: Any) -> TypeGuard[str]:
    # Leave anything odd (not a string, NUL bytes, absurd length) for validation to name.
    return isinstance(value, str) and 0 < len(value) <= MAX_TEXT and value.isprintable()


class _PathProblem(Exception):
    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")


def _absolute(path: str, base: Path, key: str) -> str:
    try:
        p = Path(path).expanduser()
        return str(p if p.is_absolute() else (base / p).resolve())
    except (RuntimeError, OSError, ValueError) as exc:  # "~nosuchuser/x", a symlink loop, ...
        raise _PathProblem(key, f"cannot resolve the path ({_one_line(exc)[:100]})") from None


def _resolve_paths(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    out = dict(raw)
    # A section given as a scalar or list is left as it is: validation names it.
    catalog = raw.get("catalog", {})
    kind = AVAILABLE_CATALOGS.get(str(catalog.get("type", "sql"))) if isinstance(catalog, dict) else None
    if kind is not None:
        # The kind's local paths only: a REST catalog's warehouse is what its server calls it,
        # a Glue or Hive catalog's a location every engine reaches, never a local path.
        catalog = dict(catalog)
        defaults = {"uri": CatalogConfig.model_fields["uri"].default,
                    "warehouse": CatalogConfig.model_fields["warehouse"].default, "state_uri": DEFAULT_STATE_URI}
        for key in kind.local_paths:
            value = catalog.get(key) or defaults.get(key)
            if not _is_path(value):
                continue
            if key in ("uri", "state_uri"):  # SQLAlchemy URIs: a relative SQLite file
                if value.startswith("sqlite:///") and not value.startswith("sqlite:////"):
                    value = "sqlite:///" + _absolute(value.removeprefix("sqlite:///"), base, f"catalog.{key}")
            elif key == "warehouse":
                if "://" not in value:
                    value = "file://" + _absolute(value, base, "catalog.warehouse")
            else:
                value = _absolute(value, base, f"catalog.{key}")
            catalog[key] = value
        out["catalog"] = catalog
    ingest = raw.get("ingest", {})
    if isinstance(ingest, dict):
        ingest = dict(ingest)
        state = ingest.get("state_dir", IngestConfig.model_fields["state_dir"].default)
        if _is_path(state):
            ingest["state_dir"] = _absolute(state, base, "ingest.state_dir")
        out["ingest"] = ingest
    compactor = raw.get("compactor", {})
    if isinstance(compactor, dict):
        compactor = dict(compactor)
        checkpoint = compactor.get("checkpoint_dir", CompactorConfig.model_fields["checkpoint_dir"].default)
        if _is_path(checkpoint) and "://" not in checkpoint:
            compactor["checkpoint_dir"] = _absolute(checkpoint, base, "compactor.checkpoint_dir")
        out["compactor"] = compactor
    return out


class _Refused(Exception):
    """The YAML document uses something a config must not (duplicate keys, deep nesting, ...)."""

    def __init__(self, message: str, mark: Any = None) -> None:
        where = f"line {mark.line + 1}: " if mark is not None else ""
        super().__init__(where + message)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, non-string keys, deep nesting and alias floods.

    PyYAML lets the last duplicate key win silently, and its composer recurses once per
    nesting level (a few thousand brackets exhaust the stack). Aliases are counted because
    each one can multiply the data a validator walks (the "billion laughs" document).
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise _Refused(f"more than {MAX_YAML_ALIASES} aliases", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _Refused(f"nested more than {MAX_YAML_DEPTH} levels deep", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *base" may be overridden, by design
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):
                shown = repr(key) if len(repr(key)) <= _MAX_SHOWN else type(key).__name__
                raise _Refused(f"key {shown} is not a string (quote it)", key_node.start_mark)
            if key in seen:
                raise _Refused(f"duplicate key '{_key_shown(key)}' (YAML would keep only the last one)",
                               key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_config_text(path: Path) -> str:
    """The file's text, if it is a regular, readable UTF-8 file of at most MAX_CONFIG_BYTES."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_CONFIG_BYTES:
        os.close(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"config file {path} is not a regular file")
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes")
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(MAX_CONFIG_BYTES + 1)  # it may have grown since fstat
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte offset {exc.start})") from None


def _parse_yaml(path: Path, text: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except _Refused as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}: {_one_line(exc.problem or exc.context or '')}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {_one_line(exc)}") from None
    except (ValueError, RecursionError) as exc:
        # PyYAML's constructors raise plain ValueError (an integer of more than 4300 digits).
        raise ConfigError(f"config file {path} holds a value YAML cannot read: {_one_line(exc)[:200]}") from None


def _env_error(exc: SettingsError) -> ConfigError:
    """pydantic-settings names only the section; find the variable whose JSON is bad."""
    match = re.search(r'field "([^"]+)"', str(exc))
    section = f"{ENV_PREFIX}{match.group(1).upper()}" if match else ENV_PREFIX
    names = []
    for name, value in sorted(os.environ.items()):
        if not name.upper().startswith(section) or not value.lstrip().startswith(("{", "[")):
            continue
        try:
            json.loads(value)
        except ValueError:
            names.append(name)
    shown = ", ".join(names) or section
    return ConfigError(f"invalid configuration in the environment: {shown}: not valid JSON "
                       f"(a section or a mapping/list key is given as JSON)")


def config_document(path: str | Path) -> dict[str, Any]:
    """The file as written (no paths resolved, no defaults, no environment): what a tool
    that rewrites a config for elsewhere (`deploy k8s`) must read. Not a mapping: {}."""
    raw = _parse_yaml(Path(path), _read_config_text(Path(path)))
    return raw if isinstance(raw, dict) else {}


def _is_fleet(path: str | Path) -> bool:
    """Whether the file declares many tables (`tables:`; common/config/fleet.py)."""
    raw = _parse_yaml(Path(path), _read_config_text(Path(path)))
    return isinstance(raw, dict) and "tables" in raw


def load_fleet(path: str | Path) -> FleetConfig:
    """Read and validate a config of many tables; every route's table configuration is
    validated too (with its first named topic, or a sample name for a pattern), so a bad key
    fails here, named as `tables.N...`."""
    path = Path(path)
    raw = _parse_yaml(path, _read_config_text(path))
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must be a mapping of sections (kafka, catalog, defaults, tables, ...)")
    raw = {key: value for key, value in raw.items() if value is not None}
    try:
        shared = _resolve_paths({"catalog": raw.get("catalog", {}), "compactor": raw.get("compactor", {}),
                                 "ingest": (raw.get("defaults") or {}).get("ingest", {})
                                 if isinstance(raw.get("defaults") or {}, dict) else {}}, path.resolve().parent)
    except _PathProblem as exc:
        raise ConfigError(f"invalid configuration in {path}: {exc}") from None
    raw["catalog"], raw["compactor"] = shared["catalog"], shared["compactor"]
    if isinstance(raw.get("defaults"), dict):
        raw["defaults"] = {**raw["defaults"], "ingest": shared["ingest"]}
    raw = _fleet_environment(raw)
    raw["config_path"] = str(path.resolve())
    try:
        fleet = FleetConfig(**raw)
    except ValidationError as exc:
        raise config_error(str(path), exc) from None
    refused: list[tuple[str, ConfigError]] = []  # every bad route, not only the first
    for i, route in enumerate(fleet.tables):
        sample = route.topics[0] if route.topics else "sample.topic"
        try:
            config = config_from_dump(fleet.document(route, sample))
            if route.route_field is not None:  # the longest value a record can give must make a table too
                config_from_dump(fleet.document(route, sample, "v" * 63))
        except ConfigError as exc:
            refused.append((f"tables.{i} ({route.identifier})", exc))
            continue
        _register_secrets(config)
    if refused:
        raise ConfigError(f"{path}: " + "; ".join(f"{where}: {exc}" for where, exc in refused),
                          problems=[f"{where}: {problem}" for where, exc in refused for problem in exc.problems])
    return fleet


# A config of many: where each section of the environment's overrides goes (the single-table
# config's sections; `table` and `ingest` are every route's defaults).
_FLEET_SECTIONS = {"kafka": ("kafka",), "catalog": ("catalog",), "compactor": ("compactor",),
                   "maintenance": ("maintenance",), "monitoring": ("monitoring",), "merge": ("merge",),
                   "run": ("run",), "govern": ("govern",), "ingest": ("defaults", "ingest"),
                   "table": ("defaults", "table")}


def _fleet_environment(raw: dict[str, Any]) -> dict[str, Any]:
    """`STREAMBERG_<SECTION>__<KEY>` overrides for a config of many, as for one table: the
    environment wins over the file, key by key (a REST credential, consumer settings, a
    bootstrap server per deployment). Relative paths it gives are the working directory's."""
    from pydantic_settings import EnvSettingsSource

    try:
        found = EnvSettingsSource(StreambergConfig, case_sensitive=False, env_prefix=ENV_PREFIX,
                                  env_nested_delimiter="__")()
    except SettingsError as exc:
        raise _env_error(exc) from None
    if not found:
        return raw
    unknown = sorted(set(found) - set(_FLEET_SECTIONS))
    if unknown:
        raise ConfigError(f"invalid configuration in the environment: {ENV_PREFIX}{unknown[0].upper()}__*: a config "
                          f"of many tables has no section {unknown[0]} (its sections: {', '.join(sorted(_FLEET_SECTIONS))})")
    try:  # the paths it gives, absolute against the working directory; nothing else filled in
        resolved = _resolve_paths({k: v for k, v in found.items() if k in ("catalog", "compactor", "ingest")},
                                  Path.cwd())
    except _PathProblem as exc:
        raise ConfigError(f"invalid configuration in the environment: {exc}") from None
    for section in ("catalog", "compactor", "ingest"):
        if isinstance(found.get(section), dict) and isinstance(resolved.get(section), dict):
            found[section] = {k: resolved[section][k] for k in found[section]}
    out = dict(raw)
    for section, value in found.items():
        where = _FLEET_SECTIONS[section]
        holder = out
        for step in where[:-1]:
            holder[step] = dict(holder.get(step) or {}) if isinstance(holder.get(step) or {}, dict) else holder.get(step)
            holder = holder[step]
        if not isinstance(holder, dict):
            continue  # a malformed section: the model names it
        current = holder.get(where[-1])
        holder[where[-1]] = _deep_merge(current, value) if isinstance(current, dict) else value
    return out


def _deep_merge(base: dict[str, Any], over: Any) -> Any:
    if not isinstance(over, dict):
        return over
    out = dict(base)
    for key, value in over.items():
        out[key] = _deep_merge(out[key], value) if isinstance(out.get(key), dict) else value
    return out


def as_fleet(config: StreambergConfig) -> FleetConfig:
    """A config of one table as a config of one route: the ingest, status and the governor
    then have one path for one table or many. Its one route names the table's topic; every
    table configuration it makes is the config itself."""
    dump = dump_config(config)
    shared = {name: section for name, section in dump.items()
              if name in ("catalog", "compactor", "maintenance", "monitoring", "merge", "run", "govern")}
    try:
        fleet = FleetConfig.model_validate({
            **shared, "kafka": {k: v for k, v in dump["kafka"].items() if k != "topic"},
            "defaults": {"ingest": dump["ingest"]}, "config_path": config.config_path, "single": dump,
            "tables": [{"identifier": config.table.identifier, "topics": [config.kafka.topic]}]})
    except ValidationError as exc:  # a table a config of one names but a route cannot: said, not raised raw
        raise config_error(str(config.config_path or "the configuration"), exc) from None
    fleet._loaded = config
    return fleet


def one_table(fleet: FleetConfig) -> StreambergConfig | None:
    """A config of one table: that table's configuration as it loaded (rebuilt from its dump
    where the fleet was: a worker's); None for a config of many. (Here, not a method of
    FleetConfig: the rebuild is this module's, which imports that one.)"""
    if fleet.many:
        return None
    if fleet._loaded is None:
        assert fleet.single is not None
        fleet._loaded = config_from_dump(fleet.single)
    return fleet._loaded


def load_tables(path: str | Path) -> FleetConfig:
    """The tables of a config file as routes: a config of many as it is, a config of one table
    as a config of one route (the only place that asks which the file is: every command loads
    its config here and sees one type, `FleetConfig.many` and `one_table` for what differs)."""
    return load_fleet(path) if _is_fleet(path) else as_fleet(load_config(path))


def load_config(path: str | Path, **overrides: Any) -> StreambergConfig:
    """Read, resolve and validate a config file; raise ConfigError naming every bad key.

    The secrets the config holds (catalog URI password, secret-named catalog properties and
    consumer settings) are registered with common.redact, so no output shows them after.
    """
    path = Path(path)
    raw = _parse_yaml(path, _read_config_text(path))
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must be a mapping of sections (kafka, catalog, table, ...)")
    if "tables" in raw:
        raise ConfigError(f"{path} declares many tables (tables:): this command works on one, give --table "
                          "<namespace.table> (or run `streamberg ingest`, `run` or `status` on the whole file)")
    # An empty section ("ingest:" with every key commented out) means its defaults.
    raw = {key: value for key, value in {**raw, **overrides}.items() if value is not None or key in ("kafka", "table")}
    try:
        raw = _resolve_paths(raw, path.resolve().parent)
    except _PathProblem as exc:
        raise ConfigError(f"invalid configuration in {path}: {exc}") from None
    raw["config_path"] = str(path.resolve())
    try:
        config = StreambergConfig(**raw)
    except ValidationError as exc:
        raise config_error(str(path), exc) from None
    except SettingsError as exc:
        raise _env_error(exc) from None
    if config.route_field is not None:  # from the file or STREAMBERG_ROUTE_FIELD: it would filter fresh reads
        raise ConfigError(f"invalid configuration in {path}: route_field: not a setting of a one-table file (a "
                          "config of many sets it for its field-routed tables: tables[].route_field)")
    config = _absolute_overrides(config)
    _register_secrets(config)
    return config


def _absolute_overrides(config: StreambergConfig) -> StreambergConfig:
    """Paths from the file were made absolute against its folder before validation; a path
    still relative came from an environment override: absolute against the working directory
    the operator gave it in, so every process of the run (Flink workers, the supervisor's
    children, Spark) means the same folder."""
    cwd = Path.cwd()
    updates: dict[str, Any] = {}
    catalog = config.catalog
    local = AVAILABLE_CATALOGS[catalog.type].local_paths
    if "uri" in local and catalog.uri.startswith("sqlite:///") and not catalog.uri.startswith("sqlite:////") \
            and _is_path(catalog.uri):
        catalog = catalog.model_copy(update={"uri": "sqlite:///" + str(cwd / catalog.uri.removeprefix("sqlite:///"))})
    state = catalog.state_uri
    if state and state.startswith("sqlite:///") and not state.startswith("sqlite:////") and _is_path(state):
        catalog = catalog.model_copy(update={"state_uri": "sqlite:///" + str(cwd / state.removeprefix("sqlite:///"))})
    if "warehouse" in local and "://" not in catalog.warehouse and not Path(catalog.warehouse).is_absolute():
        catalog = catalog.model_copy(update={"warehouse": "file://" + str(cwd / catalog.warehouse)})
    if catalog is not config.catalog:
        updates["catalog"] = catalog
    if not Path(config.ingest.state_dir).is_absolute():
        updates["ingest"] = config.ingest.model_copy(update={"state_dir": str(cwd / config.ingest.state_dir)})
    checkpoint = config.compactor.checkpoint_dir
    if checkpoint and "://" not in checkpoint and not Path(checkpoint).is_absolute():
        updates["compactor"] = config.compactor.model_copy(update={"checkpoint_dir": str(cwd / checkpoint)})
    return config.model_copy(update=updates) if updates else config


def dump_config(config: StreambergConfig) -> dict[str, Any]:
    """The config as plain data (for shipping to Flink/Spark workers)."""
    return config.model_dump(mode="json", by_alias=True)


def _register_secrets(config: StreambergConfig) -> None:
    register_uri_secrets(config.catalog.uri)
    register_uri_secrets(config.catalog.state_uri)
    for secret in (config.catalog.credential, config.catalog.token):
        register_secret(secret)
    if config.catalog.credential:  # the client secret alone, as a server's error may quote it
        register_secret(config.catalog.credential.partition(":")[2])
    register_mapping_secrets(config.catalog.properties)
    register_mapping_secrets(config.kafka.consumer)
    if config.kafka.schema_registry is not None:
        register_uri_secrets(config.kafka.schema_registry.url)
        register_mapping_secrets(config.kafka.schema_registry.properties)
    register_mapping_secrets(config.compactor.spark_conf)
    register_mapping_secrets(config.ingest.flink)


class _HandedConfig(StreambergConfig):
    """The same models and validators, with the values given as the only source: a worker's
    environment must not change the configuration the driver validated."""

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   **_others: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def config_from_dump(data: dict[str, Any]) -> StreambergConfig:
    """Rebuild a config inside a worker, validated like the driver's (every section), with
    nothing taken from the worker's environment."""
    try:
        handed = _HandedConfig(**data)
    except ValidationError as exc:
        raise config_error("the configuration handed to a worker", exc) from None
    # Validated above; the values move into the class every caller knows.
    config = StreambergConfig.model_construct(_fields_set=handed.model_fields_set, **dict(handed))
    _register_secrets(config)  # worker logs are redacted like the driver's
    return config
