"""The scan-report writer's jar: common/jvm_reporter/StreambergReportWriter.java, an Iceberg
`MetricsReporter` that appends each scan and commit report (Iceberg's JSON form) to a file in
a folder (table_meta/query_stats.py folds them).

No Maven repository is reachable, so the class is compiled here, against the Iceberg Spark
runtime jar, with the JDK's `javac` (`make setup` does it; a Spark session builds it when
missing). The jar is kept under the virtualenv, named by the sha256 of the source and of the
runtime jar it was compiled against: a jar of another source or runtime is never used.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from streamberg.common.errors import MissingJarError
from streamberg.common.jars import iceberg_spark_runtime_jar

SOURCE = Path(__file__).parent / "jvm_reporter" / "StreambergReportWriter.java"
REPORTER_CLASS = "org.streamberg.reports.StreambergReportWriter"
REPORTS_DIR_PROPERTY = "streamberg.reports-dir"


def _jar_folder() -> Path:
    return Path(sys.prefix) / "share" / "streamberg" / "jvm"


def report_jar_path() -> Path:
    runtime = iceberg_spark_runtime_jar()
    digest = hashlib.sha256(SOURCE.read_bytes() + str(runtime.stat().st_size).encode() + runtime.name.encode())
    return _jar_folder() / f"streamberg-reports-{digest.hexdigest()[:16]}.jar"


def _tool(name: str) -> str:
    home = os.environ.get("JAVA_HOME")
    found = shutil.which(name, path=os.path.join(home, "bin")) if home else shutil.which(name)
    if found is None:
        raise MissingJarError(f"`{name}` not found: the scan-report writer is compiled with a JDK 17 "
                              f"(Debian: openjdk-17-jdk-headless) or set JAVA_HOME")
    return found


def report_jar() -> Path:
    """The reporter's jar, compiled when missing (a few seconds, once)."""
    target = report_jar_path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="streamberg-reporter-") as work:
        classes = Path(work) / "classes"
        classes.mkdir()
        compiled = subprocess.run([_tool("javac"), "-nowarn", "--release", "17", "-cp", str(iceberg_spark_runtime_jar()),
                                   "-d", str(classes), str(SOURCE)], capture_output=True, text=True)
        if compiled.returncode != 0:
            raise MissingJarError(f"the scan-report writer did not compile: {compiled.stderr.strip()[:500]}")
        staged = Path(work) / target.name
        packed = subprocess.run([_tool("jar"), "cf", str(staged), "-C", str(classes), "."],
                                capture_output=True, text=True)
        if packed.returncode != 0:
            raise MissingJarError(f"the scan-report writer's jar was not made: {packed.stderr.strip()[:500]}")
        os.replace(staged, target) if staged.stat().st_dev == target.parent.stat().st_dev else \
            shutil.move(str(staged), str(target))
    return target


if __name__ == "__main__":  # make setup
    print(f"scan-report writer: {report_jar()}")
