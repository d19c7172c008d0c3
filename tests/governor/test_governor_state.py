"""The governor's state file says what runs while it runs (the dashboard's governor page and
fleet summary read it): an action is listed from its start to its end, not only after the round."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from streamberg.common.policy import GOVERN_STATE_FILE
from streamberg.governor.app import Governor, Keeper
from streamberg.governor.scheduler import Due, Scheduler
from streamberg.monitoring.dashboard.views import fleet_page, governor_document, governor_page
from streamberg.monitoring.fleet import FleetStatus


def _state(folder: Path) -> dict:
    return json.loads((folder / GOVERN_STATE_FILE).read_text())


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
        deadline = time.monotonic() + 30
        while True:  # the quick action's end is written after it returned
            state = _state(tmp_path)
            if [e["table"] for e in state["log"]] == ["db.quick"]:
                break
            assert time.monotonic() < deadline, state
            time.sleep(0.02)
        assert [(r["table"], r["action"]) for r in state["running"]] == [("db.held", "maintain")]
        assert state["running"][0]["why"] == "maintain is due on db.held"
        page = governor_page(governor_document(str(tmp_path)), None)
        assert [r["table"] for r in page["running_now"]] == ["db.held"] and page["running_now"][0]["seconds"] >= 0
        assert fleet_page(FleetStatus(), governor_document(str(tmp_path)), None)["summary"]["running"] == 1
    finally:
        release.set()
        round_thread.join(60)
    state = _state(tmp_path)
    assert state["running"] == [] and sorted(e["table"] for e in state["log"]) == ["db.held", "db.quick"]
    assert all(e["ok"] for e in state["log"])
