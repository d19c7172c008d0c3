"""`streamberg deploy k8s --config prod.yaml`: the Kubernetes manifests of one config, printed.

What it prints (one YAML stream, `kubectl apply -f -`):
- a ConfigMap holding the config file as given (mounted at /etc/streamberg/streamberg.yaml)
  and, referenced by every pod, a Secret you create (`--secret`, envFrom: the
  STREAMBERG_* variables that carry passwords and credentials, never the config itself: a
  config holding a secret is refused, naming the key to move);
- the ingest: a FlinkDeployment (Flink Kubernetes Operator, flink.apache.org/v1beta1) in
  application mode running the same entry point as `flink run` (cli/flink_submit.py), with
  `upgradeMode: last-state`, Kubernetes HA and periodic checkpoints. Exactly-once rests on
  the offsets each commit records in the table, not on Flink state (docs/exactly-once.md);
  last-state lets the operator upgrade and recover the JobManager without a savepoint and
  without a second job ever running beside the first;
- the compactor, maintenance and (for a primary-key table) the merge: a SparkApplication each
  (Kubeflow spark-operator, sparkoperator.k8s.io/v1beta2) running cli/spark_submit.py with the
  component named, restarted always (they are long-running watchers);
- the metrics exporter: a Deployment and a Service (`streamberg metrics` on 0.0.0.0 inside the
  pod: the pod network, not a shared host).

The images are deploy/k8s/Dockerfile's two targets. Checked here against the Kubernetes
schemas and the two operators' CRD schemas (tests/deploy/test_deploy_k8s.py); not run on a
cluster (none exists on these machines).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from streamberg.cli.errors import CommandError
from streamberg.common.changelog import has_changelog
from streamberg.common.config import StreambergConfig, config_from_dump, is_fleet, load_config, load_fleet
from streamberg.common.redact import redact

CONFIG_DIR = "/etc/streamberg"
CONFIG_KEY = "streamberg.yaml"
# deploy/k8s/Dockerfile: the PyFlink driver jar in the Flink image, the fixed links in the Spark image.
FLINK_PYTHON_JAR = "local:///opt/flink/opt/flink-python-2.3.0.jar"
SPARK_ENTRY = "local:///opt/streamberg/spark_submit.py"
SPARK_JARS = ["local:///opt/streamberg/iceberg-spark-runtime.jar", "local:///opt/streamberg/postgresql.jar"]
VENV_PYTHON = "/opt/venv/bin/python"
# The Flink line of the image (Flink 2.3) as the operator names it: v2_2 is the newest value
# operator 1.15 lists; an operator that knows v2_3 takes that.
FLINK_VERSION = "v2_2"
SPARK_VERSION = "3.5.9"


def _labels(name: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "streamberg", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": component}


def _config_volume(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    volume = {"name": "streamberg-config", "configMap": {"name": f"{args.name}-config"}}
    mount = {"name": "streamberg-config", "mountPath": CONFIG_DIR, "readOnly": True}
    return volume, mount


def config_map(args: argparse.Namespace, text: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{args.name}-config", "namespace": args.namespace,
                         "labels": _labels(args.name, "config")},
            "data": {CONFIG_KEY: text}}


def flink_deployment(args: argparse.Namespace, config: StreambergConfig, state_dir: str) -> dict[str, Any]:
    volume, mount = _config_volume(args)
    parallelism = config.ingest.parallelism
    return {
        "apiVersion": "flink.apache.org/v1beta1", "kind": "FlinkDeployment",
        "metadata": {"name": f"{args.name}-ingest", "namespace": args.namespace,
                     "labels": _labels(args.name, "ingest")},
        "spec": {
            "image": args.flink_image, "flinkVersion": FLINK_VERSION, "serviceAccount": args.flink_service_account,
            "flinkConfiguration": {
                "taskmanager.numberOfTaskSlots": str(parallelism),
                "python.executable": VENV_PYTHON, "python.client.executable": VENV_PYTHON,
                "taskmanager.memory.managed.fraction": "0.4",
                # last-state needs the JobManager's HA metadata and a checkpoint to resume from.
                "high-availability.type": "kubernetes",
                "high-availability.storageDir": f"{state_dir}/ha",
                "execution.checkpointing.interval": "60 s",
                "execution.checkpointing.dir": f"{state_dir}/checkpoints",
                "execution.checkpointing.savepoint-dir": f"{state_dir}/savepoints",
                "restart-strategy.type": "exponential-delay",
            },
            "jobManager": {"resource": {"memory": "2048m", "cpu": 1}},
            "taskManager": {"resource": {"memory": args.taskmanager_memory, "cpu": max(1, parallelism)}},
            "podTemplate": {"spec": {
                "containers": [{"name": "flink-main-container",
                                "envFrom": [{"secretRef": {"name": args.secret, "optional": True}}],
                                "volumeMounts": [mount]}],
                "volumes": [volume]}},
            "job": {"jarURI": FLINK_PYTHON_JAR, "entryClass": "org.apache.flink.client.python.PythonDriver",
                    "args": ["-pym", "streamberg.cli.flink_submit", "--config", f"{CONFIG_DIR}/{CONFIG_KEY}"],
                    "parallelism": parallelism, "upgradeMode": "last-state", "state": "running"},
        },
    }


def spark_application(args: argparse.Namespace, component: str, extra: list[str]) -> dict[str, Any]:
    volume, mount = _config_volume(args)
    pod = {"envFrom": [{"secretRef": {"name": args.secret, "optional": True}}], "volumeMounts": [mount],
           "labels": _labels(args.name, component)}
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
        "metadata": {"name": f"{args.name}-{component}", "namespace": args.namespace,
                     "labels": _labels(args.name, component)},
        "spec": {
            "type": "Python", "pythonVersion": "3", "mode": "cluster", "image": args.spark_image,
            "sparkVersion": SPARK_VERSION, "mainApplicationFile": SPARK_ENTRY,
            "arguments": [component, "--config", f"{CONFIG_DIR}/{CONFIG_KEY}", *extra],
            "deps": {"jars": SPARK_JARS},
            "sparkConf": {"spark.pyspark.python": VENV_PYTHON, "spark.pyspark.driver.python": VENV_PYTHON},
            # A watcher that stops is restarted; the lease (compactor) and the catalog's
            # optimistic commits keep a second copy harmless.
            "restartPolicy": {"type": "Always", "onFailureRetryInterval": 30,
                              "onSubmissionFailureRetryInterval": 60},
            "volumes": [volume],
            "driver": {"cores": 1, "memory": "1g", "serviceAccount": args.spark_service_account, **pod},
            "executor": {"instances": args.executors, "cores": 1, "memory": args.executor_memory, **pod},
        },
    }


def metrics_exporter(args: argparse.Namespace, port: int) -> list[dict[str, Any]]:
    volume, mount = _config_volume(args)
    labels = _labels(args.name, "metrics")
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": f"{args.name}-metrics", "namespace": args.namespace, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{
                "name": "metrics", "image": args.spark_image,
                "command": [f"{Path(VENV_PYTHON).parent}/streamberg", "metrics", "--config",
                            f"{CONFIG_DIR}/{CONFIG_KEY}", "--address", "0.0.0.0", "--port", str(port)],
                "ports": [{"name": "metrics", "containerPort": port}],
                "envFrom": [{"secretRef": {"name": args.secret, "optional": True}}],
                "volumeMounts": [mount],
                "readinessProbe": {"tcpSocket": {"port": "metrics"}, "periodSeconds": 10},
                "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
            }], "volumes": [volume]}}},
    }
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": f"{args.name}-metrics", "namespace": args.namespace, "labels": labels},
               "spec": {"selector": labels, "ports": [{"name": "metrics", "port": port, "targetPort": "metrics"}]}}
    return [deployment, service]


def _state_dir(args: argparse.Namespace, config: StreambergConfig) -> str:
    if args.flink_state_dir:
        return str(args.flink_state_dir).rstrip("/")
    warehouse = config.catalog.warehouse or ""
    if "://" in warehouse and not warehouse.startswith("file:"):
        return f"{warehouse.rstrip('/')}/_streamberg/flink"
    raise CommandError("the ingest's checkpoints and HA metadata need storage every pod reaches: give "
                       "--flink-state-dir s3://bucket/path (the warehouse is not an object store URL)")


def manifests(args: argparse.Namespace) -> list[dict[str, Any]]:
    text = Path(args.config).read_text()
    if redact(text) != text:
        raise CommandError(f"{args.config} holds a secret (a password or credential): it would be stored in a "
                           "ConfigMap. Move it to the Secret as a STREAMBERG_<SECTION>__<KEY> variable")
    fleet = is_fleet(args.config)
    if fleet:
        loaded = load_fleet(args.config)
        route = loaded.tables[0]
        config = config_from_dump(loaded.document(route, (route.topics or ["sample.topic"])[0]))
    else:
        config = load_config(args.config)
    documents = [config_map(args, text), flink_deployment(args, config, _state_dir(args, config))]
    if not fleet:  # a config of many tables: per-table components wait for issue 31's service
        documents.append(spark_application(args, "compact", []))
        if has_changelog(config):
            documents.append(spark_application(args, "merge", []))
        documents.append(spark_application(args, "maintain", []))
    documents += metrics_exporter(args, config.monitoring.metrics_port)
    return documents


def _run(args: argparse.Namespace) -> int:
    documents = manifests(args)
    header = (f"# streamberg deploy k8s --config {args.config}: {len(documents)} manifests. Create the Secret "
              f"{args.secret!r} (STREAMBERG_* variables) first. Not applied anywhere; review, then kubectl apply -f -\n")
    sys.stdout.write(header + yaml.safe_dump_all(documents, sort_keys=False))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("deploy", help="print the Kubernetes manifests of a config",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    targets = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    k8s = targets.add_parser("k8s", help="FlinkDeployment, SparkApplications, metrics exporter, ConfigMap",
                             description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    k8s.add_argument("--config", required=True, help="the config to deploy (stored in the ConfigMap as given)")
    k8s.add_argument("--name", default="streamberg", help="prefix of every object's name (default streamberg)")
    k8s.add_argument("--namespace", default="default")
    k8s.add_argument("--secret", default="streamberg-secrets",
                     help="the Secret every pod takes its STREAMBERG_* variables from (you create it)")
    k8s.add_argument("--flink-image", default="registry.example.com/streamberg-flink:0.1.0",
                     help="deploy/k8s/Dockerfile --target flink, pushed to your registry")
    k8s.add_argument("--spark-image", default="registry.example.com/streamberg-spark:0.1.0",
                     help="deploy/k8s/Dockerfile --target spark (also runs the metrics exporter)")
    k8s.add_argument("--flink-state-dir", default=None,
                     help="checkpoints and HA metadata of the ingest (default: <warehouse>/_streamberg/flink for an "
                          "object-store warehouse)")
    k8s.add_argument("--flink-service-account", default="flink")
    k8s.add_argument("--spark-service-account", default="spark")
    k8s.add_argument("--taskmanager-memory", default="4096m")
    k8s.add_argument("--executors", type=int, default=2)
    k8s.add_argument("--executor-memory", default="2g")
    k8s.set_defaults(func=_run)
