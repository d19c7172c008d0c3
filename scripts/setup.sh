#!/usr/bin/env bash
# Idempotent set-up: system JVM pieces, the project virtualenv, and a runtime check.
# Safe to re-run; each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

say() { printf '\033[1msetup:\033[0m %s\n' "$*"; }

# 1. Java 17: Flink 2.3 and Spark 3.5 both run on it.
if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
  echo "setup: java not found. Install a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless) and re-run." >&2
  exit 1
fi

# 2. JDBC drivers for Spark's Iceberg JdbcCatalog, from Debian (no Maven repository here).
need_pkgs=()
[ -f /usr/share/java/sqlite-jdbc.jar ] || [ -n "${STREAMBERG_SQLITE_JDBC_JAR:-}" ] || need_pkgs+=(libxerial-sqlite-jdbc-java libxerial-sqlite-jdbc-jni)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "setup: need ${need_pkgs[*]} (Debian) and cannot install as non-root; install them or set STREAMBERG_SQLITE_JDBC_JAR" >&2; exit 1; fi
  say "installing ${need_pkgs[*]}"
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

# 2b. PostgreSQL catalog: the JDBC driver (Spark's JdbcCatalog on postgresql:// catalogs) and
# the server binaries the tests start themselves (tests/fixtures/postgres.py); and strace for
# the tests. Optional for SQLite-only use, so without root or sudo this only warns.
optional_pkgs=()
[ -f /usr/share/java/postgresql.jar ] || [ -n "${STREAMBERG_POSTGRES_JDBC_JAR:-}" ] || optional_pkgs+=(libpostgresql-jdbc-java)
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || optional_pkgs+=(postgresql)
# strace: tests/test_listen_loopback.py reads every bind() of a local run with it.
command -v strace >/dev/null || optional_pkgs+=(strace)
# A real browser for the dashboard's tests (tests/monitoring/test_dashboard_browser.py).
command -v chromium >/dev/null && command -v chromedriver >/dev/null || optional_pkgs+=(chromium chromium-driver)
if [ ${#optional_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then OPT_SUDO=""; elif command -v sudo >/dev/null; then OPT_SUDO="sudo"; else OPT_SUDO="none"; fi
  if [ "$OPT_SUDO" = none ]; then
    echo "setup: warning: ${optional_pkgs[*]} (Debian) missing and not installable as non-root; the tests that need them will skip" >&2
  else
    say "installing ${optional_pkgs[*]}"
    $OPT_SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $OPT_SUDO apt-get install -y -qq "${optional_pkgs[@]}" >/dev/null
  fi
fi

# 3. The virtualenv with the pinned set (see pyproject.toml for why each pin).
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import streamberg.common, pyflink, pyspark, pyiceberg" >/dev/null 2>&1 \
   || [ pyproject.toml -nt "$VENV/.streamberg-installed" ]; then
  say "installing python packages into $VENV (pinned; takes a few minutes the first time)"
  "$VENV/bin/pip" install -q --upgrade "pip==24.3.1" "setuptools==75.6.0" wheel
  "$VENV/bin/pip" install -q -e ".[dev]"
  touch "$VENV/.streamberg-installed"
fi

# 4. Check the JVM side: java 17, the Iceberg runtime jar's sha256, the JDBC driver.
"$VENV/bin/python" -m streamberg.common.jars
# 5. The class-data-sharing archive of the ingest's gateway JVM (ingest/local/class_archive.py): a
# local `streamberg ingest` maps ~14,000 classes from it instead of loading them. Built once
# (~20 s), kept in $VENV/share/streamberg/jvm, skipped when present.
"$VENV/bin/python" -m streamberg.ingest.local.class_archive
# 6. The scan-report writer (common/report_jar.py): a MetricsReporter compiled against the Iceberg
# runtime with the JDK's javac, so engines' scans can say what they filter (catalog.scan_reports_dir).
"$VENV/bin/python" -m streamberg.common.report_jar \
  || say "no scan-report writer (needs a JDK's javac: openjdk-17-jdk-headless); catalog.scan_reports_dir will not work"
say "done. Next: make demo (runs the ingest on embedded defaults) or make test."
