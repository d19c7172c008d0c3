#!/usr/bin/env bash
# The compactor on Kubernetes with spark-submit (cluster deploy mode: the driver is a pod too).
# An example to adapt, not verified here (no Kubernetes): see deploy/README.md.
#
#   K8S_API=https://kubernetes.example.com:6443 IMAGE=registry.example.com/streamberg-spark:0.1.0 \
#     deploy/k8s/spark-submit-compactor.sh --once          # or no flag: keep watching
#
# Needs: the image (deploy/k8s/Dockerfile.spark), deploy/k8s/streamberg-config.yaml
# and deploy/k8s/spark-compactor.yaml applied in NAMESPACE, and a local Spark 3.5 to submit
# with (the repo's .venv has one: pyspark/bin/spark-submit).
# Arguments after the script's name go to `streamberg compact` (cli/spark_submit.py, the same
# entry point deploy/spark/submit-compactor.sh runs on a standalone cluster).
# The paths are inside the image (local://): the entry point and the jars the Dockerfile
# links under /opt/streamberg. For a warehouse on S3, add the AWS SDK v2 jars (e.g.
# iceberg-aws-bundle) to the image and to --jars (deploy/object-store/README.md).
set -euo pipefail

: "${K8S_API:?set K8S_API to the Kubernetes API server URL}"
: "${IMAGE:?set IMAGE to the streamberg Spark image}"
NAMESPACE=${NAMESPACE:-default}
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${STREAMBERG_PYTHON:-$repo/.venv/bin/python}
spark_home=$("$python" -c 'import os, pyspark; print(os.path.dirname(os.path.abspath(pyspark.__file__)))')

template=$(mktemp --suffix=.yaml)
trap 'rm -f "$template"' EXIT
kubectl -n "$NAMESPACE" get configmap streamberg-spark-pod-template -o jsonpath='{.data.pod\.yaml}' >"$template"

"$spark_home/bin/spark-submit" \
    --master "k8s://$K8S_API" \
    --deploy-mode cluster \
    --name streamberg-compactor \
    --conf spark.kubernetes.namespace="$NAMESPACE" \
    --conf spark.kubernetes.container.image="$IMAGE" \
    --conf spark.kubernetes.authenticate.driver.serviceAccountName=spark \
    --conf spark.kubernetes.driver.podTemplateFile="$template" \
    --conf spark.kubernetes.executor.podTemplateFile="$template" \
    --conf spark.executor.instances="${EXECUTORS:-2}" \
    --conf spark.executor.cores="${EXECUTOR_CORES:-2}" \
    --conf spark.executor.memory="${EXECUTOR_MEMORY:-4g}" \
    --conf spark.pyspark.python=/opt/venv/bin/python \
    --conf spark.pyspark.driver.python=/opt/venv/bin/python \
    --jars local:///opt/streamberg/iceberg-spark-runtime.jar,local:///opt/streamberg/postgresql.jar \
    local:///opt/streamberg/compactor_submit.py \
    --config /etc/streamberg/streamberg.yaml "$@"
