#!/usr/bin/env bash
# Submit the streamberg ingest job to a Flink session cluster, detached, with `flink run`.
#
#   deploy/flink/submit-ingest.sh --config F [--parallelism P]
#
# The entry point is the module streamberg.cli.flink_submit (cli/flink_submit.py), run by PyFlink's
# driver with -pym: it must be importable by the client's Python, as it is in the project's
# venv; `-py <path of cli/flink_submit.py>` is equivalent.
# Prints the entry point's JSON line ({"job_id": ..., "run_id": ..., "start_offsets": ...});
# stop the job with `flink stop <job_id>` (safe at any moment: offsets live in the table;
# deploy/README.md says why not `flink cancel` on a session cluster).
#
# Which cluster: the one whose config FLINK_CONF_DIR holds (rest.address/rest.port), e.g.
# after `source DIR/cluster.env` for deploy/flink/local-cluster.sh; or add `-m host:port`
# to FLINK_RUN_OPTS.
# Environment:
#   STREAMBERG_PYTHON   the client's Python environment (default: the repo's .venv); its
#                       PyFlink distribution provides the `flink` CLI
#   TASKMANAGER_PYTHON  the interpreter the TaskManagers run the Python operators with
#                       (-pyexec; default: STREAMBERG_PYTHON, right when the TaskManagers
#                       run on this machine or in an image with the venv at the same path).
#                       With a shipped environment: FLINK_RUN_OPTS="-pyarch venv.tar.gz#venv"
#                       and TASKMANAGER_PYTHON=venv/bin/python
#   FLINK_RUN_OPTS      more `flink run` options (-m, -pyarch, -D key=value, ...)
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${STREAMBERG_PYTHON:-$repo/.venv/bin/python}
[ -x "$python" ] || { echo "no Python environment at $python (run make setup, or set STREAMBERG_PYTHON)" >&2; exit 2; }
flink_home=$("$python" -c 'import os, pyflink; print(os.path.dirname(os.path.abspath(pyflink.__file__)))')

# shellcheck disable=SC2086  # FLINK_RUN_OPTS is a list of options
exec "$flink_home/bin/flink" run --detached \
    -pyclientexec "$python" \
    -pyexec "${TASKMANAGER_PYTHON:-$python}" \
    ${FLINK_RUN_OPTS:-} \
    -pym streamberg.cli.flink_submit "$@"
