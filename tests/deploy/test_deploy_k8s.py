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


def validate(document: dict[str, Any]) -> None:
    kind = document["kind"]
    if kind in SCHEMAS:
        jsonschema.validate(document, SCHEMAS[kind](), cls=jsonschema.Draft7Validator)
        if kind == "FlinkDeployment":  # its podTemplate is a core Pod the CRD leaves open
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "template"},
                   **document["spec"]["podTemplate"]}
            kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        return
    kubernetes_validate.validate(document, K8S_VERSION, strict=True)


def _config(tmp_path: Path, **kafka: Any) -> Path:
    path = tmp_path / "prod.yaml"
    path.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": "kafka:9092", "topic": "users", **kafka},
        "catalog": {"name": "lake", "type": "rest", "uri": "https://polaris.example/api/catalog",
                    "warehouse": "s3://lake/warehouse"},
        "table": {"identifier": "shop.users", **({"primary_key": ["id"]} if kafka.get("envelope") else {}),
                  "schema": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"}]},
        "ingest": {"parallelism": 3}}))
    return path


def _deploy(path: Path, *flags: str) -> list[dict[str, Any]]:
    proc = streamberg("deploy", "k8s", "--config", str(path), "--namespace", "data", *flags)
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_every_manifest_validates_and_says_what_the_config_says(tmp_path: Path) -> None:
    path = _config(tmp_path, envelope="upsert", key_format="value")
    documents = _deploy(path)
    for document in documents:
        validate(document)
    by_kind: dict[str, list[dict]] = {}
    for d in documents:
        by_kind.setdefault(d["kind"], []).append(d)
    assert sorted(by_kind) == ["ConfigMap", "Deployment", "FlinkDeployment", "Service", "SparkApplication"]
    assert all(d["metadata"]["namespace"] == "data" for d in documents)

    flink = by_kind["FlinkDeployment"][0]["spec"]
    assert flink["job"]["upgradeMode"] == "last-state" and flink["job"]["parallelism"] == 3
    conf = flink["flinkConfiguration"]
    assert conf["high-availability.type"] == "kubernetes"
    assert conf["high-availability.storageDir"].startswith("s3://lake/warehouse/")
    assert conf["execution.checkpointing.interval"] and conf["taskmanager.numberOfTaskSlots"] == "3"
    assert flink["job"]["args"][:2] == ["-pym", "streamberg.cli.flink_submit"]

    # A primary-key table: the merge runs beside the compactor and maintenance, each the one entry.
    apps = {a["metadata"]["name"]: a["spec"] for a in by_kind["SparkApplication"]}
    assert sorted(apps) == ["streamberg-compact", "streamberg-maintain", "streamberg-merge"]
    for name, spec in apps.items():
        assert spec["arguments"][0] == name.removeprefix("streamberg-")
        assert spec["restartPolicy"]["type"] == "Always"
        assert spec["mainApplicationFile"] == "local:///opt/streamberg/spark_submit.py"
    dockerfile = (Path(__file__).parents[2] / "deploy" / "k8s" / "Dockerfile").read_text()
    assert "/opt/streamberg/spark_submit.py" in dockerfile  # the image has the file the apps name

    # The ConfigMap holds the config as given, and it loads.
    text = by_kind["ConfigMap"][0]["data"]["streamberg.yaml"]
    assert text == path.read_text()
    exporter = by_kind["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]
    assert exporter["command"][1:2] == ["metrics"] and "0.0.0.0" in exporter["command"]


def test_an_event_table_has_no_merge_and_a_broken_manifest_is_caught(tmp_path: Path) -> None:
    documents = _deploy(_config(tmp_path))
    assert [d["metadata"]["name"] for d in documents if d["kind"] == "SparkApplication"] == \
        ["streamberg-compact", "streamberg-maintain"]
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


def test_the_example_manifests_in_deploy_k8s_validate_too() -> None:
    folder = Path(__file__).parents[2] / "deploy" / "k8s"
    documents = [d for path in sorted(folder.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]
    assert {d["kind"] for d in documents} >= {"FlinkDeployment", "ConfigMap"}
    for document in documents:
        validate(document)
