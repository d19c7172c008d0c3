"""End to end through the real PyFlink job: tansu broker -> `streamberg ingest` -> Iceberg.

One ingest run (module fixture) of a multi-partition topic with ~1% malformed records into a
table partitioned by day(ts) and bucket[4](user_id); the tests then check the table from
several sides: pyiceberg, Spark with the Iceberg runtime (a second implementation), the
dead-letter table, the recorded offsets, and the file layout.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition
from pyiceberg.expressions import EqualTo

from streamberg.cli.sample_events import produce_events
from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from tests.helpers import (
    config_at,
    dead_letters,
    duplicates,
    end_offsets_by_reading,
    streamberg,
    table_ids,
    write_config,
)

pytestmark = pytest.mark.flink

RECORDS = 30_000
PARTITIONS = 4
JOB_SECRET = "sealed-Qx81-secret"


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory, broker: str):
    directory = tmp_path_factory.mktemp("e2e")
    path = write_config(directory, broker, "e2e-events", partition_spec=[
        {"source": "ts", "transform": "day"}, {"source": "user_id", "transform": "bucket[4]"}])
    # A secret in the consumer settings (unused on a plaintext broker): the job graph must not
    # carry it, the workers take it from their environment (common/config/sealing.py).
    document = yaml.safe_load(path.read_text())
    document["kafka"]["consumer"] = {"ssl.key.password": JOB_SECRET}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, PARTITIONS)
    produced = produce_events(config, RECORDS, bad_fraction=0.01)
    run = streamberg("ingest", "--config", str(path), "--max-records", str(RECORDS), "--quiet")
    return config, path, produced, json.loads(run.stdout.strip().splitlines()[-1]), run.stderr


def test_table_holds_exactly_the_valid_records(ingested) -> None:
    config, _, produced, outcome, _ = ingested
    assert outcome["consumed"] == RECORDS
    ids = table_ids(config)
    assert not duplicates(ids)
    assert ids == sorted(produced.valid_ids)


def test_spark_reads_the_same_records(ingested, spark) -> None:
    from tests.helpers import spark_table

    config, _, produced, _, _ = ingested
    rows = spark_table(spark, config, config.table.identifier).select("id").collect()
    assert sorted(r.id for r in rows) == sorted(produced.valid_ids)


def test_every_malformed_record_is_dead_lettered_with_raw_bytes_and_reason(ingested) -> None:
    config, _, produced, _, _ = ingested
    dlq = dead_letters(config)
    assert dlq.num_rows == sum(produced.bad.values()) > 0
    assert not duplicates(list(zip(dlq.column("partition").to_pylist(), dlq.column("offset").to_pylist())))
    reasons = Counter(r.split(":")[0] for r in dlq.column("reason").to_pylist())
    assert set(reasons) >= {"oversized", "missing required field 'id'"}
    # A value of the wrong JSON type names the field and both types.
    assert any("where the table has long (not valid JSON for the schema" in r for r in dlq.column("reason").to_pylist())
    # The raw bytes are kept: each dead letter is the exact record at its offset.
    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap_servers, "group.id": "verify"})
    sample = dlq.slice(0, 5).to_pylist()
    for row in sample:
        consumer.assign([TopicPartition(config.kafka.topic, row["partition"], row["offset"])])
        message = consumer.consume(1, timeout=10)[0]
        assert message.value() == row["value"]
    consumer.close()


def test_offsets_end_at_the_topic_end_and_counts_reconcile(ingested) -> None:
    config, path, _, _, _ = ingested
    facts = json.loads(streamberg("table", "--config", str(path), "--json").stdout)
    ends = end_offsets_by_reading(config.kafka.bootstrap_servers, config.kafka.topic, PARTITIONS)
    assert facts["committed_offsets"]["partitions"] == ends
    assert facts["records"] + facts["dead_letters"] == RECORDS
    assert facts["reconciles"] is True


def test_commit_log_lines_carry_table_snapshot_files_records_offsets(ingested) -> None:
    _, _, _, _, stderr = ingested
    commits = [json.loads(line) for line in stderr.splitlines()
               if line.startswith("{") and '"event": "committed"' in line]
    assert commits
    for line in commits:
        assert {"table", "snapshot", "files", "records", "offsets", "job", "dead_letters"} <= set(line)


def test_files_land_in_their_partitions_and_a_point_query_prunes(ingested) -> None:
    config, _, _, _, _ = ingested
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    from pyiceberg_core import transform

    tasks = list(table.scan().plan_files())
    assert len(tasks) >= 4
    for task in tasks:
        data = pq.read_table(task.file.file_path.removeprefix("file://"), columns=["ts", "user_id"])
        days = {d.as_py() for d in transform.day(data.column("ts").combine_chunks()).cast("int32")}
        buckets = {b.as_py() for b in transform.bucket(data.column("user_id").combine_chunks(), 4)}
        assert days == {task.file.partition[0]} and buckets == {task.file.partition[1]}
    user = table.scan(selected_fields=("user_id",), limit=1).to_arrow().column("user_id")[0].as_py()
    pruned = list(table.scan(row_filter=EqualTo("user_id", user)).plan_files())
    assert 0 < len(pruned) < len(tasks)
    assert all(t.file.partition[1] == transform.bucket(__import__("pyarrow").array([user]), 4)[0].as_py() for t in pruned)


def test_existing_table_with_another_schema_is_refused_clearly(ingested, tmp_path: Path) -> None:
    config, path, _, _, _ = ingested
    import yaml

    document = yaml.safe_load(path.read_text())
    document["table"]["schema"][4]["type"] = "string"  # amount: double -> string
    document["table"]["schema"].append({"name": "country", "type": "string", "required": True})
    for key in ("uri", "warehouse"):
        document["catalog"][key] = document["catalog"][key] if "://" not in document["catalog"][key] else document["catalog"][key]
    changed = path.parent / "changed.yaml"
    changed.write_text(yaml.safe_dump(document))
    proc = streamberg("ingest", "--config", str(changed), "--max-records", "1", check=False)
    assert proc.returncode == 1
    assert "column 'amount' is double in the table but string in the config" in proc.stderr
    assert "column 'country' (string) is in the config but not in the table" in proc.stderr


def test_duration_bound_drains_records_in_flight_and_a_rerun_adds_nothing(ingested) -> None:
    config, path, produced, _, _ = ingested
    # Records the bounded run reads but cannot commit on its own: the commit interval (600 s) is
    # longer than the run, so whatever it reports consumed was committed by the graceful drain.
    extra = produce_events(config, 2000, start_id=RECORDS, seed=99)
    before = json.loads(streamberg("table", "--config", str(path), "--json").stdout)
    run = streamberg("ingest", "--config", str(path), "--duration", "15", "--quiet",
                     env={"STREAMBERG_INGEST__COMMIT_INTERVAL_SECONDS": "600"})
    drained = json.loads(run.stdout.strip().splitlines()[-1])
    assert drained["stopped_because"] == "duration 15.0s elapsed"
    assert 0 < drained["consumed"] <= extra.produced  # read, in flight at the stop, and committed
    assert '"all writers finished and every table committed"' in run.stderr  # drained, not cut off
    middle = json.loads(streamberg("table", "--config", str(path), "--json").stdout)
    assert middle["snapshots"] == before["snapshots"] + 1  # the drain's one commit
    # The rest, if the stop came before every record was read (a slow start-up eats the bound).
    remaining = extra.produced - drained["consumed"]
    if remaining:
        streamberg("ingest", "--config", str(path), "--max-records", str(remaining), "--quiet")
    settled = json.loads(streamberg("table", "--config", str(path), "--json").stdout)
    idle = json.loads(streamberg("ingest", "--config", str(path), "--duration", "8", "--quiet").stdout
                      .strip().splitlines()[-1])
    assert idle["consumed"] == 0
    after = json.loads(streamberg("table", "--config", str(path), "--json").stdout)
    assert after["snapshots"] == settled["snapshots"]  # no empty snapshots
    assert table_ids(config) == sorted(produced.valid_ids + extra.valid_ids)


def test_the_job_graph_carries_no_secret(ingested) -> None:
    """The operators a job pickles hold a marker where the secret was; a worker rebuilds the
    config from its own environment (issue 38, item 11), and the run above read every record."""
    import cloudpickle

    from streamberg.common.config.sealing import MARK, seal, unseal
    from streamberg.ingest.job import WriterFunction, job_dump

    config, _, _, outcome, stderr = ingested
    sealed, found = seal(job_dump(config))
    pickled = cloudpickle.dumps(WriterFunction(sealed, "run", None))
    assert JOB_SECRET.encode() not in pickled and MARK.encode() in pickled
    assert found == {"STREAMBERG_KAFKA__CONSUMER__SSL.KEY.PASSWORD": JOB_SECRET}
    assert unseal(sealed, found)["kafka"]["consumer"]["ssl.key.password"] == JOB_SECRET
    # It travels under a name a shell keeps (PyFlink's runner script is one).
    from streamberg.common.config.sealing import carried_name

    assert unseal(sealed, {carried_name(n): v for n, v in found.items()})["kafka"]["consumer"]["ssl.key.password"] \
        == JOB_SECRET and carried_name(next(iter(found))).replace("_", "").isalnum()
    assert outcome["consumed"] == RECORDS and JOB_SECRET not in stderr
