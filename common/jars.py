"""Where the JVM pieces come from (no Maven repository is reachable on our machines).

- Iceberg Spark runtime: shipped inside the pinned PyPI wheel snowpark-connect-deps-iceberg
  1.0.2 and checked by sha256. Users with their own jar point STREAMBERG_ICEBERG_SPARK_JAR at it.
- SQLite JDBC driver: Debian's libxerial-sqlite-jdbc-java (/usr/share/java/sqlite-jdbc.jar);
  STREAMBERG_SQLITE_JDBC_JAR overrides. PostgreSQL: libpostgresql-jdbc-java, likewise
  STREAMBERG_POSTGRES_JDBC_JAR.
- S3 for Spark (a warehouse on s3://): Iceberg's S3FileIO (in the runtime jar) needs the AWS SDK
  v2, which no PyPI wheel or Debian package here carries unshaded. Users point
  STREAMBERG_SPARK_S3_JARS at their own jars, e.g. iceberg-aws-bundle-1.10.2.jar
  (deploy/object-store/README.md).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from streamberg.common.errors import MissingJarError

ICEBERG_RUNTIME_JAR = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
ICEBERG_RUNTIME_SHA256 = "c562d482dcd16b666e808b755469fbc4b2604284b41622c9d87e2c02b7cc6c5f"
SQLITE_JDBC_CANDIDATES = ("/usr/share/java/sqlite-jdbc.jar",)
POSTGRES_JDBC_CANDIDATES = ("/usr/share/java/postgresql.jar", "/usr/share/java/postgresql-jdbc4.jar")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def iceberg_spark_runtime_jar(verify: bool = False) -> Path:
    override = os.environ.get("STREAMBERG_ICEBERG_SPARK_JAR")
    if override:
        path = Path(override)
        if not path.is_file():
            raise MissingJarError(f"STREAMBERG_ICEBERG_SPARK_JAR={override} is not a file")
        return path
    try:
        import snowpark_connect_deps_iceberg
    except ImportError:
        raise MissingJarError("the Iceberg Spark runtime wheel is not installed: run `make setup`") from None
    path = Path(snowpark_connect_deps_iceberg.__file__).parent / "jars" / ICEBERG_RUNTIME_JAR
    if not path.is_file():
        raise MissingJarError(f"{path} is missing from snowpark-connect-deps-iceberg; reinstall with `make setup`")
    if verify and (actual := _sha256(path)) != ICEBERG_RUNTIME_SHA256:
        raise MissingJarError(f"{path} has sha256 {actual}, expected {ICEBERG_RUNTIME_SHA256}")
    return path


def _first_existing(env_var: str, candidates: tuple[str, ...], package: str) -> Path:
    override = os.environ.get(env_var)
    if override:
        if not Path(override).is_file():
            raise MissingJarError(f"{env_var}={override} is not a file")
        return Path(override)
    for candidate in candidates:
        if Path(candidate).is_file():
            return Path(candidate)
    raise MissingJarError(f"no JDBC driver found at {', '.join(candidates)}: `apt-get install {package}` "
                          f"(make setup does it) or set {env_var}")


def sqlite_jdbc_jar() -> Path:
    return _first_existing("STREAMBERG_SQLITE_JDBC_JAR", SQLITE_JDBC_CANDIDATES, "libxerial-sqlite-jdbc-java")


def postgres_jdbc_jar() -> Path:
    return _first_existing("STREAMBERG_POSTGRES_JDBC_JAR", POSTGRES_JDBC_CANDIDATES, "libpostgresql-jdbc-java")


SPARK_S3_JARS_ENV = "STREAMBERG_SPARK_S3_JARS"


def spark_s3_jars() -> list[Path]:
    """The AWS SDK v2 jars Iceberg's S3FileIO needs in Spark, from STREAMBERG_SPARK_S3_JARS.

    The variable holds one or more jar paths separated by commas or the OS path separator.
    """
    value = os.environ.get(SPARK_S3_JARS_ENV, "")
    paths = [Path(p) for p in value.replace(os.pathsep, ",").split(",") if p.strip()]
    if not paths:
        raise MissingJarError(
            f"a warehouse on S3 needs the AWS SDK v2 in Spark (Iceberg's S3FileIO): set {SPARK_S3_JARS_ENV} "
            "to iceberg-aws-bundle-<iceberg version>.jar (or the AWS SDK v2 bundle); no PyPI or Debian package "
            "here ships it (deploy/object-store/README.md)"
        )
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise MissingJarError(f"{SPARK_S3_JARS_ENV}: not a file: {', '.join(missing)}")
    return paths


def java_major_version() -> int | None:
    java = shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin")) if os.environ.get("JAVA_HOME") else shutil.which("java")
    if java is None:
        return None
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    for token in out.split():
        token = token.strip('"')
        if token[:1].isdigit():
            return int(token.split(".")[0])
    return None


def check_runtime() -> list[str]:
    """Problems with the JVM side of this installation, empty when all is well."""
    problems = []
    major = java_major_version()
    if major is None:
        problems.append("java not found: install a Java 17 runtime (Debian: openjdk-17-jre-headless) or set JAVA_HOME")
    elif major != 17:
        problems.append(f"java {major} found; Flink 2.3 and Spark 3.5 here are tested on Java 17 (set JAVA_HOME)")
    for check in (lambda: iceberg_spark_runtime_jar(verify=True), sqlite_jdbc_jar):
        try:
            check()
        except MissingJarError as exc:
            problems.append(str(exc))
    return problems


if __name__ == "__main__":  # used by `make setup`
    import sys

    found = check_runtime()
    for problem in found:
        print(f"setup check failed: {problem}", file=sys.stderr)
    if not found:
        print(f"java 17, {iceberg_spark_runtime_jar()} (sha256 ok), {sqlite_jdbc_jar()}")
    sys.exit(1 if found else 0)
