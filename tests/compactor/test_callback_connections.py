"""A process that runs a compaction after another on one Spark session (the governor, `run`)
keeps a bounded number of py4j callback connections: each compaction's streaming query calls
`foreachBatch` from a new JVM thread, and py4j kept that thread's connection (a socket in the
JVM, a socket and a serving thread here) after the thread ended, one more a compaction."""

from __future__ import annotations

import pytest

from streamberg.compactor.app import CompactOptions, run_compact
from tests.compactor.helpers import FakeIngest, live_files, reload, setup_table

pytestmark = pytest.mark.spark


def _open_callback_connections(spark) -> int:
    """Connections from the JVM this process still serves (PySpark's callback server)."""
    server = spark.sparkContext._gateway._callback_server
    return sum(1 for connection in list(server.connections) if connection.socket is not None)


def test_compactions_one_after_another_keep_callback_connections_bounded(spark, tmp_path) -> None:
    config, _ = setup_table(tmp_path, compactor={"strategy": "zorder"})
    ingest = FakeIngest(config, seed=21)
    counts, compacted = [], 0
    for _ in range(6):
        ingest.append(100, days=1)
        ingest.append(100, days=1)
        out = run_compact(config, CompactOptions(once=True), spark=spark)
        assert out["batches"] == 1  # a foreachBatch call from the query's own JVM thread
        compacted += out["files_in"]
        counts.append(_open_callback_connections(spark))
    assert compacted >= 12 and len(live_files(reload(config))) <= 6  # the compactions did their work
    # Before: one more connection a compaction (counts like [2, 3, 4, 5, 6, 7]); now the ones
    # no thread used since the previous query's end are closed.
    assert max(counts[2:]) <= counts[1] + 1, counts


def test_a_session_without_py4j_callbacks_is_left_alone() -> None:
    """A session whose gateway has no callback client (a Spark Connect client, a gateway that
    failed) is not an error: the query's work is done; nothing is raised, whatever the error says."""
    from streamberg.common.spark import release_callback_connections

    class Silent:
        @property
        def sparkContext(self):  # PySpark's name
            raise RuntimeError()  # no message at all

    release_callback_connections(Silent())
    release_callback_connections(object())
