"""Expiry never drops dead letters not yet applied (table_meta/dead_letter_outbox.py).

The ingest names an interval's dead-letter file in its own snapshot, then appends it to the
dead-letter table. Here the real writer and committer run in process and the second step is
kept from happening (as a kill -9 between the two commits would): until a committer opens
again and applies the file, the snapshot naming it is its only record, and maintenance with
every snapshot past its age keeps it, saying why. Once applied, the next run expires it, and
every dead letter is in the dead-letter table exactly once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import streamberg.ingest.committer as committer_module
from streamberg.common.catalog import load_catalog
from streamberg.maintenance.app import MaintainOptions, run_maintain
from streamberg.table_meta.offsets import summary_properties
from streamberg.table_meta.summary_keys import SummaryKeys
from tests.helpers import config_at, dead_letters, write_config
from tests.runbooks.inprocess import event, ingest_until, produce_values

pytestmark = pytest.mark.spark


def test_snapshots_naming_unapplied_dead_letters_survive_expiry(tmp_path: Path, broker: str, spark,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_at(write_config(tmp_path, broker, extra={"maintenance": {
        "expire": {"max_snapshot_age_seconds": 0.001, "min_snapshots_to_keep": 1, "keep_pending_for_compactor": False},
        "orphan": {"enabled": False}}}))
    produce_values(config, [event(i) for i in range(50)] + [b"not json"], 0, 1)
    ingest_until(config, {0: 51})
    assert dead_letters(config).num_rows == 1

    # The dead-letter append never happens (a crash between the two commits), twice over.
    monkeypatch.setattr(committer_module, "apply_dead_letter_files", lambda *args, **kwargs: 0)
    produce_values(config, [b"{broken", b"[1, 2]"] + [event(i) for i in range(50, 60)], 0, 1)
    ingest_until(config, {0: 63})
    produce_values(config, [event(i) for i in range(60, 70)], 0, 1)
    ingest_until(config, {0: 73})
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    naming = [s.snapshot_id for s in table.snapshots()
              if summary_properties(s).get(SummaryKeys.DEAD_LETTER_FILE) and s.snapshot_id != table.snapshots()[0].snapshot_id]
    assert len(naming) == 1 and dead_letters(config).num_rows == 1

    run = run_maintain(config, MaintainOptions(once=True), spark=spark).last
    expire = run["expire_snapshots"]
    assert expire["ran"] and "error" not in expire and naming[0] in expire["protected_snapshot_ids"], (expire, [(s.snapshot_id, s.timestamp_ms, s.sequence_number) for s in table.snapshots()])
    assert any("dead letters the dead-letter table does not hold yet" in p["reason"] for p in expire["protected"])
    remaining = {s.snapshot_id for s in load_catalog(config.catalog).load_table(config.table.identifier).snapshots()}
    assert naming[0] in remaining and len(remaining) == 2  # it and the newer one; the first is gone

    # A committer opens again and applies the file; then the snapshot may go.
    monkeypatch.undo()
    ingest_until(config, {0: 73})
    letters = dead_letters(config).to_pylist()
    assert sorted(d["offset"] for d in letters) == [50, 51, 52]
    run = run_maintain(config, MaintainOptions(once=True), spark=spark).last
    remaining = {s.snapshot_id for s in load_catalog(config.catalog).load_table(config.table.identifier).snapshots()}
    assert naming[0] not in remaining, run["expire_snapshots"]
    assert sorted(d["offset"] for d in dead_letters(config).to_pylist()) == [50, 51, 52]
