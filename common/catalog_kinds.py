"""The catalog kinds, one entry each: how to open one, read-only, for Spark, where its state
lives and which of its settings are local paths (pyiceberg's AVAILABLE_CATALOGS is the model).

Every question whose answer depends on `catalog.type` is asked here, through `kind_of(config)`:
`tests/test_architecture.py` refuses a comparison of `catalog.type` anywhere else (the config
model's own validators excepted). A new kind is one entry.

| kind | pyiceberg | Iceberg Java (Spark) | streamberg's own tables |
|---|---|---|---|
| sql | SqlCatalog (SQLite, PostgreSQL) | JdbcCatalog on the same database | in the catalog's database |
| rest | RestCatalog | RESTCatalog | `catalog.state_uri` |
| glue | GlueCatalog | GlueCatalog | `catalog.state_uri` |
| hive | HiveCatalog | HiveCatalog | `catalog.state_uri` |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the config package's loading reads this registry
    from pyiceberg.catalog import Catalog

    from streamberg.common.config.table import CatalogConfig

DEFAULT_STATE_URI = "sqlite:///.streamberg/state.db"


@dataclass(frozen=True)
class CatalogKind:
    name: str
    # A catalog to work with: creates what a first run needs (a SQLite file, its tables).
    open: Callable[[CatalogConfig], Catalog]
    # A catalog that answered one query, opened without creating anything (readers: status).
    open_readonly: Callable[[CatalogConfig, int], Catalog]
    # Iceberg Java's catalog properties (a Spark catalog of the same name).
    java_properties: Callable[[CatalogConfig], dict[str, str]]
    # Whether streamberg's own tables live in the catalog's database (else catalog.state_uri).
    state_in_catalog: bool
    # The config's keys that name local files or folders, resolved against the config file's
    # folder when relative (a path of the file means the same from every working directory).
    local_paths: tuple[str, ...]
    # What `check` and messages call the catalog.
    describe: Callable[[CatalogConfig], str]
    # Extra jars a Spark session needs for it, beyond the Iceberg runtime and SQLite's driver.
    spark_jars: Callable[[CatalogConfig], list[str]]
    # Whether `warehouse` is a name its server knows (a REST catalog: the location is what the
    # server states) rather than a location.
    warehouse_named_by_server: bool = False

    def state_uri(self, config: CatalogConfig) -> str | None:
        """The database of streamberg's own tables when not the catalog's own."""
        return None if self.state_in_catalog else (config.state_uri or DEFAULT_STATE_URI)


# The openers and Java properties live a floor below (common/catalog_open.py,
# common/catalog_java.py) and are imported on use: the config's loading reads this registry
# (its kinds' local paths), and sqlalchemy with pyiceberg's SQL catalog would add ~0.45 s to
# every command's start. Neither module imports this one, the config or common/catalog.py:
# no import circle (tests/test_architecture.py refuses one).


def _sql_open(config: CatalogConfig) -> Catalog:
    from streamberg.common.catalog_open import open_sql_catalog

    return open_sql_catalog(config)


def _sql_readonly(config: CatalogConfig, timeout: int) -> Catalog:
    from streamberg.common.catalog_open import open_sql_catalog_readonly

    return open_sql_catalog_readonly(config, timeout)


def _rest_open(config: CatalogConfig) -> Catalog:
    from streamberg.common.catalog_open import open_rest_catalog

    return open_rest_catalog(config)


def _rest_readonly(config: CatalogConfig, timeout: int) -> Catalog:
    from streamberg.common.catalog_open import rest_catalog_readonly

    return rest_catalog_readonly(config, timeout)


def _glue_open(config: CatalogConfig, timeout: int = 0) -> Catalog:
    from streamberg.common.catalog_open import open_glue_catalog

    return open_glue_catalog(config, timeout)


def _hive_open(config: CatalogConfig, timeout: int = 0) -> Catalog:
    from streamberg.common.catalog_open import open_hive_catalog

    return open_hive_catalog(config, timeout)


def _jdbc_java(config: CatalogConfig) -> dict[str, str]:
    from streamberg.common.catalog_java import jdbc_catalog_properties

    return jdbc_catalog_properties(config)


def _rest_java(config: CatalogConfig) -> dict[str, str]:
    from streamberg.common.catalog_java import rest_catalog_properties

    return rest_catalog_properties(config)


def _glue_java(config: CatalogConfig) -> dict[str, str]:
    from streamberg.common.catalog_java import glue_catalog_properties

    return glue_catalog_properties(config)


def _hive_java(config: CatalogConfig) -> dict[str, str]:
    from streamberg.common.catalog_java import hive_catalog_properties

    return hive_catalog_properties(config)


def _sql_jars(config: CatalogConfig) -> list[str]:
    from sqlalchemy.engine import make_url

    from streamberg.common.jars import postgres_jdbc_jar

    if make_url(config.uri).get_backend_name() in ("postgresql", "postgres"):
        return [str(postgres_jdbc_jar())]
    return []


def _aws_jars(config: CatalogConfig) -> list[str]:
    from streamberg.common.jars import spark_s3_jars

    return [str(p) for p in spark_s3_jars()]  # Glue's client is the AWS SDK v2 too


def _none(config: CatalogConfig) -> list[str]:
    return []


AVAILABLE_CATALOGS: dict[str, CatalogKind] = {
    "sql": CatalogKind("sql", _sql_open, _sql_readonly, _jdbc_java, state_in_catalog=True,
                       local_paths=("uri", "warehouse", "scan_reports_dir"), describe=lambda c: f"sql {c.uri}", spark_jars=_sql_jars),
    "rest": CatalogKind("rest", _rest_open, _rest_readonly, _rest_java, state_in_catalog=False,
                        local_paths=("state_uri", "credential_file", "token_file", "scan_reports_dir"),
                        describe=lambda c: f"rest {c.uri}", spark_jars=_none, warehouse_named_by_server=True),
    "glue": CatalogKind("glue", _glue_open, _glue_open, _glue_java, state_in_catalog=False,
                        local_paths=("state_uri", "scan_reports_dir"),
                        describe=lambda c: f"glue {c.properties.get('glue.region', '(region from the environment)')}",
                        spark_jars=_aws_jars),
    "hive": CatalogKind("hive", _hive_open, _hive_open, _hive_java, state_in_catalog=False,
                        local_paths=("state_uri", "scan_reports_dir"), describe=lambda c: f"hive {c.uri}", spark_jars=_none),
}


def kind_of(config: CatalogConfig | dict[str, Any]) -> CatalogKind:
    """The entry of a catalog config (or of a config file's catalog section, as written)."""
    name = config.get("type", "sql") if isinstance(config, dict) else config.type
    return AVAILABLE_CATALOGS[str(name)]
