"""`flink run` entry point: the ingest job, submitted to a Flink cluster.

    flink run -d -pyexec /opt/venv/bin/python -pym streamberg.cli.flink_submit \\
      --config /etc/streamberg/prod.yaml [--parallelism P]

(or `-py <path of this file>`; deploy/flink/submit-ingest.sh wraps the command). It builds
the same topology as `streamberg ingest` (ingest/job.py) and submits it to the cluster
`flink run` points at (session cluster), or to the one it runs in (application mode,
deploy/k8s/). It does not drive the job: there is no bound and no stop marker, because the
client and the TaskManagers share no disk. Stop it through Flink: `flink stop <job id>`
(stop-with-savepoint; the savepoint holds nothing streamberg needs), `flink cancel`, or
deleting the FlinkDeployment. Any of them is safe at any moment, since the Kafka offsets
live in the table's snapshots and a resubmitted job resumes from them (deploy/README.md
says why `flink stop` is preferred on a session cluster).

The Python interpreter of the TaskManagers comes from `flink run` (-pyexec, or -pyarch with a
shipped environment), not from here. Prints one JSON line (job id, run id, table, start
offsets) once the job is submitted. Exit codes: 0 submitted (detached) or finished
(attached), 1 runtime failure, 2 bad usage or invalid configuration (`flink run` itself
reports any failure of this script with its own exit code 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from streamberg.common.errors import ConfigError
from streamberg.common.redact import redact

PROG = "streamberg-ingest-submit"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Submit the streamberg ingest job to a Flink cluster (run me with `flink run -pym`).",
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("--config", required=True, help="the streamberg YAML config (readable by the client)")
    parser.add_argument("--parallelism", type=int, default=None,
                        help="writer subtasks (default: ingest.parallelism); the cluster needs that many free slots")
    return parser


def _attached(env: Any) -> bool:
    """Whether `flink run` was called without -d (it then waits for the job, and so do we).

    `env`: pyflink's StreamExecutionEnvironment (its Java object is read through py4j)."""
    from pyflink.java_gateway import get_gateway

    options = get_gateway().jvm.org.apache.flink.configuration.DeploymentOptions
    return bool(env._j_stream_execution_environment.getConfiguration().get(options.ATTACHED))


def submit(config_path: str, parallelism: int | None) -> int:
    from streamberg.common.config.loading import load_tables
    from streamberg.common.errors import StreambergError
    from streamberg.common.log import get_logger
    from streamberg.common.tables import run_settings
    from streamberg.ingest.job import build_job, job_name
    from streamberg.ingest.routes import prepare_routes
    from streamberg.ingest.run_folder import new_run_id

    fleet = load_tables(config_path)  # one table or many: routes (the ingest writes a change log itself)
    parallelism = parallelism or run_settings(fleet).ingest.parallelism
    if parallelism < 1:
        raise ConfigError("--parallelism must be at least 1")
    run_id = new_run_id()
    log = get_logger("ingest.submit", job=job_name(fleet), run=run_id)
    try:
        topics = prepare_routes(fleet, log)  # a bad table fails here, not in every TaskManager
    except StreambergError as exc:
        print(f"{PROG}: {redact(str(exc))}", file=sys.stderr)
        return 1
    env = build_job(fleet, parallelism, run_id, cluster=True)
    client = env.execute_async(job_name(fleet))
    job_id = str(client.get_job_id())
    log.info("ingest job submitted", flink_job=job_id, parallelism=parallelism, topics=topics)
    print(json.dumps({"job_id": job_id, "run_id": run_id, "tables": [r.identifier for r in fleet.tables],
                      "topics": topics, "parallelism": parallelism}), flush=True)
    if _attached(env):
        from streamberg.ingest.job import failure_message

        try:
            client.get_job_execution_result().result()  # an unbounded job ends only by failing or cancel
        except Exception:  # noqa: BLE001 - reported in one line, like `streamberg ingest`
            print(f"{PROG}: {redact(failure_message(client, str(client.get_job_status().result())))}", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return submit(args.config, args.parallelism)
    except ConfigError as exc:
        print(f"{PROG}: {redact(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
