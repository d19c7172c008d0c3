"""The one scheduler: which table's which action runs next, and when, for the governor's fleet
and for a component started alone (`streamberg merge`, `streamberg maintain`: the same
scheduler over one table, `keep_alone`).

Pure bookkeeping (no Spark, no catalog): it is handed what each table needs now (`Due`), it
answers what to run (`Choice`), in order, within the round's budget, and when the next action
could run (`next_at`).

- **Need**: each due action has an urgency in comparable units: how many times its trigger
  is passed (files waiting / the compactor's min_files; a change log's oldest pending
  change's age / merge.interval_seconds; time since maintenance / its interval).
- **Fairness**: an action that could have run for `max_wait_seconds` or longer (due, and past
  its own minimum interval and backoff) goes before every other, the longest waiting first,
  so a hot table cannot keep a quiet one waiting past the bound (given a budget that fits the
  due work at all: starvation is then measured, `oldest_wait`).
- **Minimum interval**: a table's action does not run again within the table's
  `streamberg.govern.min_interval_seconds` of its last run.
- **Failures**: a failed action backs off (30 s doubled per failure, at most 15 min) with its
  reason kept for status; the other tables go on.

A component started alone asks the same rules of one table (`keep_alone`): an action every
`min_interval_seconds` measured start to start (its own time included, so a change waits at most
one interval for the next merge to start) or, for maintenance, from the previous run's end (as
the governor measures it), checked again every `recheck_seconds` meanwhile (the expiry
maintenance runs between its passes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamberg.table_meta.keeping import Due, backoff

BACKOFF_BASE_SECONDS = 30.0
BACKOFF_MAX_SECONDS = 900.0


@dataclass(frozen=True)
class Choice:
    due: Due
    waited_seconds: float
    reason: str  # why it was chosen now: "waited past the bound" or "most urgent"


@dataclass
class _Track:
    due_since: float | None = None
    min_interval: float = 0.0  # the action's own, as its last Due said
    eligible_at: float = 0.0  # when it could run (past its minimum interval and backoff)
    last_run: float | None = None
    failures: int = 0
    retry_at: float = 0.0
    last_error: str | None = None
    last_result: dict[str, Any] | None = None


@dataclass
class Scheduler:
    max_wait_seconds: float = 600.0
    tracks: dict[tuple[str, str], _Track] = field(default_factory=dict)

    def plan(self, due: list[Due], now: float, budget: int) -> list[Choice]:
        """Up to `budget` actions to run now, in order, at most one a table."""
        seen = {(d.table, d.action) for d in due}
        for key, track in self.tracks.items():  # no longer due: its wait ends
            if key not in seen:
                track.due_since = None
        ready: list[tuple[tuple[int, float], Choice]] = []
        for d in due:
            track = self.tracks.setdefault((d.table, d.action), _Track())
            if track.due_since is None:
                track.due_since = now
            track.min_interval = d.min_interval_seconds
            # It waits from when it could run: not while its own minimum interval or backoff
            # holds it (that is the table's policy, not another table starving it).
            rested = track.last_run + d.min_interval_seconds if track.last_run is not None else track.due_since
            track.eligible_at = max(track.due_since, rested, track.retry_at)
            if now < track.eligible_at:
                continue
            waited = now - track.eligible_at
            if waited >= self.max_wait_seconds:
                ready.append(((0, -waited), Choice(d, waited, f"waited {waited:.0f} s, past the {self.max_wait_seconds:.0f} s bound")))
            else:
                ready.append(((1, -d.urgency), Choice(d, waited, f"urgency {d.urgency:.1f}: {d.why}")))
        ready.sort(key=lambda item: item[0])
        chosen: list[Choice] = []
        for _, choice in ready:  # one action a table a round: two at once on one table would race
            if len(chosen) < budget and all(c.due.table != choice.due.table for c in chosen):
                chosen.append(choice)
        return chosen

    def ran(self, choice: Choice, now: float, result: dict[str, Any] | None = None) -> None:
        track = self.tracks[(choice.due.table, choice.due.action)]
        track.last_run, track.due_since, track.failures, track.retry_at = now, None, 0, 0.0
        track.last_error, track.last_result = None, result

    def failed(self, choice: Choice, now: float, error: str) -> float:
        """Record a failure; returns the backoff before the next try."""
        track = self.tracks[(choice.due.table, choice.due.action)]
        track.failures += 1
        wait = backoff(track.failures, BACKOFF_BASE_SECONDS, BACKOFF_MAX_SECONDS)
        track.retry_at, track.last_error = now + wait, error
        return wait

    def next_at(self, now: float) -> float | None:
        """The earliest time still to come at which a tracked action could run again (past its
        minimum interval and backoff); None when no action waits on time."""
        times = (max(t.last_run + t.min_interval if t.last_run is not None else 0.0, t.retry_at)
                 for t in self.tracks.values())
        return min((at for at in times if at > now), default=None)

    def oldest_wait(self, now: float) -> float:
        """The longest any due action has been waiting while it could run (the starvation figure)."""
        return max((now - t.eligible_at for t in self.tracks.values() if t.due_since is not None and t.eligible_at <= now),
                   default=0.0)

    def state(self, now: float) -> list[dict[str, Any]]:
        """Every table's action as status shows it: waiting since, last run, failures."""
        return [{"table": table, "action": action,
                 "waiting_seconds": round(max(0.0, now - t.eligible_at), 1) if t.due_since is not None else None,
                 "last_run_age_seconds": round(now - t.last_run, 1) if t.last_run is not None else None,
                 "failures": t.failures, "last_error": t.last_error,
                 "retry_in_seconds": round(t.retry_at - now, 1) if t.retry_at > now else None}
                for (table, action), t in sorted(self.tracks.items())]


def keep_alone(probe: Callable[[], list[Due]], run: Callable[[Choice], dict[str, Any] | None],
               stop: threading.Event, *, recheck_seconds: float, clock: Callable[[], float] = time.monotonic,
               from_end: bool = False, scheduler: Scheduler | None = None) -> Scheduler:
    """The scheduler over one table until `stop` is set: `probe` says what is due, the scheduler
    picks one action (one a table), `run` runs it, and the run's start is its time (so an action
    with a minimum interval runs every interval, its own time included). A failure raises out of
    `run`: the component decides whether it ends the service (the merge) or is caught inside
    `run` and tried again at the next interval (maintenance). Between runs it waits until the
    next action could run, or `recheck_seconds` when that is sooner or nothing waits on time.
    `from_end`: a run's end is its time instead (an interval *between* runs: maintenance, as the
    governor measures it from the recorded run's end)."""
    scheduler = scheduler or Scheduler()
    while not stop.is_set():
        now = clock()
        # When what ran now may run again: an action with a minimum interval from its start (past
        # already when it ran longer: then at once); one without waits for the next check, so an
        # action that stays due (an expiry that cannot get under its cap) never spins.
        again = []
        for choice in scheduler.plan(probe(), now, budget=1):
            result = run(choice)
            at = clock() if from_end else now
            scheduler.ran(choice, at, result)
            if choice.due.min_interval_seconds > 0:
                again.append(at + choice.due.min_interval_seconds)
        if stop.is_set():
            break
        now = clock()
        next_at = min(again) if again else scheduler.next_at(now)
        stop.wait(recheck_seconds if next_at is None else max(0.0, min(recheck_seconds, next_at - now)))
    return scheduler
