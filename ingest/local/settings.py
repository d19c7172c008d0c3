"""The settings of a local run's MiniCluster, which lives in the gateway JVM.

By default Flink's REST endpoint and BLOB server bind every interface, with web job
submission and cancellation on; a local run binds loopback only and speaks mutual TLS with
its own key (gateway_auth.py, docs/security.md). `ingest.flink` (applied last, in
ingest/job.py) can widen any of these.
"""

from __future__ import annotations

import sys

from pyflink.common import Configuration

# PyFlink reads a local job's Python worker mode (loopback or process) from this variable.
WORKER_MODE_ENV = "_python_worker_execution_mode"


def configuration(settings: dict[str, str]) -> Configuration:
    conf = Configuration()
    for key, value in settings.items():
        conf.set_string(key, value)
    return conf


def local_settings(parallelism: int, python_workers: str | None = None) -> dict[str, str]:
    """What a local run (a MiniCluster in the gateway JVM) needs on top of the job's settings."""
    from streamberg.ingest.local.gateway_auth import start_run_key_pair

    return {
        # Python workers must run this environment's interpreter (PyFlink defaults to `python`).
        "python.executable": python_workers or sys.executable,
        "python.client.executable": sys.executable,
        "taskmanager.numberOfTaskSlots": str(max(parallelism, 1)),
        # The network buffers carry the writers' units (file lists, offsets) to the committer,
        # not records: 16 MB (512 buffers) instead of Flink's 64 MB minimum, off-heap.
        "taskmanager.memory.network.min": "16mb",
        "taskmanager.memory.network.max": "16mb",
        # A local MiniCluster listens on loopback only (docs/security.md): by default its REST
        # endpoint and BLOB server bind every interface, with web job submission and
        # cancellation on. `ingest.flink` (applied last) can widen any of these.
        "rest.address": "127.0.0.1",
        "rest.bind-address": "127.0.0.1",
        "jobmanager.rpc.address": "127.0.0.1",
        "jobmanager.bind-host": "127.0.0.1",  # also the BLOB server's bind host
        "taskmanager.host": "127.0.0.1",
        "taskmanager.bind-host": "127.0.0.1",
        "web.submit.enable": "false",
        "web.cancel.enable": "false",
        # Mutual TLS with this run's own key on the REST endpoint and Flink's RPC, BLOB and
        # data ports: no other local process can submit a job or send a message
        # (ingest/local/gateway_auth.py).
        **start_run_key_pair().flink_settings(),
    }
