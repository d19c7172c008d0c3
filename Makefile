# streamberg: `make setup` once, then `make demo` or `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
SB := $(VENV)/bin/streamberg
CONFIG ?= examples/demo.yaml

.PHONY: setup demo demo-fleet test test-fast lint bench bench-ingest bench-fresh bench-compact bench-incremental bench-cdc bench-soak bench-fleet bench-govern bench-peers bench-govern-events bench-govern-fleet bench-layout bench-dashboard clean help

help:
	@echo "make setup          create $(VENV) with pinned deps, JDBC driver, checks (idempotent)"
	@echo "make demo           the whole loop: broker, a minute of events, ingest + compactor + maintenance, status, layout PNG"
	@echo "make demo-fleet     28 tables from one ingest job (examples/fleet.yaml), each exactly once"
	@echo "make test           the whole test suite (real broker, PyFlink, Spark, Iceberg)"
	@echo "make test-fast      the suite without PyFlink jobs, kill -9 drills and the slowest tests (under 10 minutes)"
	@echo "make lint           ruff over the tree, mypy over common/, table_meta/ and fresh/ (CI runs it before the tests)"
	@echo "make bench          = make bench-ingest (the bench/ folder made a plain 'make bench' a silent no-op)"
	@echo "make bench-ingest   ingest throughput/freshness vs a bare Python baseline"
	@echo "make bench-compact  compactor benchmarks"
	@echo "make bench-cdc      change-data capture: ingest, merge, freshness, scans after delete compaction"
	@echo "make bench-fresh    fresh reads vs committed reads: freshness, read time, exactness (10,000/s, 5 and 60 s commits), then a fresh read's fetch wait against the broker, then under load through a kill -9 (5,000/s, 60 s commits, ~25 min)"
	@echo "make bench-dashboard  1,000 tables: a metrics scrape from the model, the fleet page's load and refresh in Chromium, memory (~5 min)"
	@echo "make bench-peers    streamberg beside Quix Streams, dlt+dlt-iceberg and a bare loop: same events, one run (peers in .bench-peers/)"
	@echo "make bench-govern-fleet   the real govern keeping 1,000 mostly idle tables for 10 min: CPU, memory, descriptors (~13 min)"
	@echo "make bench-govern-events  the governor's catalog calls for 1,000 mostly idle tables: polling vs commit reports (~3 min)"
	@echo "make bench-layout   the layout follows a shifting query mix: files per query vs full optimizes, adaptation, dropped columns (~10 min)"
	@echo "make bench-fleet    100 tables from one ingest job vs the same records into one table (memory, time, freshness)"
	@echo "make bench-govern   one governor keeping 100 tables vs 100 per-table compactors (estimated from one each), ~25 min"
	@echo "make bench-soak     the whole loop for 22 min at a 1 s commit interval: memory, metadata, commit time"
	@echo "make bench-incremental  incremental clustering vs a full optimize over 30 passes (~30 min)"
	@echo "make bench-skipping data skipping per layout (SKIPPING_SCALE=1 for the study's 1000 files)"
	@echo "make drills         the runbooks' scripted drills (docs/runbooks)"

setup:
	bash scripts/setup.sh

# The whole loop (scripts/demo.sh): broker, a minute of events, `streamberg run`, table facts,
# status verdict, layout report PNG; stops the broker on any exit.
demo: setup
	VENV=$(VENV) CONFIG=$(CONFIG) bash scripts/demo.sh

demo-fleet: setup
	$(PY) scripts/fleet_demo.py

# Two workers (pytest-xdist), each file's tests on one of them (its module fixtures, its order):
# the tests mostly wait on JVMs, brokers and subprocesses, and two of them side by side keep
# 2 cores busy (the fast tier: 5 min 55 s on two, 8 min 50 s on one). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
TEST_SPLIT := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: setup
	$(PY) -m pytest tests $(TEST_SPLIT)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy common table_meta fresh

# The tiers are set at collection (tests/conftest.py): flink (a PyFlink job), chaos (kill -9,
# drills, local clusters), spark, broker. The fast tier keeps Spark and the broker.
test-fast: setup
	$(PY) -m pytest tests -m "not flink and not chaos and not slow" $(TEST_SPLIT)

bench: bench-ingest

bench-ingest: setup
	$(PY) bench/ingest_throughput.py

bench-peers: setup
	$(PY) bench/peers.py --records $(or $(PEERS_RECORDS),1000000)

bench-govern-events: setup
	$(PY) bench/govern_events.py

bench-govern-fleet: setup
	$(PY) bench/govern_fleet.py

bench-layout: setup
	$(PY) bench/layout.py

bench-compact: setup
	$(PY) bench/compact.py

bench-cdc: setup
	$(PY) bench/cdc.py

bench-govern: setup
	$(PY) bench/govern.py

bench-soak: setup
	$(PY) bench/soak.py

bench-fresh: setup
	$(PY) bench/fresh.py
	$(PY) bench/fresh_fetch_wait.py --busy 2
	$(PY) bench/fresh.py --rate 5000 --seconds 180 --intervals 60 --phases ingest,kept-end --crash-at 90 --from-start --quiet-tail 0

bench-dashboard: setup
	$(PY) bench/dashboard.py

bench-fleet: setup
	$(PY) bench/fleet.py

bench-incremental: setup
	$(SB) bench incremental --report .streamberg/bench-incremental

clean:
	-$(SB) broker stop
	rm -rf .streamberg

# Data-skipping benchmark (bench/skipping, docs/skipping.md). SF0.1 / 100 files by
# default (minutes on 2 cores); `make bench-skipping SKIPPING_SCALE=1` for the study's 1000 files.
SKIPPING_SCALE ?= 0.1
SKIPPING_ARGS ?=
.PHONY: bench-skipping
bench-skipping: setup
	$(SB) bench skipping --scale $(SKIPPING_SCALE) --report .streamberg/bench-skipping/report $(SKIPPING_ARGS)

# The runbooks' scripted drills (docs/runbooks/): each page's marked commands, run for real.
.PHONY: drills
drills: setup
	$(PY) -m pytest tests/runbooks
