"""Monitoring test helpers: a table with real ingest commits and real messages behind them."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from streamberg.common.broker import ensure_topic
from streamberg.common.config import StreambergConfig
from streamberg.ingest.committer import CommitResult, Committer
from streamberg.ingest.dead_letters import open_tables
from tests.helpers import config_at, write_config
from tests.ingest.test_committer import make_unit


def produce_to(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    """Produce counts[p] small JSON messages to partition p, and wait until all are acknowledged.

    A long linger puts each partition's messages in one record batch, so on tansu (whose
    watermark is its last batch's base offset + 1) the watermark lags the true end by all but
    one record: the monitoring tests rely on that gap to exercise "offsets past the watermark".
    """
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1000})
    for partition, n in counts.items():
        for i in range(n):
            producer.produce(topic, value=json.dumps({"id": i}).encode(), partition=partition)
    assert producer.flush(30) == 0, "messages still unacknowledged after 30 s"


def with_monitoring(config: StreambergConfig, **thresholds: Any) -> StreambergConfig:
    """The same config with some monitoring thresholds changed (for judging the same facts)."""
    return config.model_copy(update={"monitoring": config.monitoring.model_copy(update=thresholds)})


@dataclass
class Scenario:
    """What was produced and committed, i.e. what status must report."""

    config: StreambergConfig
    path: Path
    produced: dict[int, int]
    committed: dict[int, int] = field(default_factory=dict)
    results: list[CommitResult] = field(default_factory=list)
    last_commit_window_ms: tuple[int, int] = (0, 0)

    @property
    def lag(self) -> dict[int, int]:
        return {p: n - self.committed.get(p, 0) for p, n in self.produced.items()}


def build_scenario(directory: Path, bootstrap: str, produced: dict[int, int],
                   commits: list[list[tuple[int, int, int, tuple[int, ...]]]], extra: dict | None = None,
                   catalog: dict | None = None) -> Scenario:
    """A table whose commits are made by the real ingest committer.

    `commits` lists the commits; each is a list of units (partition, start, end, dead
    offsets), one per writer, all committed together in one snapshot.
    """
    topic = f"mon-{uuid.uuid4().hex[:10]}"
    # A long commit interval: nobody ingests after these commits, and a short one would make
    # the (correct) "ingest stalled while records wait" rule fire within seconds.
    path = write_config(directory, bootstrap, topic, ingest={"commit_interval_seconds": 600}, extra=extra,
                        catalog=catalog)
    config = config_at(path)
    open_tables(config)
    ensure_topic(bootstrap, topic, max(produced) + 1)
    produce_to(bootstrap, topic, produced)
    scenario = Scenario(config=config, path=path, produced=produced)
    commit_units(scenario, commits)
    return scenario


def commit_units(scenario: Scenario, commits: list[list[tuple[int, int, int, tuple[int, ...]]]]) -> None:
    """Commits made by the real ingest committer, after those the scenario has (each a list of
    units: partition, start, end, dead offsets, one per writer, committed in one snapshot)."""
    config = scenario.config
    first = len(scenario.results)
    for n, units in enumerate(commits, start=first):
        committer = Committer(config, parallelism=len(units), run_id=f"run-{n}")
        committer.open()
        before = int(time.time() * 1000)
        result = None
        for writer, (partition, start, end, dead) in enumerate(units):
            unit = make_unit(config, writer, partition=partition, start=start, end=end, epoch=n + 1, dead=dead)
            unit.messages = end - start  # what a writer counts: every record read, valid or not
            result = committer.offer(unit)
        after = int(time.time() * 1000)
        committer.close()
        assert result is not None, "every writer reported: the committer must have committed"
        scenario.results.append(result)
        scenario.committed.update(result.offsets)
        scenario.last_commit_window_ms = (before, after)
