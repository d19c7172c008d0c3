"""The whole loop against an Iceberg REST catalog (catalog.type: rest).

The server is tests/fixtures/rest_catalog.py (no REST catalog server is installable here; it
speaks the Iceberg REST specification over a SQL catalog of its own, demands OAuth2 client
credentials, checks every commit's requirements and answers 409 on a lost race). Our side is
the real thing: pyiceberg's RestCatalog in the ingest's committer and the CLI, Iceberg Java's
RESTCatalog inside Spark for the compactor and maintenance.

The ingest (PyFlink) runs while a producer writes, is killed with SIGKILL mid-interval and
started again; the server refuses some commits as lost races; the compactor clusters while
the ingest commits (both through the server); maintenance runs; `status` reads it all. The
table then holds every valid id once (pyiceberg and DuckDB). A wrong secret is refused in one
line that does not show it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.common.errors import ConfigError
from streamberg.compactor.app import CompactOptions, run_compact
from streamberg.table_meta.offsets import committed_position
from streamberg.table_meta.summary_keys import SummaryKeys
from tests.helpers import EVENT_SCHEMA, BackgroundProducer, duplicates, streamberg, table_ids, wait_for

pytestmark = [pytest.mark.flink, pytest.mark.spark]


def _config(tmp_path: Path, broker: str, url: str, secret_file: Path, topic: str) -> Path:
    document = {
        "kafka": {"bootstrap_servers": broker, "topic": topic},
        "catalog": {"name": f"rest{uuid.uuid4().hex[:6]}", "type": "rest", "uri": url, "warehouse": "tests",
                    "credential_file": str(secret_file),
                    "allow_insecure": True},  # the stand-in serves plain http on loopback
        "table": {"identifier": "web.events", "schema": EVENT_SCHEMA,
                  "partition_spec": [{"source": "ts", "transform": "day"}]},
        "ingest": {"commit_interval_seconds": 1, "parallelism": 2, "state_dir": "state", "max_poll_records": 500},
        "compactor": {"strategy": "zorder", "columns": ["user_id", "city"], "min_files": 2, "checkpoint_dir": "cp"},
    }
    path = tmp_path / "rest.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_rest_catalog_config_is_checked_at_load(tmp_path: Path) -> None:
    def load(catalog: dict) -> None:
        (tmp_path / "c.yaml").write_text(yaml.safe_dump({"kafka": {"topic": "t"}, "catalog": catalog,
                                                         "table": {"identifier": "a.b", "schema": EVENT_SCHEMA}}))
        load_config(tmp_path / "c.yaml")

    for catalog, expect in (
        ({"type": "rest", "uri": "sqlite:///x.db"}, "catalog.uri"),
        ({"type": "rest", "uri": "https://polaris.example/api/catalog", "credential": "no-colon"}, "client_id"),
        ({"type": "rest", "uri": "https://p.example", "credential": "a:b", "token": "t"}, "one way"),
        ({"uri": "sqlite:///x.db", "credential": "a:b"}, "REST catalog"),
        ({"type": "nessie", "uri": "thrift://h:9083"}, "catalog.type"),
        ({"type": "hive", "uri": "thrift://h:9083"}, "catalog.warehouse"),
        # A credential or token over plain http (issue 38, item 11): refused, naming the fix.
        ({"type": "rest", "uri": "http://polaris.example/api/catalog", "credential": "a:b"}, "allow_insecure"),
        ({"type": "rest", "uri": "https://p.example", "oauth2_server_uri": "http://idp.example/token",
          "token_file": "/run/token"}, "plain http"),
    ):
        with pytest.raises(ConfigError) as error:
            load(catalog)
        assert expect in str(error.value) and "\n" not in str(error.value).strip(), (catalog, str(error.value))
    load({"type": "rest", "uri": "http://127.0.0.1:8181", "credential": "a:b", "allow_insecure": True, "warehouse": "w"})
    with pytest.raises(ConfigError, match="catalog.warehouse: a REST catalog serves named warehouses"):
        load({"type": "rest", "uri": "https://polaris.example/api/catalog"})  # issue 38, item 12
    load({"type": "rest", "uri": "https://polaris.example/api/catalog", "warehouse": "prod"})
    assert load_config(tmp_path / "c.yaml").catalog.warehouse == "prod"  # a server's name, not a path


def test_whole_loop_through_a_rest_catalog(tmp_path: Path, broker: str, spark, rest_catalog) -> None:
    secret = tmp_path / "catalog-credential"
    secret.write_text(rest_catalog.credential + "\n")
    secret.chmod(0o600)
    topic = f"rest-{uuid.uuid4().hex[:6]}"
    path = _config(tmp_path, broker, rest_catalog.url, secret, topic)
    config = load_config(path)
    ensure_topic(broker, topic, 3)
    producer = BackgroundProducer(config, 1000, rate=1500, bad_fraction=0.01).start()
    exe = Path(sys.executable).parent / "streamberg"
    env = {**os.environ, "STREAMBERG_LOG_FORMAT": "json"}
    log = tmp_path / "ingest.log"
    catalog = load_catalog(config.catalog)
    rest_catalog.refuse_commits = 2  # two lost races: the committer retries on fresh metadata

    def start() -> subprocess.Popen:
        return subprocess.Popen([str(exe), "ingest", "--config", str(path), "--quiet"], stdout=log.open("a"),
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def commits() -> int:
        try:
            return len(catalog.load_table("web.events").metadata.snapshots)
        except Exception:  # noqa: BLE001 - not created yet
            return 0

    ingest = start()
    try:
        wait_for(lambda: commits() >= 3, 240, "three commits", proc=ingest, log=log, every=0.5)
        # Killed mid-interval: what it wrote and did not commit is read again by the next run.
        os.killpg(ingest.pid, signal.SIGKILL)
        ingest.wait(30)
        ingest = start()
        wait_for(lambda: commits() >= 6, 240, "three more commits after the kill", proc=ingest, log=log, every=0.5)
        passes = [run_compact(config, CompactOptions(once=True), spark=spark) for _ in range(2)]
        time.sleep(2)
        producer.stop()
        wait_for(lambda: committed_position(catalog.load_table("web.events"), topic).consumed_total
                 >= producer.produced, 180, "every produced record committed", proc=ingest, log=log, every=0.5)
    finally:
        producer.stop()
        if ingest.poll() is None:
            ingest.send_signal(signal.SIGINT)
            ingest.wait(120)
    assert ingest.returncode == 0, log.read_text()[-3000:]

    ids = table_ids(config)
    assert not duplicates(ids) and ids == sorted(producer.ids), (len(ids), len(set(ids)), len(producer.ids))
    assert rest_catalog.conflicts >= 2  # the refused commits were retried, not lost
    table = catalog.load_table("web.events")
    rewrites = [s for s in table.metadata.snapshots if s.summary is not None and s.summary.operation.value == "replace"]
    assert rewrites, passes  # the compactor's replace went through the server too
    assert table.metadata_location.startswith(f"file://{rest_catalog.root}")  # the server wrote the metadata

    # Maintenance through Spark's REST client, recorded in the local state database.
    done = streamberg("maintain", "--config", str(path), "--once", "--json", timeout=600)
    assert json.loads(done.stdout)["status"] == "ok", done.stdout
    assert table_ids(config) == sorted(producer.ids)
    status = streamberg("status", "--config", str(path), "--json", check=False)
    facts = json.loads(status.stdout)
    assert facts["maintenance"]["last_run"] is not None, facts["maintenance"]
    assert facts["ingest"]["last_commit"]["consumed_total"] >= producer.produced
    # DuckDB, an independent reader, agrees.
    from tests.cdc.helpers import rows_by_duckdb

    assert sorted(rows_by_duckdb(config)) == sorted(producer.ids)
    assert SummaryKeys.KAFKA_OFFSETS_PREFIX + topic in table.current_snapshot().summary.additional_properties

    # Iceberg's REST client in Spark posts a report for each commit and each scan it plans (the
    # spec's /metrics endpoint); the stand-in keeps them as a server may, and they fold as ours do.
    from streamberg.common.spark import register_catalog

    assert any(r.get("report-type") == "commit-report" for r in rest_catalog.reports)  # the compactor's
    name = register_catalog(spark, config.catalog)
    for city in ("c1", "c2", "c3"):
        spark.sql(f"SELECT count(*) FROM {name}.web.events WHERE city = '{city}'").collect()
    scans = [r for r in rest_catalog.reports if r.get("report-type") == "scan-report"
             and str(r.get("table-name", "")).endswith("web.events")]
    assert scans, rest_catalog.reports[:3]
    folder = tmp_path / "posted-reports"
    folder.mkdir()
    (folder / "reports-rest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in scans))
    from streamberg.table_meta.query_stats import fold, usage

    fold(folder, config.catalog.name)
    seen = usage(folder, "web.events")
    assert seen["scans_total"] == len(scans) >= 3 and seen["filtered"]["city"] >= 3


def test_a_wrong_secret_is_refused_in_one_line_without_showing_it(tmp_path: Path, broker: str,
                                                                 rest_catalog) -> None:
    secret = tmp_path / "catalog-credential"
    wrong = "streamberg-tests:not-the-secret-" + uuid.uuid4().hex
    secret.write_text(wrong)
    path = _config(tmp_path, broker, rest_catalog.url, secret, "any")
    out = streamberg("status", "--config", str(path), check=False)
    assert out.returncode == 1, out
    text = out.stdout + out.stderr
    assert "invalid_client" in text or "401" in text or "OAuth" in text, text
    assert wrong.split(":")[1] not in text and "Traceback" not in text, text
