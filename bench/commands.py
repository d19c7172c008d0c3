"""`streamberg bench`: the benchmarks that measure what the components buy.

Registered by cli/main.py as an optional command: without the `bench` extra (DuckDB's TPC-H
generator, matplotlib) the CLI says what is missing instead of failing halfway through a run.
"""

from __future__ import annotations

import argparse
import importlib.util

# The `bench` extra, checked cheaply (no import).
for _module in ("duckdb", "duckdb_extension_tpch", "matplotlib"):
    if importlib.util.find_spec(_module) is None:
        raise ModuleNotFoundError(f"No module named {_module!r}", name=_module)


def register(subparsers: argparse._SubParsersAction) -> None:
    from streamberg.bench.incremental import commands as incremental
    from streamberg.bench.skipping import commands as skipping

    bench = subparsers.add_parser("bench", help="benchmarks (data skipping per layout, incremental clustering)",
                                  description="Benchmarks that measure what the project's components buy.")
    kinds = bench.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    skipping.register(kinds)
    incremental.register(kinds)
