"""The process's Spark session is its runtime's (common/runtime.py `spark`): the components of
one process run on one session, each with its catalog registered, and the runtime stops it
once when it closes; used again after, it builds a new one.

Real Spark with the Iceberg runtime, in a process of its own (the tests' shared session must
not be the one stopped), two SQLite catalogs written through it and read back by pyiceberg."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamberg.common.catalog import load_catalog
from streamberg.common.config import CatalogConfig

pytestmark = [pytest.mark.slow]  # a JVM of its own: ~15 s on 2 cores

SCRIPT = """
import json, sys
from streamberg.common.config import CatalogConfig
from streamberg.common.runtime import Runtime
from streamberg.common.spark import process_session, session_for

def stopped(session):
    return session.sparkContext._jsc is None or session.sparkContext._jsc.sc().isStopped()

folder = sys.argv[1]
a, b = (CatalogConfig(name=n, uri=f"sqlite:///{folder}/{n}.db", warehouse=f"file://{folder}/{n}-wh") for n in "ab")
out = {}
with Runtime() as runtime:
    for config in (a, b):
        runtime.catalog(config).create_namespace("ns")  # the catalog database made, as the ingest makes it
    first = process_session(a, "local[1]", {}, app_name="owner-test")
    with session_for(b, "local[1]", {}) as second:  # another component of the process, another catalog
        second.sql("CREATE TABLE b.ns.t (id bigint) USING iceberg")
        second.sql("INSERT INTO b.ns.t VALUES (1), (2), (3)")
    first.sql("CREATE TABLE a.ns.t (id bigint) USING iceberg")
    first.sql("INSERT INTO a.ns.t VALUES (7)")
    out["same"] = first is second
    out["alive_after_component"] = not stopped(first)
    out["held"] = runtime.held()["spark"]
    out["built"] = runtime.opened["spark"]
out["stopped_at_close"] = stopped(first)
out["held_after"] = runtime.held()["spark"]
again = process_session(a, "local[1]", {})  # the process's own runtime now: a new session
out["new_after_close"] = again is not first and not stopped(again)
print(json.dumps(out))
"""


def test_one_session_a_process_stopped_once_by_its_runtime(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"same": True, "alive_after_component": True, "held": 1, "built": 1, "stopped_at_close": True,
                   "held_after": 0, "new_after_close": True}, out
    # What each component wrote through the one session is in its own catalog.
    for name, ids in (("a", [7]), ("b", [1, 2, 3])):
        catalog = load_catalog(CatalogConfig(name=name, uri=f"sqlite:///{tmp_path}/{name}.db",
                                             warehouse=f"file://{tmp_path}/{name}-wh"))
        rows = catalog.load_table("ns.t").scan().to_arrow().column("id").to_pylist()
        assert sorted(rows) == ids
