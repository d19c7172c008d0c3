"""Entry point shared by `streamberg merge`, `streamberg run` and tests: the primary-key table,
Spark, then one merge or a merge every merge.interval_seconds."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from py4j.protocol import Py4JError
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import GreaterThanOrEqual

from streamberg.common.catalog_wait import wait_for_catalog, wait_for_table
from streamberg.common.config import StreambergConfig
from streamberg.common.errors import CatalogUnreachable, MergeError, ResyncRefused
from streamberg.common.jvm import java_message
from streamberg.common.log import get_logger
from streamberg.common.metadata_files import bound_metadata
from streamberg.common.redact import redact
from streamberg.common.spark import session_for
from streamberg.merge.merger import Merger
from streamberg.merge.tables import ensure_target
from streamberg.table_meta.changelog import changelog_identifier, has_changelog, key_state_identifier
from streamberg.table_meta.keeping import Due
from streamberg.table_meta.schedule import Choice, keep_alone
from streamberg.table_meta.table_runtime import TableRuntime


@dataclass(frozen=True)
class MergeOptions:
    once: bool = False  # apply what is pending now, then exit
    # The source was resynced from this time (ms): after merging, delete the rows whose key
    # no change since then touched (docs/runbooks/source-table-resynced.md). Implies once.
    resynced_since_ms: int | None = None
    # Delete even though records of the table went to the dead letters since then (their
    # rows would be deleted as if the resync had not sent them).
    ignore_dead_letters: bool = False


def _refuse_with_dead_letters(catalog: Any, config: StreambergConfig, options: MergeOptions) -> None:
    """A resync's record that went to the dead letters is a row the source still has: deleting
    the rows the resync did not send would delete it. Refused while such dead letters exist."""
    assert options.resynced_since_ms is not None
    if options.ignore_dead_letters:
        return
    identifier = config.ingest_target.dead_letter_table
    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        return
    since = datetime.fromtimestamp(options.resynced_since_ms / 1000, tz=timezone.utc)
    count = table.scan(row_filter=GreaterThanOrEqual("dead_lettered_at", since.isoformat()),
                       selected_fields=("offset",)).to_arrow().num_rows
    if count:
        raise ResyncRefused(
            f"{count:,} record(s) of the table went to the dead letters ({identifier}) since then: their rows may be "
            "ones the resync sent, and would be deleted. Replay them first (streamberg replay --dead-letters --since "
            "T; docs/runbooks/source-table-resynced.md), or pass --ignore-dead-letters to delete anyway")


def run_merge(config: StreambergConfig, options: MergeOptions, *, spark: Any = None,
              stop: threading.Event | None = None) -> dict[str, Any]:
    """Run the merge stage as the CLI does; returns the summary it prints."""
    if not has_changelog(config):
        raise MergeError("kafka.envelope is none: the table is an append table, there is no change log to merge "
                         "(set kafka.envelope debezium or upsert and table.primary_key)")
    stop = stop or threading.Event()
    changelog = changelog_identifier(config)
    wait = 0.0 if options.once else config.merge.wait_for_table_seconds
    log = get_logger("merge", table=config.table.identifier, changelog=changelog)
    try:
        catalog = wait_for_catalog(config.catalog, wait, "merge", stop)
        if catalog is None:
            return {"table": config.table.identifier, "merges": 0, "stopped_before_table_existed": True}
        if wait_for_table(catalog, changelog, wait, "merge", stop) is None:
            return {"table": config.table.identifier, "merges": 0, "stopped_before_table_existed": True}
    except (CatalogUnreachable, NoSuchTableError) as exc:
        raise MergeError(f"change log {changelog} not found in {redact(config.catalog.uri)} ({exc}); it is created by "
                         "`streamberg ingest`") from None
    target = bound_metadata(ensure_target(catalog, config.table))
    config = TableRuntime.of(config, target).settings  # the table's own streamberg.* settings over the config's
    summary: dict[str, Any] = {"table": config.table.identifier, "changelog": changelog, "merges": 0, "changes": 0}
    started = time.monotonic()
    with session_for(config.catalog, config.merge.spark_master, config.merge.spark_conf, given=spark,
                     app_name="streamberg-merge") as session:
        merger = Merger(session, catalog, config.target, changelog, config.merge, key_state_identifier(config))
        summary["run_id"] = merger.run_id
        log.info("merge stage started", run=merger.run_id, interval_seconds=config.merge.interval_seconds,
                 once=options.once)

        def merge_once(_: Choice | None = None) -> dict[str, Any] | None:
            try:
                outcome = merger.merge()
            except Py4JError as exc:
                raise MergeError(f"merge into {config.table.identifier} failed: {java_message(exc)[:2000]}") from None
            if outcome is None:
                return None
            summary["merges"] += 1
            summary["changes"] += outcome.changes
            summary["last"] = outcome.to_dict()
            return {"changes": outcome.changes}

        if stop.is_set():
            pass  # stopped before the first merge
        elif options.resynced_since_ms is not None:
            merge_once()
            _refuse_with_dead_letters(catalog, config, options)
            try:
                summary["resync"] = merger.delete_missing_since(options.resynced_since_ms).to_dict()
            except Py4JError as exc:
                raise MergeError(f"deleting the rows the resync did not keep failed: {java_message(exc)[:2000]}") \
                    from None
        elif options.once:
            merge_once()
        else:
            # The one scheduler over this table: a merge every interval, start to start, so a
            # change waits at most one interval for the next merge to start (freshness).
            interval = config.merge.interval_seconds
            every = Due(config.table.identifier, "merge", 1.0, "a merge every merge.interval_seconds",
                        min_interval_seconds=interval)
            keep_alone(lambda: [every], merge_once, stop, recheck_seconds=interval)
    summary["seconds"] = round(time.monotonic() - started, 1)
    return summary


def declare_source_epoch(config: StreambergConfig, why: str, since: dict[int, int] | None = None) -> dict[str, Any]:
    """`merge --new-source-epoch`: the source started over (RESET MASTER, a restore into a new
    cluster, a clock set back): changes from a Kafka position on are newer than every change
    before it, whatever their positions (table_meta/source_epochs.py). From where: `since`
    (partition -> first offset) when given; else from the first change the merge found going
    backwards (then the changes from before it are merged again); else from the change log's
    end (the changes the ingest appends from now on)."""
    from streamberg.common.catalog import shared_catalog
    from streamberg.table_meta.changelog import OFFSET, PARTITION
    from streamberg.table_meta.source_epochs import (
        EPOCHS_PROPERTY,
        REAPPLY_PROPERTY,
        REGRESSION_PROPERTY,
        now_text,
        read_epochs,
        read_regression,
        update_changelog_properties,
    )

    if not has_changelog(config):
        raise MergeError("kafka.envelope is none: an append table has no source epochs")
    catalog = shared_catalog(config.catalog)
    changelog_name = changelog_identifier(config)
    try:
        changelog = catalog.load_table(changelog_name)
    except NoSuchTableError:
        raise MergeError(f"change log {changelog_name} not found: nothing to declare an epoch of") from None
    epochs, unreadable = read_epochs(changelog.properties)
    if unreadable is not None:
        raise MergeError(f"{changelog_name}: {unreadable}; remove the property to start the record again")
    regression = read_regression(changelog.properties)
    updates: dict[str, str] = {}
    removals: tuple[str, ...] = ()
    if since is not None:
        start, source = dict(since), "given"
    elif regression is not None and regression.since:
        start, source = dict(regression.since), "the first change that went backwards"
        removals = (REGRESSION_PROPERTY,)
        updates[REAPPLY_PROPERTY] = str(regression.after_snapshot) if regression.after_snapshot is not None else "0"
    else:
        ends: dict[int, int] = {}
        for batch in changelog.scan(selected_fields=(PARTITION, OFFSET)).to_arrow().to_batches():
            for p, o in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                ends[p] = max(ends.get(p, -1), o + 1)
        start, source = ends, "the change log's end"
    declared = epochs.declared(start, why, now_text())
    updates[EPOCHS_PROPERTY] = declared.to_property()
    update_changelog_properties(catalog, changelog_name, updates, removals)
    epoch = declared.epochs[-1]
    get_logger("merge", table=config.table.identifier, changelog=changelog_name).warning(
        "source epoch declared", epoch=epoch.epoch, since=epoch.since, from_=source, why=why)
    return {"table": config.table.identifier, "changelog": changelog_name, "epoch": epoch.epoch,
            "since": {str(p): o for p, o in sorted(epoch.since.items())}, "from": source,
            "merged_again_after_snapshot": updates.get(REAPPLY_PROPERTY)}
