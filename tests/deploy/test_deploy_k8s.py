"""`streamberg deploy k8s`: every manifest it prints is checked against its schema, offline.

- Built-in kinds (ConfigMap, Deployment, Service) with kubernetes-validate's Kubernetes 1.31
  schemas, strict (an unknown field fails).
- FlinkDeployment against the Flink Kubernetes Operator's CRD (release-1.15.0, commit
  79d730bab4d8403f3a447fb027f879f5cbdc59ad, helm/flink-kubernetes-operator/crds/
  flinkdeployments.flink.apache.org-v1.yml) and SparkApplication against Kubeflow
  spark-operator's (v2.5.2, commit 43afb8bbd32463037d8fb6e414e252c69081882b,
  charts/spark-operator-chart/crds/sparkoperator.k8s.io_sparkapplications.yaml), both
  Apache-2.0, kept gzipped in tests/deploy/crds/. Unknown fields are refused here too, as
  `kubectl apply --validate=strict` would; the pod templates the Flink CRD leaves open are
  checked as core Pod specs.
Nothing here runs on a cluster: no Kubernetes exists on these machines.
"""

from __future__ import annotations

import copy
import gzip
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.helpers import EVENT_SCHEMA, streamberg

CRDS = Path(__file__).parent / "crds"
K8S_VERSION = "1.31.0"
SECRET = "pw-Zk81-deploy"


def _crd_schema(file: str, version: str) -> dict[str, Any]:
    crd = yaml.safe_load(gzip.decompress((CRDS / file).read_bytes()))
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]
    schema = _closed(copy.deepcopy(schema))
    # The root's apiVersion, kind and metadata are Kubernetes' own (every object has them).
    schema["properties"].update({"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                 "metadata": {"type": "object"}})
    return schema


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """Every object with declared properties refuses others (a misspelled key fails), unless
    the CRD keeps unknown fields there on purpose."""
    if isinstance(schema, dict):
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        for value in schema.values():
            if isinstance(value, dict):
                _closed(value)
            elif isinstance(value, list):
                for item in value:
                    _closed(item)
    return schema


SCHEMAS = {
    "FlinkDeployment": lambda: _crd_schema("flinkdeployments.flink.apache.org-v1.yml.gz", "v1beta1"),
    "SparkApplication": lambda: _crd_schema("sparkoperator.k8s.io_sparkapplications.yaml.gz", "v1beta2"),
}


def _as_pod(template: dict[str, Any]) -> None:
    """A pod template the CRD leaves open, checked as a core Pod (containers need an image)."""
    spec = copy.deepcopy(template["spec"])
    for container in spec.get("containers", []):
        container.setdefault("image", "image")
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "template"}, "spec": spec},
                                 K8S_VERSION, strict=True)


# The Prometheus Operator's ServiceMonitor (monitoring.coreos.com/v1): the fields streamberg
# writes, as the operator's CRD (v0.87) defines them, copied by hand (the full CRD, 74 KB, is not
# kept here); unknown fields refused, as a structural schema's strict validation would.
_SERVICE_MONITOR = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object"},
        "spec": {"type": "object", "required": ["selector", "endpoints"], "additionalProperties": False, "properties": {
            "selector": {"type": "object", "additionalProperties": False, "properties": {
                "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}},
            "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                "matchNames": {"type": "array", "items": {"type": "string"}}, "any": {"type": "boolean"}}},
            "endpoints": {"type": "array", "items": {"type": "object", "additionalProperties": False, "properties": {
                "port": {"type": "string"}, "path": {"type": "string"},
                "interval": {"type": "string", "pattern": "^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}}}}}}}}


def validate(document: dict[str, Any]) -> None:
    kind = document["kind"]
    if kind == "ServiceMonitor":
        jsonschema.validate(document, _SERVICE_MONITOR, cls=jsonschema.Draft7Validator)
        # Its metadata as Kubernetes takes any object's (checked on a ConfigMap carrying it).
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": document["metadata"]},
                                     K8S_VERSION, strict=True)
        return
    if kind in SCHEMAS:
        jsonschema.validate(document, SCHEMAS[kind](), cls=jsonschema.Draft7Validator)
        if kind == "FlinkDeployment":  # its pod templates are core Pods the CRD leaves open
            _as_pod(document["spec"]["podTemplate"])
            for role in ("jobManager", "taskManager"):
                if "podTemplate" in document["spec"][role]:
                    _as_pod(document["spec"][role]["podTemplate"])
        if kind == "SparkApplication":
            for role in ("driver", "executor"):
                if "template" in document["spec"][role]:
                    _as_pod(document["spec"][role]["template"])
        return
    kubernetes_validate.validate(document, K8S_VERSION, strict=True)


def pods(document: dict[str, Any]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(pod security context, containers) of every pod an object makes."""
    spec = document.get("spec", {})
    if document["kind"] == "FlinkDeployment":
        template = spec["podTemplate"]["spec"]
        roles = [spec[r]["podTemplate"]["spec"]["containers"][0] for r in ("jobManager", "taskManager")]
        merged = [{**template["containers"][0], **role} for role in roles]
        return [(template["securityContext"], [c]) for c in merged]
    if document["kind"] == "SparkApplication":
        return [(spec[r]["podSecurityContext"], [{**spec[r], **spec[r]["template"]["spec"]["containers"][0]}])
                for r in ("driver", "executor")]
    if document["kind"] == "Deployment":
        template = spec["template"]["spec"]
        return [(template["securityContext"], template["containers"])]
    return []


def assert_hardened(documents: list[dict[str, Any]]) -> None:
    """Every pod: non-root, read-only root, no capabilities, no escalation; every container a
    probe of each kind where it serves (the executors are Spark's own), resources."""
    for document in documents:
        for pod_security, containers in pods(document):
            assert pod_security["runAsNonRoot"] is True and pod_security["runAsUser"] > 0, document["metadata"]
            for container in containers:
                security = container["securityContext"]
                assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
                assert security["capabilities"]["drop"] == ["ALL"], document["metadata"]
                if not container["name"].endswith("executor"):
                    assert "livenessProbe" in container and "readinessProbe" in container, \
                        (document["metadata"]["name"], container["name"])
        if document["kind"] == "Deployment":
            assert document["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        if document["kind"] == "SparkApplication":
            assert document["spec"]["driver"]["memoryLimit"] and document["spec"]["driver"]["coreLimit"]
        if document["kind"] == "FlinkDeployment":
            assert all(document["spec"][r]["resource"]["memory"] for r in ("jobManager", "taskManager"))


def _config(tmp_path: Path, **kafka: Any) -> Path:
    path = tmp_path / "prod.yaml"
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": "kafka:9092", "topic": "users", **kafka},
        "catalog": {"name": "lake", "type": "rest", "uri": "https://polaris.example/api/catalog",
                    "warehouse": "s3://lake/warehouse", "state_uri": "postgresql://streamberg@db:5432/state"},
        "table": {"identifier": "shop.users", **({"primary_key": ["id"]} if kafka.get("envelope") else {}),
                  "schema": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"}]},
        "ingest": {"parallelism": 3}}))
    return path


S3_JARS = ("--spark-s3-jars", "local:///opt/streamberg/iceberg-aws-bundle.jar")
IMAGES = ("--flink-image", "registry.example.com/streamberg-flink:0.1.0",
          "--spark-image", "registry.example.com/streamberg-spark:0.1.0", *S3_JARS)


def _deploy(path: Path, *flags: str) -> list[dict[str, Any]]:
    proc = streamberg("deploy", "k8s", "--config", str(path), "--namespace", "data", *IMAGES, *flags)
    assert "warning" not in proc.stderr or "--state-claim" in proc.stderr, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_every_manifest_validates_and_says_what_the_config_says(tmp_path: Path) -> None:
    path = _config(tmp_path, envelope="upsert", key_format="value")
    documents = _deploy(path)
    for document in documents:
        validate(document)
    by_kind: dict[str, list[dict]] = {}
    for d in documents:
        by_kind.setdefault(d["kind"], []).append(d)
    assert sorted(by_kind) == ["ConfigMap", "Deployment", "FlinkDeployment", "Service", "ServiceMonitor",
                               "SparkApplication"]
    assert all(d["metadata"]["namespace"] == "data" for d in documents)
    # Prometheus Operator scrapes the exporter's Service: its labels, its port by name, /metrics.
    service, monitor = by_kind["Service"][0], by_kind["ServiceMonitor"][0]["spec"]
    assert monitor["selector"]["matchLabels"] == service["metadata"]["labels"]
    assert [e["port"] for e in monitor["endpoints"]] == [p["name"] for p in service["spec"]["ports"]] == ["metrics"]
    assert monitor["endpoints"][0]["path"] == "/metrics" and monitor["namespaceSelector"]["matchNames"] == ["data"]

    flink = by_kind["FlinkDeployment"][0]["spec"]
    assert flink["job"]["upgradeMode"] == "last-state" and flink["job"]["parallelism"] == 3
    conf = flink["flinkConfiguration"]
    assert conf["high-availability.type"] == "kubernetes"
    assert conf["high-availability.storageDir"].startswith("s3://lake/warehouse/")
    assert conf["execution.checkpointing.interval"] and conf["taskmanager.numberOfTaskSlots"] == "3"
    assert flink["job"]["args"][:2] == ["-pym", "streamberg.cli.flink_submit"]

    # The governor keeps the table: one SparkApplication running `govern`, its probes the heartbeat.
    apps = {a["metadata"]["name"]: a["spec"] for a in by_kind["SparkApplication"]}
    assert sorted(apps) == ["streamberg-govern"]
    governor = apps["streamberg-govern"]
    assert governor["arguments"][:3] == ["govern", "--config", "/etc/streamberg/streamberg.yaml"]
    assert governor["restartPolicy"]["type"] == "Always"
    assert governor["mainApplicationFile"] == "local:///opt/streamberg/spark_submit.py"
    probe = governor["driver"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"]["command"]
    assert probe[-1] == "--health" and "govern" in probe
    dockerfile = (Path(__file__).parents[2] / "deploy" / "k8s" / "Dockerfile.spark").read_text()
    assert "/opt/streamberg/spark_submit.py" in dockerfile  # the image has the file the apps name
    assert_hardened(documents)
    # Relative state paths go on the state volume, by the environment every pod has.
    env = {e["name"]: e["value"] for e in governor["driver"]["env"]}
    assert env["STREAMBERG_INGEST__STATE_DIR"].startswith("/var/lib/streamberg/")
    assert env["STREAMBERG_COMPACTOR__CHECKPOINT_DIR"] == "s3://lake/warehouse/_streamberg/compactor-checkpoint"

    # For one table, the components instead: compact, maintain and (a primary-key table) merge.
    components = {a["metadata"]["name"]: a["spec"] for a in _deploy(path, "--keepers", "components")
                  if a["kind"] == "SparkApplication"}
    assert sorted(components) == ["streamberg-compact", "streamberg-maintain", "streamberg-merge"]
    for name, spec in components.items():
        assert spec["arguments"][0] == name.removeprefix("streamberg-")

    # The ConfigMap holds the config as given, and it loads.
    text = by_kind["ConfigMap"][0]["data"]["streamberg.yaml"]
    assert text == path.read_text()
    exporter = by_kind["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]
    assert exporter["command"][1:2] == ["metrics"] and "0.0.0.0" in exporter["command"]


def test_an_event_table_has_no_merge_and_a_broken_manifest_is_caught(tmp_path: Path) -> None:
    assert [d["metadata"]["name"] for d in _deploy(_config(tmp_path), "--keepers", "components")
            if d["kind"] == "SparkApplication"] == ["streamberg-compact", "streamberg-maintain"]
    documents = _deploy(_config(tmp_path))
    # The validation can fail: a misspelled field of each kind is refused.
    for document in documents:
        broken = copy.deepcopy(document)
        broken["spec" if "spec" in broken else "data"]["unknownFieldX"] = 1
        with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
            validate(broken)


def test_a_secret_in_the_config_is_refused_and_not_printed(tmp_path: Path) -> None:
    path = tmp_path / "secret.yaml"
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": "kafka:9092", "topic": "t", "consumer": {"sasl.password": SECRET}},
        "catalog": {"uri": "sqlite:///c.db", "warehouse": "s3://lake/wh"},
        "table": {"identifier": "a.b", "schema": EVENT_SCHEMA}}))
    proc = streamberg("deploy", "k8s", "--config", str(path), check=False)
    assert proc.returncode != 0 and "Secret" in proc.stderr
    assert SECRET not in proc.stdout + proc.stderr
    # A warehouse that is a local path: the ingest's checkpoints need a shared place, asked for.
    local = _config(tmp_path)
    document = yaml.safe_load(local.read_text())
    document["catalog"]["warehouse"] = "/data/warehouse"
    local.write_text(yaml.safe_dump(document))
    proc = streamberg("deploy", "k8s", "--config", str(local), check=False)
    assert proc.returncode != 0 and "--flink-state-dir" in proc.stderr
    assert _deploy(local, "--flink-state-dir", "s3://ckpt/flink")


def test_a_config_of_many_is_deployed_whole(tmp_path: Path) -> None:
    """Issue 38, item 10: examples/fleet.yaml (a SQLite catalog and a local warehouse, so a
    shared claim) gets the ingest, the governor keeping every table, the exporter; every pod
    hardened and probed; every manifest valid."""
    example = Path(__file__).parents[2] / "examples" / "fleet.yaml"
    path = tmp_path / "fleet.yaml"
    path.write_text(example.read_text())
    refused = streamberg("deploy", "k8s", "--config", str(path), *IMAGES, check=False)
    assert refused.returncode != 0 and "--state-claim" in refused.stderr and "Traceback" not in refused.stderr
    documents = _deploy(path, "--state-claim", "streamberg-state")
    for document in documents:
        validate(document)
    assert_hardened(documents)
    kinds = sorted(d["kind"] for d in documents)
    assert kinds == ["ConfigMap", "Deployment", "FlinkDeployment", "Service", "ServiceMonitor", "SparkApplication"], kinds
    governor = next(d for d in documents if d["kind"] == "SparkApplication")["spec"]
    assert governor["arguments"][0] == "govern"
    assert {v["name"]: v for v in governor["volumes"]}["streamberg-state"]["persistentVolumeClaim"] == \
        {"claimName": "streamberg-state"}
    env = {e["name"]: e["value"] for e in governor["driver"]["env"]}
    assert env["STREAMBERG_CATALOG__URI"] == "sqlite:////var/lib/streamberg/.streamberg/fleet/catalog.db"
    assert env["STREAMBERG_CATALOG__WAREHOUSE"] == "file:///var/lib/streamberg/.streamberg/fleet/warehouse"
    assert env["STREAMBERG_INGEST__STATE_DIR"] == "/var/lib/streamberg/.streamberg/fleet/state"
    flink = next(d for d in documents if d["kind"] == "FlinkDeployment")["spec"]
    assert flink["flinkConfiguration"]["high-availability.storageDir"] == "file:///var/lib/streamberg/flink/ha"
    # The environment the pods get is what the config of many takes: every table's.
    import os

    from streamberg.common.config import config_from_dump, load_fleet
    saved = dict(os.environ)
    try:
        os.environ.update(env)
        fleet = load_fleet(path)
        one = config_from_dump(fleet.document(fleet.tables[0], "orders"))
        assert one.ingest.state_dir == env["STREAMBERG_INGEST__STATE_DIR"]
        assert one.catalog.uri == env["STREAMBERG_CATALOG__URI"]
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.slow  # 9-12 s alone on 2 cores (make test-fast --durations, 2026-11-29)
def test_images_state_paths_and_secret_files_are_said_or_refused(tmp_path: Path) -> None:
    path = _config(tmp_path)
    proc = streamberg("deploy", "k8s", "--config", str(path), *S3_JARS)
    assert "REPLACE-ME.invalid" in proc.stdout and "--flink-image" in proc.stderr  # loudly a placeholder
    assert proc.stdout.count("# WARNING") >= 1
    # A REST catalog's state database as a SQLite file: one pod's alone, refused with the fix.
    document = yaml.safe_load(path.read_text())
    document["catalog"]["state_uri"] = "sqlite:///state.db"
    path.write_text(yaml.safe_dump(document))
    refused = streamberg("deploy", "k8s", "--config", str(path), *IMAGES, check=False)
    assert refused.returncode != 0 and "postgresql://" in refused.stderr
    document["catalog"]["state_uri"] = "postgresql://streamberg@db:5432/state"
    document["ingest"]["state_dir"] = "/srv/state"  # a path in the image: read-only there
    path.write_text(yaml.safe_dump(document))
    refused = streamberg("deploy", "k8s", "--config", str(path), *IMAGES, check=False)
    assert refused.returncode != 0 and "ingest.state_dir" in refused.stderr and "read-only" in refused.stderr
    # credential_file: the Secret's key mounted as a file, the config pointed at it.
    del document["ingest"]["state_dir"]
    document["catalog"]["credential_file"] = "secrets/rest-credential"
    path.write_text(yaml.safe_dump(document))
    documents = _deploy(path)
    for d in documents:
        validate(d)
    governor = next(d for d in documents if d["kind"] == "SparkApplication")["spec"]
    files = {v["name"]: v for v in governor["volumes"]}["streamberg-secret-files"]["secret"]
    assert files["secretName"] == "streamberg-secrets" and files["items"] == [
        {"key": "catalog-credential", "path": "credential"}] and files["defaultMode"] == 0o400
    env = {e["name"]: e["value"] for e in governor["driver"]["env"]}
    assert env["STREAMBERG_CATALOG__CREDENTIAL_FILE"] == "/etc/streamberg-secrets/credential"
    mounts = {m["mountPath"]: m for m in governor["driver"]["volumeMounts"]}
    assert mounts["/etc/streamberg-secrets"]["readOnly"] is True


def test_an_s3_warehouse_needs_the_aws_bundle_in_the_spark_image(tmp_path: Path) -> None:
    """Spark opens s3:// files through Iceberg's S3FileIO (the AWS SDK): refused without the jar,
    saying how to build it in; with it, every SparkApplication adds it."""
    path = _config(tmp_path)
    refused = streamberg("deploy", "k8s", "--config", str(path), *IMAGES[:4], check=False)
    assert refused.returncode == 2 and "AWS_BUNDLE_JAR" in refused.stderr and "--spark-s3-jars" in refused.stderr
    assert "Traceback" not in refused.stderr and not refused.stdout
    documents = _deploy(path)
    for document in documents:
        if document["kind"] == "SparkApplication":
            assert S3_JARS[1] in document["spec"]["deps"]["jars"], document["spec"]["deps"]
