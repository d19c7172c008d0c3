#!/usr/bin/env bash
# The compactor on a Spark cluster: deploy/spark/submit.sh compact (kept for existing scripts).
exec "$(dirname "$0")/submit.sh" compact "$@"
