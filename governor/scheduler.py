"""Which table's which action runs next: need first, no table starved, failures isolated.

Pure bookkeeping (no Spark, no catalog): the governor hands it what each table needs now
(`Due`), it answers what to run (`Choice`), in order, within the round's budget.

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
"""

from __future__ import annotations

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
