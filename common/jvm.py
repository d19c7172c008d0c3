"""The py4j bridge to Java objects in a Spark driver, shared by the compactor and maintenance.

Java exceptions are classified here, once, by class (walking their causes: a procedure
wraps Iceberg's exception in Spark's), never by matching message text elsewhere.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

from py4j.protocol import Py4JJavaError

from streamberg.common.redact import redact

_MAX_CAUSES = 5


class IcebergFailure(enum.Enum):
    """The Iceberg commit failures callers handle differently."""

    VALIDATION = "org.apache.iceberg.exceptions.ValidationException"  # a conflicting change
    COMMIT_FAILED = "org.apache.iceberg.exceptions.CommitFailedException"  # kept losing races
    STATE_UNKNOWN = "org.apache.iceberg.exceptions.CommitStateUnknownException"  # may have landed


def _java_chain(exc: BaseException) -> list[Any]:
    """The Java exception behind `exc` and its causes: a Py4JJavaError's, or the one PySpark
    kept when it converted a Java exception into its own (`CapturedException._origin`)."""
    current = exc.java_exception if isinstance(exc, Py4JJavaError) else getattr(exc, "_origin", None)
    chain: list[Any] = []
    while current is not None and len(chain) < _MAX_CAUSES:
        chain.append(current)
        cause = current.getCause()
        current = None if cause is None or cause.equals(current) else cause
    return chain


def java_class_name(exc: BaseException) -> str | None:
    """The Java exception class behind a Py4JJavaError (None for Python errors)."""
    if not isinstance(exc, Py4JJavaError):
        return None
    return str(exc.java_exception.getClass().getName())


def iceberg_failure(exc: BaseException) -> IcebergFailure | None:
    """Which Iceberg commit failure `exc` is (or is caused by), if any."""
    by_class = {kind.value: kind for kind in IcebergFailure}
    for java in _java_chain(exc):
        kind = by_class.get(str(java.getClass().getName()))
        if kind is not None:
            return kind
    return None


def java_message(exc: BaseException) -> str:
    """The Java exception's message followed by its causes' (the useful part is often a cause)."""
    # Redacted: driver and JDBC errors quote connection URLs and properties.
    if not isinstance(exc, Py4JJavaError):
        return redact(str(exc))
    chain = _java_chain(exc)
    return redact(" <- ".join(f"{j.getClass().getSimpleName()}: {j.getMessage()}" for j in chain))


def load_table(spark: Any, spark_table: str) -> Any:
    """The Java org.apache.iceberg.Table behind a Spark table name (fresh from the catalog)."""
    return spark._jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, spark_table)


def java_list(spark: Any, items: Iterable[Any]) -> Any:
    out = spark._jvm.java.util.ArrayList()
    for item in items:
        out.add(item)
    return out


def java_set(spark: Any, items: Iterable[Any]) -> Any:
    out = spark._jvm.java.util.HashSet()
    for item in items:
        out.add(item)
    return out


def iterate(jcollection: Any) -> list[Any]:
    """A Java collection's elements as a Python list of Java objects."""
    out = []
    it = jcollection.iterator()
    while it.hasNext():
        out.append(it.next())
    return out
