"""A recreated topic under the whole ingest (PyFlink, tansu, SQLite catalog, Parquet).

The table's offsets are past the new topic's end, so librdkafka would reset the position in
silence and the ingest would commit lower offsets as if nothing happened. With the default
`ingest.on_lost_offsets: fail` it stops at once (no Flink restarts) with exit 1, naming the
partition, the committed offset and the watermarks; with `skip-and-record` it reads the new
topic from its start and the jump is in `streamberg table` and `status`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from streamberg.cli.sample_events import produce_events
from streamberg.common.broker import ensure_topic
from tests.helpers import config_at, duplicates, spark_table, streamberg, table_ids, write_config

pytestmark = pytest.mark.flink


def _recreate(broker: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": broker})
    for future in admin.delete_topics([topic]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"topic {topic} still listed after its deletion"
        time.sleep(0.2)
    ensure_topic(broker, topic, partitions)


def test_a_recreated_topic_stops_the_ingest_or_is_recorded_and_read_again(tmp_path: Path, broker: str, spark) -> None:
    path = write_config(tmp_path, broker, ingest={"commit_interval_seconds": 1})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 2)
    produce_events(config, 300)
    streamberg("ingest", "--config", str(path), "--max-records", "300", "--quiet")
    before = json.loads(streamberg("table", "--config", str(path), "--json").stdout)["committed_offsets"]["partitions"]
    assert sum(before.values()) == 300

    _recreate(broker, config.kafka.topic, 2)
    produce_events(config, 50, start_id=1000)
    started = time.monotonic()
    refused = streamberg("ingest", "--config", str(path), "--max-records", "50", "--quiet", check=False)
    assert refused.returncode == 1, refused.stderr[-3000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("streamberg ingest: table db.events:") and "is beyond the partition's end" in last
    # Each writer names its own partitions; the first to open stops the run.
    assert any(f"{config.kafka.topic}[{p}]: the table's committed offset {before[p]} " in last for p in before), last
    assert "watermarks: low 0" in last
    assert "skip-and-record" in last and "Traceback" not in refused.stderr
    assert "task restarted after a failure" not in refused.stderr  # stopped at once, not after Flink's restarts
    assert time.monotonic() - started < 120
    assert table_ids(config) == list(range(300))  # nothing moved

    streamberg("ingest", "--config", str(path), "--max-records", "50", "--quiet",
               env={"STREAMBERG_INGEST__ON_LOST_OFFSETS": "skip-and-record"})
    ids = table_ids(config)
    assert ids == list(range(300)) + list(range(1000, 1050)) and not duplicates(ids)
    facts = json.loads(streamberg("table", "--config", str(path), "--json").stdout)
    skips = sorted((s["partition"], s["from"], s["to"], s["kind"]) for s in facts["offset_skips"])
    assert skips == [(0, before["0"], 0, "rewound"), (1, before["1"], 0, "rewound")]
    assert facts["counts_match"] and not facts["reconciles"] and facts["lost_offsets"] == 0
    assert sum(facts["committed_offsets"]["partitions"].values()) == 50
    text = streamberg("table", "--config", str(path)).stdout
    assert f"offsets went back from {before['0']:,} to 0" in text
    # An independent reader sees the same rows.
    assert sorted(r["id"] for r in spark_table(spark, config, config.table.identifier).select("id").collect()) == ids
