"""Benchmarks: what the components buy, measured against a baseline in the same run.

Not product code: no component imports from here. `bench/skipping/` is the data-skipping
benchmark behind `streamberg bench skipping` (its DuckDB and matplotlib come with the
`bench` extra); `ingest_throughput.py` and `compact.py` are run from the checkout
(`make bench-ingest`, `make bench-compact`).
"""
