"""Planner rules on real pyiceberg tables (SQLite catalog, Parquet files); no Spark needed."""

from __future__ import annotations

from streamberg.compactor.planner import plan_rewrite
from streamberg.compactor.runs import PlanningRules
from tests.compactor.helpers import DAY, FakeIngest, reload, setup_table

OFF = dict(min_files=None, min_bytes=None, max_delay_seconds=None, every_n_snapshots=None)


def _ingested(tmp_path, commits: int, rows: int = 200, **row_kwargs):
    config, _ = setup_table(tmp_path, partition_spec=DAY)
    ingest = FakeIngest(config)
    snaps = [ingest.append(rows, **row_kwargs) for _ in range(commits)]
    return config, reload(config), snaps


def test_pending_files_grouped_per_partition(tmp_path) -> None:
    _, table, snaps = _ingested(tmp_path, commits=3, days=2)
    plan = plan_rewrite(table, PlanningRules(**{**OFF, "min_files": 1}))
    partitions = {g.partition for g in plan.groups}
    assert len(partitions) == len(plan.groups) == 2  # two days, one group each
    assert plan.files == plan.live_data_files == 6  # every append wrote one file per day
    assert plan.starting_snapshot_id == snaps[-1].snapshot_id
    for group in plan.groups:
        assert len({f.partition for f in group.files}) == 1
        assert set(group.snapshot_ids) == {s.snapshot_id for s in snaps}


def test_min_files_defers_small_partitions(tmp_path) -> None:
    _, table, _ = _ingested(tmp_path, commits=3, days=2)
    deferred = plan_rewrite(table, PlanningRules(**{**OFF, "min_files": 4}))
    assert not deferred.groups and len(deferred.deferred) == 2
    assert all(d.files == 3 for d in deferred.deferred)
    acted = plan_rewrite(table, PlanningRules(**{**OFF, "min_files": 3}))
    assert len(acted.groups) == 2 and all("min_files" in g.reasons[0] for g in acted.groups)


def test_min_bytes_counts_pending_bytes(tmp_path) -> None:
    _, table, _ = _ingested(tmp_path, commits=2, days=1)
    plan_all = plan_rewrite(table, PlanningRules(**{**OFF, "min_files": 1}))
    size = plan_all.groups[0].size_bytes
    assert not plan_rewrite(table, PlanningRules(**{**OFF, "min_bytes": size + 1})).groups
    assert plan_rewrite(table, PlanningRules(**{**OFF, "min_bytes": size})).groups


def test_max_delay_uses_commit_time_of_oldest_pending_file(tmp_path) -> None:
    _, table, snaps = _ingested(tmp_path, commits=2, days=1)
    oldest_ms = snaps[0].timestamp_ms
    rules = PlanningRules(**{**OFF, "max_delay_seconds": 60})
    assert not plan_rewrite(table, rules, now_ms=oldest_ms + 59_000).groups
    late = plan_rewrite(table, rules, now_ms=oldest_ms + 61_000)
    assert late.groups and "max_delay_seconds" in late.groups[0].reasons[0]


def test_every_n_snapshots_is_table_wide(tmp_path) -> None:
    config, _, _ = _ingested(tmp_path, commits=2, days=1)
    ingest = FakeIngest(config, seed=9)
    ingest.next_id = 10_000
    table = reload(config)
    rules = PlanningRules(**{**OFF, "every_n_snapshots": 3})
    assert not plan_rewrite(table, rules).groups
    ingest.append(50, days=1)
    plan = plan_rewrite(reload(config), rules)
    assert plan.pending_snapshots == 3 and plan.groups and "every_n_snapshots" in plan.groups[0].reasons[0]


def test_up_to_sequence_number_leaves_later_commits_for_the_next_batch(tmp_path) -> None:
    _, table, snaps = _ingested(tmp_path, commits=3, days=1)
    bound = snaps[1].sequence_number
    plan = plan_rewrite(table, PlanningRules(**{**OFF, "min_files": 1}), up_to_sequence_number=bound)
    assert {s for g in plan.groups for s in g.snapshot_ids} == {snaps[0].snapshot_id, snaps[1].snapshot_id}


def test_large_partitions_split_into_groups_oldest_first(tmp_path) -> None:
    _, table, snaps = _ingested(tmp_path, commits=4, days=1)
    one = plan_rewrite(table, PlanningRules(**{**OFF, "min_files": 1}))
    sizes = sorted(f.size_bytes for f in one.groups[0].files)
    cap = sizes[-1] + sizes[-2]  # at most two files fit a group
    split = plan_rewrite(table, PlanningRules(**{**OFF, "min_files": 1, "max_group_bytes": cap}))
    assert len(split.groups) >= 2
    assert all(g.size_bytes <= cap for g in split.groups)
    assert sorted(p for g in split.groups for p in g.paths) == sorted(one.groups[0].paths)
    order = [f.sequence_number for g in split.groups for f in g.files]
    assert order == sorted(order)
    assert split.groups[0].snapshot_ids[0] == snaps[0].snapshot_id


def test_full_mode_takes_every_file_without_rules(tmp_path) -> None:
    _, table, _ = _ingested(tmp_path, commits=2, days=2)
    plan = plan_rewrite(table, PlanningRules(**{**OFF, "min_files": 100}), mode="full")
    assert plan.files == plan.live_data_files and all(g.reasons == ("full",) for g in plan.groups)


def test_commit_batches_bound_the_number_of_commits(tmp_path) -> None:
    _, table, _ = _ingested(tmp_path, commits=1, days=5)
    plan = plan_rewrite(table, PlanningRules(**{**OFF, "min_files": 1}))
    assert len(plan.groups) == 5
    batches = plan.commit_batches(2)
    assert len(batches) == 2 and [g.index for b in batches for g in b] == [g.index for g in plan.groups]
    assert len(plan.commit_batches(10)) == 5


def test_empty_table_plans_nothing(tmp_path) -> None:
    _, table = setup_table(tmp_path)
    plan = plan_rewrite(table, PlanningRules())
    assert plan.starting_snapshot_id is None and not plan.groups


def test_every_pass_and_the_dry_run_plan_with_the_same_target_size(tmp_path) -> None:
    """One rule for the size of a rewritten file: compactor.target_file_size_bytes, else the
    table's write.target-file-size-bytes, else table.target_file_size_bytes. The size tiers of
    runs are in units of it, so a dry run that used another size would promise another plan."""
    from streamberg.compactor.planner import PassPlanner
    from streamberg.table_meta.table_files import TARGET_SIZE_PROPERTY

    config, table, _ = _ingested(tmp_path, commits=2)
    table_default = int(table.properties[TARGET_SIZE_PROPERTY])
    assert table_default == config.table.target_file_size_bytes
    assert PassPlanner(config.compactor, config.target, ()).target_file_size(table) == table_default
    own = config.compactor.model_copy(update={"target_file_size_bytes": 4096})
    planner = PassPlanner(own, config.target, ("user_id",))
    assert planner.target_file_size(table) == 4096
    plan = planner.plan(table, "full")
    assert plan.groups
    direct = plan_rewrite(table, planner.rules, mode="full", columns=("user_id",), target_file_size_bytes=4096)
    assert plan.groups == direct.groups


def test_a_keeper_of_many_tables_replans_an_unchanged_table_without_listing_it_again(tmp_path, monkeypatch) -> None:
    """The governor's compact executors share one manifest cache (cli/govern.py): replanning
    two unchanged tables lists neither again; a commit to one lists that one, and every plan
    equals one made with nothing kept."""
    import streamberg.table_meta.table_files as table_files
    from streamberg.common.catalog import load_catalog
    from streamberg.compactor.app import CompactOptions, dry_run
    from streamberg.compactor.executor import CompactExecutor
    from streamberg.table_meta.declared import ensure_table
    from streamberg.table_meta.table_files import ManifestCache

    listings = []
    real = table_files._live_data_files
    monkeypatch.setattr(table_files, "_live_data_files", lambda *a: listings.append(1) or real(*a))
    config, _ = setup_table(tmp_path, partition_spec=DAY, compactor={"min_files": 2})
    other = config.model_copy(update={"table": config.table.model_copy(update={"identifier": "db.other"})})
    ensure_table(load_catalog(config.catalog), other.table)
    ingests = [FakeIngest(config, seed=1), FakeIngest(other, seed=2)]
    for ingest in ingests:
        for _ in range(3):
            ingest.append(100, days=2)
    cache = ManifestCache()
    keepers = [(c, CompactExecutor(replan_seconds=0.0, cache=cache)) for c in (config, other)]

    def plans() -> list[dict]:
        return [executor.plan(c, reload(c)) for c, executor in keepers]

    def fresh(c) -> dict:
        return dry_run(c, CompactOptions(dry_run=True), reload(c))  # a cache of its own

    first = plans()
    assert len(listings) == 2 and [p["files"] for p in first] == [6, 6]
    assert plans() == first and len(listings) == 2  # replanned (replan_seconds 0), nothing listed again
    ingests[0].append(100, days=2)
    third = plans()
    assert len(listings) == 3 and third[0]["files"] == 8 and third[1] == first[1]
    listings.clear()
    assert third == [fresh(c) for c in (config, other)] and len(listings) == 2


def test_a_listing_reads_only_unread_manifests_side_by_side(tmp_path, monkeypatch) -> None:
    """The manifests a cache holds are not worth a thread: a listing after one more commit
    reads its one new manifest inline (no pool), one with a cache of its own reads all of them
    side by side, and both list the same files."""
    from concurrent.futures import ThreadPoolExecutor

    import streamberg.table_meta.table_files as table_files
    from streamberg.table_meta.table_files import ManifestCache, live_data_files

    pools: list[int] = []

    class Counted(ThreadPoolExecutor):
        def __init__(self, max_workers: int) -> None:
            pools.append(max_workers)
            super().__init__(max_workers=max_workers)

    monkeypatch.setattr(table_files, "ThreadPoolExecutor", Counted)
    config, _ = setup_table(tmp_path, partition_spec=DAY)
    ingest = FakeIngest(config)
    for _ in range(3):
        ingest.append(100, days=2)
    kept = ManifestCache()
    first, _ = live_data_files(reload(config), kept)
    assert len(first) == 6 and pools == [3]  # three manifests, none read before: side by side
    ingest.append(100, days=2)
    second, _ = live_data_files(reload(config), kept)
    assert len(second) == 8 and pools == [3]  # one new manifest, read inline
    alone, _ = live_data_files(reload(config), ManifestCache())
    assert pools == [3, 4]
    assert sorted((f.path, f.record_count) for f in alone) == sorted((f.path, f.record_count) for f in second)
    assert sum(f.record_count for f in second) == 400  # the test's four appends of 100 rows
