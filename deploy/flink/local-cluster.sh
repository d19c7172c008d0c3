#!/usr/bin/env bash
# A standalone Flink session cluster on this machine, from the distribution inside the
# apache-flink wheel (pyflink/bin, pyflink/lib): one JobManager and one TaskManager with N
# slots, bound to 127.0.0.1, with its own conf, log, pid and tmp dirs under DIR, so it shares
# nothing with other clusters or with the wheel's own conf/.
#
#   deploy/flink/local-cluster.sh start  DIR [--slots N] [--rest-port P] [--tm-memory 1728m]
#   deploy/flink/local-cluster.sh status DIR      # REST /overview of the running cluster
#   deploy/flink/local-cluster.sh stop   DIR      # TaskManager, then JobManager; waits for both
#
# `start` waits until the TaskManager has registered its slots and prints the cluster's
# environment, which is also written to DIR/cluster.env:
#   source DIR/cluster.env && "$FLINK_HOME/bin/flink" list     # this cluster's jobs
# deploy/flink/submit-ingest.sh submits the ingest job to it.
#
# The Python interpreter is not part of the cluster's config: each job names it
# (flink run -pyexec), as it would on a shared cluster. STREAMBERG_PYTHON selects the
# environment whose PyFlink distribution is used (default: the repo's .venv).
set -euo pipefail

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 2 ] || usage
command=$1; dir=$2; shift 2

repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${STREAMBERG_PYTHON:-$repo/.venv/bin/python}
[ -x "$python" ] || { echo "no Python environment at $python (run make setup, or set STREAMBERG_PYTHON)" >&2; exit 2; }
flink_home=$("$python" -c 'import os, pyflink; print(os.path.dirname(os.path.abspath(pyflink.__file__)))')

export FLINK_HOME=$flink_home
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
export FLINK_CONF_DIR=$dir/conf FLINK_LOG_DIR=$dir/log FLINK_PID_DIR=$dir/pid

rest_url() { sed -n 's/^FLINK_REST_URL=//p' "$dir/cluster.env"; }

pids() { cat "$FLINK_PID_DIR"/*.pid 2>/dev/null || true; }

wait_for_taskmanager() {
    local url=$1 slots=$2 deadline=$((SECONDS + ${FLINK_START_TIMEOUT:-90}))
    while [ $SECONDS -lt $deadline ]; do
        local overview
        overview=$(curl -fsS "$url/overview" 2>/dev/null || true)
        if [ -n "$overview" ] && "$python" -c '
import json, sys
o = json.loads(sys.argv[1])
sys.exit(0 if o["taskmanagers"] >= 1 and o["slots-total"] >= int(sys.argv[2]) else 1)' "$overview" "$slots"; then
            return 0
        fi
        for p in $(pids); do kill -0 "$p" 2>/dev/null || { echo "a Flink daemon (pid $p) died during start-up" >&2; return 1; }; done
        sleep 1
    done
    echo "the TaskManager did not register within ${FLINK_START_TIMEOUT:-90}s" >&2
    return 1
}

start() {
    local slots=2 rest_port="" tm_memory=1728m
    while [ $# -gt 0 ]; do
        case $1 in
            --slots) slots=$2; shift 2 ;;
            --rest-port) rest_port=$2; shift 2 ;;
            --tm-memory) tm_memory=$2; shift 2 ;;
            *) echo "unknown option $1" >&2; usage ;;
        esac
    done
    if [ -n "$(pids)" ]; then
        for p in $(pids); do
            kill -0 "$p" 2>/dev/null && { echo "a cluster is already running from $dir (pid $p); stop it first" >&2; exit 1; }
        done
        rm -f "$FLINK_PID_DIR"/*.pid
    fi
    mkdir -p "$FLINK_CONF_DIR" "$FLINK_LOG_DIR" "$FLINK_PID_DIR" "$dir/tmp"
    # The distribution's log4j settings; our own config.yaml.
    cp "$flink_home"/conf/log4j*.properties "$FLINK_CONF_DIR"/
    local free_port='from streamberg.common.broker import free_port; print(free_port())'
    rest_port=${rest_port:-$("$python" -c "$free_port")}
    local rpc_port; rpc_port=$("$python" -c "$free_port")
    "$python" - "$flink_home/conf/config.yaml" "$FLINK_CONF_DIR/config.yaml" <<EOF
import sys, yaml
distribution = yaml.safe_load(open(sys.argv[1]))
conf = {
    # Java 17 needs the distribution's --add-opens/--add-exports for Flink's reflection.
    "env.java.opts.all": distribution["env"]["java"]["opts"]["all"],
    "env.log.dir": "$FLINK_LOG_DIR",
    "env.pid.dir": "$FLINK_PID_DIR",
    "io.tmp.dirs": "$dir/tmp",
    # For "flink stop" (stop-with-savepoint): the way to end the ingest job that keeps the
    # TaskManager up (see deploy/README.md on flink cancel).
    "state.savepoints.dir": "file://$dir/savepoints",
    # Everything on loopback: RPC, REST, data exchange.
    "jobmanager.rpc.address": "127.0.0.1",
    "jobmanager.rpc.port": $rpc_port,
    "jobmanager.bind-host": "127.0.0.1",
    "jobmanager.memory.process.size": "1024m",
    "taskmanager.host": "127.0.0.1",
    "taskmanager.bind-host": "127.0.0.1",
    "taskmanager.numberOfTaskSlots": $slots,
    "taskmanager.memory.process.size": "$tm_memory",
    "rest.address": "127.0.0.1",
    "rest.bind-address": "127.0.0.1",
    "rest.port": $rest_port,
    # No jar upload through the web UI: `flink run` submits through the REST job endpoint,
    # which this does not touch. Cancel stays on (an operator's last resort; `flink stop` is
    # the way to end the ingest job, see deploy/README.md).
    "web.submit.enable": "false",
    "parallelism.default": 1,
}
with open(sys.argv[2], "w") as out:
    yaml.safe_dump(conf, out, sort_keys=False)
EOF
    local url="http://127.0.0.1:$rest_port"
    cat > "$dir/cluster.env" <<EOF
export FLINK_HOME=$flink_home
export FLINK_CONF_DIR=$FLINK_CONF_DIR
export FLINK_LOG_DIR=$FLINK_LOG_DIR
FLINK_REST_URL=$url
EOF
    "$flink_home/bin/jobmanager.sh" start >/dev/null
    "$flink_home/bin/taskmanager.sh" start >/dev/null
    if ! wait_for_taskmanager "$url" "$slots"; then
        tail -n 30 "$FLINK_LOG_DIR"/*.log >&2 || true
        stop
        exit 1
    fi
    cat "$dir/cluster.env"
}

descendants() {  # every process below the given pids (the TaskManager's Python workers)
    local p
    for p in "$@"; do
        for c in $(ps -o pid= --ppid "$p" 2>/dev/null); do echo "$c"; descendants "$c"; done
    done
}

stop() {
    local daemons children p left=""
    daemons=$(pids)
    children=$(descendants $daemons)
    # The daemons' own stop: SIGTERM by pid file, SIGKILL after 10 s.
    "$flink_home/bin/taskmanager.sh" stop-all >/dev/null 2>&1 || true
    "$flink_home/bin/jobmanager.sh" stop-all >/dev/null 2>&1 || true
    # A TaskManager that had to be SIGKILLed leaves its Python workers behind.
    for p in $children; do kill -9 "$p" 2>/dev/null || true; done
    # SIGKILLed processes take a moment to be gone (and reaped).
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        left=""
        for p in $daemons $children; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
        [ -z "$left" ] && break
        sleep 0.5
    done
    [ -z "$left" ] || { echo "still running:$left" >&2; exit 1; }
    rm -f "$FLINK_PID_DIR"/*.pid
}

case $command in
    start) start "$@" ;;
    stop) stop ;;
    status) curl -fsS "$(rest_url)/overview"; echo ;;
    *) usage ;;
esac
