#!/usr/bin/env bash
# `make demo`: the whole loop on embedded defaults, in at most ~3 minutes on 2 cores.
#   1. a fresh embedded broker (tansu, in memory) and a fresh demo table under .streamberg/
#   2. events produced at a steady rate for about a minute, 1 % malformed (background)
#   3. `streamberg run`: ingest + continuous compactor + scheduled maintenance, bounded
#   4. the table facts, the status verdict, and a layout report (PNG); the dashboard's address
#      printed while it runs and its fleet page saved as a PNG where a browser is installed
# Leaves nothing running: the broker and the producer are stopped on any exit (trap).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
SB="$VENV/bin/streamberg"
PY="$VENV/bin/python"
CONFIG=${CONFIG:-examples/demo.yaml}
RATE=${DEMO_RATE:-1000}            # events per second
SECONDS_OF_EVENTS=${DEMO_SECONDS:-60}
RUN_SECONDS=${DEMO_RUN_SECONDS:-95}  # the loop's bound: start-up + the events + catching up
OUT=.streamberg/demo-layout.png
SHOT=.streamberg/demo-dashboard.png  # the fleet page, beside the layout report
DASHBOARD=${DEMO_DASHBOARD:-127.0.0.1:9470}

producer=""
cleanup() {
  status=$?
  if [ -n "$producer" ] && kill -0 "$producer" 2>/dev/null; then kill "$producer" 2>/dev/null || true; wait "$producer" 2>/dev/null || true; fi
  "$SB" broker stop >/dev/null 2>&1 || true
  exit $status
}
trap cleanup EXIT INT TERM

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "fresh embedded broker and an empty demo table (.streamberg/)"
"$SB" broker stop >/dev/null 2>&1 || true   # tansu keeps topics in memory: start from nothing
rm -rf .streamberg/catalog.db* .streamberg/warehouse .streamberg/state .streamberg/compactor-checkpoint "$OUT" "$SHOT"
"$SB" broker start

say "producing $((RATE * SECONDS_OF_EVENTS)) events at $RATE/s for ${SECONDS_OF_EVENTS}s, 1% malformed (background)"
"$SB" produce --config "$CONFIG" --count $((RATE * SECONDS_OF_EVENTS)) --rate "$RATE" --bad-fraction 0.01 \
  > .streamberg/demo-produce.json 2>/dev/null &
producer=$!

say "streamberg run for ${RUN_SECONDS}s: ingest + compactor + maintenance, each its own process"
echo "the dashboard, while it runs: http://$DASHBOARD/"
# A screenshot of the fleet page once the run is well under way (where a browser is installed).
( sleep $((RUN_SECONDS * 2 / 3)); "$PY" scripts/dashboard_shot.py --url "http://$DASHBOARD/" --out "$SHOT" ) &
shot=$!
"$SB" run --config "$CONFIG" --duration "$RUN_SECONDS" --dashboard "$DASHBOARD"
wait "$shot" || true
wait "$producer"; producer=""
echo "producer: $(cat .streamberg/demo-produce.json)"

say "the table: snapshots, files, records, offsets, dead letters"
"$SB" table --config "$CONFIG"

say "health: streamberg status"
"$SB" status --config "$CONFIG" || true   # exit 1 on a critical verdict; the demo shows it either way

say "layout: data files read per point query, as ingested vs after the compactor"
"$PY" scripts/demo_layout.py --config "$CONFIG" --out "$OUT"
