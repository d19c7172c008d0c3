"""When a source's positions start over, no later change is dropped as stale (issue 38, item 8;
table_meta/source_epochs.py, docs/runbooks/cdc-source-regressed.md).

Each case is a Debezium stream whose positions go backwards in one partition: a MySQL failover
to another server (`db2-bin.000007` after `mysql-bin.000412`: a new source name, so the merge
opens the epoch itself), a MySQL RESET MASTER (binlog files from 000001 again, same name), a
PostgreSQL restored into a new cluster (LSNs from the backup's), a resync whose snapshot events
carry no LSN before the new cluster's stream, a connector that knows only `ts_ms` behind a clock
set back. Before the epochs, every later change was dropped as stale. Now: the new server's
changes apply by themselves; the others are counted as regressions (status critical, nothing
of them applied), and after `streamberg merge --new-source-epoch` the next merge applies them.
Records go through the real writer and committer and the real merge on the shared Spark
session; Spark, DuckDB and pyiceberg read the table, compared with the state this test
computes by applying the events in Kafka order: row counts, distinct keys, values.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamberg.common.catalog import load_catalog
from streamberg.merge.app import MergeOptions, declare_source_epoch, run_merge
from streamberg.monitoring.collect import collect_status
from streamberg.monitoring.health import with_health
from streamberg.table_meta.changelog import changelog_identifier, ingest_config
from streamberg.table_meta.source_epochs import EPOCHS_PROPERTY, REGRESSION_PROPERTY
from tests.cdc.helpers import assert_table_holds, cdc_config
from tests.cdc.test_order import _produce
from tests.runbooks.inprocess import cli, ingest_until

COLUMNS = ["id", "name", "score"]


class Stream:
    """One source's change events and the truth: each change applied in Kafka order."""

    def __init__(self, position) -> None:
        self.position = position  # n -> the event's `source` block
        self.n = 0
        self.state: dict[int, dict] = {}

    def change(self, op: str, key: int, score: int = 0) -> tuple[int, bytes, bytes]:
        self.n += 1
        after = None if op == "d" else {"id": key, "name": f"n{key}-{self.n}", "score": score}
        before = {"id": key} if op != "c" else None
        if op == "d":
            self.state.pop(key, None)
        else:
            self.state[key] = after
        value = json.dumps({"before": before, "after": after, "op": op, "source": self.position(self.n)}).encode()
        return 0, json.dumps({"id": key}).encode(), value

    def first_life(self) -> list:
        return [self.change("c", k, score=1) for k in range(20)] + [self.change("u", k, score=2) for k in range(10)]

    def second_life(self) -> list:
        """After the source started over: updates, deletes, inserts of new keys."""
        return ([self.change("u", k, score=3) for k in range(0, 10)] + [self.change("d", k) for k in range(10, 15)]
                + [self.change("c", k, score=4) for k in range(20, 25)] + [self.change("u", k, score=5) for k in (0, 20)])


def _mysql(server: int, prefix: str, file: int):
    return lambda n: {"connector": "mysql", "server_id": server, "file": f"{prefix}.{file:06d}", "pos": 100 * n,
                      "row": 0, "ts_ms": 1_764_000_000_000 + n}


def _postgres(base: int | None):
    return lambda n: {"connector": "postgresql", "ts_ms": 1_764_000_000_000 + n,
                      "sequence": json.dumps([None, None] if base is None else [str(base + 10 * n - 5), str(base + 10 * n)])}


def _clock(start_ms: int):
    return lambda n: {"connector": "informix", "ts_ms": start_ms + n}


# (old source, new source, whether the merge tells the new epoch by itself)
CASES = {
    "mysql-failover": (_mysql(1, "mysql-bin", 412), _mysql(2, "db2-bin", 7), True),
    "mysql-reset-master": (_mysql(1, "mysql-bin", 412), _mysql(1, "mysql-bin", 1), False),
    "postgres-new-cluster": (_postgres(9_000_000), _postgres(10_000), False),
    "ts-ms-only-clock-back": (_clock(1_764_000_000_000), _clock(1_700_000_000_000), False),
}


def _merge(config, spark) -> dict:
    summary = run_merge(config, MergeOptions(once=True), spark=spark)
    return summary.get("last", {})


def _critical(config) -> list[str]:
    status = with_health(collect_status(config), config)
    return [r for r in status.health.reasons if "went backwards" in r] if status.health.verdict == "critical" else []


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_source_that_starts_over_loses_no_later_change(case: str, tmp_path: Path, broker: str, spark) -> None:
    old, new, automatic = CASES[case]
    config = cdc_config(tmp_path, broker, "debezium", {"table": {
        "identifier": "db.users", "primary_key": ["id"],
        "schema": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"},
                   {"name": "score", "type": "int"}]}})
    view = ingest_config(config)
    stream = Stream(old)
    ends = _produce(config, 1, stream.first_life())
    ingest_until(view, ends)
    assert _merge(config, spark)["stale"] == 0
    assert_table_holds(spark, config, stream.state, columns=COLUMNS)
    first_state = {**stream.state}

    stream.position = new
    ends = _produce(config, 1, stream.second_life(), ends)
    ingest_until(view, ends)
    outcome = _merge(config, spark)
    changelog = load_catalog(config.catalog).load_table(changelog_identifier(config))
    if automatic:  # a new source name: its epoch opened by the merge, nothing regressed
        assert outcome["regressed"] == 0 and outcome["stale"] == 0, outcome
        assert set(json.loads(changelog.properties[EPOCHS_PROPERTY])["sources"].values()) == {0, 1}
        assert not _critical(config)
        assert_table_holds(spark, config, stream.state, columns=COLUMNS)
        return

    # The same name, positions back: regressions counted, not applied, status critical.
    assert outcome["regressed"] > 0, outcome
    assert REGRESSION_PROPERTY in changelog.properties
    reasons = _critical(config)
    assert reasons and "cdc-source-regressed" in reasons[0], reasons
    # The table kept its first life for every key it held; keys new to it went in (no position
    # to compare theirs with).
    held = {**first_state, **{k: v for k, v in stream.state.items() if k >= 20}}
    assert_table_holds(spark, config, held, columns=COLUMNS)

    # The runbook's step: declare the epoch (the real command), merge again.
    declared = json.loads(cli("merge", "--config", config.config_path, "--new-source-epoch",
                              f"{case} (test)").stdout)
    assert declared["epoch"] == 1 and declared["from"] == "the first change that went backwards", declared
    again = _merge(config, spark)
    assert again["regressed"] == 0, again
    assert_table_holds(spark, config, stream.state, columns=COLUMNS)
    assert not _critical(config)
    # And the stream goes on in the new epoch: later changes apply as usual.
    more = [stream.change("u", k, score=9) for k in (1, 2, 21)]
    ends = _produce(config, 1, more, ends)
    ingest_until(view, ends)
    assert _merge(config, spark)["regressed"] == 0
    assert_table_holds(spark, config, stream.state, columns=COLUMNS)


def test_a_resync_without_positions_then_a_new_cluster_in_one_batch(tmp_path: Path, broker: str, spark) -> None:
    """A resync whose snapshot events carry no LSN (ordered by offset), then the new cluster's
    stream with LSNs far below the old ones, all in one merge batch: the regression is found
    inside the batch (not only against the key state), and the declared epoch fixes it."""
    config = cdc_config(tmp_path, broker, "debezium", {"table": {
        "identifier": "db.users", "primary_key": ["id"],
        "schema": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"},
                   {"name": "score", "type": "int"}]}})
    view = ingest_config(config)
    stream = Stream(_postgres(9_000_000))
    events = stream.first_life()
    stream.position = _postgres(None)  # the resync: every row again, op r, no LSN
    events += [stream.change("u", k, score=7) for k in range(20)]
    stream.position = _postgres(10_000)
    events += stream.second_life()
    ends = _produce(config, 1, events)
    ingest_until(view, ends)
    outcome = _merge(config, spark)
    assert outcome["regressed"] > 0, outcome
    assert _critical(config)
    declare_source_epoch(config, "restored into a new cluster (test)")
    assert _merge(config, spark)["regressed"] == 0
    assert_table_holds(spark, config, stream.state, columns=COLUMNS)
    assert not _critical(config)
