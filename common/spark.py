"""A SparkSession that sees the same Iceberg catalog as pyiceberg.

The compactor (and tests that read tables back with Spark) use Iceberg's Spark runtime with a
``JdbcCatalog`` that points at the very database pyiceberg's ``SqlCatalog`` uses. Both keep
one row per table in ``iceberg_tables`` (catalog_name, table_namespace, table_name,
metadata_location, previous_metadata_location) and commit with the same compare-and-swap
``UPDATE ... WHERE metadata_location = <old>``, so a commit by either engine is seen by the
other and a lost race fails cleanly on both sides.

Two details make the sharing work:

- The Spark catalog must be *named* like the pyiceberg catalog (``catalog.name``), because
  ``JdbcCatalog`` uses its own name as the ``catalog_name`` column value.
- ``jdbc.schema-version`` stays ``V0``: pyiceberg 0.8.1 creates ``iceberg_tables`` without the
  ``iceberg_type`` column that Iceberg's V1 layout (views) adds. V0 reads and writes exactly
  the columns pyiceberg knows and never alters the shared schema. (V1 would ``ALTER TABLE``
  the shared database; pyiceberg would keep working, as V1 treats a NULL type as a table, but
  there is no reason to change a database another program owns.)

SQLAlchemy URIs are mapped to JDBC ones: ``sqlite:////abs/x.db`` -> ``jdbc:sqlite:/abs/x.db``
(with the same busy timeout pyiceberg uses, so neither side fails on a held lock), and
``postgresql[+driver]://user:pw@host:port/db`` -> ``jdbc:postgresql://host:port/db`` with
``jdbc.user``/``jdbc.password``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from streamberg.common.catalog_java import is_s3_warehouse
from streamberg.common.catalog_kinds import kind_of
from streamberg.common.config import CatalogConfig
from streamberg.common.errors import MissingJarError, SparkCatalogError
from streamberg.common.jars import (
    SPARK_S3_JARS_ENV,
    iceberg_spark_runtime_jar,
    postgres_jdbc_jar,
    spark_s3_jars,
    sqlite_jdbc_jar,
)
from streamberg.common.log import get_logger

ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
SPARK_CATALOG_CLASS = "org.apache.iceberg.spark.SparkCatalog"
# A class of the AWS SDK v2 S3 client that S3FileIO links against: present iff the jars are.
AWS_SDK_S3_CLIENT = "software.amazon.awssdk.services.s3.S3Client"


def spark_catalog_conf(catalog: CatalogConfig) -> dict[str, str]:
    """Spark conf entries registering `catalog` as a Spark catalog of the same name."""
    prefix = f"spark.sql.catalog.{catalog.name}"
    conf = {prefix: SPARK_CATALOG_CLASS}
    conf.update({f"{prefix}.{key}": value for key, value in kind_of(catalog).java_properties(catalog).items()})
    if catalog.scan_reports_dir:  # every scan's report, for the clustering that follows the queries
        from streamberg.common.report_jar import REPORTER_CLASS, REPORTS_DIR_PROPERTY

        conf[f"{prefix}.metrics-reporter-impl"] = REPORTER_CLASS
        conf[f"{prefix}.{REPORTS_DIR_PROPERTY}"] = catalog.scan_reports_dir
    return conf


def spark_jars(catalog: CatalogConfig | None = None) -> list[str]:
    """Jars a session needs: the Iceberg runtime, the JDBC drivers, S3 jars for an S3 warehouse.

    Without a catalog (a shared session whose catalogs are registered later), the PostgreSQL
    driver is added when installed: a JDBC driver must be on the classpath from the start.
    """
    jars = [str(iceberg_spark_runtime_jar()), str(sqlite_jdbc_jar())]
    try:  # the scan-report writer (common/report_jar.py): on the classpath of every session
        from streamberg.common.report_jar import report_jar

        jars.append(str(report_jar()))
    except MissingJarError as exc:
        if catalog is not None and catalog.scan_reports_dir:
            raise
        get_logger("spark").warning("no scan reports from this session", reason=str(exc)[:300])
    if catalog is None:
        try:
            jars.append(str(postgres_jdbc_jar()))
        except MissingJarError:
            pass
        return jars
    jars += [j for j in kind_of(catalog).spark_jars(catalog) if j not in jars]
    if is_s3_warehouse(catalog):
        jars += [j for j in (str(p) for p in spark_s3_jars()) if j not in jars]
    return jars


def base_spark_conf(jars: list[str], master: str, app_name: str) -> dict[str, str]:
    """Session-wide settings: jars, Iceberg SQL extensions (CALL, system functions), loopback only when local."""
    conf = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.jars": ",".join(jars),
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        # Timestamps in the table are UTC; never let the driver's zone leak into results.
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
        # HotSpot does not JIT-compile methods over 8000 bytes of bytecode; a whole-stage
        # codegen method that large runs interpreted, several times slower (the Hilbert
        # index chain hits this: 24 s instead of 5 s per million rows here). At 8000 Spark
        # falls back to per-operator code instead, as its documentation advises for HotSpot.
        "spark.sql.codegen.hugeMethodLimit": "8000",
    }
    # The UI's kill links would let anyone who reaches it stop a stage (docs/security.md).
    conf["spark.ui.killEnabled"] = "false"
    # Spark masks conf values whose key matches this in its UI, event log and errors. Its
    # default (secret|password|token|access[.]key) misses the catalog's credential (REST
    # client_id:client_secret) and the object stores' key names.
    conf["spark.redaction.regex"] = SPARK_REDACTION_REGEX
    if master.startswith("local"):
        # A local driver needs no reachable address; binding to loopback keeps Spark off
        # whatever interface the hostname resolves to (and off the network entirely).
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf["spark.driver.host"] = "127.0.0.1"
        # The UI ignores spark.driver.bindAddress and listens on every interface (*:4040);
        # nobody watches a local compactor's UI, so it is off (compactor.spark_conf can turn
        # it back on). tests/test_listen_loopback.py checks nothing listens off loopback.
        conf["spark.ui.enabled"] = "false"
        # Loopback keeps the network out, not the host's other users: the driver's RPC and
        # block manager ports ask every connection for this application's secret, which
        # Spark makes itself for a local master (docs/security.md). PySpark's own py4j
        # gateway has its token already.
        conf["spark.authenticate"] = "true"
        # The heap sized explicitly, and given back when idle: G1 returns unused committed heap
        # to the OS after a periodic collection, so a compactor, merge or maintenance process
        # that is idle between passes shrinks back instead of holding its high-water mark
        # (a soak showed a compactor's resident memory climbing towards the default heap's
        # limit). compactor.spark_conf / merge.spark_conf override either.
        conf["spark.driver.memory"] = LOCAL_DRIVER_MEMORY
        conf["spark.driver.extraJavaOptions"] = LOCAL_DRIVER_JAVA_OPTIONS
    return conf


SPARK_REDACTION_REGEX = (r"(?i)secret|password|passwd|token|credential|access[.\-_]?key|account[.\-_]?key"
                         r"|private[.\-_]?key|sas[.\-_]?key|authorization|bearer")
LOCAL_DRIVER_MEMORY = "1g"
LOCAL_DRIVER_JAVA_OPTIONS = "-XX:+UseG1GC -XX:G1PeriodicGCInterval=30000 -XX:MaxMetaspaceSize=384m"


def register_catalog(spark: Any, catalog: CatalogConfig) -> str:
    """Make `catalog` usable in an existing session (catalogs can be added at runtime).

    Returns the Spark catalog name. Re-registering the same settings is a no-op; a different
    database under a name the session already uses is refused, because Spark keeps the first
    catalog instance it loaded under a name for the life of the session.
    """
    conf = spark_catalog_conf(catalog)
    prefix = f"spark.sql.catalog.{catalog.name}"
    existing_uri = spark.conf.get(f"{prefix}.uri", None)
    if existing_uri is not None and existing_uri != conf[f"{prefix}.uri"]:
        raise SparkCatalogError(
            f"this Spark session already has a catalog named {catalog.name!r} on {existing_uri}; "
            f"give catalog.name a different value to use {conf[f'{prefix}.uri']} too"
        )
    if is_s3_warehouse(catalog) and not _jvm_has_class(spark, AWS_SDK_S3_CLIENT):
        # Fail here, naming the fix, rather than with a NoClassDefFoundError at the first read.
        raise SparkCatalogError(
            f"catalog.warehouse {catalog.warehouse!r} is on S3, but this Spark session has no AWS SDK v2 "
            f"({AWS_SDK_S3_CLIENT}): start it with the jars of {SPARK_S3_JARS_ENV} (iceberg-aws-bundle)"
        )
    for key, value in conf.items():
        spark.conf.set(key, value)
    return catalog.name


def _jvm_has_class(spark: Any, name: str) -> bool:
    """Whether the session's classloader (the one that sees spark.jars) can load `name`."""
    jvm = spark._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    try:
        jvm.java.lang.Class.forName(name, False, loader)
    except Exception:  # noqa: BLE001 - py4j wraps ClassNotFoundException
        return False
    return True


def spark_session(conf: Mapping[str, str]) -> Any:
    """getOrCreate with these settings (a context already running keeps its own)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def build_spark_session(catalog: CatalogConfig, master: str, spark_conf: Mapping[str, str],
                        app_name: str = "streamberg-compactor") -> Any:
    """A SparkSession on `master` with the catalog registered, `spark_conf` applied last
    (`compactor.spark_master` / `compactor.spark_conf`, which maintenance shares).

    Under spark-submit the master and jars given there win (getOrCreate keeps an existing
    context's settings); locally the session is built from the config.
    """
    conf = base_spark_conf(spark_jars(catalog), master, app_name)
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        # Launched by spark-submit: its --master and --jars decide (builder settings would
        # override them), the rest of the settings still apply.
        conf.pop("spark.master")
        conf.pop("spark.jars")
        # The loopback binding is for a local master only (compactor.spark_master, which
        # spark-submit overrides); executors on other hosts must reach this driver.
        conf.pop("spark.driver.bindAddress", None)
        conf.pop("spark.driver.host", None)
        conf.pop("spark.ui.enabled", None)  # the submit's (and the cluster's) choice
        # Spark makes the authentication secret itself only for a local master; a cluster's
        # secret is the cluster's setting (spark.authenticate.secret), not ours.
        conf.pop("spark.authenticate", None)
    # Small local runs: the default 200 shuffle partitions only add task overhead.
    conf.setdefault("spark.sql.shuffle.partitions", str(max(2, os.cpu_count() or 2)))
    conf.update(spark_conf)
    spark = spark_session(conf)
    register_catalog(spark, catalog)
    return spark


def quiet_spark_logs(spark: Any, level: str = "WARN") -> None:
    """Spark's own log level, plus silence for a warning that is expected here.

    JdbcCatalog warns on every start that the catalog has no view support: that is the
    deliberate V0 schema shared with pyiceberg (see the module docstring).
    """
    spark.sparkContext.setLogLevel(level)
    try:
        jvm = spark._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.iceberg.jdbc.JdbcCatalog", jvm.org.apache.logging.log4j.Level.ERROR
        )
    except Exception:  # noqa: BLE001 - cosmetic only
        pass


def activate(spark: Any) -> None:
    """Make `spark` the active session of the calling thread (JVM side).

    Spark resolves runtime-registered catalogs through the thread's active session; a thread
    without one (any Python thread but the one that built the session) would fall back to
    the global default conf and not find the catalog.
    """
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def release_callback_connections(spark: Any) -> None:
    """Close the JVM's connections to this Python process that nothing used since the last call.

    A streaming query's `foreachBatch` is called from the query's own JVM thread, a new one
    every query; in PySpark's pinned-thread mode py4j gives each such thread a connection of
    its own (a socket in the JVM, a socket and a serving thread here) and keeps it in its pool
    after the thread ends: py4j's PythonClient never cleans that pool (its cleaner is off). A
    process that runs a query a compaction (`govern`, `run`) grew by a socket pair each
    (bench/govern_fleet.py: 70 in ten minutes). py4j's own cleanup closes the pooled
    connections not used since its previous call; a connection in use is out of the pool, and
    a live thread whose idle connection was closed opens a new one on its next call (a
    continuous query keeps running across it). Called when a query ends; a failure is logged,
    never raised (the query's work is done)."""
    try:
        spark.sparkContext._gateway.java_gateway_server.getCallbackClient().periodicCleanup()
    except Exception as exc:  # noqa: BLE001 - another gateway (a Spark Connect client): nothing to release
        get_logger("spark").debug("callback connections not released",
                                  error=(str(exc).splitlines() or [type(exc).__name__])[0][:200])


# A Spark local property: scans planned while it is "true" are the product's own work and not
# reported as queries (common/jvm_reporter/StreambergReportWriter.java).
OWN_SCANS_PROPERTY = "streamberg.own-scans"


@contextmanager
def own_scans(spark: Any) -> Iterator[None]:
    """The product's own work on `spark` in this thread (and the streaming queries it starts):
    its scans read every column and are not what users query, so they are not reported."""
    context = spark.sparkContext
    before = context.getLocalProperty(OWN_SCANS_PROPERTY)
    context.setLocalProperty(OWN_SCANS_PROPERTY, "true")
    try:
        yield
    finally:
        context.setLocalProperty(OWN_SCANS_PROPERTY, before)


@contextmanager
def session_for(catalog: CatalogConfig, master: str, spark_conf: Mapping[str, str], given: Any = None,
                app_name: str = "streamberg-compactor") -> Iterator[Any]:
    """The Spark session a component runs on: `given` (a caller's, e.g. a test's), else the
    process's (`process_session`: the runtime's, stopped when the command ends); made current
    with this catalog registered. Its scans are the component's own work while it runs
    (own_scans): not reported as queries."""
    spark = given if given is not None else process_session(catalog, master, spark_conf, app_name)
    activate(spark)
    register_catalog(spark, catalog)
    with own_scans(spark):
        yield spark


def process_session(catalog: CatalogConfig, master: str, spark_conf: Mapping[str, str],
                    app_name: str = "streamberg-compactor") -> Any:
    """The process's Spark session, owned by its runtime (common/runtime.py): built from the
    config on first use, stopped when the runtime closes (the command's end); the catalog
    registered in it (a second component's catalog is added to the same session)."""
    from streamberg.common.runtime import current

    def make() -> Any:
        spark = build_spark_session(catalog, master, spark_conf, app_name=app_name)
        quiet_spark_logs(spark)
        return spark

    spark = current().spark(make)
    register_catalog(spark, catalog)
    return spark


class JobGroups:
    """Cancellable work on one shared session: an action marks the Spark jobs its thread starts
    with a job group (pinned-thread mode: PySpark's thread is the JVM's), and `cancel` ends
    them, and any streaming query whose name starts with the given prefix (a streaming query
    runs its jobs in its own thread, under its own group)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def enter(self, group: str, description: str) -> None:
        self.spark.sparkContext.setJobGroup(group, description[:200], interruptOnCancel=True)

    def leave(self) -> None:
        self.spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)

    def cancel(self, group: str, query_prefix: str | None = None) -> None:
        self.spark.sparkContext.cancelJobGroup(group)
        if query_prefix is None:
            return
        for query in self.spark.streams.active:
            if (query.name or "").startswith(query_prefix):
                try:
                    query.stop()
                except Exception:  # noqa: BLE001 - it stopped meanwhile
                    pass
