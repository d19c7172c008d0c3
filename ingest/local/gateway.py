"""The gateway JVM of a local run: started once per process, patched and authenticated first."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from streamberg.common.config import StreambergConfig
from streamberg.ingest.local.settings import WORKER_MODE_ENV

_local_gateway: threading.Thread | None = None


def start_local_gateway(config: StreambergConfig) -> threading.Thread:
    """Start the gateway JVM of a local run in the background, once per process.

    The JVM takes about a second to come up; the driver prepares the tables meanwhile.
    Local servers listen on loopback only and answer only this driver, so the patches and
    the token go in before the JVM and the worker pool start (ingest/local/loopback.py,
    ingest/local/gateway_auth.py, docs/security.md). A launch that fails here
    fails again, with its message, where build_job asks for the gateway itself.
    """
    global _local_gateway
    if _local_gateway is None:
        from pyflink.java_gateway import get_gateway

        from streamberg.ingest.local.class_archive import add_gateway_jvm_options, use_archive
        from streamberg.ingest.local.gateway_auth import start_run_key_pair
        from streamberg.ingest.local.jvm_lib import jvm_cache_dir, prepare_gateway_jvm
        from streamberg.ingest.local.loopback import bind_loopback_worker_pool

        lib_dir = prepare_gateway_jvm(jvm_cache_dir(fallback=Path(config.ingest.state_dir)))
        start_run_key_pair()  # keytool runs while the JVM starts; local_settings waits for it
        add_gateway_jvm_options()
        if lib_dir is not None:
            use_archive(lib_dir)  # the classes of an earlier JVM, mapped instead of loaded (class_archive.py)

        def launch() -> None:
            try:
                get_gateway()
            except Exception:  # noqa: BLE001 - raised again, in the driver's thread, by build_job
                pass

        _local_gateway = threading.Thread(target=launch, name="flink-gateway", daemon=True)
        _local_gateway.start()
        # Patch 1 only matters where the driver itself serves the Python workers (loopback
        # mode); it imports Beam's gRPC modules (~1 s), so never before the JVM is on its way.
        if os.environ.get(WORKER_MODE_ENV) != "process":
            bind_loopback_worker_pool()
    return _local_gateway


def python_worker_mode() -> str:
    """Run a local job's Python operators in worker processes of their own (Flink's
    `process` mode) unless the operator chose otherwise.

    PyFlink's default for a MiniCluster is `loopback`: every Python operator runs inside
    the driver's interpreter, so P writers share one GIL and a native crash in a writer
    (a parser segfault, an OOM kill) takes the whole `streamberg ingest` down instead of
    being a task failure Flink restarts from the table's offsets. PyFlink reads the choice
    from this environment variable when the job starts; `loopback` stays available for
    debugging a worker in the driver's process.
    """
    return os.environ.setdefault(WORKER_MODE_ENV, "process")
