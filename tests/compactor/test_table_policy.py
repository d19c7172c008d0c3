"""A table is kept alike whoever keeps it (issue 39): `streamberg compact` (and merge,
maintain, status) read the table's own `streamberg.*` settings over the config's, as the
governor does (table_meta/policy.effective)."""

from __future__ import annotations

import pytest

from streamberg.compactor.app import CompactOptions, run_compact
from streamberg.monitoring.collect import collect_status
from streamberg.monitoring.health import with_health
from streamberg.table_meta.summary_keys import SummaryKeys
from tests.compactor.helpers import FakeIngest, compactor_snapshots, reload, row_multiset, setup_table, summary

pytestmark = pytest.mark.spark


def test_compact_clusters_by_the_tables_own_columns_and_status_names_a_missing_one(spark, tmp_path) -> None:
    config, table = setup_table(tmp_path, compactor={"columns": ["user_id", "city"]})
    with table.transaction() as tx:
        tx.set_properties({"streamberg.cluster.columns": "city", "streamberg.cluster.strategy": "hilbert"})
    ingest = FakeIngest(config, seed=41)
    for _ in range(3):
        ingest.append(200, days=1)
    rows = row_multiset(reload(config))
    out = run_compact(config, CompactOptions(once=True), spark=spark)
    assert out["columns"] == ["city"] and out["strategy"] == "hilbert", out
    written = summary(compactor_snapshots(reload(config))[-1])
    assert written[SummaryKeys.COMPACTOR_COLUMNS] == "city" and written[SummaryKeys.COMPACTOR_STRATEGY] == "hilbert"
    assert row_multiset(reload(config)) == rows

    # status judges the table as it is kept, and names a policy column the table lacks.
    with reload(config).transaction() as tx:
        tx.set_properties({"streamberg.cluster.columns": "city,no_such_column"})
    status = with_health(collect_status(config), config)
    assert any(p.startswith("streamberg.cluster.columns: no_such_column not a column") for p in status.policy_problems), \
        status.policy_problems
    assert any("no_such_column" in r for r in status.health.reasons) and status.health.verdict != "ok"
