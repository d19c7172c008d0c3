"""The governor's scheduler and policy parsing, pure: no Spark, no catalog (fast)."""

from __future__ import annotations

import random

import pytest

from streamberg.table_meta.policy import POLICY_KEYS, policy_for, policy_of
from streamberg.table_meta.schedule import BACKOFF_BASE_SECONDS, Due, Scheduler


def test_a_hot_table_cannot_starve_the_quiet_ones() -> None:
    """20 quiet tables due a little, 3 hot ones always very due, one action a round (10 s):
    every quiet table still runs, none waiting past the bound plus one round."""
    bound, round_seconds = 120.0, 10.0
    scheduler = Scheduler(max_wait_seconds=bound)
    rng = random.Random(3)
    quiet_due: dict[str, float] = {}
    waits: list[float] = []
    ran_quiet: set[str] = set()
    now = 0.0
    for _ in range(400):
        for q in range(20):  # a quiet table becomes due now and then, stays due until run
            if f"q{q}" not in quiet_due and rng.random() < 0.02:
                quiet_due[f"q{q}"] = now
        due = [Due(f"hot{h}", "compact", 50.0 + h, "hot", 0) for h in range(3)]
        due += [Due(t, "compact", 1.0, "quiet", 0) for t in quiet_due]
        for choice in scheduler.plan(due, now, budget=1):
            scheduler.ran(choice, now)
            if choice.due.table in quiet_due:
                waits.append(now - quiet_due.pop(choice.due.table))
                ran_quiet.add(choice.due.table)
        now += round_seconds
    assert len(ran_quiet) == 20 and waits
    # The bound, plus the rounds of other quiet tables that passed it at the same moment (140 s here).
    assert max(waits) <= bound + 5 * round_seconds, max(waits)
    # Without the bound the quiet ones would never run: the hot tables are always more urgent.
    greedy = Scheduler(max_wait_seconds=float("inf"))
    chosen = {c.due.table for _ in range(50)
              for c in greedy.plan([Due("hot", "compact", 50, "", 0), Due("q", "compact", 1, "", 0)], 0.0, 1)}
    assert chosen == {"hot"}


def test_min_interval_and_backoff_isolate_a_table() -> None:
    scheduler = Scheduler(max_wait_seconds=600)
    a, b = Due("a", "compact", 5, "", 60), Due("b", "compact", 1, "", 60)
    first = scheduler.plan([a, b], 0.0, budget=1)[0]
    assert first.due.table == "a"
    scheduler.failed(first, 0.0, "RuntimeError: boom")
    # a backs off; b goes on
    assert [c.due.table for c in scheduler.plan([a, b], 1.0, budget=2)] == ["b"]
    scheduler.ran(scheduler.plan([b], 1.0, budget=1)[0], 1.0)
    assert scheduler.plan([b], 30.0, budget=1) == []  # its minimum interval
    assert [c.due.table for c in scheduler.plan([a, b], BACKOFF_BASE_SECONDS + 70.0, budget=2)] == ["a", "b"]
    state = {s["table"]: s for s in scheduler.state(1.0)}
    assert state["a"]["failures"] == 1 and state["a"]["last_error"] == "RuntimeError: boom"


def test_policy_keys_parse_and_bad_values_are_named() -> None:
    policy = policy_of({"streamberg.cluster.columns": "user_id, city", "streamberg.cluster.strategy": "HILBERT",
                        "streamberg.compact.enabled": "maybe", "streamberg.cluster.colums": "x",
                        "streamberg.route.topic": "events", "write.format.default": "parquet"})
    assert policy.governed and policy.settings == {"compactor.columns": ["user_id", "city"], "compactor.strategy": "hilbert"}
    assert policy.compact_enabled  # the bad value is ignored, not guessed
    assert [p.split(":")[0] for p in policy.problems] == ["streamberg.cluster.colums", "streamberg.compact.enabled"]
    assert not policy_of({"streamberg.route.topic": "events"}).governed
    assert len({k.name for k in POLICY_KEYS}) == len(POLICY_KEYS)


def test_a_tables_settings_stand_in_for_the_configs_within_their_bounds(tmp_path) -> None:
    """Policy keys that stand in for config settings are checked by the config section's own
    model: a value past its bound, or breaking a rule between keys, is named and the
    configured value stays; the others apply to this table only."""
    from tests.compactor.helpers import write_config
    from tests.helpers import config_at

    config = config_at(write_config(tmp_path))
    policy, kept = policy_for(config, {"streamberg.snapshots.keep": "5", "streamberg.snapshots.max": "0",
                                       "streamberg.compact.min_files": "3", "streamberg.retention.days": "30",
                                       "streamberg.compact.seal_after_seconds": "nan", "streamberg.snapshots.colour": "x"})
    assert kept.maintenance.expire.min_snapshots_to_keep == 5 and kept.compactor.min_files == 3
    assert kept.maintenance.expire.max_snapshots == config.maintenance.expire.max_snapshots
    assert kept.maintenance.retention.days is None and kept.compactor.seal_after_seconds == config.compactor.seal_after_seconds
    assert sorted(p.split(":")[0] for p in policy.problems) == [
        "streamberg.compact.seal_after_seconds", "streamberg.retention.days", "streamberg.snapshots.colour",
        "streamberg.snapshots.max"]
    assert config.maintenance.expire.min_snapshots_to_keep == 1  # the config itself is untouched
    assert policy_for(config, {"streamberg.compact.enabled": "false"})[1] is config


def test_every_policy_key_is_documented() -> None:
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "governor.md").read_text()
    assert [k.name for k in POLICY_KEYS if f"`{k.name}`" not in text] == []


@pytest.mark.slow
def test_table_set_writes_only_checked_policy_keys(tmp_path) -> None:
    """`streamberg table --set/--unset` (the CLI entry beside Spark SQL): a refused value writes
    nothing; accepted ones land in the table's properties, where `govern` reads them."""
    from streamberg.common.catalog import load_catalog
    from streamberg.table_meta.declared import ensure_table
    from tests.compactor.helpers import write_config
    from tests.helpers import config_at, streamberg

    path = write_config(tmp_path)
    config = config_at(path)
    ensure_table(load_catalog(config.catalog), config.table)

    def properties() -> dict:
        return dict(load_catalog(config.catalog).load_table(config.table.identifier).properties)

    before = properties()
    for bad in ("streamberg.cluster.strategy=spiral", "streamberg.nope=1", "write.format.default=orc", "no-equals"):
        proc = streamberg("table", "--config", str(path), "--set", "streamberg.compact.enabled=false", "--set", bad,
                          check=False)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (bad, proc.stderr)  # a usage error
        assert properties() == before, bad
    streamberg("table", "--config", str(path), "--set", "streamberg.cluster.columns=user_id,city",
               "--set", "streamberg.cluster.strategy=hilbert")
    policy = policy_of(properties())
    assert policy.settings == {"compactor.columns": ["user_id", "city"], "compactor.strategy": "hilbert"}
    assert not policy.problems
    # Bounds and the rules between keys are the config's: refused before anything is written.
    for bad in ("streamberg.snapshots.keep=0", "streamberg.retention.days=3", "streamberg.compact.merge_factor=1"):
        proc = streamberg("table", "--config", str(path), "--set", "streamberg.compact.min_files=3", "--set", bad,
                          check=False)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (bad, proc.stderr)  # a usage error
        assert bad.split("=")[0] in proc.stderr and "streamberg.compact.min_files" not in properties(), bad
    streamberg("table", "--config", str(path), "--set", "streamberg.retention.column=ts", "--set",
               "streamberg.retention.days=3")
    assert policy_of(properties()).settings["maintenance.retention.days"] == 3.0
    streamberg("table", "--config", str(path), "--unset", "streamberg.cluster.strategy")
    assert "streamberg.cluster.strategy" not in properties()


def test_status_of_a_config_of_many_shows_the_governors_fleet_line(tmp_path) -> None:
    """`streamberg status --config fleet.yaml` reads govern.json's fleet line (the governor's
    own record, written every round) into one line under the header."""
    import json
    import time

    from streamberg.common.config import StreambergConfig
    from streamberg.monitoring.collect import governor_state
    from streamberg.monitoring.fleet import FleetStatus, render_fleet

    config = StreambergConfig(kafka={"topic": "t"}, table={"identifier": "db.a"}, ingest={"state_dir": str(tmp_path)})
    (tmp_path / "govern.json").write_text(json.dumps({
        "written_at": time.time() - 4, "actions": [{"table": "db.a", "action": "compact", "waiting_seconds": 12.0}],
        "fleet": {"tables_due": 3, "oldest_wait_seconds": 41.5, "actions_last_minute": 7}}))
    state = governor_state(config)
    assert state is not None and [a["action"] for a in state["actions"]] == ["compact"]
    lines = render_fleet(FleetStatus(governor={**state["fleet"], "written_age_seconds": state["written_age_seconds"]}))
    assert lines.splitlines()[1].startswith("governor: 3 tables due, oldest wait 41.5 s, 7 actions in the last minute")
    assert render_fleet(FleetStatus()).splitlines()[1].startswith("verdict")


def test_bad_govern_settings_are_refused_naming_them(tmp_path) -> None:
    """A govern flag or config key out of its bounds: exit 2 and one line naming it, before any
    table is read or Spark started."""
    from tests.helpers import streamberg

    path = tmp_path / "c.yaml"
    path.write_text("kafka: {topic: t}\ncatalog: {uri: 'sqlite:///cat.db', warehouse: wh}\ntable: {identifier: db.a}\n")
    proc = streamberg("govern", "--config", str(path), "--max-concurrent", "0", "--dry-run", check=False, timeout=60)
    assert proc.returncode == 2 and "max_concurrent: must be an integer between 1 and 64" in proc.stderr
    assert "Traceback" not in proc.stderr
    path.write_text(path.read_text() + "govern: {max_wait_seconds: .nan}\n")
    proc = streamberg("govern", "--config", str(path), "--dry-run", check=False, timeout=60)
    assert proc.returncode == 2 and "govern.max_wait_seconds" in proc.stderr and "Traceback" not in proc.stderr


class _FakeTime:
    """A clock and a stop event in one: a wait moves the clock on (nothing sleeps), and the stop
    is set once the clock passes `until`."""

    def __init__(self, until: float) -> None:
        self.now, self.until, self.waits = 0.0, until, []

    def __call__(self) -> float:
        return self.now

    def is_set(self) -> bool:
        return self.now >= self.until

    def wait(self, seconds: float) -> bool:
        self.waits.append(round(seconds, 6))
        self.now += seconds
        return self.is_set()


def test_a_component_alone_runs_its_action_every_interval_start_to_start() -> None:
    """`streamberg merge` alone is the scheduler over one table: a merge every 10 s measured from
    each start (a 3 s merge waits 7 s), and a merge longer than the interval is followed at once."""
    from streamberg.table_meta.schedule import keep_alone

    fake, starts = _FakeTime(until=45.0), []
    durations = iter([3.0, 12.0, 1.0, 1.0, 1.0, 1.0])

    def run(choice):
        starts.append(fake.now)
        fake.now += next(durations)
        return {"changes": 1}

    every = Due("db.t", "merge", 1.0, "every interval", min_interval_seconds=10.0)
    scheduler = keep_alone(lambda: [every], run, fake, recheck_seconds=10.0, clock=fake)
    assert starts == [0.0, 10.0, 22.0, 32.0, 42.0]
    assert fake.waits[:2] == [7.0, 0.0]  # the 12 s merge ran past its interval: the next starts at once
    assert scheduler.state(fake.now)[0]["failures"] == 0


def test_a_component_alone_checks_between_its_passes_and_never_runs_two_at_once() -> None:
    """`streamberg maintain` alone: a pass every 100 s; the expiry check every 30 s meanwhile
    runs when its probe says so, never in the round of a pass (one action a table a round)."""
    from streamberg.table_meta.schedule import keep_alone

    fake, ran = _FakeTime(until=250.0), []

    def probe():
        due = [Due("db.t", "maintain", 1.0, "every interval", min_interval_seconds=100.0)]
        if 50 <= fake.now < 100 or fake.now >= 200:  # too many snapshots then
            due.append(Due("db.t", "expire", 1.0, "past max_snapshots", min_interval_seconds=0.0))
        return due

    def run(choice):
        ran.append((fake.now, choice.due.action))
        return None

    keep_alone(probe, run, fake, recheck_seconds=30.0, clock=fake)
    assert ran == [(0.0, "maintain"), (60.0, "expire"), (90.0, "expire"), (100.0, "maintain"),
                   (200.0, "maintain"), (230.0, "expire")]
    assert fake.waits[:4] == [30.0, 30.0, 30.0, 10.0]  # rechecks, then up to the pass's time


def test_a_failure_raised_by_the_action_ends_the_loop_alone() -> None:
    """The merge's failure ends `streamberg merge` (its supervisor restarts it): the loop does
    not swallow it."""
    from streamberg.table_meta.schedule import keep_alone

    fake = _FakeTime(until=100.0)

    def run(choice):
        raise RuntimeError("merge failed")

    with pytest.raises(RuntimeError, match="merge failed"):
        keep_alone(lambda: [Due("db.t", "merge", 1.0, "x", 10.0)], run, fake, recheck_seconds=10.0, clock=fake)
    assert fake.now == 0.0


def test_next_at_is_the_next_run_or_retry_still_to_come() -> None:
    scheduler = Scheduler()
    assert scheduler.next_at(0.0) is None  # nothing tracked: nothing waits on time
    (choice,) = scheduler.plan([Due("a", "merge", 1.0, "x", min_interval_seconds=10.0)], 0.0, 1)
    scheduler.ran(choice, 0.0)
    assert scheduler.next_at(4.0) == 10.0
    assert scheduler.next_at(10.0) is None  # already past: the next plan runs it
    (choice,) = scheduler.plan([Due("b", "maintain", 1.0, "y", min_interval_seconds=0.0)], 5.0, 1)
    scheduler.failed(choice, 5.0, "boom")
    assert scheduler.next_at(6.0) == 10.0  # a's interval ends first
    assert scheduler.next_at(11.0) == 5.0 + BACKOFF_BASE_SECONDS  # then b's backoff


def test_maintenance_alone_counts_its_interval_from_the_passs_end() -> None:
    """`streamberg maintain` alone: an interval *between* passes (the governor counts from the
    recorded run's end too): a 20 s pass every 100 s starts at 0, 120 and 240."""
    from streamberg.table_meta.schedule import keep_alone

    fake, starts = _FakeTime(until=300.0), []

    def run(choice):
        starts.append(fake.now)
        fake.now += 20.0
        return None

    every = Due("db.t", "maintain", 1.0, "every interval", min_interval_seconds=100.0)
    keep_alone(lambda: [every], run, fake, recheck_seconds=30.0, clock=fake, from_end=True)
    assert starts == [0.0, 120.0, 240.0]
