"""The governor's heartbeat says what runs while it runs (the dashboard's governor page and
fleet summary read it): an action is listed from its start to its end, not only after the
round; govern.json stays the rounds' record, written when a round ends."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from streamberg.governor.app import Governor, Keeper
from streamberg.monitoring.collect import governor_document
from streamberg.monitoring.dashboard.views import fleet_page, governor_page, heartbeat_document
from streamberg.monitoring.fleet import FleetStatus
from streamberg.table_meta.policy import GOVERN_HEARTBEAT_FILE, GOVERN_STATE_FILE
from streamberg.table_meta.schedule import Due, Scheduler
from tests.helpers import wait_for


def _state(folder: Path) -> dict:
    return json.loads((folder / GOVERN_STATE_FILE).read_text())


def _beat(folder: Path) -> dict:
    try:
        return json.loads((folder / GOVERN_HEARTBEAT_FILE).read_text())
    except (OSError, ValueError):
        return {}


def test_an_action_is_in_the_state_while_it_runs(tmp_path: Path) -> None:
    release, quick_done = threading.Event(), threading.Event()

    def held(action: str) -> dict:
        assert release.wait(60), "never released"
        return {"ok": True}

    def quick(action: str) -> dict:
        quick_done.set()
        return {"ok": True}

    def due(table: str, action: str):
        return lambda: ([Due(table, action, 1.0, f"{action} is due on {table}", 0.0)], [])

    governor = Governor(lambda: [Keeper("db.held", due("db.held", "maintain"), held),
                                 Keeper("db.quick", due("db.quick", "compact"), quick)],
                        Scheduler(max_wait_seconds=600), budget=2, concurrent=2, state_dir=str(tmp_path))
    round_thread = threading.Thread(target=governor.round)
    round_thread.start()
    try:
        assert quick_done.wait(30)
        def held_alone() -> dict | None:  # the quick action's end is beaten after it returned
            beat = _beat(tmp_path)
            return beat if [r["table"] for r in beat.get("running", [])] == ["db.held"] else None

        beat = wait_for(held_alone, 30, "the heartbeat listing db.held alone", every=0.02,
                        log=lambda: json.dumps(_beat(tmp_path)))
        assert beat["running"][0]["action"] == "maintain" and beat["running"][0]["why"] == "maintain is due on db.held"
        assert not (tmp_path / GOVERN_STATE_FILE).exists()  # the round has not ended: no record of it yet
        page = governor_page(governor_document(str(tmp_path)), None, heartbeat_document(str(tmp_path)))
        assert [r["table"] for r in page["running_now"]] == ["db.held"] and page["running_now"][0]["seconds"] >= 0
        assert fleet_page(FleetStatus(), None, None, None, heartbeat_document(str(tmp_path)))["summary"]["running"] == 1
    finally:
        release.set()
        round_thread.join(60)
    state = _state(tmp_path)
    assert _beat(tmp_path)["running"] == [] and sorted(e["table"] for e in state["log"]) == ["db.held", "db.quick"]
    assert all(e["ok"] for e in state["log"])
