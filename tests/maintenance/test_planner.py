"""What maintenance decides, on real pyiceberg tables (SQLite catalog, Parquet); no Spark."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from streamberg.common.config import ExpireConfig, ManifestsConfig, RetentionConfig
from streamberg.common.errors import RetentionColumnError
from streamberg.maintenance.expire import pending_append_snapshots, plan_expire
from streamberg.maintenance.manifests import plan_manifests
from streamberg.maintenance.retention import plan_retention
from streamberg.table_meta.offsets import ancestry, committed_position
from tests.compactor.helpers import BASE_TS, DAY, TOPIC, FakeIngest, reload
from tests.maintenance.helpers import setup_maintained

# Every snapshot is "old": only the safety rules can keep one.
ANY_AGE = dict(max_snapshot_age_seconds=0.001, min_snapshots_to_keep=1)


def _now_ms() -> int:
    return int(time.time() * 1000) + 1000


def test_ingest_lineage_is_kept_behind_snapshots_without_offsets(tmp_path) -> None:
    config, _ = setup_maintained(tmp_path, partition_spec=DAY)
    ingest = FakeIngest(config)
    appends = [ingest.append(100, days=1) for _ in range(4)]
    table = reload(config)
    table.delete("id < 10")  # snapshots without offsets on top of the last ingest commit
    reload(config).delete("id >= 390")
    table = reload(config)
    lineage = ancestry(table)
    assert lineage[2].snapshot_id == appends[-1].snapshot_id

    plan = plan_expire(table, ExpireConfig(**ANY_AGE, keep_pending_for_compactor=False), TOPIC, _now_ms())

    position = committed_position(table, TOPIC)
    assert position.snapshot_id == appends[-1].snapshot_id
    chain = [s.snapshot_id for s in lineage[:3]]
    assert plan.protected_ids == chain
    assert plan.retain_last == 3 and plan.older_than_ms <= position.timestamp_ms
    assert set(plan.expired_ids) == {s.snapshot_id for s in appends[:-1]}
    # The configuration alone (keep 1, any age) would have expired the two below the current one.
    assert set(plan.held_back_ids) == set(chain[1:])
    assert "ingest position" in plan.protected[-1].reason and plan.refusal is None


def test_appends_with_pending_files_are_kept(tmp_path) -> None:
    config, _ = setup_maintained(tmp_path)
    ingest = FakeIngest(config)
    appends = [ingest.append(100) for _ in range(4)]
    table = reload(config)
    pending = pending_append_snapshots(table)
    assert set(pending) == {s.snapshot_id for s in appends}

    plan = plan_expire(table, ExpireConfig(**ANY_AGE), TOPIC, _now_ms())
    assert plan.expired_ids == ()
    assert set(plan.protected_ids) == set(pending)
    assert plan.older_than_ms <= min(pending.values())
    assert set(plan.held_back_ids) == {s.snapshot_id for s in appends[:-1]}

    # Without the compactor rule only the ingest position (the current snapshot) is kept.
    off = plan_expire(table, ExpireConfig(**ANY_AGE, keep_pending_for_compactor=False), TOPIC, _now_ms())
    assert set(off.expired_ids) == {s.snapshot_id for s in appends[:-1]}


def test_an_append_whose_files_are_all_gone_is_no_longer_protected(tmp_path) -> None:
    config, _ = setup_maintained(tmp_path)
    ingest = FakeIngest(config)
    appends = [ingest.append(100) for _ in range(3)]
    reload(config).delete("id < 100")  # every row of the first append: its file is dropped whole
    table = reload(config)
    assert set(pending_append_snapshots(table)) == {s.snapshot_id for s in appends[1:]}

    plan = plan_expire(table, ExpireConfig(**ANY_AGE), TOPIC, _now_ms())
    assert plan.expired_ids == (appends[0].snapshot_id,)


def test_age_and_count_bounds_apply_when_nothing_needs_protection(tmp_path) -> None:
    config, _ = setup_maintained(tmp_path)
    ingest = FakeIngest(config)
    appends = [ingest.append(50) for _ in range(5)]
    table = reload(config)
    settings = dict(keep_pending_for_compactor=False)
    keep3 = plan_expire(table, ExpireConfig(max_snapshot_age_seconds=0.001, min_snapshots_to_keep=3, **settings),
                        TOPIC, _now_ms())
    assert keep3.expired_ids == tuple(s.snapshot_id for s in appends[:2])
    young = plan_expire(table, ExpireConfig(max_snapshot_age_seconds=3600, **settings), TOPIC, _now_ms())
    assert young.expired_ids == ()
    # A snapshot exactly at the cutoff is kept (Iceberg expires strictly older ones).
    at = plan_expire(table, ExpireConfig(max_snapshot_age_seconds=1, **settings), TOPIC,
                     appends[2].timestamp_ms + 1000)
    assert set(at.expired_ids) == {s.snapshot_id for s in appends if s.timestamp_ms < appends[2].timestamp_ms}


def test_manifest_thresholds(tmp_path) -> None:
    config, _ = setup_maintained(tmp_path)
    ingest = FakeIngest(config)
    for _ in range(5):
        ingest.append(50)
    table = reload(config)
    count = len(table.current_snapshot().manifests(table.io))
    total = sum(m.manifest_length for m in table.current_snapshot().manifests(table.io))
    assert count == 5  # one manifest per fast append
    assert not plan_manifests(table, ManifestsConfig(min_count=count + 1, min_total_bytes=None)).run
    by_count = plan_manifests(table, ManifestsConfig(min_count=count, min_total_bytes=None))
    assert by_count.run and by_count.reasons == (f"min_count: {count} >= {count}",)
    assert not plan_manifests(table, ManifestsConfig(min_count=None, min_total_bytes=total + 1)).run
    assert plan_manifests(table, ManifestsConfig(min_count=None, min_total_bytes=total)).run


@pytest.mark.parametrize(("spec", "aligned"), [(DAY, "day"), (None, None)])
def test_retention_cutoff_rounds_down_to_whole_partitions(tmp_path, spec, aligned) -> None:
    config, table = setup_maintained(tmp_path, partition_spec=spec)
    now = BASE_TS + dt.timedelta(days=3, hours=6)
    plan = plan_retention(table, RetentionConfig(column="ts", days=2), int(now.timestamp() * 1000))
    assert plan.requested_cutoff == BASE_TS + dt.timedelta(days=1, hours=6)
    assert plan.aligned_to == aligned
    expected = BASE_TS + dt.timedelta(days=1) if aligned else plan.requested_cutoff
    assert plan.cutoff == expected and plan.kind == "timestamptz"
    assert plan.sql_literal() == f"TIMESTAMP '{expected.strftime('%Y-%m-%d %H:%M:%S.%f')}'"
    assert plan_retention(table, RetentionConfig(), 0) is None
    with pytest.raises(RetentionColumnError, match="'city' is string"):
        plan_retention(table, RetentionConfig(column="city", days=1), 0)


def test_a_branch_retention_that_would_expire_protected_snapshots_is_refused(tmp_path) -> None:
    config, _ = setup_maintained(tmp_path)
    ingest = FakeIngest(config)
    appends = [ingest.append(50) for _ in range(3)]
    reload(config).delete("id >= 140")  # a snapshot without offsets on top of the last ingest commit
    table = reload(config)
    # main's own settings win over the call's in Iceberg: keep 1, any age.
    with table.manage_snapshots() as manage:
        manage.create_branch(table.current_snapshot().snapshot_id, "main", max_snapshot_age_ms=1,
                             min_snapshots_to_keep=1)
    table = reload(config)
    plan = plan_expire(table, ExpireConfig(**ANY_AGE), TOPIC, _now_ms())
    assert plan.refusal is not None and str(appends[-1].snapshot_id) in plan.refusal
