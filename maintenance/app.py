"""Entry point shared by `streamberg maintain` and tests: checks, Spark, then one run or a schedule.

No lease. Maintenance does not take the compactor's per-table lease: a continuous compactor
holds it for as long as it runs, so sharing it would starve maintenance (or stop the
compactor). It does not need it either, because every step is safe against a concurrent
compactor or ingest commit through Iceberg's optimistic concurrency:

- expire_snapshots and rewrite_manifests are metadata commits that Iceberg retries on a
  lost race; expiry keeps the compactor's pending appends and ingest's position (expire.py);
- a compactor commit whose plan snapshot was expired meanwhile fails validation ("cannot
  determine history") and gives up cleanly (its files deleted, re-planned next pass);
- the TTL delete: with whole-partition cutoffs it is a metadata delete by row filter that
  Iceberg re-applies on retry; a row-level (copy-on-write) delete racing a compaction replace
  of the same files fails validation on whichever commits second, and that side retries
  later (the compactor next pass, maintenance next run). Rows are never lost or duplicated;
  only work is repeated;
- orphan removal only considers files older than the safety age, which no in-flight write
  reaches.

Two maintainers on one table are safe for the same reasons (every step is idempotent); run
one per table to avoid the repeated work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamberg.common.catalog_wait import open_existing_table
from streamberg.common.config import StreambergConfig
from streamberg.common.config.types import find
from streamberg.common.errors import ConfigError, MaintainError, RetentionColumnError
from streamberg.common.log import get_logger
from streamberg.common.spark import session_for
from streamberg.maintenance.retention import column_kind
from streamberg.table_meta.changelog import changelog_identifier, has_changelog, key_state_identifier
from streamberg.table_meta.keeping import Due
from streamberg.table_meta.schedule import Choice, keep_alone
from streamberg.table_meta.table_runtime import TableRuntime

_TEMPORAL = {"date", "timestamp", "timestamptz"}


@dataclass(frozen=True)
class MaintainOptions:
    once: bool = False
    dry_run: bool = False


@dataclass
class MaintainSummary:
    runs: int = 0
    failed_runs: int = 0
    last: dict[str, Any] | None = None


def _config_error(config: StreambergConfig, message: str) -> ConfigError:
    return ConfigError(f"invalid configuration in {config.config_path or '(config)'}: {message}")


def check_config(config: StreambergConfig, table: Any | None = None) -> None:
    """Checks that need the table's schema: the retention column (the config's schema first,
    when it declares one, then the table's)."""
    column = config.maintenance.retention.column
    if not column:
        return
    if config.table.schema_ is not None:
        found = find(config.table.field_specs, column)
        if found is None:
            names = ", ".join(f.name for f in config.table.schema_)
            raise _config_error(config, f"maintenance.retention.column: {column!r} is not in table.schema "
                                        f"(columns: {names})")
        spec, repeated = found
        if repeated or str(spec.type) not in _TEMPORAL:
            kind = f"inside a list or map ({spec.type})" if repeated else str(spec.type)
            raise _config_error(config, f"maintenance.retention.column: {column!r} is {kind}; "
                                        "it must be a date, timestamp or timestamptz column")
    if table is not None:
        try:
            column_kind(table, column)
        except RetentionColumnError as exc:
            raise _config_error(config, f"maintenance.retention.column: {exc}") from None


def run_maintain(config: StreambergConfig, options: MaintainOptions, *, spark: Any = None,
                 stop: threading.Event | None = None, on_result: Callable[[dict[str, Any]], None] | None = None,
                 clock: Callable[[], float] | None = None) -> MaintainSummary:
    """Run maintenance as the CLI does.

    --once or --dry-run: one run. Otherwise one run every maintenance.interval_seconds until
    `stop` is set (SIGINT/SIGTERM in the CLI); a run in progress finishes its current step and
    skips the rest. `on_result` gets each run's JSON object as it completes. `spark`: an
    existing session (tests); otherwise one is built and stopped at the end.
    """
    check_config(config)
    stop = stop or threading.Event()
    log = get_logger("maintenance", table=config.table.identifier)
    single = options.once or options.dry_run
    # Only the scheduled service waits for the table; a one-off run reports it missing at once.
    _, table = open_existing_table(config, "maintenance", MaintainError,
                                   0.0 if single else config.maintenance.wait_for_table_seconds, stop)
    if table is None:  # stopped while waiting
        return MaintainSummary()
    config = TableRuntime.of(config, table).settings  # the table's own streamberg.* settings over the config's
    check_config(config, table)  # bad settings fail before Spark starts
    summary = MaintainSummary()
    # Maintenance shares the compactor's Spark settings (docs/maintenance.md).
    with session_for(config.catalog, config.compactor.spark_master, config.compactor.spark_conf, given=spark,
                     app_name="streamberg-maintenance") as spark:
        from streamberg.maintenance.maintainer import Maintainer

        changelog = changelog_identifier(config) if has_changelog(config) else None
        maintainer = Maintainer(config.maintenance, config.target, config.kafka.topic, spark, changelog=changelog,
                                dead_letter_table=config.ingest_target.dead_letter_table,
                                key_state=key_state_identifier(config) if changelog is not None else None,
                                **({"clock": clock} if clock is not None else {}))

        def pass_once() -> dict[str, Any] | None:
            try:
                result = maintainer.run(dry_run=options.dry_run, stop=stop)
            except Exception as exc:
                if single:
                    raise MaintainError(f"maintenance run failed: {exc}") from exc
                log.error("maintenance run failed; retrying at the next interval", error=str(exc))
                summary.runs += 1
                summary.failed_runs += 1
                return None
            summary.runs += 1
            summary.failed_runs += result["status"] == "failed"
            summary.last = result
            if on_result is not None:
                on_result(result)
            return {"status": result["status"]}

        def due() -> list[Due]:
            """A pass every interval; between passes, the expiry when the table holds more snapshots
            than maintenance.expire.max_snapshots (a commit every few seconds fills it long before
            an hourly pass)."""
            every = Due(config.table.identifier, "maintain", 1.0, "a pass every maintenance.interval_seconds",
                        min_interval_seconds=config.maintenance.interval_seconds)
            if not config.maintenance.expire.enabled:
                return [every]
            try:
                tables = maintainer.expiry_due()
            except Exception as exc:  # noqa: BLE001 - the next check or pass tries again
                log.error("expiry between passes failed; retrying at the next check", error=str(exc)[:500])
                return [every]
            expire = Due(config.table.identifier, "expire", 1.0, f"snapshots past max_snapshots: {tables}",
                         min_interval_seconds=0.0)
            return [every, expire] if tables else [every]

        def run(choice: Choice) -> dict[str, Any] | None:
            if choice.due.action == "maintain":
                return pass_once()
            from streamberg.maintenance.maintainer import EXPIRY_STEPS

            log.info("snapshots past maintenance.expire.max_snapshots: expiring before the next pass",
                     why=choice.due.why)
            try:
                result = maintainer.run(dry_run=options.dry_run, stop=stop, only=EXPIRY_STEPS, record=False)
                if result["status"] == "failed":
                    log.error("expiry between passes failed; retrying at the next check", result=result)
            except Exception as exc:  # noqa: BLE001 - the next check or pass tries again
                log.error("expiry between passes failed; retrying at the next check", error=str(exc)[:500])
            return None

        if single:
            if not stop.is_set():
                pass_once()
        else:
            # The one scheduler over this table: an interval between passes (from the previous
            # pass's end, as the governor counts from the recorded run's), the expiry checked
            # every maintenance.expire.check_seconds meanwhile.
            keep_alone(due, run, stop, recheck_seconds=config.maintenance.expire.check_seconds, from_end=True)
        log.info("maintenance finished", runs=summary.runs, failed_runs=summary.failed_runs)
        return summary
