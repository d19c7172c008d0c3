"""`streamberg govern`: one process keeps many tables, by need, within a budget.

The governor is given, per table, a *probe* (what is due now, and the problems of its
policy: cheap, no Spark) and a *runner* (run one action: the compactor's, the merge's or
maintenance's own code, on the one Spark session the caller made). Each round it probes every
table, asks the scheduler what to run within the round's budget, runs it, and records the
outcome: a table's failure backs off with its reason while the others go on. The wiring lives
in cli/govern.py; this module imports only common/ and its own floor.

Every round's state (each table's due work, last action, wait, failures, policy problems, and
a fleet line: tables due, oldest wait, actions a minute) is written to `<state_dir>/govern.json`
for `status` and operators.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from streamberg.common.catalog_open import first_line
from streamberg.common.log import get_logger
from streamberg.table_meta.policy import GOVERN_HEARTBEAT_FILE as HEARTBEAT_FILE
from streamberg.table_meta.policy import GOVERN_STATE_FILE as STATE_FILE
from streamberg.table_meta.schedule import Choice, Due, Scheduler


@dataclass
class Keeper:
    """What the governor is given for one table."""

    identifier: str
    probe: Callable[[], tuple[list[Due], list[str]]]  # due actions now, policy problems
    run: Callable[[str], dict[str, Any]]  # run one action ("compact", "merge", "maintain")
    # The name prefix of the streaming queries its actions start (stopped with a timed-out action).
    streams: str | None = None


class Jobs(Protocol):
    """Cancellable work on the one session (common/spark.py JobGroups)."""

    def enter(self, group: str, description: str) -> None: ...
    def leave(self) -> None: ...
    def cancel(self, group: str, query_prefix: str | None = None) -> None: ...


HEARTBEAT_SECONDS = 5.0
ACTION_LOG_ENTRIES = 500  # the governor's last actions kept in govern.json


def _outcome(result: Any) -> dict[str, Any]:
    """An action's result as the log keeps it: its numbers and short words (bytes rewritten,
    files in and out, rows deleted), nothing long."""
    if not isinstance(result, dict):
        return {}
    return {k: v for k, v in list(result.items())[:12]
            if isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) <= 120)}
# `govern --health`: alive when the heartbeat is younger than this.
HEALTHY_WITHIN_SECONDS = 120.0


def health(state_dir: str, now: float | None = None) -> tuple[bool, str]:
    """Whether the governor writing under `state_dir` is alive, and a line saying so."""
    path = Path(state_dir) / HEARTBEAT_FILE
    try:
        beat = json.loads(path.read_text())
        age = (time.time() if now is None else now) - float(beat["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return False, f"no heartbeat at {path}: the governor is not running there (or cannot write it)"
    if age > HEALTHY_WITHIN_SECONDS:
        return False, f"the heartbeat is {age:.0f} s old (> {HEALTHY_WITHIN_SECONDS:.0f} s): the governor is stuck or gone"
    return True, f"alive: heartbeat {age:.0f} s ago, {beat.get('tables_due', '?')} tables due"


class ActionTimedOut(Exception):
    """An action ran past govern.action_timeout_seconds and was cancelled."""


@dataclass
class RoundReport:
    planned: list[Choice] = field(default_factory=list)
    ran: list[dict[str, Any]] = field(default_factory=list)
    due: list[Due] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)

    def plan_lines(self) -> list[str]:
        lines = [f"{c.due.table:<40} {c.due.action:<9} {c.reason}" for c in self.planned]
        waiting = [d for d in self.due if (d.table, d.action) not in {(c.due.table, c.due.action) for c in self.planned}]
        lines += [f"{d.table:<40} {d.action:<9} due, not this round (urgency {d.urgency:.1f}: {d.why})" for d in waiting]
        lines += [f"{table:<40} {'policy':<9} {problem}" for table, found in self.problems.items() for problem in found]
        return lines or ["nothing is due"]


class Governor:
    def __init__(self, keepers: Callable[[], list[Keeper]], scheduler: Scheduler, *, budget: int = 1,
                 concurrent: int = 1, state_dir: str | None = None, clock: Callable[[], float] = time.monotonic,
                 timeout_seconds: float | None = None, jobs: Jobs | None = None) -> None:
        # budget: actions a round; concurrent: of them at once (threads on the one session,
        # each on another table: the scheduler plans one action a table a round).
        # timeout_seconds: an action still running then is cancelled (`jobs`: its Spark jobs
        # and streaming queries) and its table backs off; the round goes on without it.
        self.keepers, self.scheduler, self.budget, self.concurrent = keepers, scheduler, budget, concurrent
        self.timeout_seconds, self.jobs = timeout_seconds, jobs
        self.running: dict[str, threading.Thread] = {}  # table -> an action past its timeout, not ended yet
        self._groups = 0
        self._lock = threading.Lock()
        self.state_path = Path(state_dir) / STATE_FILE if state_dir else None
        # The heartbeat (`govern --health`, a pod's probes): written while the service lives,
        # between probes, while an action runs and while it waits, never only per round.
        self.heartbeat_path = Path(state_dir) / HEARTBEAT_FILE if state_dir else None
        self._beaten = 0.0
        self.clock = clock
        self.log = get_logger("governor")
        self.actions: list[float] = []  # when each action finished (actions a minute)
        # The last actions, newest last: what ran, when, how long, its outcome (status and the dashboard).
        self.log_entries: deque[dict[str, Any]] = deque(maxlen=ACTION_LOG_ENTRIES)
        # The actions running now (table -> action, when it started, why): in the heartbeat as
        # each starts and ends, so the dashboard shows them while they run, not after the round.
        self.in_flight: dict[str, dict[str, Any]] = {}
        self._report: RoundReport | None = None  # the round under way (its due and planned)
        self._state_lock = threading.Lock()

    def round(self, dry_run: bool = False) -> RoundReport:
        report = RoundReport()
        keepers = {k.identifier: k for k in self.keepers()}
        for identifier, keeper in keepers.items():
            self.beat()
            try:
                due, problems = keeper.probe()
            except Exception as exc:  # noqa: BLE001 - a table that cannot be read is its own problem
                due, problems = [], [f"cannot be read: {type(exc).__name__}: {str(exc)[:200]}"]
            report.due += due
            if problems:
                report.problems[identifier] = problems
        now = self.clock()
        with self._lock:  # a table whose cancelled action has not ended yet is not given another
            busy = {t for t, thread in self.running.items() if thread.is_alive()}
        report.planned = self.scheduler.plan([d for d in report.due if d.table not in busy], now, self.budget)
        self._report = report if not dry_run else None
        if not dry_run and self.concurrent > 1 and len(report.planned) > 1:
            with ThreadPoolExecutor(self.concurrent, thread_name_prefix="governor") as pool:
                report.ran = list(pool.map(lambda c: self._run(keepers[c.due.table], c), report.planned))
        elif not dry_run:
            for choice in report.planned:
                report.ran.append(self._run(keepers[choice.due.table], choice))
        if not dry_run:  # a dry run changes nothing, not even the state status reads
            self._write_state(report)
        return report

    def _run(self, keeper: Keeper, choice: Choice) -> dict[str, Any]:
        log = self.log.bind(table=keeper.identifier, action=choice.due.action)
        started = self.clock()
        started_at = time.time()
        log.info("action started", why=choice.reason, waited_seconds=round(choice.waited_seconds, 1))
        with self._lock:
            self.in_flight[keeper.identifier] = {"table": keeper.identifier, "action": choice.due.action,
                                                 "started_at": round(started_at, 1), "why": choice.due.why[:200]}
        self.beat(force=True)  # the heartbeat says what runs (govern.json is the rounds' record)
        try:
            return self._ran(keeper, choice, log, started, started_at)
        finally:
            with self._lock:
                self.in_flight.pop(keeper.identifier, None)
            self.beat(force=True)

    def _ran(self, keeper: Keeper, choice: Choice, log: Any, started: float, started_at: float) -> dict[str, Any]:
        try:
            result = self._bounded(keeper, choice.due.action)
        except Exception as exc:  # noqa: BLE001 - isolated: this table backs off, the others go on
            error = first_line(exc)[:300]
            with self._lock:
                backoff = self.scheduler.failed(choice, self.clock(), error)
                self.log_entries.append({"table": keeper.identifier, "action": choice.due.action,
                                         "started_at": round(started_at, 1), "seconds": round(self.clock() - started, 2),
                                         "ok": False, "why": choice.due.why[:200], "error": error})
            log.warning("action failed; the table backs off, the others go on", error=error,
                        backoff_seconds=backoff)
            return {"table": keeper.identifier, "action": choice.due.action, "ok": False, "error": error}
        finished = self.clock()
        with self._lock:
            self.scheduler.ran(choice, finished, result)
            self.actions.append(finished)
            self.log_entries.append({"table": keeper.identifier, "action": choice.due.action,
                                     "started_at": round(started_at, 1), "seconds": round(finished - started, 2),
                                     "ok": True, "why": choice.due.why[:200], "outcome": _outcome(result)})
        log.info("action finished", seconds=round(finished - started, 2))
        return {"table": keeper.identifier, "action": choice.due.action, "ok": True,
                "seconds": round(finished - started, 2)}

    def _bounded(self, keeper: Keeper, action: str) -> dict[str, Any]:
        """Run one action on a thread of its own, within the timeout: past it, its Spark jobs
        and streaming queries are cancelled and ActionTimedOut raised (the thread is left to
        end; its table gets no other action until it has)."""
        with self._lock:
            self._groups += 1
            group = f"streamberg-govern-{self._groups}"
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                if self.jobs is not None:
                    self.jobs.enter(group, f"streamberg govern: {action} {keeper.identifier}")
                outcome["result"] = keeper.run(action)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                outcome["error"] = exc
            finally:
                if self.jobs is not None:
                    self.jobs.leave()
                done.set()

        thread = threading.Thread(target=work, name=f"governor-{keeper.identifier}", daemon=True)
        thread.start()
        deadline = None if self.timeout_seconds is None else time.monotonic() + self.timeout_seconds
        while not done.wait(HEARTBEAT_SECONDS if deadline is None else
                            max(0.0, min(HEARTBEAT_SECONDS, deadline - time.monotonic()))):
            self.beat()
            if deadline is not None and time.monotonic() >= deadline:
                break
        if not done.is_set():
            with self._lock:
                self.running[keeper.identifier] = thread
            if self.jobs is not None:
                self.jobs.cancel(group, keeper.streams if action == "compact" else None)
            raise ActionTimedOut(f"{action} ran past govern.action_timeout_seconds ({self.timeout_seconds:g} s); "
                                 "its Spark jobs were cancelled")
        if "error" in outcome:
            raise outcome["error"]
        result: dict[str, Any] = outcome["result"]
        return result

    def beat(self, force: bool = False) -> None:
        """Write the heartbeat (at most every HEARTBEAT_SECONDS); a failure to write is logged
        once, never raised (the probe then says the service is not well)."""
        now = time.monotonic()
        if self.heartbeat_path is None or (not force and now - self._beaten < HEARTBEAT_SECONDS):
            return
        with self._state_lock:  # beats of several threads: the last line computed is the last written
            with self._lock:
                self._beaten = now
                # What runs now, as each action starts and ends (the dashboard shows it): govern.json
                # is the rounds' record, written when a round ends.
                line = {**self.fleet_line(), "running": list(self.in_flight.values())}
            try:
                self.heartbeat_path.parent.mkdir(parents=True, exist_ok=True)
                temporary = self.heartbeat_path.with_suffix(f".{threading.get_ident()}.tmp")
                temporary.write_text(json.dumps({"at": time.time(), "pid": os.getpid(), **line}))
                os.replace(temporary, self.heartbeat_path)
            except OSError as exc:
                self.log.warning("heartbeat not written", path=str(self.heartbeat_path), error=str(exc)[:200])

    def fleet_line(self) -> dict[str, Any]:
        now = self.clock()
        recent = [t for t in self.actions if now - t <= 60]
        return {"tables_due": len({t["table"] for t in self.scheduler.state(now) if t["waiting_seconds"] is not None}),
                "oldest_wait_seconds": round(self.scheduler.oldest_wait(now), 1),
                "actions_last_minute": len(recent)}

    def _write_state(self, report: RoundReport | None) -> None:
        if self.state_path is None or report is None:
            return
        with self._lock:  # the scheduler's state and the log change on the actions' threads
            document = {"written_at": time.time(), "fleet": self.fleet_line(),
                        "actions": self.scheduler.state(self.clock()), "problems": report.problems,
                        "due": [{"table": d.table, "action": d.action, "urgency": round(d.urgency, 2), "why": d.why}
                                for d in report.due],
                        "planned": [{"table": c.due.table, "action": c.due.action, "reason": c.reason}
                                    for c in report.planned],
                        "concurrency": self.concurrent, "budget": self.budget, "log": list(self.log_entries)}
        with self._state_lock:  # actions on several threads start and end at once
            try:
                self.state_path.parent.mkdir(parents=True, exist_ok=True)
                temporary = self.state_path.with_suffix(".tmp")
                temporary.write_text(json.dumps(document, indent=1))
                os.replace(temporary, self.state_path)
            except OSError as exc:  # what status reads goes stale; the actions go on
                self.log.warning("governor state not written", path=str(self.state_path), error=str(exc)[:200])

    def run(self, stop: threading.Event, interval_seconds: float, rounds: int | None = None) -> int:
        """Rounds until `stop` (or `rounds` of them); returns how many ran."""
        done = 0
        self.beat(force=True)
        while not stop.is_set() and (rounds is None or done < rounds):
            report = self.round()
            done += 1
            self.log.info("round", planned=len(report.planned), due=len(report.due), **self.fleet_line())
            if not report.planned:
                idle_until = time.monotonic() + interval_seconds
                while not stop.is_set() and time.monotonic() < idle_until:
                    self.beat()
                    stop.wait(min(HEARTBEAT_SECONDS, max(0.0, idle_until - time.monotonic())))
        return done
