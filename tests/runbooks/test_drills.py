"""Scripted drills: each runbook page's marked blocks, run as written against a real situation.

For every page the test creates the situation for real (records waiting with no ingest, a
second instance that moved the offsets, pending small files, poison records and a schema
change, rows lost from the table, a graceful stop and a `kill -9`, a catalog database that
refuses connections, a full file system), then runs the page's `drill=` blocks with bash
and asserts what the page's "Check it worked" promises. Steps a human does by hand (edit
the config, stop the other machine's job) are done here in Python, marked "by hand".

The setup uses the real ingest code in-process (tests/runbooks/inprocess.py) where it only
needs committed data; what the page tells the operator to run is always the real command.
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import pytest
import yaml
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

from streamberg.cli.sample_events import produce_events
from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.common.errors import FencedError
from streamberg.ingest.committer import Committer
from streamberg.ingest.units import FlushUnit
from streamberg.table_meta.offsets import committed_position
from tests.helpers import config_at, dead_letters, duplicates, table_ids, wait_for, write_config
from tests.runbooks.inprocess import event, ingest_until, produce_values, schema_change_events

INGEST_WAIT_SECONDS = 240  # a PyFlink start is ~20-30 s on an idle 2-core machine
# What catalog-down.md says a running ingest does when the database goes away (measured:
# exit 1 about 20 s after the outage began, on a loaded 2-core machine).
CATALOG_DOWN_EXIT_SECONDS = 120
CATALOG_DOWN_MESSAGE = "streamberg ingest: catalog database unreachable"
# disk-full.md: the job fails for good after Flink's restarts (measured: ~37 s after the disk
# filled); the driver reports it one of two ways, depending on when it polls the job.
DISK_FULL_EXIT_SECONDS = 240
DISK_FULL_MESSAGES = ("streamberg ingest: the Flink job failed and its cluster shut down",
                      "streamberg ingest: ingest job JobStatus.FAILED: OSError: [Errno 28]")


def _config(tmp_path: Path, broker: str, **extra) -> Path:
    ingest = {"commit_interval_seconds": 1, "parallelism": 1, **extra.pop("ingest", {})}
    return write_config(tmp_path, broker, ingest=ingest, extra=extra or None)


def _position(config):
    return committed_position(load_catalog(config.catalog).load_table(config.table.identifier), config.kafka.topic)


def _has_ids(config, expected: list[int]):
    return lambda: table_ids(config) == expected


def _outcome(running) -> dict:
    """The JSON line `streamberg ingest` prints when it exits."""
    lines = [line for line in running.output().splitlines() if line.startswith('{"run_id"')]
    assert lines, f"{running.step} printed no outcome line:\n{running.output()[-3000:]}"
    return json.loads(lines[-1])


def _stopped_gracefully(running, why: str) -> dict:
    code = running.stop()
    assert code == 0, f"{running.step} exited {code}:\n{running.output()[-3000:]}"
    outcome = _outcome(running)
    assert outcome["stopped_because"] == why, outcome
    return outcome


# -- pages without a PyFlink run ---------------------------------------------------------------
def test_replay_topic_range(tmp_path: Path, broker: str, drills) -> None:
    config_path = _config(tmp_path, broker)
    config = config_at(config_path)
    produce_values(config, [event(i) for i in range(100)], partition=0, partitions=1)
    ingest_until(config, {0: 100})
    before = _position(config)
    # The incident: an over-eager retention deleted ids 20..39 (offsets 20..39).
    load_catalog(config.catalog).load_table(config.table.identifier).delete(
        And(GreaterThanOrEqual("id", 20), LessThan("id", 40)))
    drill = drills("replay-topic-range.md", CONFIG=str(config_path), PARTITION="0", FROM="20", TO="40")

    facts = drill.run("confirm").expect(0).json()
    assert facts["reconciles"] is False and facts["records"] == 80
    assert facts["committed_offsets"]["partitions"] == {"0": 100}
    dry = drill.run("dry-run").expect(0).json()
    assert (dry["read"], dry["records_added"], dry["still_bad"]) == (20, 20, 0)
    assert len(table_ids(config)) == 80
    fixed = drill.run("fix").expect(0).json()
    assert fixed["records_added"] == 20 and fixed["snapshot_id"] is not None
    facts = drill.run("check").expect(0).json()
    assert facts["reconciles"] is True and facts["records"] == 100
    assert table_ids(config) == list(range(100))
    again = drill.run("check-again").expect(1)
    assert "refused" in again.stderr and "overlaps range(s) already replayed" in again.stderr
    assert _position(config).offsets == before.offsets


@pytest.mark.spark
def test_compactor_behind(tmp_path: Path, broker: str, drills) -> None:
    config_path = _config(tmp_path, broker, compactor={"min_files": 2, "checkpoint_dir": "checkpoint"})
    config = config_at(config_path)
    for batch in range(3):  # three ingest commits: three small pending files
        produce_values(config, [event(batch * 50 + i) for i in range(50)], partition=0, partitions=1)
        ingest_until(config, {0: (batch + 1) * 50})
    drill = drills("compactor-behind.md", CONFIG=str(config_path))

    status = drill.run("confirm").expect(0, 1).json()
    assert status["compactor"]["pending_files"] == 3 and status["compactor"]["last_optimize"] is None
    plan = drill.run("plan").expect(0).json()
    assert plan["files"] == 3 and plan["groups"] >= 1
    done = drill.run("fix", timeout=600).expect(0)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["files_in"] == 3 and summary["files_out"] >= 1
    status = drill.run("check").expect(0, 1).json()
    assert status["compactor"]["pending_files"] == 0
    assert status["compactor"]["last_optimize"] is not None
    assert not any("compactor" in reason for reason in status["health"]["reasons"])
    assert table_ids(config) == list(range(150))


# -- pages whose fix starts the real ingest (PyFlink) -----------------------------------------
@pytest.mark.flink
def test_second_instance_then_lag(tmp_path: Path, broker: str, drills) -> None:
    """commit-failures.md then ingest-lag.md: our ingest was fenced by another instance and
    stopped; records pile up. One restart is the fix of both pages."""
    config_path = _config(tmp_path, broker)
    config = config_at(config_path)
    for p in range(2):
        produce_values(config, [event(p * 1000 + i) for i in range(50)], partition=p, partitions=2)
    ingest_until(config, {0: 50, 1: 50})
    ours = Committer(config, parallelism=1, run_id="ours")
    ours.open()
    for p in range(2):
        produce_values(config, [event(p * 1000 + i) for i in range(50, 100)], partition=p, partitions=2)
    # The incident: the same config also runs on another host, under another job id.
    document = yaml.safe_load(config_path.read_text())
    document["ingest"]["job_id"] = "ingest:other-host"
    other_path = tmp_path / "other-host.yaml"
    other_path.write_text(yaml.safe_dump(document))
    ingest_until(config_at(other_path), {0: 100, 1: 100})
    with pytest.raises(FencedError) as fenced:
        ours.offer(FlushUnit(run_id="ours", writer=0, epoch=1, topic=config.kafka.topic, ranges={0: (50, 100)},
                             final=True))
    ours.close()
    failures = drills("commit-failures.md", CONFIG=str(config_path))
    symptom = "Refusing to commit: another ingest instance is writing this table"
    assert symptom in str(fenced.value) and symptom in failures.page.text

    facts = failures.run("confirm").expect(0).json()
    assert facts["committed_offsets"]["job_id"] == "ingest:other-host"
    # By hand: the other host's job is stopped. Producers carry on while no ingest runs.
    for p in range(2):
        produce_values(config, [event(p * 1000 + i) for i in range(100, 300)], partition=p, partitions=2)
    expected = sorted(p * 1000 + i for p in range(2) for i in range(300))
    lag = drills("ingest-lag.md", CONFIG=str(config_path))
    status = lag.run("confirm").expect(0, 1).json()
    assert status["ingest"]["lag"]["total"] > 0 and status["ingest"]["last_commit"] is not None

    running = lag.start("fix")  # the same command as commit-failures.md's fix
    assert lag.page.drill("fix").body == failures.page.drill("fix").body
    wait_for(_has_ids(config, expected), INGEST_WAIT_SECONDS, "our ingest to take over and catch up", proc=running.proc,
             log=running.output, every=1.0)
    status = lag.run("check").expect(0).json()
    assert status["ingest"]["lag"]["total"] == 0 and status["health"]["verdict"] != "critical"
    facts = failures.run("check").expect(0).json()
    assert facts["committed_offsets"]["job_id"] == config.ingest_target.job_id and facts["reconciles"] is True
    _stopped_gracefully(running, "SIGINT")
    assert not duplicates(table_ids(config))


@pytest.mark.flink
def test_poison_or_schema_change(tmp_path: Path, broker: str, drills) -> None:
    # The page's operator path: the ingest does not add fields itself, it counts them.
    config_path = _config(tmp_path, broker, ingest={"schema_evolution": "off"})
    config = config_at(config_path)
    # Producers start sending anonymous events (no user_id, required in the table) and a new
    # field `device`; one poison record.
    values = schema_change_events(valid=range(40), anonymous=range(40, 52), with_device=range(52, 57),
                                  poison=b"\x00poison")
    produce_values(config, values, partition=0, partitions=1)
    ingest_until(config, {0: len(values)})
    drill = drills("poison-or-schema-change.md", CONFIG=str(config_path), REASON="missing required field 'user_id'%")

    status = drill.run("confirm").expect(0, 1).json()
    assert status["dead_letters"]["records"] == 13
    # The new field is not written, and status says so (records 52..56 carried it).
    assert status["ingest"]["unknown_fields"] == [
        {"path": "device", "records": 5, "first": {"0": 52}, "last": {"0": 56}, "ignored": False}]
    assert any(f["check"] == "unknown_fields" for f in status["health"]["findings"])
    reasons = drill.run("reasons").expect(0).json()
    assert reasons["candidates_by_reason"]["missing required field 'user_id'"] == 12
    assert reasons["records_added"] == 0
    # By hand: the config's schema takes user_id as optional and adds `device`.
    document = yaml.safe_load(config_path.read_text())
    for field in document["table"]["schema"]:
        if field["name"] == "user_id":
            field["required"] = False
    document["table"]["schema"].append({"name": "device", "type": "string"})
    config_path.write_text(yaml.safe_dump(document, sort_keys=False))

    plan = drill.run("evolve-plan").expect(0)
    assert "would add optional column 'device'" in plan.stdout and "would make column 'user_id' optional" in plan.stdout
    assert "device" not in load_catalog(config.catalog).load_table(config.table.identifier).schema().column_names
    drill.run("evolve").expect(0)
    produce_values(config, [event(100 + i, device="tablet", user_id=None) for i in range(10)], partition=0, partitions=1)
    running = drill.start("restart")
    after_restart = sorted(list(range(40)) + [52 + i for i in range(5)] + [100 + i for i in range(10)])
    wait_for(_has_ids(config, after_restart), INGEST_WAIT_SECONDS, "the restarted ingest to take the new shape",
             proc=running.proc, log=running.output, every=1.0)
    _stopped_gracefully(running, "SIGINT")
    replayed = drill.run("replay").expect(0).json()
    assert (replayed["records_added"], replayed["removed_from_dlq"], replayed["still_bad"]) == (12, 12, 0)

    facts = drill.run("check").expect(0).json()
    assert facts["dead_letters"] == 1 and facts["reconciles"] is True
    assert table_ids(config) == sorted(after_restart + [40 + i for i in range(12)])
    rows = load_catalog(config.catalog).load_table(config.table.identifier).scan(
        selected_fields=("id", "device")).to_arrow().to_pylist()
    device = {r["id"]: r["device"] for r in rows}
    assert all(device[100 + i] == "tablet" for i in range(10))
    # As the page says: with schema_evolution off, a field sent before the column existed was
    # not written (counted, above), not dead-lettered.
    assert all(device[52 + i] is None for i in range(5))
    assert dead_letters(config).column("value").to_pylist() == [b"\x00poison"]


def _accept_connections(postgres, database: str, allow: bool) -> None:
    """What a database outage looks like to clients: existing sessions cut, new ones refused."""
    import psycopg2

    from tests.fixtures.postgres import PASSWORD, USER

    conn = psycopg2.connect(host="127.0.0.1", port=postgres.port, user=USER, password=PASSWORD, dbname="postgres")
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS {str(allow).lower()}')
            if not allow:
                cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (database,))
    finally:
        conn.close()


@pytest.mark.flink
def test_upgrade_crash_and_catalog_outage(tmp_path: Path, broker: str, postgres, drills) -> None:
    """rolling-upgrade.md, crash-recovery.md and catalog-down.md, in that order, on one table
    with a PostgreSQL catalog while a producer keeps writing: a graceful upgrade, then the new
    job is killed with SIGKILL, then the restarted job loses its catalog database."""
    uri = postgres.create_database("runbook")
    database = uri.rsplit("/", 1)[1]
    config_path = _config(tmp_path, broker, catalog={"name": f"pg{database[-8:]}", "uri": uri, "warehouse": "warehouse"})
    config = config_at(config_path)
    ensure_topic(broker, config.kafka.topic, 2)
    produced: list[int] = []
    stop_producing = threading.Event()

    def produce() -> None:
        batch = 0
        while not stop_producing.is_set():
            produced.extend(produce_events(config, 100, rate=200, start_id=batch * 100, seed=batch).valid_ids)
            batch += 1

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        # rolling-upgrade.md
        upgrade = drills("rolling-upgrade.md", CONFIG=str(config_path))
        old = upgrade.start("start")
        wait_for(lambda: load_catalog(config.catalog).table_exists(config.table.identifier)
                 and _position(config).offsets,
                 INGEST_WAIT_SECONDS, "the old job's first commit", proc=old.proc, log=old.output, every=1.0)
        status = upgrade.run("confirm").expect(0, 1).json()
        assert status["ingest"]["last_commit"] is not None and status["health"]["verdict"] != "critical"
        upgrade.variables["INGEST_PID"] = str(old.command_pid())
        upgrade.run("stop").expect(0)
        assert old.wait(120) == 0, old.output()[-3000:]
        assert _outcome(old)["stopped_because"] == "SIGTERM"
        stopped_at = _position(config)
        new = upgrade.start("start")
        wait_for(lambda: sum(_position(config).offsets.values()) > sum(stopped_at.offsets.values()),
                 INGEST_WAIT_SECONDS, "the new job to commit", proc=new.proc, log=new.output, every=1.0)
        facts = upgrade.run("check").expect(0).json()
        assert facts["reconciles"] is True
        assert all(int(o) >= stopped_at.offsets[int(p)] for p, o in facts["committed_offsets"]["partitions"].items())

        # crash-recovery.md: the machine running the new job dies.
        new.signal(signal.SIGKILL)
        new.wait(60)
        killed_run = _position(config).run_id
        crash = drills("crash-recovery.md", CONFIG=str(config_path))
        status = crash.run("confirm").expect(0, 1).json()
        assert status["ingest"]["last_commit"] is not None
        assert crash.run("position").expect(0).json()["reconciles"] is True
        restarted = crash.start("fix")
        wait_for(lambda: _position(config).run_id != killed_run, INGEST_WAIT_SECONDS, "the restarted job to commit",
                 proc=restarted.proc, log=restarted.output, every=1.0)
    finally:
        stop_producing.set()
        producer.join()
    wait_for(_has_ids(config, sorted(produced)), INGEST_WAIT_SECONDS, "the restarted ingest to catch up",
             proc=restarted.proc, log=restarted.output, every=1.0)
    status = crash.run("check").expect(0).json()
    assert status["ingest"]["lag"]["total"] == 0 and status["health"]["verdict"] != "critical"
    assert not duplicates(table_ids(config))

    # catalog-down.md: the catalog database goes away under the running ingest.
    outage = drills("catalog-down.md", CONFIG=str(config_path))
    _accept_connections(postgres, database, False)
    try:
        produce_values(config, [event(10_000_000 + i) for i in range(50)], partition=0, partitions=2)
        code = restarted.wait(CATALOG_DOWN_EXIT_SECONDS)
        assert code == 1 and CATALOG_DOWN_MESSAGE in restarted.output(), restarted.output()[-3000:]
        status = outage.run("confirm").expect(1).json()
        assert status["catalog"]["reachable"] is False and status["health"]["verdict"] == "critical"
        assert any("catalog unreachable" in reason for reason in status["health"]["reasons"])
    finally:
        _accept_connections(postgres, database, True)  # by hand: the DBA brings it back
    back = outage.start("fix")
    everything = sorted(produced + [10_000_000 + i for i in range(50)])
    wait_for(_has_ids(config, everything), INGEST_WAIT_SECONDS, "the ingest after the outage", proc=back.proc,
             log=back.output, every=1.0)
    status = outage.run("check").expect(0).json()
    assert status["catalog"]["reachable"] is True and status["ingest"]["lag"]["total"] == 0
    _stopped_gracefully(back, "SIGINT")
    assert not duplicates(table_ids(config))


# -- the warehouse file system fills up ----------------------------------------------------------
@pytest.fixture
def small_filesystem(tmp_path: Path):
    """A 16 MiB tmpfs: a file system that really fills up (ENOSPC), then is unmounted."""
    import os
    import subprocess

    mount = tmp_path / "warehouse-fs"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root); this drill fills a real file system")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill_with_orphans(data_dir: Path, age_seconds: float) -> int:
    """Fill the file system with files no snapshot references (what crashed writers leave),
    dated `age_seconds` ago; return the bytes written."""
    import errno
    import os
    import time

    written, chunk = 0, b"\0" * (256 * 1024)
    stamp = time.time() - age_seconds
    for n in range(10_000):
        path = data_dir / f"crashed-writer-{n:05d}.parquet"
        try:
            with path.open("wb") as f:
                for _ in range(4):
                    f.write(chunk)
                    written += len(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            os.utime(path, (stamp, stamp))
            return written
        os.utime(path, (stamp, stamp))
    raise AssertionError("the file system never filled up")


@pytest.mark.flink
@pytest.mark.spark
def test_disk_full(tmp_path: Path, broker: str, small_filesystem: Path, drills) -> None:
    config_path = _config(tmp_path, broker, catalog={"name": f"c{tmp_path.name[-8:]}", "uri": "sqlite:///catalog.db",
                                                     "warehouse": str(small_filesystem)})
    config = config_at(config_path)
    produce_values(config, [event(i) for i in range(100)], partition=0, partitions=1)
    ingest_until(config, {0: 100})
    location = Path(load_catalog(config.catalog).load_table(config.table.identifier).location().removeprefix("file://"))
    safety = config.maintenance.orphan.safety_age_seconds
    filled = _fill_with_orphans(location / "data", age_seconds=safety + 3600)
    produce_values(config, [event(i) for i in range(100, 150)], partition=0, partitions=1)
    drill = drills("disk-full.md", CONFIG=str(config_path), WAREHOUSE=str(small_filesystem))

    failing = drill.start("restart")  # the ingest meets the full file system
    code = failing.wait(DISK_FULL_EXIT_SECONDS)
    output = failing.output()
    assert code == 1 and "No space left on device" in output, output[-3000:]
    assert any(m in output for m in DISK_FULL_MESSAGES), output[-3000:]
    assert table_ids(config) == list(range(100))  # nothing half-written became visible
    df = drill.run("confirm-space").expect(0)
    assert "100%" in df.stdout, df.stdout
    status = drill.run("confirm").expect(0, 1).json()
    assert status["ingest"]["lag"]["total"] > 0
    freed = drill.run("fix").expect(0).json()
    assert freed["orphan_files"]["bytes_freed"] >= filled * 0.9
    running = drill.start("restart")
    wait_for(_has_ids(config, list(range(150))), INGEST_WAIT_SECONDS, "the ingest after space was freed",
             proc=running.proc, log=running.output, every=1.0)
    facts = drill.run("check").expect(0).json()
    assert facts["reconciles"] is True
    _stopped_gracefully(running, "SIGINT")


@pytest.mark.flink
def test_lost_offsets(tmp_path: Path, mock_kafka, drills) -> None:
    """Retention ran ahead of a stopped ingest (librdkafka's mock cluster deletes old segments;
    tansu keeps everything)."""
    from tests.ingest.test_lost_offsets import _commit_first_ten, _events

    config_path = _config(tmp_path, mock_kafka.bootstrap, monitoring={"broker_timeout_seconds": 10})
    config = config_at(config_path)
    from streamberg.ingest.dead_letters import open_tables

    open_tables(config)
    _commit_first_ten(config)
    low = mock_kafka.produce_until_low_passes(config.kafka.topic, 10)
    _events(config, 0, range(1000, 1020))
    drill = drills("lost-offsets.md", CONFIG=str(config_path))

    status = drill.run("confirm").expect(1).json()
    assert status["health"]["verdict"] == "critical" and status["ingest"]["lag"]["behind_low_partitions"] == ["0"]
    outcome = json.loads(drill.run("fix", timeout=400).expect(0).stdout.strip().splitlines()[-1])
    assert outcome["consumed"] > 0, outcome
    facts = drill.run("check").expect(0).json()
    skip = facts["offset_skips"][0]
    assert (skip["partition"], skip["from"], skip["to"], skip["kind"]) == (0, 10, low, "lost")
    assert facts["lost_offsets"] == low - 10 and facts["counts_match"] and facts["reconciles"] is False
    assert facts["committed_offsets"]["partitions"]["0"] >= low
    assert set(range(1000, 1020)) <= set(table_ids(config))
