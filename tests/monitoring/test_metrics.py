"""`streamberg metrics`: the Prometheus text format, parsed back, equals the status facts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from streamberg.common.broker import free_port
from streamberg.monitoring.collect import collect_status
from tests.helpers import streamberg, wait_for
from tests.monitoring.helpers import Scenario


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, for every sample of an exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_once_values_equal_the_status_facts(scenario: Scenario) -> None:
    config = scenario.config
    text = streamberg("metrics", "--config", str(scenario.path), "--once").stdout
    got = samples(text)
    facts = collect_status(config)
    t = (("table", config.table.identifier),)

    def value(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted((*t, *labels.items()))))]

    assert value("streamberg_up", source="catalog") == value("streamberg_up", source="broker") == 1
    assert value("streamberg_health") == 0
    assert value("streamberg_ingest_records_consumed_total") == facts.ingest.last_commit.consumed_total
    assert value("streamberg_ingest_last_commit_records") == facts.ingest.last_commit.records
    assert value("streamberg_ingest_last_commit_files") == facts.ingest.last_commit.files
    assert value("streamberg_ingest_last_commit_latency_seconds") == facts.ingest.last_commit.commit_latency_seconds
    assert value("streamberg_dead_letters_total") == facts.dead_letters.records > 0
    assert value("streamberg_table_records") == facts.files.records
    assert value("streamberg_table_data_files") == facts.files.data_files
    assert value("streamberg_table_small_files") == facts.files.small_files
    assert value("streamberg_compactor_pending_files") == facts.compactor.pending_files
    assert value("streamberg_compactor_pending_bytes") == facts.compactor.pending_bytes
    assert value("streamberg_table_snapshots") == facts.snapshots.count
    assert value("streamberg_table_metadata_bytes") == facts.snapshots.metadata_bytes
    topic = config.kafka.topic
    for p, produced in scenario.produced.items():
        labels = {"topic": topic, "partition": str(p)}
        assert value("streamberg_ingest_lag_records", **labels) == scenario.lag[p] == facts.ingest.lag.partitions[str(p)].lag
        assert value("streamberg_kafka_end_offset", **labels) == produced
        assert value("streamberg_kafka_high_watermark", **labels) == facts.ingest.lag.partitions[str(p)].watermark
        assert value("streamberg_ingest_committed_offset", **labels) == scenario.committed[p]
    # Ages grow between the two reads, never shrink.
    assert value("streamberg_ingest_last_commit_age_seconds") <= facts.ingest.last_commit.age_seconds
    assert value("streamberg_compactor_oldest_pending_age_seconds") <= facts.compactor.oldest_pending_age_seconds
    assert 0 < value("streamberg_ingest_lag_seconds") <= facts.ingest.lag.seconds


def test_unknown_facts_are_absent_not_zero(scenario: Scenario) -> None:
    closed = f"127.0.0.1:{free_port()}"
    proc = streamberg("metrics", "--config", str(scenario.path), "--once",
                      env={"STREAMBERG_KAFKA__BOOTSTRAP_SERVERS": closed})
    got = samples(proc.stdout)
    names = {name for name, _ in got}
    t = ("table", scenario.config.table.identifier)
    assert got[("streamberg_up", (("source", "broker"), t))] == 0
    assert got[("streamberg_health", (t,))] == 2
    assert "streamberg_ingest_lag_records" not in names and "streamberg_kafka_end_offset" not in names
    assert "streamberg_table_records" in names  # the table was still read


def test_exporter_serves_scrapes_until_ctrl_c(scenario: Scenario) -> None:
    port = free_port()
    exe = Path(sys.executable).parent / "streamberg"
    proc = subprocess.Popen([str(exe), "metrics", "--config", str(scenario.path), "--port", str(port),
                             "--address", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def scraped() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
                    return response.read().decode()
            except OSError:
                return None

        text = wait_for(scraped, 60, "the exporter to answer a scrape", proc=proc)
        # /healthz answers at once, without collecting (a pod's probes).
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            assert response.status == 200 and response.read() == b"ok\n"
        got = samples(text)
        lag = got[("streamberg_ingest_lag_records", (("partition", "0"), ("table", scenario.config.table.identifier),
                                                     ("topic", scenario.config.kafka.topic)))]
        assert lag == scenario.lag[0]
    finally:
        _interrupted_cleanly(proc)


def test_scrapes_serve_the_last_collection_and_the_probes_tell_the_truth(scenario: Scenario) -> None:
    """A scrape is the model's last collection (no catalog or broker call of its own: two scrapes
    without a refresh between them are the same text, collected once); /healthz says the loop
    lives; /readyz says the broker is not reached, and why."""
    port = free_port()
    closed = f"127.0.0.1:{free_port()}"
    exe = Path(sys.executable).parent / "streamberg"
    env = {**os.environ, "STREAMBERG_KAFKA__BOOTSTRAP_SERVERS": closed}
    proc = subprocess.Popen([str(exe), "metrics", "--config", str(scenario.path), "--port", str(port),
                             "--refresh", "3600"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    try:
        def scraped() -> str | None:
            try:
                status, text = get("/metrics")
            except OSError:
                return None
            return text if status == 200 else None

        first = wait_for(scraped, 90, "the exporter to answer a scrape", proc=proc)
        status, second = get("/metrics")
        assert status == 200 and second == first  # the same collection: nothing asked again
        got = samples(first)
        t = ("table", scenario.config.table.identifier)
        assert got[("streamberg_up", (("source", "broker"), t))] == 0
        assert got[("streamberg_table_records", (t,))] > 0  # the table was read all the same
        assert ("streamberg_status_refreshed_timestamp_seconds", ()) in got
        assert get("/healthz") == (200, "ok\n")
        ready, why = get("/readyz")
        assert ready == 503 and "broker not reached" in why and scenario.config.table.identifier in why
        # The exporter is the dashboard's server with the probes alone: no page of a table.
        assert get("/")[0] == 404 and get("/api/fleet.json")[0] == 404
        assert get(f"/table/{scenario.config.table.identifier}")[0] == 404
    finally:
        _interrupted_cleanly(proc)


def _interrupted_cleanly(proc: subprocess.Popen) -> None:
    """Ctrl-C ends the exporter with exit 0 and no traceback (killed if it does not stop)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "Traceback" not in stderr
