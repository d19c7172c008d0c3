"""The verdict rules, judged on facts collected from a real table and broker.

`judge` is pure, so each rule is checked by judging the same real facts under thresholds
placed just below or just above the measured value (or at a later `now`).
"""

from __future__ import annotations

import dataclasses

import pytest

from streamberg.common.catalog import load_catalog
from streamberg.monitoring.collect import collect_status
from streamberg.monitoring.health import judge
from streamberg.monitoring.model import Status
from tests.monitoring.helpers import Scenario, with_monitoring

# Every rule off: each test turns on the one it checks.
ALL_OFF = dict(lag_warn_records=None, lag_critical_records=None, commit_age_warn_intervals=None,
               commit_age_critical_intervals=None, pending_age_warn_factor=None, pending_age_critical_factor=None,
               small_file_ratio_warn=None, snapshots_warn=None, snapshots_critical=None, dead_letters_warn=None)


@pytest.fixture(scope="module")
def facts(scenario: Scenario) -> Status:
    return collect_status(scenario.config)


def checks(health) -> list[tuple[str, str]]:
    return [(f["check"], f["severity"]) for f in health.findings]


def test_defaults_judge_the_scenario_ok(scenario: Scenario, facts: Status) -> None:
    health = judge(facts, scenario.config)
    assert health.verdict == "ok", health.reasons
    assert judge(facts, with_monitoring(scenario.config, **ALL_OFF)).reasons == []


def test_lag_thresholds(scenario: Scenario, facts: Status) -> None:
    lag = facts.ingest.lag.total
    assert lag == sum(scenario.lag.values()) > 0
    at = with_monitoring(scenario.config, **{**ALL_OFF, "lag_warn_records": lag})
    health = judge(facts, at)
    assert checks(health) == [("lag", "warn")] and f"{lag:,} records" in health.reasons[0]
    health = judge(facts, with_monitoring(scenario.config, **{**ALL_OFF, "lag_warn_records": lag - 1,
                                                                 "lag_critical_records": lag}))
    assert health.verdict == "critical" and checks(health) == [("lag", "critical")]
    assert judge(facts, with_monitoring(scenario.config, **{**ALL_OFF, "lag_warn_records": lag + 1})).verdict == "ok"


def test_stalled_ingest_while_records_wait(scenario: Scenario) -> None:
    config = scenario.config
    interval = config.ingest.commit_interval_seconds
    rules = {**ALL_OFF, "commit_age_warn_intervals": 3.0, "commit_age_critical_intervals": 10.0}
    judged = with_monitoring(config, **rules)
    last_ms = load_catalog(config.catalog).load_table(config.table.identifier).current_snapshot().timestamp_ms

    def at(intervals: float) -> Status:
        return collect_status(config, now_ms=last_ms + int(intervals * interval * 1000))

    assert judge(at(2.5), judged).verdict == "ok"
    health = judge(at(3.5), judged)
    assert checks(health) == [("commit_age", "warn")] and "stalled" in health.reasons[0]
    assert checks(judge(at(11), judged)) == [("commit_age", "critical")]


def test_old_commit_without_waiting_records_is_idle_not_stalled(scenario: Scenario) -> None:
    config = scenario.config
    last_ms = load_catalog(config.catalog).load_table(config.table.identifier).current_snapshot().timestamp_ms
    stale = collect_status(config, now_ms=last_ms + int(5 * config.ingest.commit_interval_seconds * 1000))
    caught_up = dataclasses.replace(stale.ingest, lag=dataclasses.replace(stale.ingest.lag, total=0))
    rules = with_monitoring(config, **{**ALL_OFF, "commit_age_warn_intervals": 3.0})
    assert checks(judge(stale, rules)) == [("commit_age", "warn")]
    assert judge(dataclasses.replace(stale, ingest=caught_up), rules).verdict == "ok"


def test_compactor_behind(scenario: Scenario) -> None:
    config = scenario.config
    max_delay = config.compactor.max_delay_seconds
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    first_ms = min(s.timestamp_ms for s in table.metadata.snapshots)
    rules = with_monitoring(config, **{**ALL_OFF, "pending_age_warn_factor": 2.0, "pending_age_critical_factor": 6.0})

    def at(factor: float) -> Status:
        return collect_status(config, now_ms=first_ms + int(factor * max_delay * 1000))

    assert judge(at(1.5), rules).verdict == "ok"
    behind = at(2.5)
    health = judge(behind, rules)
    assert checks(health) == [("compactor", "warn")]
    assert f"{behind.compactor.pending_files:,} files" in health.reasons[0]
    assert checks(judge(at(7), rules)) == [("compactor", "critical")]


def test_small_files_snapshots_and_dead_letters(scenario: Scenario, facts: Status) -> None:
    files = facts.files
    assert files.small_files == files.data_files > 0
    small = with_monitoring(scenario.config, **{**ALL_OFF, "small_file_ratio_warn": 1.0,
                                                 "small_file_min_files": files.data_files})
    assert checks(judge(facts, small)) == [("small_files", "warn")]
    too_few = with_monitoring(scenario.config, **{**ALL_OFF, "small_file_ratio_warn": 1.0,
                                                   "small_file_min_files": files.data_files + 1})
    assert judge(facts, too_few).verdict == "ok"  # a young table is all small files

    count = facts.snapshots.count
    assert checks(judge(facts, with_monitoring(scenario.config, **{**ALL_OFF, "snapshots_warn": count}))) == [
        ("snapshots", "warn")]
    assert checks(judge(facts, with_monitoring(scenario.config, **{**ALL_OFF, "snapshots_critical": count}))) == [
        ("snapshots", "critical")]

    dead = facts.dead_letters.records
    assert dead > 0
    assert checks(judge(facts, with_monitoring(scenario.config, **{**ALL_OFF, "dead_letters_warn": dead}))) == [
        ("dead_letters", "warn")]
    assert judge(facts, with_monitoring(scenario.config, **{**ALL_OFF, "dead_letters_warn": dead + 1})).verdict == "ok"
