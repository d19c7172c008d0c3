#!/usr/bin/env bash
# A Spark standalone cluster on this machine, from the pyspark wheel's own distribution
# (pyspark/bin/spark-class, pyspark/jars): one master and one worker, bound to 127.0.0.1,
# with their logs, pids and work dirs under DIR.
#
#   deploy/spark/local-cluster.sh start  DIR [--cores 1] [--memory 1g] [--port P]
#   deploy/spark/local-cluster.sh status DIR      # the master's JSON view (workers, apps)
#   deploy/spark/local-cluster.sh stop   DIR      # worker (and its executors), then master
#
# `start` waits until the worker is ALIVE and prints the cluster's environment, also written
# to DIR/cluster.env (SPARK_MASTER=spark://127.0.0.1:P, SPARK_MASTER_UI=http://...);
# deploy/spark/submit-compactor.sh submits the compactor to it.
# STREAMBERG_PYTHON selects the environment whose pyspark is used (default: the repo's .venv).
set -euo pipefail

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 2 ] || usage
command=$1; dir=$2; shift 2

repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${STREAMBERG_PYTHON:-$repo/.venv/bin/python}
[ -x "$python" ] || { echo "no Python environment at $python (run make setup, or set STREAMBERG_PYTHON)" >&2; exit 2; }
spark_home=$("$python" -c 'import os, pyspark; print(os.path.dirname(os.path.abspath(pyspark.__file__)))')
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

export SPARK_HOME=$spark_home
# Nothing from the wheel's (absent) conf dir, everything on loopback, scratch under DIR.
export SPARK_CONF_DIR=$dir/conf SPARK_LOCAL_IP=127.0.0.1 SPARK_LOCAL_DIRS=$dir/tmp
export SPARK_DAEMON_MEMORY=${SPARK_DAEMON_MEMORY:-512m}

master_ui() { sed -n 's/^SPARK_MASTER_UI=//p' "$dir/cluster.env"; }

pids() { cat "$dir"/pid/*.pid 2>/dev/null || true; }

wait_for_worker() {
    local ui=$1 deadline=$((SECONDS + ${SPARK_START_TIMEOUT:-60}))
    while [ $SECONDS -lt $deadline ]; do
        local view
        view=$(curl -fsS "$ui/json/" 2>/dev/null || true)
        if [ -n "$view" ] && "$python" -c '
import json, sys
sys.exit(0 if any(w["state"] == "ALIVE" for w in json.loads(sys.argv[1])["workers"]) else 1)' "$view"; then
            return 0
        fi
        for p in $(pids); do kill -0 "$p" 2>/dev/null || { echo "a Spark daemon (pid $p) died during start-up" >&2; return 1; }; done
        sleep 1
    done
    echo "the worker did not register within ${SPARK_START_TIMEOUT:-60}s" >&2
    return 1
}

daemon() {  # daemon NAME CLASS ARGS...: run a spark-class daemon in the background, pid in DIR/pid
    local name=$1; shift
    nohup "$spark_home/bin/spark-class" "$@" >"$dir/log/$name.log" 2>&1 </dev/null &
    echo $! >"$dir/pid/$name.pid"
}

start() {
    local cores=1 memory=1g port=""
    while [ $# -gt 0 ]; do
        case $1 in
            --cores) cores=$2; shift 2 ;;
            --memory) memory=$2; shift 2 ;;
            --port) port=$2; shift 2 ;;
            *) echo "unknown option $1" >&2; usage ;;
        esac
    done
    for p in $(pids); do
        kill -0 "$p" 2>/dev/null && { echo "a cluster is already running from $dir (pid $p); stop it first" >&2; exit 1; }
    done
    rm -rf "$dir/pid"
    mkdir -p "$SPARK_CONF_DIR" "$dir/log" "$dir/pid" "$dir/tmp" "$dir/work"
    local free_port='from streamberg.common.broker import free_port; print(free_port())'
    port=${port:-$("$python" -c "$free_port")}
    local ui_port worker_ui_port
    ui_port=$("$python" -c "$free_port"); worker_ui_port=$("$python" -c "$free_port")
    daemon master org.apache.spark.deploy.master.Master --host 127.0.0.1 --port "$port" --webui-port "$ui_port"
    daemon worker org.apache.spark.deploy.worker.Worker "spark://127.0.0.1:$port" --host 127.0.0.1 \
        --cores "$cores" --memory "$memory" --webui-port "$worker_ui_port" --work-dir "$dir/work"
    cat >"$dir/cluster.env" <<EOF
export SPARK_HOME=$spark_home
SPARK_MASTER=spark://127.0.0.1:$port
SPARK_MASTER_UI=http://127.0.0.1:$ui_port
EOF
    if ! wait_for_worker "http://127.0.0.1:$ui_port"; then
        tail -n 30 "$dir"/log/*.log >&2 || true
        stop
        exit 1
    fi
    cat "$dir/cluster.env"
}

descendants() {  # every process below the given pids (executors and their Python workers)
    local p
    for p in "$@"; do
        for c in $(ps -o pid= --ppid "$p" 2>/dev/null); do echo "$c"; descendants "$c"; done
    done
}

stop() {
    local worker master children p left=""
    worker=$(cat "$dir/pid/worker.pid" 2>/dev/null || true)
    master=$(cat "$dir/pid/master.pid" 2>/dev/null || true)
    children=$(descendants $worker $master)
    # SIGTERM: the worker kills its executors on the way out; SIGKILL after 15 s.
    for p in $worker $master; do
        kill "$p" 2>/dev/null || continue
        timeout 15 tail --pid="$p" -f /dev/null || kill -9 "$p" 2>/dev/null || true
    done
    for p in $children; do kill -9 "$p" 2>/dev/null || true; done
    # SIGKILLed processes take a moment to be gone (and reaped).
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        left=""
        for p in $worker $master $children; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
        [ -z "$left" ] && break
        sleep 0.5
    done
    [ -z "$left" ] || { echo "still running:$left" >&2; exit 1; }
    rm -f "$dir"/pid/*.pid
}

case $command in
    start) start "$@" ;;
    stop) stop ;;
    status) curl -fsS "$(master_ui)/json/"; echo ;;
    *) usage ;;
esac
