"""Iceberg Java's catalog properties for each kind of catalog: a Spark catalog of the same
name as pyiceberg's, reading and committing the same tables.

The SQL catalog is shared through Iceberg's JdbcCatalog on the very database pyiceberg's
SqlCatalog uses (common/spark.py says why that works); a REST, Glue or Hive catalog through
Java's client of the same service, with the same keys. The kinds' registry
(common/catalog_kinds.py) names these in its entries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.engine import make_url

from streamberg.common.catalog_open import SQLITE_BUSY_TIMEOUT_SECONDS, rest_properties
from streamberg.common.errors import SparkCatalogError
from streamberg.common.redact import redact

if TYPE_CHECKING:  # annotations only: the config package's loading stands on the kinds' registry
    from streamberg.common.config.table import CatalogConfig

JDBC_CATALOG_IMPL = "org.apache.iceberg.jdbc.JdbcCatalog"
S3_FILE_IO_IMPL = "org.apache.iceberg.aws.s3.S3FileIO"
# Warehouse schemes served by S3FileIO (pyiceberg reads the same three with pyarrow).
S3_SCHEMES = ("s3", "s3a", "s3n")


def jdbc_catalog_properties(catalog: CatalogConfig) -> dict[str, str]:
    """Iceberg JdbcCatalog properties equivalent to pyiceberg's SqlCatalog for `catalog`."""
    url = make_url(catalog.uri)
    backend = url.get_backend_name()
    props: dict[str, str] = {
        "catalog-impl": JDBC_CATALOG_IMPL,
        "warehouse": catalog.warehouse,
        "jdbc.schema-version": "V0",
        # pyiceberg creates the catalog tables. Iceberg 1.10's JdbcCatalog checks for them with
        # DatabaseMetaData.getTables() and never closes that ResultSet; on SQLite the open
        # statement pins an old WAL snapshot on a pooled connection, so later reads are stale
        # and commits fail with SQLITE_BUSY_SNAPSHOT. Skipping the check avoids the leak.
        "jdbc.init-catalog-tables": "false",
        # Another engine (pyiceberg ingest) commits to the same tables all the time: never
        # serve a cached, stale table to a Spark query.
        "cache-enabled": "false",
    }
    if backend == "sqlite":
        if not url.database or url.database == ":memory:":
            raise SparkCatalogError(f"catalog.uri {redact(catalog.uri)!r}: an in-memory SQLite catalog cannot be shared with Spark")
        props["uri"] = f"jdbc:sqlite:{url.database}"
        # Passed to the xerial driver as a connection property (JdbcCatalog strips "jdbc.").
        props["jdbc.busy_timeout"] = str(SQLITE_BUSY_TIMEOUT_SECONDS * 1000)
    elif backend in ("postgresql", "postgres"):
        host = url.host or "localhost"
        port = f":{url.port}" if url.port else ""
        props["uri"] = f"jdbc:postgresql://{host}{port}/{url.database or ''}"
        if url.username:
            props["jdbc.user"] = url.username
        if url.password:
            props["jdbc.password"] = str(url.password)
    else:
        raise SparkCatalogError(
            f"catalog.uri {redact(catalog.uri)!r}: Spark can share sqlite or postgresql catalogs, not {backend!r}"
        )
    if is_s3_warehouse(catalog):
        # Java's default FileIO (HadoopFileIO) would need hadoop-aws; S3FileIO needs only the
        # AWS SDK v2 (spark_s3_jars).
        props["io-impl"] = S3_FILE_IO_IMPL
        # pyiceberg takes the region as s3.region or client.region, S3FileIO only as client.region.
        if "s3.region" in catalog.properties and "client.region" not in catalog.properties:
            props["client.region"] = catalog.properties["s3.region"]
    # FileIO settings (s3.endpoint, s3.access-key-id, s3.secret-access-key,
    # s3.path-style-access, ...) mean the same to pyiceberg and Iceberg's Java FileIO.
    props.update(catalog.properties)
    return props


def is_s3_warehouse(catalog: CatalogConfig) -> bool:
    scheme, separator, _ = catalog.warehouse.partition("://")
    return bool(separator) and scheme.lower() in S3_SCHEMES


def rest_catalog_properties(catalog: CatalogConfig) -> dict[str, str]:
    """Iceberg Java's RESTCatalog properties for `catalog`: the keys pyiceberg's RestCatalog
    is given (common/catalog_open.rest_properties), the same names in both clients."""
    props = {"type": "rest", **rest_properties(catalog)}
    # Another engine (pyiceberg ingest) commits to the same tables all the time.
    props.setdefault("cache-enabled", "false")
    if is_s3_warehouse(catalog) and "io-impl" not in props:
        props["io-impl"] = S3_FILE_IO_IMPL
    return props


def _metastore_properties(catalog: CatalogConfig, kind: str, own: dict[str, str], s3: bool) -> dict[str, str]:
    """Iceberg Java's Glue or Hive catalog properties: the same warehouse, the pass-through
    properties (glue.id, glue.endpoint, client.region and the FileIO's own) as pyiceberg's."""
    props = {"type": kind, "warehouse": catalog.warehouse, "cache-enabled": "false", **own}
    if (s3 or is_s3_warehouse(catalog)) and "io-impl" not in catalog.properties:
        props["io-impl"] = S3_FILE_IO_IMPL
    props.update(catalog.properties)
    return props


def glue_catalog_properties(catalog: CatalogConfig) -> dict[str, str]:
    region = catalog.properties.get("glue.region")
    # Iceberg Java names the region client.region; Glue is AWS: S3FileIO whatever the warehouse.
    return _metastore_properties(catalog, "glue", {"client.region": region} if region else {}, s3=True)


def hive_catalog_properties(catalog: CatalogConfig) -> dict[str, str]:
    return _metastore_properties(catalog, "hive", {"uri": catalog.uri}, s3=False)
