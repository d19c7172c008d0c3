"""The governor reads a table from the catalog when a commit was reported for it, not every
round (governor/keeper.py): the ingest's commits are reported (table_meta/query_stats.py
record_commit, through the real ingest code in-process against a real broker), a probe of an
unchanged table costs no catalog read, `govern.poll_seconds` bounds how stale it may get, and
without a report folder every probe reads the table as before."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from streamberg.common.broker import ensure_topic
from streamberg.governor import keeper as keeper_module
from streamberg.governor.keeper import SharedCatalogs, TableKeeper
from streamberg.ingest.dead_letters import open_tables
from streamberg.table_meta.query_stats import commits
from tests.helpers import config_at, write_config
from tests.runbooks.inprocess import event, ingest_until, produce_values


def _config(tmp_path: Path, broker: str, reports: bool, poll_seconds: float = 300.0):
    path = write_config(tmp_path, broker, ingest={"parallelism": 1}, extra={"govern": {"poll_seconds": poll_seconds}},
                        catalog={"scan_reports_dir": "reports"} if reports else None)
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 1)
    open_tables(config)
    return config


def test_a_table_is_read_again_only_after_a_reported_commit(tmp_path: Path, broker: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keeper_module, "COMMITS_EVERY_SECONDS", 0.0)
    config = _config(tmp_path, broker, reports=True)
    produce_values(config, [event(i) for i in range(20)], 0, 1)
    ingest_until(config, {0: 20})
    assert commits(config.catalog.scan_reports_dir, config.catalog.name)[config.table.identifier]["total"] == 1
    keeper = TableKeeper(config, [], None, SharedCatalogs())
    for _ in range(5):
        assert keeper.probe() == ([], [])
    assert keeper.catalog_reads == 1  # four probes of an unchanged table: no catalog read

    produce_values(config, [event(i) for i in range(20, 30)], 0, 1)
    ingest_until(config, {0: 30})  # the ingest's commit, reported
    keeper.probe()
    keeper.probe()
    assert keeper.catalog_reads == 2
    assert keeper._table.current_snapshot().snapshot_id == \
        commits(config.catalog.scan_reports_dir, config.catalog.name)[config.table.identifier]["snapshot_id"]


def test_without_reports_or_past_the_poll_every_probe_reads(tmp_path: Path, broker: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keeper_module, "COMMITS_EVERY_SECONDS", 0.0)
    for name, reports, poll in (("no-reports", False, 300.0), ("poll-0", True, 0.001)):
        config = _config(tmp_path / name, broker, reports=reports, poll_seconds=poll)
        produce_values(config, [event(i) for i in range(5)], 0, 1)
        ingest_until(config, {0: 5})
        keeper = TableKeeper(config, [], None, SharedCatalogs())
        for _ in range(3):
            keeper.probe()
            time.sleep(0.01)  # past the 1 ms poll
        assert keeper.catalog_reads == 3, name
