"""The cluster path on one machine, so it is not only documentation.

- Flink: a standalone session cluster (JobManager + one TaskManager) started from the PyFlink
  wheel's distribution by deploy/flink/local-cluster.sh; the ingest job submitted detached
  with `flink run -py` (deploy/flink/submit-ingest.sh -> cli/flink_submit.py, the entry point
  the Kubernetes FlinkDeployment names), stopped with `flink stop`.
- Spark: a standalone master + worker from the pyspark wheel (deploy/spark/local-cluster.sh),
  shared by the module's Spark tests; the compactor, the merge and maintenance each run once
  with spark-submit (deploy/spark/submit.sh -> cli/spark_submit.py), executors on the worker.

Every daemon runs under the test's tmp dir; the fixtures stop them, and kill by pid whatever
survives, even when the test fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamberg.cli.sample_events import produce_events
from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.table_meta.offsets import committed_position
from streamberg.table_meta.summary_keys import SummaryKeys
from tests.compactor.helpers import (
    DAY,
    FakeIngest,
    compactor_snapshots,
    live_files,
    reload,
    removed_by,
    row_multiset,
    setup_table,
    summary,
)
from tests.helpers import (
    config_at,
    dead_letters,
    duplicates,
    end_offsets_by_reading,
    table_ids,
    wait_for,
    write_config,
)

REPO = Path(__file__).resolve().parents[2]
FLINK_CLUSTER = REPO / "deploy" / "flink" / "local-cluster.sh"
SUBMIT_INGEST = REPO / "deploy" / "flink" / "submit-ingest.sh"
SPARK_CLUSTER = REPO / "deploy" / "spark" / "local-cluster.sh"
SUBMIT_COMPACTOR = REPO / "deploy" / "spark" / "submit-compactor.sh"
SUBMIT_SPARK = REPO / "deploy" / "spark" / "submit.sh"

PARTITIONS = 2
BEFORE_SUBMIT = 3_000  # records waiting in the topic when the job starts
WHILE_RUNNING = 3_000  # records produced while it runs


def run(*cmd: str | Path, timeout: float, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "STREAMBERG_LOG_FORMAT": "json", **(env or {})})
    assert proc.returncode == 0, (f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
                                  f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}")
    return proc


def cluster_env(directory: Path) -> dict[str, str]:
    """DIR/cluster.env as a dict (lines `[export ]KEY=value`)."""
    pairs = (line.removeprefix("export ").split("=", 1) for line in (directory / "cluster.env").read_text().splitlines())
    return {key: value for key, value in pairs}


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def last_json_line(text: str) -> dict:
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def descendants(pid: int) -> list[int]:
    children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout.split()
    return [d for c in map(int, children) for d in (c, *descendants(c))]


def managed_cluster(script: Path, directory: Path, *start_args: str) -> Iterator[dict[str, str]]:
    """Start a cluster with `script`; on the way out stop it, then make sure nothing survives."""
    pid_files = directory / "pid"
    try:
        run(script, "start", directory, *start_args, timeout=150)
        yield cluster_env(directory)
    finally:
        daemons = [int(p) for f in pid_files.glob("*.pid") for p in f.read_text().split()]
        processes = daemons + [d for p in daemons for d in descendants(p)]
        subprocess.run([str(script), "stop", str(directory)], capture_output=True, timeout=120)
        deadline = time.monotonic() + 5  # a process just killed takes a moment to be reaped
        while (survivors := [p for p in processes if alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
        assert not survivors, f"{script.name} stop left processes running: {survivors}"


# -- Flink -------------------------------------------------------------------------------

@pytest.fixture
def flink_cluster(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    directory = tmp_path / "flink-cluster"
    for env in managed_cluster(FLINK_CLUSTER, directory, "--slots", str(PARTITIONS)):
        yield directory, env


def job_state(rest: str, job_id: str) -> str:
    return get_json(f"{rest}/jobs/{job_id}")["state"]


@pytest.mark.flink
@pytest.mark.timeout(600)
def test_ingest_on_a_flink_session_cluster(flink_cluster, broker: str, tmp_path: Path) -> None:
    directory, env = flink_cluster
    rest = env["FLINK_REST_URL"]
    path = write_config(tmp_path / "table", broker, f"cluster-{uuid.uuid4().hex[:8]}",
                        ingest={"parallelism": PARTITIONS, "commit_interval_seconds": 2})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, PARTITIONS)
    before = produce_events(config, BEFORE_SUBMIT, bad_fraction=0.01)

    flink = Path(env["FLINK_HOME"]) / "bin" / "flink"
    submitted = run(SUBMIT_INGEST, "--config", path, "--parallelism", str(PARTITIONS), timeout=180, env=env)
    job = last_json_line(submitted.stdout)
    try:
        wait_for(lambda: job_state(rest, job["job_id"]) == "RUNNING", 60, "the job to run")
        during = produce_events(config, WHILE_RUNNING, bad_fraction=0.01, start_id=BEFORE_SUBMIT, seed=8)
        ends = end_offsets_by_reading(broker, config.kafka.topic, PARTITIONS)
        table = load_catalog(config.catalog)

        def at_the_end():
            position = committed_position(table.load_table(config.table.identifier), config.kafka.topic)
            return {str(p): o for p, o in position.offsets.items()} == ends and position

        position = wait_for(at_the_end, 120, f"the committed offsets to reach {ends}")
        # Stop-with-savepoint (the cluster config names the savepoint dir); see deploy/README.md
        # for why not `flink cancel`, which is as safe for the table.
        run(flink, "stop", job["job_id"], timeout=120, env=env)
        wait_for(lambda: job_state(rest, job["job_id"]) == "FINISHED", 30, "the job to finish")
    finally:
        if job_state(rest, job["job_id"]) not in ("FINISHED", "CANCELED", "FAILED"):
            subprocess.run([str(flink), "cancel", job["job_id"]], capture_output=True, timeout=60,
                           env={**os.environ, **env})

    # Exactly once: every valid record once, every malformed one dead-lettered once.
    ids = table_ids(config)
    assert not duplicates(ids)
    assert ids == sorted(before.valid_ids + during.valid_ids)
    dlq = dead_letters(config)
    assert dlq.num_rows == sum(before.bad.values()) + sum(during.bad.values()) > 0
    assert position.consumed_total == BEFORE_SUBMIT + WHILE_RUNNING
    # The commits are this submission's, made on the cluster's TaskManager (its log has them).
    assert position.run_id == job["run_id"] and position.job_id == config.ingest_target.job_id
    taskmanager_output = "".join(p.read_text(errors="replace") for p in (directory / "log").glob("*taskexecutor*"))
    assert job["run_id"] in taskmanager_output and '"committed"' in taskmanager_output
    assert get_json(f"{rest}/overview")["taskmanagers"] == 1  # the stop left the TaskManager up


# -- Spark -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    directory = tmp_path_factory.mktemp("spark") / "spark-cluster"
    for env in managed_cluster(SPARK_CLUSTER, directory, "--cores", "1", "--memory", "1g"):
        yield directory, env


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_compactor_once_on_a_spark_standalone_cluster(spark_cluster, tmp_path: Path) -> None:
    directory, env = spark_cluster
    config, _ = setup_table(tmp_path / "table", partition_spec=DAY, compactor={
        "strategy": "zorder", "spark_conf": {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}})
    ingest = FakeIngest(config, seed=11)
    for _ in range(3):
        ingest.append(300, days=2)
    before = reload(config)
    rows, ingest_files = row_multiset(before), set(live_files(before))

    # From tmp_path: Spark's session may create its default spark-warehouse/ in the cwd.
    proc = run(SUBMIT_COMPACTOR, "--config", config.config_path, "--once", timeout=420, cwd=tmp_path,
               env={"SPARK_CLUSTER_DIR": str(directory), "SPARK_LOCAL_IP": "127.0.0.1"})
    out = last_json_line(proc.stdout)

    after = reload(config)
    assert row_multiset(after) == rows
    files_after = live_files(after)
    assert len(files_after) < len(ingest_files)
    snapshots = compactor_snapshots(after)
    assert snapshots and all(s.summary.operation.value == "replace" for s in snapshots)
    assert set().union(*(removed_by(after, s) for s in snapshots)) == ingest_files
    recorded = [summary(s) for s in snapshots]
    assert {r[SummaryKeys.COMPACTOR_STRATEGY] for r in recorded} == {"zorder"}
    assert sum(int(r[SummaryKeys.COMPACTOR_FILES_IN]) for r in recorded) == len(ingest_files)
    assert out["mode"] == "once" and out["files_in"] == len(ingest_files)
    assert out["files_out"] == out["table_data_files"] == len(files_after)
    # It ran on the cluster: the master saw the application finish with the worker's cores,
    # and the worker ran its executor.
    assert_ran_on_the_cluster(directory, env, "streamberg-compactor")


def assert_ran_on_the_cluster(directory: Path, env: dict[str, str], name: str) -> None:
    """The master saw the application `name` finish with the worker's cores, and the worker ran
    an executor of it."""
    apps = [a for a in get_json(f"{env['SPARK_MASTER_UI']}/json/")["completedapps"] if a["name"] == name]
    assert len(apps) == 1 and apps[0]["cores"] >= 1, apps
    assert list((directory / "work").glob(f"{apps[0]['id']}/*/stderr"))


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_merge_and_maintenance_on_a_spark_standalone_cluster(spark_cluster, broker: str, tmp_path: Path) -> None:
    """The one entry point with the component named: upserts and tombstones ingested into the
    change log (in process), applied by `submit.sh merge --once` on the cluster, then
    `submit.sh maintain --once` expires and trims there; the table read by pyiceberg and
    DuckDB equals the state this test computes."""
    import random

    from streamberg.table_meta.changelog import changelog_identifier, ingest_config
    from tests.cdc.helpers import cdc_config, rows_by_duckdb, rows_by_pyiceberg
    from tests.cdc.test_upsert import _changes, _produce
    from tests.runbooks.inprocess import ingest_until

    directory, env = spark_cluster
    config = cdc_config(tmp_path / "cdc", broker, "upsert", {
        "merge": {"interval_seconds": 1, "spark_conf": {"spark.sql.shuffle.partitions": "2"}},
        "compactor": {"spark_conf": {"spark.sql.shuffle.partitions": "2"}},
        "maintenance": {"changelog": {"keep_applied_seconds": 0}, "orphan": {"enabled": False}}},
        key_format="value")
    state: dict[int, dict] = {}
    batches = _changes(random.Random(5), 200, 1500, state)
    _produce(config, batches)
    ingest_until(ingest_config(config), {p: len(b) for p, b in enumerate(batches)})

    submit_env = {"SPARK_CLUSTER_DIR": str(directory), "SPARK_LOCAL_IP": "127.0.0.1"}
    run(SUBMIT_SPARK, "merge", "--config", config.config_path, "--once", timeout=420, cwd=tmp_path, env=submit_env)
    assert rows_by_pyiceberg(config) == rows_by_duckdb(config) == state
    assert_ran_on_the_cluster(directory, env, "streamberg-merge")

    changelog = load_catalog(config.catalog).load_table(changelog_identifier(config))
    logged = changelog.scan().to_arrow().num_rows
    run(SUBMIT_SPARK, "maintain", "--config", config.config_path, "--once", "--json", timeout=420, cwd=tmp_path,
        env=submit_env)
    assert_ran_on_the_cluster(directory, env, "streamberg-maintenance")
    # Applied changes kept for 0 s: maintenance on the cluster trimmed them; the table is unchanged.
    trimmed = load_catalog(config.catalog).load_table(changelog_identifier(config)).scan().to_arrow()
    assert logged > 0 and trimmed.num_rows < logged
    assert rows_by_pyiceberg(config) == state


# -- Kubernetes manifests (no Kubernetes here: check what can be checked) ------------------

K8S = REPO / "deploy" / "k8s"
PROD = {"kafka": {"bootstrap_servers": "kafka:9092", "topic": "events"},
        "catalog": {"name": "lake", "type": "rest", "uri": "https://catalog.example/api/catalog",
                    "warehouse": "s3://lake/warehouse", "state_uri": "postgresql://streamberg@db:5432/state"},
        "table": {"identifier": "web.events", "schema": [{"name": "id", "type": "long", "required": True}]},
        "ingest": {"parallelism": 2}}


def k8s_documents(tmp_path: Path) -> dict[tuple[str, str], dict]:
    """(kind, name) -> document, as `streamberg deploy k8s` prints them for a production-like
    config (the one Kubernetes story: no hand-written manifests to drift from it)."""
    import argparse

    import yaml

    from streamberg.cli.deploy import manifests

    path = tmp_path / "prod.yaml"
    path.write_text(yaml.safe_dump(PROD))
    args = argparse.Namespace(config=str(path), name="streamberg", namespace="data", secret="streamberg-secrets",
                              keepers="governor", flink_image="r.example/f:1", spark_image="r.example/s:1",
                              state_claim=None, flink_state_dir=None, flink_service_account="flink",
                              spark_service_account="spark", taskmanager_memory="4096m", executors=2,
                              executor_memory="2g", spark_s3_jars="local:///opt/streamberg/iceberg-aws-bundle.jar")
    documents, _ = manifests(args)
    assert all({"apiVersion", "kind", "metadata"} <= set(d) for d in documents)
    return {(d["kind"], d["metadata"]["name"]): d for d in documents}


def test_flink_deployment_runs_the_entry_point_the_local_cluster_test_runs(tmp_path: Path) -> None:
    import importlib.util
    import zipfile

    import pyflink

    docs = k8s_documents(tmp_path)
    spec = docs[("FlinkDeployment", "streamberg-ingest")]["spec"]
    job = spec["job"]
    # The driver jar: the one the wheel's distribution ships, and it has the entry class.
    jar = Path(pyflink.__file__).parent / "opt" / Path(job["jarURI"].removeprefix("local://")).name
    assert job["jarURI"].startswith("local:///opt/flink/opt/") and jar.is_file()
    with zipfile.ZipFile(jar) as archive:
        assert job["entryClass"].replace(".", "/") + ".class" in archive.namelist()
    # The module it runs is the one deploy/flink/submit-ingest.sh submits in the test above.
    module = job["args"][job["args"].index("-pym") + 1]
    assert importlib.util.find_spec(module) is not None
    assert module in SUBMIT_INGEST.read_text()
    # Its --config is the ConfigMap's file, where the pod template mounts it.
    config_arg = Path(job["args"][job["args"].index("--config") + 1])
    container = spec["podTemplate"]["spec"]["containers"][0]
    mount = next(m for m in container["volumeMounts"] if Path(m["mountPath"]) == config_arg.parent)
    volume = next(v for v in spec["podTemplate"]["spec"]["volumes"] if v["name"] == mount["name"])
    config_map = docs[("ConfigMap", volume["configMap"]["name"])]
    assert config_arg.name in config_map["data"]
    assert container["envFrom"][0]["secretRef"]["name"] == "streamberg-secrets"
    # The interpreter it names is the image's venv.
    assert spec["flinkConfiguration"]["python.executable"] == "/opt/venv/bin/python"
    assert "uv venv --python 3.11 /opt/venv" in (K8S / "Dockerfile.flink").read_text()
    assert f"FROM flink:{pyflink_version()}-" in (K8S / "Dockerfile.flink").read_text()


def pyflink_version() -> str:
    from importlib.metadata import version

    return version("apache-flink")


def test_the_cluster_config_is_valid_and_the_secret_overrides_it(tmp_path: Path, monkeypatch) -> None:
    from streamberg.common.config import load_config

    docs = k8s_documents(tmp_path)
    path = tmp_path / "streamberg.yaml"
    path.write_text(docs[("ConfigMap", "streamberg-config")]["data"]["streamberg.yaml"])
    monkeypatch.setenv("STREAMBERG_CATALOG__URI", "https://other.example/api/catalog")  # as the Secret gives it
    config = load_config(path)
    assert config.catalog.uri == "https://other.example/api/catalog"
    assert config.ingest.parallelism == docs[("FlinkDeployment", "streamberg-ingest")]["spec"]["job"]["parallelism"]


def test_the_spark_applications_name_what_the_image_provides(tmp_path: Path) -> None:
    from importlib.metadata import version

    from streamberg.common.jars import ICEBERG_RUNTIME_JAR

    dockerfile = (K8S / "Dockerfile.spark").read_text()
    docs = k8s_documents(tmp_path)
    governor = docs[("SparkApplication", "streamberg-govern")]["spec"]
    # Every local:// path the SparkApplication names is one the Dockerfile creates.
    named = [governor["mainApplicationFile"], *governor["deps"]["jars"]]
    for uri in named:
        assert uri.startswith("local:///opt/streamberg/"), uri
        assert uri.removeprefix("local://") in dockerfile, uri
    assert "streamberg.cli.spark_submit" in dockerfile and "iceberg_spark_runtime_jar" in dockerfile
    assert "3.5_2.12" in ICEBERG_RUNTIME_JAR and f"FROM apache/spark:{version('pyspark')}-scala2.12-" in dockerfile
    assert governor["driver"]["serviceAccount"] == "spark"
    assert not list(K8S.glob("*.yaml")), "hand-written manifests: `streamberg deploy k8s` prints them"


def test_cluster_entry_points_refuse_an_invalid_config_naming_the_key(tmp_path: Path) -> None:
    """Before any JVM starts: exit 2 and the bad key, from the spark-submit wrapper and the Flink entry."""
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text("kafka: {topic: t}\ntable: {identifier: db.e, schema: [{name: id, type: lng}]}\n")
    for cmd, env in (([str(SUBMIT_COMPACTOR), "--config", str(bad), "--once"], {"SPARK_MASTER": "spark://127.0.0.1:9"}),
                     ([sys.executable, "-m", "streamberg.cli.flink_submit", "--config", str(bad)], {})):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **env})
        assert proc.returncode == 2, proc.stderr
        assert "table.schema.0.type: unknown type 'lng'" in proc.stderr
