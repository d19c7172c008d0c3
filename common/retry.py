"""One retry policy for commits that lost a race to another writer (tenacity).

Iceberg commits are optimistic: a commit that finds the table moved under it fails, and the
writer re-reads the table, re-checks what it must (fencing, what a replay may add) and tries
again. Every such loop in streamberg (ingest commits, dead letters, replays, the compactor's
rewrite, maintenance steps, and `load_catalog` when processes started together race to create
the catalog's own tables) uses this policy: `retries` retries after the first attempt,
exponential backoff with full jitter (so writers that collided do not collide again in
step), capped per caller: short where records wait on the commit (ingest), longer for
background work (compactor, maintenance).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

BACKOFF_MULTIPLIER_SECONDS = 0.2
INGEST_MAX_BACKOFF_SECONDS = 5.0
BACKGROUND_MAX_BACKOFF_SECONDS = 30.0


def commit_retrying(retries: int, retry_if: Callable[[BaseException], bool], *,
                    max_backoff_seconds: float = INGEST_MAX_BACKOFF_SECONDS,
                    log: Any = None, event: str = "commit lost a race; retrying") -> Retrying:
    """Attempts for `for attempt in commit_retrying(...): with attempt: ...`.

    An exception that `retry_if` accepts is retried until `retries` retries are spent, then
    raised as it is (`reraise`); any other exception is raised at once. `log`: a structlog
    logger that logs `event` (a warning with attempt, of, backoff_s, error) before each retry;
    the runbooks name these events, so each caller keeps its own.
    """

    def before_sleep(state: RetryCallState) -> None:
        if log is not None and state.outcome is not None:
            log.warning(event, attempt=state.attempt_number, of=retries + 1,
                        backoff_s=round(state.upcoming_sleep, 2), error=str(state.outcome.exception())[:300])

    return Retrying(
        stop=stop_after_attempt(retries + 1),
        wait=wait_random_exponential(multiplier=BACKOFF_MULTIPLIER_SECONDS, max=max_backoff_seconds),
        retry=retry_if_exception(retry_if),
        before_sleep=before_sleep,
        reraise=True,
    )


def is_instance(*types: type[BaseException]) -> Callable[[BaseException], bool]:
    return lambda exc: isinstance(exc, types)
