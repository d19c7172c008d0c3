"""`streamberg status` against a real broker, a real SQLite catalog and real ingest commits.

Every expected value is derived from what the test produced and committed, or read back
independently (pyiceberg scans, the broker read to its end), never copied from the output.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamberg.cli.main import main
from streamberg.common.broker import ensure_topic, free_port
from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.ingest.dead_letters import open_tables
from streamberg.monitoring.collect import collect_status
from streamberg.monitoring.health import with_health
from streamberg.monitoring.metrics import status_metrics
from streamberg.table_meta.table_files import live_data_files
from tests.compactor.helpers import TOPIC, FakeIngest, setup_table
from tests.helpers import config_at, streamberg, write_config
from tests.monitoring.helpers import Scenario, with_monitoring


def _status_json(*args: str, env: dict | None = None) -> tuple[int, dict, str]:
    proc = streamberg("status", *args, "--json", check=False, env=env)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def test_fresh_table(tmp_path: Path, broker: str) -> None:
    path = write_config(tmp_path, broker)
    config = config_at(path)
    open_tables(config)
    ensure_topic(broker, config.kafka.topic, 3)

    code, status, _ = _status_json("--config", str(path))

    assert code == 0 and status["health"] == {"verdict": "ok", "reasons": [], "findings": []}
    assert status["table"] == config.table.identifier and status["checked_at"].endswith("+00:00")
    assert status["catalog"] == {"reachable": True, "error": None} and status["table_exists"] is True
    ingest = status["ingest"]
    assert ingest["last_commit"] is None and ingest["broker"] == {"reachable": True, "error": None}
    assert ingest["lag"]["total"] == 0
    assert set(ingest["lag"]["partitions"]) == {"0", "1", "2"}
    assert all(p == {"committed": None, "end": 0, "lag": 0, "watermark": 0} for p in ingest["lag"]["partitions"].values())
    assert status["files"]["data_files"] == status["files"]["small_files"] == 0
    assert status["compactor"]["pending_files"] == 0 and status["compactor"]["last_optimize"] is None
    assert status["snapshots"]["count"] == 0 and status["snapshots"]["metadata_bytes"] > 0
    assert status["dead_letters"] == {"table": config.ingest_target.dead_letter_table, "exists": True, "records": 0,
                                      "recent": []}


def test_topic_not_created_yet_is_a_warning(tmp_path: Path, broker: str) -> None:
    config = config_at(write_config(tmp_path, broker))
    open_tables(config)
    status = with_health(collect_status(config), config)
    assert status.ingest.topic_exists is False and status.health.verdict == "warn"
    assert [f["check"] for f in status.health.findings] == ["topic"]
    assert config.kafka.topic in status.health.reasons[0]


def _record_times(config, offsets: dict[int, int]) -> dict[int, int]:
    """The Kafka timestamp of the record at each partition's offset, read by a consumer of the test's."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap_servers, "group.id": "test-record-times",
                         "enable.auto.commit": False})
    found: dict[int, int] = {}
    try:
        for partition, offset in offsets.items():
            consumer.assign([TopicPartition(config.kafka.topic, partition, offset)])
            message = consumer.poll(30)
            assert message is not None and message.error() is None and message.offset() == offset
            found[partition] = message.timestamp()[1]
    finally:
        consumer.close()
    return found


def test_after_ingest_commits(scenario: Scenario) -> None:
    config = scenario.config
    now_ms = int(time.time() * 1000)
    status = with_health(collect_status(config, now_ms=now_ms), config)
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    dlq = load_catalog(config.catalog).load_table(config.ingest_target.dead_letter_table)

    # last commit: the second ingest commit
    last, result = status.ingest.last_commit, scenario.results[-1]
    assert last.snapshot_id == result.snapshot_id == table.current_snapshot().snapshot_id
    assert (last.records, last.files, last.dead_letters) == (result.records, result.files, result.dead_letters)
    assert last.job_id == config.ingest_target.job_id
    assert last.consumed_total == sum(scenario.committed.values())
    low, high = scenario.last_commit_window_ms
    assert 0 <= last.commit_latency_seconds <= (high - low) / 1000

    # lag: messages produced (and acknowledged) into a fresh topic minus the recorded offsets
    lag = status.ingest.lag
    assert {p: (v.committed, v.end, v.lag) for p, v in lag.partitions.items()} == {
        str(p): (scenario.committed[p], scenario.produced[p], scenario.lag[p]) for p in scenario.produced}
    assert lag.total == sum(scenario.lag.values()) and lag.ahead_partitions == []
    # ... and in seconds: how long the oldest record not in the table has waited (its Kafka
    # timestamp, read here by a consumer of the test's, to the check)
    waiting = _record_times(config, {p: scenario.committed[p] for p in scenario.produced if scenario.lag[p]})
    assert waiting and lag.seconds == round((now_ms - min(waiting.values())) / 1000, 3) > 0

    # files, compactor backlog, dead letters: against independent reads of the table
    files, _ = live_data_files(table)
    assert status.files.data_files == len(files) == sum(r.files for r in scenario.results)
    assert status.files.records == table.scan().to_arrow().num_rows == sum(r.records for r in scenario.results)
    assert status.files.bytes == sum(f.size_bytes for f in files)
    assert status.files.small_files == status.files.data_files  # KiB files against a 128 MiB target
    assert status.compactor.pending_files == len(files)  # all added by ingest appends
    assert status.compactor.pending_snapshots == len(scenario.results)
    assert status.dead_letters.records == dlq.scan().to_arrow().num_rows == sum(r.dead_letters for r in scenario.results)
    # The newest dead letters with their reasons (the table's page lists them), as the table holds them.
    held = sorted(dlq.scan().to_arrow().to_pylist(), key=lambda r: (r["dead_lettered_at"], r["partition"], r["offset"]),
                  reverse=True)
    assert [(d["partition"], d["offset"], d["reason"]) for d in status.dead_letters.recent] == \
        [(r["partition"], r["offset"], r["reason"]) for r in held[:5]] and len(held) >= 2
    assert status.snapshots.count == len(table.metadata.snapshots) == len(scenario.results)
    assert status.snapshots.manifests == len(table.current_snapshot().manifests(table.io))
    assert status.health.verdict == "ok", status.health.reasons


def test_watermark_alone_and_offsets_past_it(scenario: Scenario) -> None:
    """With read_last_batch off the end is the reported watermark; a recorded offset past it
    (tansu's watermark stops at its last batch's base offset + 1) is flagged, never negative lag."""
    config = with_monitoring(scenario.config, read_last_batch=False)
    status = with_health(collect_status(config), config)
    lag = status.ingest.lag
    for p, part in lag.partitions.items():
        assert part.end == part.watermark and part.lag == max(0, part.watermark - scenario.committed[int(p)])
    ahead = [str(p) for p, c in scenario.committed.items() if c > lag.partitions[str(p)].watermark]
    assert ahead, "the scenario must put a recorded offset past the watermark (see produce_to)"
    assert lag.ahead_partitions == ahead
    assert ("lag", "warn") in [(f["check"], f["severity"]) for f in status.health.findings]


def test_pending_age_is_the_oldest_ingest_commit(scenario: Scenario) -> None:
    table = load_catalog(scenario.config.catalog).load_table(scenario.config.table.identifier)
    first = min(s.timestamp_ms for s in table.metadata.snapshots)
    later = 42_500  # ms after the first commit
    status = collect_status(scenario.config, now_ms=first + later)
    assert status.compactor.oldest_pending_age_seconds == later / 1000
    last = table.current_snapshot().timestamp_ms
    assert status.ingest.last_commit.age_seconds == (first + later - last) / 1000


def test_broker_down_is_critical_and_table_facts_still_shown(scenario: Scenario) -> None:
    closed = f"127.0.0.1:{free_port()}"
    code, status, _ = _status_json("--config", str(scenario.path), env={"STREAMBERG_KAFKA__BOOTSTRAP_SERVERS": closed})
    assert code == 1 and status["health"]["verdict"] == "critical"
    assert status["ingest"]["broker"]["reachable"] is False and closed in status["ingest"]["broker"]["error"]
    assert any(r.startswith("broker unreachable") and closed in r for r in status["health"]["reasons"])
    assert status["ingest"]["lag"] == {"total": None, "partitions": {}, "ahead_partitions": [],
                                     "behind_low_partitions": []}  # unknown, not 0
    assert status["ingest"]["last_commit"]["snapshot_id"] == scenario.results[-1].snapshot_id
    assert status["files"]["data_files"] == sum(r.files for r in scenario.results)


@pytest.mark.parametrize("uri_kind", ["sqlite-missing", "postgres-closed-port"])
def test_catalog_unreachable_is_critical(scenario: Scenario, tmp_path: Path, uri_kind: str) -> None:
    uri = (f"sqlite:///{tmp_path}/no-such-dir/catalog.db" if uri_kind == "sqlite-missing"
           else f"postgresql+psycopg2://streamberg:s3cret@127.0.0.1:{free_port()}/catalog")
    code, status, stderr = _status_json("--config", str(scenario.path), env={"STREAMBERG_CATALOG__URI": uri})
    assert code == 1 and status["health"]["verdict"] == "critical"
    assert status["catalog"]["reachable"] is False
    assert status["health"]["findings"][0]["check"] == "catalog"
    assert status["files"] is None and status["ingest"]["last_commit"] is None
    assert status["ingest"]["broker"]["reachable"] is True  # still asked
    assert "s3cret" not in json.dumps(status) and "s3cret" not in stderr
    assert not (tmp_path / "no-such-dir").exists()  # status never creates a catalog


def test_table_missing_is_critical(tmp_path: Path, broker: str) -> None:
    path = write_config(tmp_path, broker)
    config = config_at(path)
    load_catalog(config.catalog)  # the catalog database exists, the table does not
    code, status, _ = _status_json("--config", str(path))
    assert code == 1 and status["table_exists"] is False
    assert any(config.table.identifier in r and "does not exist" in r for r in status["health"]["reasons"])


def test_screen_and_watch_until_ctrl_c(scenario: Scenario) -> None:
    screen = streamberg("status", "--config", str(scenario.path)).stdout
    assert screen.splitlines()[2].split() == ["health", "OK"] and f"snapshot {scenario.results[-1].snapshot_id}" in screen
    exe = Path(sys.executable).parent / "streamberg"
    proc = subprocess.Popen([str(exe), "status", "--config", str(scenario.path), "--json", "--watch", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        refreshes = [json.loads(proc.stdout.readline()) for _ in range(2)]
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [r["health"]["verdict"] for r in refreshes] == ["ok", "ok"]
    assert refreshes[0]["checked_at"] <= refreshes[1]["checked_at"]
    assert proc.returncode == 0 and "Traceback" not in stderr


def test_invalid_monitoring_config_names_the_key(tmp_path: Path, broker: str, capsys) -> None:
    path = write_config(tmp_path, broker, extra={"monitoring": {"lag_warn_records": 0, "small_file_fraction": 2}})
    assert main(["status", "--config", str(path)]) == 2
    stderr = capsys.readouterr().err
    assert "monitoring.lag_warn_records" in stderr and "monitoring.small_file_fraction" in stderr
    path = write_config(tmp_path, broker, extra={"monitoring": {"snapshots_warn": 50, "snapshots_critical": 5}})
    assert main(["status", "--config", str(path)]) == 2
    stderr = capsys.readouterr().err
    assert "snapshots_warn" in stderr and "snapshots_critical" in stderr


def test_unreadable_table_files_are_critical_not_a_crash(tmp_path: Path, broker: str) -> None:
    made, _ = setup_table(tmp_path)
    config = load_config(made.config_path, kafka={"topic": TOPIC, "bootstrap_servers": broker})
    snapshot = FakeIngest(config).append(50)
    manifest_list = Path(snapshot.manifest_list.removeprefix("file://"))
    manifest_list.unlink()  # e.g. a bucket lifecycle rule or a wrong cleanup removed it

    status = with_health(collect_status(config), config)

    assert status.catalog.reachable and status.table_exists
    assert status.ingest.last_commit.snapshot_id == snapshot.snapshot_id  # metadata alone still answers
    assert status.files is None and status.compactor is None and status.snapshots is None
    assert status.health.verdict == "critical"
    table_reasons = [f["reason"] for f in status.health.findings if f["check"] == "table"]
    assert table_reasons and all(manifest_list.name in r for r in table_reasons), table_reasons


def test_last_maintenance_run_is_shown_and_a_failed_one_warns(tmp_path: Path, broker: str) -> None:
    from streamberg.table_meta.maintenance_runs import record_run

    path = write_config(tmp_path, broker)
    config = config_at(path)
    open_tables(config)
    ensure_topic(broker, config.kafka.topic, 1)
    assert with_health(collect_status(config), config).maintenance["last_run"] is None

    finished = time.time() - 30
    result = {"run_id": "m-1", "table": config.table.identifier, "dry_run": False, "status": "failed",
              "bytes_freed": 4096}
    record_run(load_catalog(config.catalog).engine, config.catalog.name, result, started_at=finished - 2,
               finished_at=finished)
    status = with_health(collect_status(config), config)

    run = status.maintenance["last_run"]
    assert (run["run_id"], run["status"], run["bytes_freed"]) == ("m-1", "failed", result["bytes_freed"])
    assert run["age_seconds"] >= 30
    assert [(f["check"], f["severity"]) for f in status.health.findings] == [("maintenance", "warn")]
    assert "m-1" in status.health.reasons[0]
    exported = {s.name: s.value for family in status_metrics(status, 0.0) for s in family.samples}
    assert exported["streamberg_maintenance_last_run_bytes_freed"] == result["bytes_freed"]
    assert exported["streamberg_maintenance_last_run_age_seconds"] == run["age_seconds"]
