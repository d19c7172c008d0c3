#!/usr/bin/env bash
# Run the compactor, the merge or maintenance on a Spark cluster with spark-submit (client
# deploy mode: the driver runs here, executors on the cluster's workers).
#
#   SPARK_MASTER=spark://host:7077 deploy/spark/submit.sh compact  --config F [--once | --full ...]
#   SPARK_MASTER=spark://host:7077 deploy/spark/submit.sh merge    --config F [--once ...]
#   SPARK_MASTER=spark://host:7077 deploy/spark/submit.sh maintain --config F [--once ...]
#
# Arguments after the component are those of `streamberg <component>` (cli/spark_submit.py is
# the entry point); it prints what the local command prints. The jars are the ones the local
# command uses (common/jars.py): the Iceberg Spark runtime, plus the JDBC driver of catalog.uri.
# The application names itself as locally: streamberg-compactor, -merge, -maintenance.
# Environment:
#   SPARK_MASTER        spark://host:port (default: from DIR/cluster.env when SPARK_CLUSTER_DIR
#                       names a deploy/spark/local-cluster.sh dir)
#   STREAMBERG_PYTHON   the driver's Python environment (default: the repo's .venv)
#   EXECUTOR_PYTHON     the executors' interpreter (spark.pyspark.python; default:
#                       STREAMBERG_PYTHON, right when the workers have the venv at that path)
#   SPARK_SUBMIT_EXTRA  more spark-submit options (--conf k=v, --executor-memory, ...)
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${STREAMBERG_PYTHON:-$repo/.venv/bin/python}
[ -x "$python" ] || { echo "no Python environment at $python (run make setup, or set STREAMBERG_PYTHON)" >&2; exit 2; }
if [ -z "${SPARK_MASTER:-}" ] && [ -n "${SPARK_CLUSTER_DIR:-}" ]; then
    SPARK_MASTER=$(sed -n 's/^SPARK_MASTER=//p' "$SPARK_CLUSTER_DIR/cluster.env")
fi
[ -n "${SPARK_MASTER:-}" ] || { echo "set SPARK_MASTER (spark://host:port) or SPARK_CLUSTER_DIR" >&2; exit 2; }

command=${1:-}
case "$command" in
    compact|merge|maintain) shift ;;
    *) echo "usage: $0 compact|merge|maintain --config F [options of that command]" >&2; exit 2 ;;
esac
config=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    [ "${args[i]}" = "--config" ] && config=${args[i + 1]:-}
done
[ -n "$config" ] || { echo "usage: $0 $command --config F [options of streamberg $command]" >&2; exit 2; }

spark_home=$("$python" -c 'import os, pyspark; print(os.path.dirname(os.path.abspath(pyspark.__file__)))')
entry=$("$python" -c 'import streamberg.cli.spark_submit as m; print(m.__file__)')
# The jars for this config's catalog; a bad config (naming the key) or a missing jar (naming
# the fix) fails here, before Spark starts (exit 2).
jars=$("$python" -c '
import sys
from streamberg.common.config import load_config
from streamberg.common.errors import ConfigError
from streamberg.common.jars import MissingJarError
from streamberg.common.spark import spark_jars
try:
    print(",".join(spark_jars(load_config(sys.argv[1]).catalog)))
except (ConfigError, MissingJarError) as exc:
    sys.exit(f"streamberg: {exc}")' "$config") || exit 2

# shellcheck disable=SC2086  # SPARK_SUBMIT_EXTRA is a list of options
exec "$spark_home/bin/spark-submit" --master "$SPARK_MASTER" --deploy-mode client \
    --jars "$jars" \
    --conf "spark.pyspark.python=${EXECUTOR_PYTHON:-$python}" \
    --conf "spark.pyspark.driver.python=$python" \
    ${SPARK_SUBMIT_EXTRA:-} \
    "$entry" "$command" "$@"
