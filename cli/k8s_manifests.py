"""The Kubernetes objects of `streamberg deploy k8s` (cli/deploy.py decides which, with what).

Every pod runs as the image's non-root user with a read-only root file system, no Linux
capabilities, no privilege escalation and the runtime's default seccomp profile; the places a
process writes are volumes: /tmp and the engines' own work folders (emptyDir) and the state
volume at STATE_ROOT (an emptyDir of the pod, or `--state-claim`, a ReadWriteMany claim every
pod shares), where relative state paths of the config are put (PodPlan.env). Every container
has resource requests and limits and liveness and readiness probes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

CONFIG_DIR = "/etc/streamberg"
CONFIG_KEY = "streamberg.yaml"
SECRET_DIR = "/etc/streamberg-secrets"  # catalog.credential_file and token_file, from the Secret
STATE_ROOT = "/var/lib/streamberg"  # the state volume: run folders, heartbeats, local state paths
# deploy/k8s/Dockerfile.flink and Dockerfile.spark: the PyFlink driver jar in the Flink image,
# the fixed links in the Spark image, the one venv of both.
FLINK_PYTHON_JAR = "local:///opt/flink/opt/flink-python-2.3.0.jar"
SPARK_ENTRY = "local:///opt/streamberg/spark_submit.py"
SPARK_JARS = ["local:///opt/streamberg/iceberg-spark-runtime.jar", "local:///opt/streamberg/postgresql.jar"]
VENV_PYTHON = "/opt/venv/bin/python"
STREAMBERG = "/opt/venv/bin/streamberg"
# The Flink line of the image (Flink 2.3) as the operator names it: v2_2 is the newest value
# operator 1.15 lists; an operator that knows v2_3 takes that.
FLINK_VERSION = "v2_2"
SPARK_VERSION = "3.5.9"
# The official images' users: flink (9999) and spark (185).
FLINK_UID, SPARK_UID = 9999, 185


@dataclass
class PodPlan:
    """What every pod of one deployment shares: its name prefix and namespace, the Secret of
    STREAMBERG_* variables, the environment that puts relative state paths on the state
    volume, the Secret files (credential_file, token_file) and the state claim."""

    name: str
    namespace: str
    secret: str
    env: dict[str, str] = field(default_factory=dict)
    secret_files: dict[str, str] = field(default_factory=dict)  # Secret key -> absolute path in the pod
    state_claim: str | None = None
    flink_account: str = "flink"
    spark_account: str = "spark"
    # Jars the Spark pods add for an object-store warehouse (local:// paths in the image, e.g.
    # Iceberg's AWS bundle for s3://): `deploy k8s --spark-s3-jars`.
    spark_extra_jars: list[str] = field(default_factory=list)

    def labels(self, component: str) -> dict[str, str]:
        return {"app.kubernetes.io/name": "streamberg", "app.kubernetes.io/instance": self.name,
                "app.kubernetes.io/component": component}

    def metadata(self, component: str, suffix: str | None = None) -> dict[str, Any]:
        return {"name": f"{self.name}-{suffix or component}", "namespace": self.namespace,
                "labels": self.labels(component)}

    def volumes(self, scratch: list[str]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"name": "streamberg-config", "configMap": {"name": f"{self.name}-config"}},
                                     {"name": "streamberg-state", **({"persistentVolumeClaim": {
                                         "claimName": self.state_claim}} if self.state_claim else {"emptyDir": {}})}]
        out += [{"name": f"scratch-{i}", "emptyDir": {}} for i in range(len(scratch))]
        if self.secret_files:
            out.append({"name": "streamberg-secret-files", "secret": {
                "secretName": self.secret, "defaultMode": 0o400,
                "items": [{"key": key, "path": PurePosixPath(path).name} for key, path in sorted(self.secret_files.items())]}})
        return out

    def mounts(self, scratch: list[str]) -> list[dict[str, Any]]:
        out = [{"name": "streamberg-config", "mountPath": CONFIG_DIR, "readOnly": True},
               {"name": "streamberg-state", "mountPath": STATE_ROOT}]
        out += [{"name": f"scratch-{i}", "mountPath": path} for i, path in enumerate(scratch)]
        if self.secret_files:
            out.append({"name": "streamberg-secret-files", "mountPath": SECRET_DIR, "readOnly": True})
        return out

    def environment(self) -> list[dict[str, Any]]:
        return [{"name": k, "value": v} for k, v in sorted(self.env.items())]

    def env_from(self) -> list[dict[str, Any]]:
        return [{"secretRef": {"name": self.secret, "optional": True}}]


def pod_security(uid: int) -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"}}


def container_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]}}


def exec_probe(command: list[str], period: int = 30, initial: int = 60, timeout: int = 20) -> dict[str, Any]:
    return {"exec": {"command": command}, "initialDelaySeconds": initial, "periodSeconds": period,
            "timeoutSeconds": timeout, "failureThreshold": 3}


def config_map(plan: PodPlan, text: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": plan.metadata("config"), "data": {CONFIG_KEY: text}}


FLINK_SCRATCH = ["/tmp", "/opt/flink/log"]
SPARK_SCRATCH = ["/tmp", "/opt/spark/work-dir"]


def flink_deployment(plan: PodPlan, image: str, parallelism: int, state_dir: str, taskmanager_memory: str) -> dict[str, Any]:
    """The ingest: application mode, the same entry point as `flink run` (cli/flink_submit.py),
    last-state upgrades with Kubernetes HA. Exactly-once rests on the offsets each commit
    records in the table, not on Flink state (docs/exactly-once.md)."""
    container = {"name": "flink-main-container", "env": plan.environment(), "envFrom": plan.env_from(),
                 "volumeMounts": plan.mounts(FLINK_SCRATCH), "securityContext": container_security()}
    pod = {"spec": {"securityContext": pod_security(FLINK_UID), "containers": [container],
                    "volumes": plan.volumes(FLINK_SCRATCH)}}

    def role(probes: dict[str, Any]) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": "flink-main-container", **probes}]}}

    return {
        "apiVersion": "flink.apache.org/v1beta1", "kind": "FlinkDeployment", "metadata": plan.metadata("ingest"),
        "spec": {
            "image": image, "flinkVersion": FLINK_VERSION, "serviceAccount": plan.flink_account,
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
            "jobManager": {"resource": {"memory": "2048m", "cpu": 1}, "podTemplate": role({
                "readinessProbe": {"httpGet": {"path": "/config", "port": 8081}, "periodSeconds": 10},
                "livenessProbe": {"tcpSocket": {"port": 6123}, "initialDelaySeconds": 60, "periodSeconds": 30}})},
            "taskManager": {"resource": {"memory": taskmanager_memory, "cpu": max(1, parallelism)}, "podTemplate": role({
                "readinessProbe": {"tcpSocket": {"port": 6122}, "periodSeconds": 10},
                "livenessProbe": {"tcpSocket": {"port": 6122}, "initialDelaySeconds": 60, "periodSeconds": 30}})},
            "podTemplate": pod,
            "job": {"jarURI": FLINK_PYTHON_JAR, "entryClass": "org.apache.flink.client.python.PythonDriver",
                    "args": ["-pym", "streamberg.cli.flink_submit", "--config", f"{CONFIG_DIR}/{CONFIG_KEY}"],
                    "parallelism": parallelism, "upgradeMode": "last-state", "state": "running"},
        },
    }


def spark_application(plan: PodPlan, image: str, component: str, arguments: list[str], executors: int,
                      executor_memory: str, health: list[str] | None = None) -> dict[str, Any]:
    """A Spark component (`govern`, or one table's `compact`/`merge`/`maintain`) run by
    cli/spark_submit.py, restarted always (a long-running keeper). `health`: the command
    whose exit code the driver's probes read."""
    def pod(role: str, probed: bool) -> dict[str, Any]:
        container: dict[str, Any] = {"name": f"spark-kubernetes-{role}", "securityContext": container_security()}
        if probed and health:
            container["livenessProbe"] = exec_probe(health)
            container["readinessProbe"] = exec_probe(health, period=30, initial=30)
        return {"serviceAccount": plan.spark_account, "env": plan.environment(), "envFrom": plan.env_from(),
                "volumeMounts": plan.mounts(SPARK_SCRATCH), "labels": plan.labels(component),
                "podSecurityContext": pod_security(SPARK_UID), "securityContext": container_security(),
                "template": {"spec": {"containers": [container]}}}

    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication", "metadata": plan.metadata(component),
        "spec": {
            "type": "Python", "pythonVersion": "3", "mode": "cluster", "image": image,
            "sparkVersion": SPARK_VERSION, "mainApplicationFile": SPARK_ENTRY,
            "arguments": [component, "--config", f"{CONFIG_DIR}/{CONFIG_KEY}", *arguments],
            "deps": {"jars": SPARK_JARS + plan.spark_extra_jars},
            "sparkConf": {"spark.pyspark.python": VENV_PYTHON, "spark.pyspark.driver.python": VENV_PYTHON,
                          "spark.local.dir": "/tmp"},
            # A keeper that stops is restarted; the lease (compactor) and the catalog's
            # optimistic commits keep a second copy harmless.
            "restartPolicy": {"type": "Always", "onFailureRetryInterval": 30, "onSubmissionFailureRetryInterval": 60},
            "volumes": plan.volumes(SPARK_SCRATCH),
            "driver": {"cores": 1, "coreLimit": "1", "memory": "2g", "memoryLimit": "3g", **pod("driver", True)},
            "executor": {"instances": executors, "cores": 1, "coreLimit": "1", "memory": executor_memory,
                         **pod("executor", False)},
        },
    }


def metrics_exporter(plan: PodPlan, image: str, port: int) -> list[dict[str, Any]]:
    """`streamberg metrics` on the pod network (0.0.0.0 inside the pod, not a shared host);
    /healthz answers the probes without collecting."""
    labels = plan.labels("metrics")
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": plan.metadata("metrics"),
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"securityContext": pod_security(SPARK_UID), "containers": [{
                "name": "metrics", "image": image,
                "command": [STREAMBERG, "metrics", "--config", f"{CONFIG_DIR}/{CONFIG_KEY}", "--address", "0.0.0.0",
                            "--port", str(port)],
                "ports": [{"name": "metrics", "containerPort": port}],
                "env": plan.environment(), "envFrom": plan.env_from(),
                "volumeMounts": plan.mounts(["/tmp"]),
                "securityContext": container_security(),
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 10},
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}, "initialDelaySeconds": 20,
                                  "periodSeconds": 30},
                "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
            }], "volumes": plan.volumes(["/tmp"])}}},
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": plan.metadata("metrics"),
               "spec": {"selector": labels, "ports": [{"name": "metrics", "port": port, "targetPort": "metrics"}]}}
    # The Prometheus Operator's scrape of that Service (its port by name): applied where the
    # operator's CRDs are installed (kube-prometheus-stack), refused harmlessly elsewhere.
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": plan.metadata("metrics"),
               "spec": {"selector": {"matchLabels": service["metadata"]["labels"]},
                        "namespaceSelector": {"matchNames": [plan.namespace]},
                        "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s"}]}}
    return [deployment, service, monitor]
