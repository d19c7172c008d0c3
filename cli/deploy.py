"""`streamberg deploy k8s --config prod.yaml`: the Kubernetes manifests of a config, printed.

For a config of one table or of many (`tables:`), one YAML stream (`kubectl apply -f -`):
- a ConfigMap holding the config file as given (mounted read-only at /etc/streamberg) and,
  referenced by every pod, a Secret you create (`--secret`): its STREAMBERG_* variables carry
  passwords and credentials (a config holding a secret is refused, naming the key to move), and
  its keys `catalog-credential` / `catalog-token` are mounted as files when the config names
  catalog.credential_file / token_file;
- the ingest: a FlinkDeployment (Flink Kubernetes Operator, flink.apache.org/v1beta1) in
  application mode running cli/flink_submit.py, `upgradeMode: last-state`, Kubernetes HA,
  periodic checkpoints (exactly-once rests on the offsets each commit records in the table);
- the keeper of every table: the governor, a SparkApplication (Kubeflow spark-operator,
  sparkoperator.k8s.io/v1beta2) running `streamberg govern` through cli/spark_submit.py, which
  compacts, merges and maintains every table of the config by need. For one table,
  `--keepers components` emits a SparkApplication each for compact, maintain and (a primary-key
  table) merge instead; never both (two keepers of a table would fight over its lease);
- the metrics exporter: a Deployment and a Service (`streamberg metrics`, /healthz for probes).

Every pod: non-root, read-only root file system, no capabilities, resources, liveness and
readiness probes (the governor's: `streamberg govern --health`, its heartbeat). Relative state
paths of the config (ingest.state_dir, compactor.checkpoint_dir, a SQLite catalog or state
database, a local warehouse) are put on writable volumes by STREAMBERG_* variables in the
pods, or refused with the fix: a path every pod must share needs `--state-claim` (a
ReadWriteMany PersistentVolumeClaim) or a database and object store every pod reaches.

The images are deploy/k8s/Dockerfile.flink and Dockerfile.spark, pushed to your registry:
`--flink-image` and `--spark-image` (without them the manifests name a placeholder that no
registry serves, and say so). Checked here against the Kubernetes schemas and the two
operators' CRD schemas (tests/deploy/test_deploy_k8s.py); not run on a cluster (none exists on
these machines).
"""

from __future__ import annotations

import argparse
import posixpath
import sys
from pathlib import Path
from typing import Any

import yaml

from streamberg.cli.errors import CommandError, UsageError
from streamberg.cli.k8s_manifests import (
    CONFIG_DIR,
    CONFIG_KEY,
    SECRET_DIR,
    STATE_ROOT,
    STREAMBERG,
    PodPlan,
    config_map,
    flink_deployment,
    metrics_exporter,
    spark_application,
)
from streamberg.common.catalog_kinds import kind_of
from streamberg.common.config import StreambergConfig, load_tables
from streamberg.common.config.loading import config_document
from streamberg.common.redact import redact
from streamberg.common.tables import run_settings
from streamberg.table_meta.changelog import has_changelog

PLACEHOLDER = "REPLACE-ME.invalid"  # no registry answers for it: the manifests fail loudly if applied as printed
AWS_BUNDLE_IN_IMAGE = "/opt/streamberg/iceberg-aws-bundle.jar"  # deploy/k8s/Dockerfile.spark puts it there
OBJECT_STORES = ("s3://", "s3a://", "gs://", "abfs://", "abfss://", "wasbs://", "oss://", "hdfs://")


def _on_volume(path: str) -> str:
    """A relative path of the file, put on the state volume ('..' and '.' dropped)."""
    parts = [p for p in path.split("/") if p not in ("", ".", "..")]
    return posixpath.join(STATE_ROOT, *parts) if parts else STATE_ROOT


def _relative(value: Any) -> bool:
    return isinstance(value, str) and "://" not in value and not value.startswith("/")


def _sqlite_path(uri: Any) -> str | None:
    """The file of a relative SQLite URI (None: not one)."""
    if isinstance(uri, str) and uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return uri.removeprefix("sqlite:///")
    return None


def _plan(args: argparse.Namespace, document: dict[str, Any], fleet: bool, config: StreambergConfig) -> PodPlan:
    """Where the config's state goes in the pods; a path no pod could write, or one every pod
    must share without a shared place to put it, refused with the fix."""
    plan = PodPlan(args.name, args.namespace, args.secret, state_claim=args.state_claim,
                   flink_account=args.flink_service_account, spark_account=args.spark_service_account)
    catalog = document.get("catalog") or {}
    ingest = ((document.get("defaults") or {}).get("ingest") if fleet else document.get("ingest")) or {}
    compactor = document.get("compactor") or {}
    shared = "give --state-claim NAME (a ReadWriteMany PersistentVolumeClaim every pod mounts at " \
             f"{STATE_ROOT}) or use a database and an object store every pod reaches"

    state_dir = ingest.get("state_dir", ".streamberg/state")
    if not _relative(state_dir):
        raise CommandError(f"ingest.state_dir: {state_dir} is a path inside the image, whose file system is "
                           "read-only in the pods; leave it unset or relative (deploy puts it on the state volume)")
    plan.env["STREAMBERG_INGEST__STATE_DIR"] = _on_volume(state_dir)

    checkpoint = compactor.get("checkpoint_dir", ".streamberg/compactor-checkpoint")
    if _relative(checkpoint):
        warehouse = str(catalog.get("warehouse", ""))
        plan.env["STREAMBERG_COMPACTOR__CHECKPOINT_DIR"] = (
            f"{warehouse.rstrip('/')}/_streamberg/compactor-checkpoint" if warehouse.startswith(OBJECT_STORES)
            else _on_volume(checkpoint))
    elif str(checkpoint).startswith("/"):
        raise CommandError(f"compactor.checkpoint_dir: {checkpoint} is a path inside the image; leave it unset or "
                           "relative, or give an object-store URL")

    if kind_of(config.catalog).state_in_catalog:  # the catalog's database holds streamberg's tables too
        uri = catalog.get("uri", "sqlite:///.streamberg/catalog.db")
        if str(uri).startswith("sqlite:"):
            if not args.state_claim:
                raise CommandError(f"catalog.uri: a SQLite catalog ({uri}) in a pod is that pod's alone, and every "
                                   f"component must see the same catalog: {shared}")
            if (file := _sqlite_path(uri)) is not None:
                plan.env["STREAMBERG_CATALOG__URI"] = "sqlite:///" + _on_volume(file)
        warehouse = catalog.get("warehouse", "warehouse")
        if _relative(warehouse) or str(warehouse).startswith(("file:", "/")):
            if not args.state_claim:
                raise CommandError(f"catalog.warehouse: a local folder ({warehouse}) is one pod's: {shared}")
            if _relative(warehouse):
                plan.env["STREAMBERG_CATALOG__WAREHOUSE"] = "file://" + _on_volume(str(warehouse))
    else:
        state = catalog.get("state_uri", "sqlite:///.streamberg/state.db")
        if str(state).startswith("sqlite:"):
            if not args.state_claim:
                raise CommandError(f"catalog.state_uri: the compactor's leases and the maintenance runs ({state}) must "
                                   f"be in one database every pod reaches: set catalog.state_uri to a postgresql:// "
                                   f"URI (its password in the Secret as STREAMBERG_CATALOG__STATE_URI), or {shared}")
            if (file := _sqlite_path(state)) is not None:
                plan.env["STREAMBERG_CATALOG__STATE_URI"] = "sqlite:///" + _on_volume(file)
    for key, secret_key in (("credential_file", "catalog-credential"), ("token_file", "catalog-token")):
        if catalog.get(key):
            name = "credential" if key == "credential_file" else "token"
            plan.secret_files[secret_key] = f"{SECRET_DIR}/{name}"
            plan.env[f"STREAMBERG_CATALOG__{key.upper()}"] = f"{SECRET_DIR}/{name}"
    return plan


def _flink_state_dir(args: argparse.Namespace, config: StreambergConfig) -> str:
    if args.flink_state_dir:
        return str(args.flink_state_dir).rstrip("/")
    warehouse = config.catalog.warehouse or ""
    if warehouse.startswith(OBJECT_STORES):
        return f"{warehouse.rstrip('/')}/_streamberg/flink"
    if args.state_claim:
        return f"file://{STATE_ROOT}/flink"
    raise CommandError("the ingest's checkpoints and HA metadata need storage every pod reaches: give "
                       "--flink-state-dir s3://bucket/path, or --state-claim (the warehouse is not an object store URL)")


def _spark_s3_jars(args: argparse.Namespace, config: StreambergConfig) -> list[str]:
    """Spark opens an s3:// warehouse's files with Iceberg's S3FileIO, which needs the AWS SDK
    (Iceberg's `iceberg-aws-bundle` jar): not in the Spark image unless it was built with it
    (deploy/k8s/Dockerfile.spark, build argument AWS_BUNDLE_JAR). Refused without it: every
    keeper would fail at its first read instead."""
    jars = [j.strip() for j in (args.spark_s3_jars or "").split(",") if j.strip()]
    warehouse = str(config.catalog.warehouse or "")
    if warehouse.startswith(("s3://", "s3a://")) and not jars:
        raise UsageError(
            f"catalog.warehouse {warehouse} is on S3: Spark needs Iceberg's AWS bundle (iceberg-aws-bundle, the "
            f"version of the Iceberg runtime) to open its files. Build the Spark image with it (docker build "
            f"--build-arg AWS_BUNDLE_JAR=<jar in the build context> -f deploy/k8s/Dockerfile.spark .) and give "
            f"--spark-s3-jars local://{AWS_BUNDLE_IN_IMAGE}")
    for jar in jars:
        if not jar.startswith(("local://", "s3://", "s3a://", "https://")):
            raise UsageError(f"--spark-s3-jars {jar}: give local:///path/in/the/image.jar (or an s3a:// or https:// "
                             f"URL Spark can fetch)")
    return jars


def _images(args: argparse.Namespace) -> tuple[str, str, list[str]]:
    flink = args.flink_image or f"{PLACEHOLDER}/streamberg-flink:0.1.0"
    spark = args.spark_image or f"{PLACEHOLDER}/streamberg-spark:0.1.0"
    missing = [flag for flag, given in (("--flink-image", args.flink_image), ("--spark-image", args.spark_image))
               if not given]
    return flink, spark, missing


def manifests(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    """The objects, and the warnings to print beside them."""
    text = Path(args.config).read_text()
    if redact(text) != text:
        raise CommandError(f"{args.config} holds a secret (a password or credential): it would be stored in a "
                           "ConfigMap. Move it to the Secret as a STREAMBERG_<SECTION>__<KEY> variable")
    loaded = load_tables(args.config)
    fleet, config = loaded.many, run_settings(loaded)
    if fleet and args.keepers == "components":
        raise CommandError("--keepers components: a config of many tables is kept by the governor (one "
                           "SparkApplication for every table); leave --keepers at governor")
    plan = _plan(args, config_document(args.config), fleet, config)
    plan.spark_extra_jars = _spark_s3_jars(args, config)
    flink_image, spark_image, missing = _images(args)
    warnings = [f"no {', '.join(missing)}: the manifests name the placeholder {PLACEHOLDER}, which no registry "
                "serves; build deploy/k8s/Dockerfile.flink and Dockerfile.spark, push them, and give both"] \
        if missing else []
    documents = [config_map(plan, text),
                 flink_deployment(plan, flink_image, config.ingest.parallelism, _flink_state_dir(args, config),
                                  args.taskmanager_memory)]
    health = [STREAMBERG, "govern", "--config", f"{CONFIG_DIR}/{CONFIG_KEY}", "--health"]
    if args.keepers == "governor":
        documents.append(spark_application(plan, spark_image, "govern", [], args.executors, args.executor_memory,
                                           health=health))
    else:
        alive = ["/bin/sh", "-c", "test -d /proc/1"]  # a component has no heartbeat of its own
        for component in ["compact", *(["merge"] if has_changelog(config) else []), "maintain"]:
            documents.append(spark_application(plan, spark_image, component, [], args.executors,
                                               args.executor_memory, health=alive))
    documents += metrics_exporter(plan, spark_image, config.monitoring.metrics_port)
    if not args.state_claim:
        warnings.append(f"no --state-claim: each pod's state folder ({STATE_ROOT}) is its own emptyDir, so the "
                        "exporter's status does not see the governor's or the ingest's run folders (paused tables, "
                        "the governor's fleet line); the tables themselves are unaffected")
    return documents, warnings


def _run(args: argparse.Namespace) -> int:
    documents, warnings = manifests(args)
    for warning in warnings:
        print(f"streamberg deploy k8s: warning: {warning}", file=sys.stderr)
    header = (f"# streamberg deploy k8s --config {args.config}: {len(documents)} manifests. Create the Secret "
              f"{args.secret!r} (STREAMBERG_* variables; keys catalog-credential / catalog-token when the config names "
              "credential_file / token_file) first. Not applied anywhere; review, then kubectl apply -f -\n")
    header += "".join(f"# WARNING: {w}\n" for w in warnings)
    sys.stdout.write(header + yaml.safe_dump_all(documents, sort_keys=False))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("deploy", help="print the Kubernetes manifests of a config",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    targets = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    k8s = targets.add_parser("k8s", help="FlinkDeployment, the governor's SparkApplication, metrics exporter, ConfigMap",
                             description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    k8s.add_argument("--config", required=True, help="the config to deploy, of one table or many (stored in the "
                     "ConfigMap as given)")
    k8s.add_argument("--name", default="streamberg", help="prefix of every object's name (default streamberg)")
    k8s.add_argument("--namespace", default="default")
    k8s.add_argument("--secret", default="streamberg-secrets",
                     help="the Secret every pod takes its STREAMBERG_* variables from (you create it)")
    k8s.add_argument("--keepers", choices=("governor", "components"), default="governor",
                     help="who keeps the tables: the governor (default; one SparkApplication for every table) or, for "
                          "one table, a SparkApplication each for compact, maintain and merge")
    k8s.add_argument("--flink-image", default=None,
                     help="deploy/k8s/Dockerfile.flink, pushed to your registry (required for a working deployment)")
    k8s.add_argument("--spark-image", default=None,
                     help="deploy/k8s/Dockerfile.spark, pushed to your registry (the governor, the components and the "
                          "metrics exporter run it)")
    k8s.add_argument("--state-claim", default=None, metavar="PVC",
                     help=f"a ReadWriteMany PersistentVolumeClaim every pod mounts at {STATE_ROOT}: relative state "
                          "paths, a SQLite catalog or a local warehouse go there (default: an emptyDir per pod, and "
                          "such shared paths are refused)")
    k8s.add_argument("--flink-state-dir", default=None,
                     help="checkpoints and HA metadata of the ingest (default: <warehouse>/_streamberg/flink for an "
                          "object-store warehouse, else the state claim)")
    k8s.add_argument("--spark-s3-jars", default=None, metavar="JARS",
                     help="jars the Spark pods add for an s3:// warehouse, comma-separated: Iceberg's AWS bundle in "
                          f"the image (local://{AWS_BUNDLE_IN_IMAGE} when Dockerfile.spark was built with "
                          "AWS_BUNDLE_JAR); required for an s3:// warehouse")
    k8s.add_argument("--flink-service-account", default="flink")
    k8s.add_argument("--spark-service-account", default="spark")
    k8s.add_argument("--taskmanager-memory", default="4096m")
    k8s.add_argument("--executors", type=int, default=2)
    k8s.add_argument("--executor-memory", default="2g")
    k8s.set_defaults(func=_run)
