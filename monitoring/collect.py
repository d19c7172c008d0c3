"""Collect every fact `streamberg status` reports, degrading truthfully.

Pure reads: nothing here creates, commits or deletes anything. Each source is asked on its
own, so one failing does not hide the others: with the catalog down the broker is still
asked; with the broker down the table facts are still read. A failure becomes an
unreachable flag with its error (or an entry in `errors`), never an exception, so the
verdict can name it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from streamberg.common.catalog import state_engine
from streamberg.common.catalog_open import close_catalog
from streamberg.common.config import StreambergConfig
from streamberg.common.errors import BrokerUnreachable, CatalogUnreachable
from streamberg.common.log import get_logger
from streamberg.common.metadata_files import KeepsParsedMetadata, ParsedMetadata
from streamberg.common.times import iso_from_ms
from streamberg.common.watermarks import WatermarkReader
from streamberg.monitoring import table_stats
from streamberg.monitoring.catalog_probe import first_line, open_catalog_readonly
from streamberg.monitoring.lag import lag_reader, lag_reader_key, read_lag
from streamberg.monitoring.model import (
    DeadLetterFacts,
    IngestFacts,
    OffsetSkipFact,
    Reachability,
    SchemaAdditionFact,
    Status,
    UnknownFieldFact,
)
from streamberg.table_meta.changelog import changelog_identifier, has_changelog
from streamberg.table_meta.column_lifecycle import ignored_fields
from streamberg.table_meta.field_sightings import added_fields_of, sightings_of, widened_fields_of
from streamberg.table_meta.maintenance_runs import last_maintenance_run, newest_runs, runs_recorded
from streamberg.table_meta.offsets import CommittedPosition, ancestry, committed_position, summary_properties
from streamberg.table_meta.policy import GOVERN_STATE_FILE
from streamberg.table_meta.table_facts import recent_dead_letters, summary_total
from streamberg.table_meta.table_files import ManifestCache, live_data_files
from streamberg.table_meta.table_runtime import TableRuntime
from streamberg.table_meta.tail_segments import cache_folder


def table_key(config: StreambergConfig) -> str:
    """A table's key in what is kept across passes (a name is its catalog's)."""
    return f"{config.catalog.name}|{config.table.identifier}"


class CollectionPass:
    """What one collection of many tables shares, opened when first needed and closed at the
    pass's end: a read-only catalog per catalog config (a thousand tables, one open), a
    watermark reader per broker, a topic's watermarks (the tables of a field-routed topic
    share them), a namespace's listing, whether maintenance runs were recorded, and
    govern.json read once. A catalog or broker that did not
    answer is not asked again in the pass: a thousand tables on a stopped broker cost one
    timeout, each of them reported unreachable with its error."""

    def __init__(self, parsed: ParsedMetadata | None = None,
                 runtimes: dict[str, TableRuntime] | None = None) -> None:
        # The tables' parsed metadata and runtimes its owner keeps across passes (a catalog
        # opened a pass would parse every table it loads again each pass; a table's settings
        # are parsed once a metadata version).
        self.parsed = parsed
        self.runtimes = runtimes
        self._catalogs: dict[str, Any] = {}  # catalog config -> catalog, or the CatalogUnreachable it raised
        self._readers: dict[str, WatermarkReader] = {}
        self._brokers_down: dict[str, BrokerUnreachable] = {}
        # Facts read once a pass, by what they are and of what: ("watermarks", reader, topic,
        # true ends), ("listing", catalog, namespace), ("runs recorded", engine), ("governor", state_dir).
        self._facts: dict[tuple[Any, ...], Any] = {}

    def __enter__(self) -> CollectionPass:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def catalog(self, config: StreambergConfig) -> Any:
        key = config.catalog.model_dump_json()
        if key not in self._catalogs:
            try:
                self._catalogs[key] = opened = open_catalog_readonly(config.catalog)
                if self.parsed is not None and isinstance(opened, KeepsParsedMetadata):
                    opened.parsed = self.parsed
            except CatalogUnreachable as exc:
                self._catalogs[key] = exc
        found = self._catalogs[key]
        if isinstance(found, CatalogUnreachable):
            raise found
        return found

    def lag(self, config: StreambergConfig, recorded: Any, timeout_seconds: float, now_ms: int) -> Any:
        key = f"{lag_reader_key(config)}|{timeout_seconds}"
        if key in self._brokers_down:
            raise self._brokers_down[key]
        if key not in self._readers:
            self._readers[key] = lag_reader(config, timeout_seconds)
        reader = self._readers[key]
        # A topic's watermarks once a pass: the tables of a field-routed topic share them.
        topic = (key, config.kafka.topic, config.monitoring.read_last_batch)
        try:
            marks = self._once(("watermarks", *topic),
                               lambda: reader.read(config.kafka.topic, read_ends=config.monitoring.read_last_batch))
            return read_lag(config, recorded, timeout_seconds, now_ms, reader, marks)
        except BrokerUnreachable as exc:
            self._brokers_down[key] = exc
            raise

    def runtime(self, config: StreambergConfig, table: Table) -> TableRuntime:
        """The table's runtime for `table` as loaded now: the one kept from an earlier pass
        while its config is the same object and its metadata file the same, else parsed."""
        if self.runtimes is None:
            return TableRuntime.of(config, table)
        key = table_key(config)
        kept = self.runtimes.get(key)
        found = kept.refreshed(table) if kept is not None and kept.config is config else TableRuntime.of(config, table)
        self.runtimes[key] = found
        return found

    def surely_absent(self, catalog: Catalog, identifier: str) -> bool:
        """Whether the catalog's listing of the namespace, made once a pass, lacks `identifier`
        (in any case): a thousand tables' dead-letter tables, most never made, cost one
        listing a namespace instead of a failed load each. False when the listing failed."""
        if isinstance(catalog, RestCatalog):
            # pyiceberg 0.8 reads a listing's first page alone, and a REST server may page it
            # unasked: what it lacks may be on a later page. Loaded, then.
            return False
        namespace = identifier.split(".")[:-1]

        def listing() -> set[str] | None:
            try:
                return {".".join(t).lower() for t in catalog.list_tables(tuple(namespace))}
            except Exception:  # noqa: BLE001 - the table is then loaded, as without a listing
                return None  # (a namespace not found in this case may be another case's, in some catalog)

        listed = self._once(("listing", id(catalog), tuple(namespace)), listing)
        return listed is not None and identifier.lower() not in listed

    def runs_recorded(self, engine: Any) -> bool:
        """Whether the state database holds maintenance runs, asked once a pass (a schema
        inspection a table cost a fifth of a quiet pass)."""
        return bool(self._once(("runs recorded", id(engine)), lambda: runs_recorded(engine)))

    def newest_runs(self, engine: Any, catalog_name: str) -> dict[str, Any]:
        """Every table's newest maintenance run, read once a pass (one query for all)."""
        found: dict[str, Any] = self._once(("newest runs", id(engine), catalog_name),
                                           lambda: newest_runs(engine, catalog_name))
        return found

    def query_stats(self, folder: str) -> dict[str, Any]:
        """The scan statistics as saved, read once a pass (or as this pass folded them): a table
        whose entry needs nothing recorded is answered from it (table_meta/query_stats.observe),
        not from a read a table."""
        from streamberg.table_meta.query_stats import load

        found: dict[str, Any] = self._once(("query stats", str(folder)), lambda: load(folder))
        return found

    def folded(self, folder: str, catalog_name: str) -> dict[str, Any]:
        """The scan and commit reports folded into the statistics, once a pass; the statistics
        then answer the pass's tables too (query_stats)."""
        from streamberg.table_meta.query_stats import fold

        found: dict[str, Any] = self._once(("folded", str(folder), catalog_name), lambda: fold(folder, catalog_name))
        self._facts.setdefault(("query stats", str(folder)), found)
        return found

    def governor_document(self, state_dir: str) -> Any:
        return self._once(("governor", state_dir), lambda: governor_document(state_dir))

    def _once(self, key: tuple[Any, ...], read: Callable[[], Any]) -> Any:
        """`read()` the first time `key` is asked in this pass, its answer after."""
        if key not in self._facts:
            self._facts[key] = read()
        return self._facts[key]

    def close(self) -> None:
        for catalog in self._catalogs.values():
            if not isinstance(catalog, CatalogUnreachable):
                close_catalog(catalog)
        for reader in self._readers.values():
            reader.close()
        self._catalogs.clear()
        self._readers.clear()
        self._facts.clear()


class _Collector:
    """One status collection; `errors` gathers parts that failed although the catalog answered."""

    def __init__(self, config: StreambergConfig, now_ms: int, cache: ManifestCache,
                 shared: CollectionPass | None = None) -> None:
        self.config, self.now_ms, self.cache, self.shared = config, now_ms, cache, shared
        self.errors: list[str] = []
        self.log = get_logger("monitoring.status", table=config.table.identifier)

    def part(self, what: str, read: Callable[..., Any], *args: Any) -> Any:
        """Run one read; on failure record which part could not be read, and go on."""
        try:
            return read(*args)
        except Exception as exc:  # noqa: BLE001 - a broken part is reported, the rest still is
            message = f"{what} could not be read: {first_line(exc)}"
            self.log.warning("status part failed", part=what, error=first_line(exc))
            self.errors.append(message)
            return None

    def ingest(self, position: CommittedPosition | None, table: Table | None) -> IngestFacts:
        config = self.config
        last = self.part("last ingest commit", table_stats.last_commit, table, position, self.now_ms) \
            if table is not None and position is not None else None
        skips = [OffsetSkipFact(s.partition, s.from_offset, s.to_offset, s.kind, s.lost,
                                iso_from_ms(s.at_ms, timespec="seconds") if s.at_ms else None)
                 for s in (position.skips if position is not None else ())]
        recorded = {"offset_skips": skips, "lost_offsets": position.lost_total if position is not None else 0,
                    **(self.part("schema evolution", _schema_facts, table, position) or {} if table is not None else {})}
        offsets = position.offsets if position is not None else None
        timeout = config.monitoring.broker_timeout_seconds
        try:
            marks, lag = self.shared.lag(config, offsets, timeout, self.now_ms) if self.shared is not None \
                else read_lag(config, offsets, timeout, self.now_ms)
        except Exception as exc:  # noqa: BLE001 - e.g. a client setting librdkafka refuses: unreachable too
            error = str(exc) if isinstance(exc, BrokerUnreachable) else \
                f"broker {config.kafka.bootstrap_servers}: {first_line(exc)}"
            self.log.warning("broker unreachable", bootstrap=config.kafka.bootstrap_servers, error=error)
            return IngestFacts(last_commit=last, broker=Reachability(False, error), topic=config.kafka.topic,
                               topic_exists=None, lag=None, **recorded)
        # Lag needs the recorded offsets, i.e. a readable table.
        return IngestFacts(last_commit=last, broker=Reachability(True), topic=config.kafka.topic,
                           topic_exists=marks.exists, lag=lag, **recorded)

    def dead_letters(self, catalog: Catalog) -> DeadLetterFacts:
        identifier = self.config.ingest_target.dead_letter_table
        if self.shared is not None and self.shared.surely_absent(catalog, identifier):
            return DeadLetterFacts(table=identifier, exists=False, records=0)
        try:
            table = catalog.load_table(identifier)
        except NoSuchTableError:
            return DeadLetterFacts(table=identifier, exists=False, records=0)
        records = summary_total(table, "total-records")
        snapshot = table.current_snapshot()
        # The newest reasons, read once a dead-letter commit (its files never change).
        recent = self.part("recent dead letters", self.cache.derived, ("dead letters", identifier, snapshot.snapshot_id),
                           lambda: recent_dead_letters(table)) if records and snapshot is not None else []
        return DeadLetterFacts(table=identifier, exists=True, records=records, recent=tuple(recent or ()))


# The newest schema additions status lists (all are counted).
SCHEMA_ADDITIONS_LISTED = 5


def _schema_facts(table: Table, position: CommittedPosition | None) -> dict[str, Any]:
    """Fields not written (counted by the newest ingest commit) and the commits that added fields."""
    unknown: list[UnknownFieldFact] = []
    if position is not None and position.snapshot_id is not None:
        snapshot = table.snapshot_by_id(position.snapshot_id)
        if snapshot is not None:
            ignored = ignored_fields(table.properties)
            unknown = [UnknownFieldFact(path, seen.records, {str(p): o for p, o in sorted(seen.first.items())},
                                        {str(p): o for p, o in sorted(seen.last.items())},
                                        ignored=path.split(".")[0] in ignored)
                       for path, seen in sorted(sightings_of(summary_properties(snapshot)).items(),
                                                key=lambda item: -item[1].records)]
    additions: list[SchemaAdditionFact] = []
    total = 0
    for snapshot in ancestry(table):
        summary = summary_properties(snapshot)
        added, widened = added_fields_of(summary), widened_fields_of(summary)
        total += len(added)
        if (added or widened) and len(additions) < SCHEMA_ADDITIONS_LISTED:
            additions.append(SchemaAdditionFact(
                snapshot.snapshot_id, iso_from_ms(snapshot.timestamp_ms, timespec="seconds"),
                [f"{path} {t}" for path, t in added] + [f"{path} {old} -> {new}" for path, old, new in widened]))
    return {"unknown_fields": unknown, "schema_additions": additions, "fields_added": total}


def _load_if_present(catalog: Catalog, identifier: str) -> Table | None:
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        return None


def last_maintenance(config: StreambergConfig, catalog: Catalog | None,
                     shared: CollectionPass | None = None) -> dict[str, Any]:
    """The last `streamberg maintain` run, if this installation can tell.

    It is read through the status's own read-only catalog connection: left to itself the
    reader would open the catalog the writers' way, which creates a missing SQLite file.
    """
    if catalog is None:
        return {"available": True, "last_run": None, "error": "not read: the catalog database is unreachable"}
    try:
        engine = state_engine(config.catalog, catalog)
        recorded = shared.runs_recorded(engine) if shared is not None else None
        newest = shared.newest_runs(engine, config.catalog.name) if shared is not None and recorded else None
        return {"available": True, "last_run": last_maintenance_run(config, engine=engine, recorded=recorded,
                                                                    newest=newest), "error": None}
    except Exception as exc:  # noqa: BLE001 - its failure must not hide the rest of the status
        return {"available": True, "last_run": None, "error": first_line(exc)}


def collect_status(config: StreambergConfig, *, now_ms: int | None = None,
                   cache: ManifestCache | None = None, shared: CollectionPass | None = None) -> Status:
    """Every fact about the configured table, its broker and its catalog (no verdict yet).

    `cache` keeps parsed manifests between calls (`--watch`, the metrics exporter):
    manifests are immutable, so later collections read only the new ones. `shared`: the pass
    of many tables this one is part of (its catalog, broker reader and governor state).
    """
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    run = _Collector(config, now_ms, cache or ManifestCache(), shared)
    identifier = config.table.identifier
    checked_at = iso_from_ms(now_ms, timespec="seconds")
    empty = {"table": identifier, "checked_at": checked_at, "files": None, "compactor": None, "clustering": None,
             "snapshots": None, "dead_letters": None}
    try:
        catalog = shared.catalog(config) if shared is not None else open_catalog_readonly(config.catalog)
    except CatalogUnreachable as exc:
        run.log.warning("catalog unreachable", error=str(exc))
        return Status(**empty, catalog=Reachability(False, str(exc)), table_exists=None,
                      ingest=run.ingest(None, None), maintenance=last_maintenance(config, None))
    try:
        return _collect_from(run, config, catalog, checked_at, empty, now_ms)
    finally:
        if shared is None:
            close_catalog(catalog)  # opened for this call (a table's status): closed with it


def _collect_from(run: _Collector, config: StreambergConfig, catalog: Any, checked_at: str, empty: dict[str, Any],
                  now_ms: int) -> Status:
    identifier = config.table.identifier
    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        # A primary-key table before its first merge: the ingest may be well under way.
        ingest = run.ingest(None, None)
        if has_changelog(config):
            changelog = run.part("change log", _load_if_present, catalog, changelog_identifier(config))
            if changelog is not None:
                ingest = run.ingest(run.part("committed offsets", committed_position, changelog, config.kafka.topic),
                                    changelog)
        return Status(**{**empty, "dead_letters": run.part("dead letters", run.dead_letters, catalog)},
                      catalog=Reachability(True), table_exists=False, ingest=ingest,
                      maintenance=last_maintenance(config, catalog, run.shared), errors=run.errors)
    except Exception as exc:  # noqa: BLE001 - metadata file missing or unreadable, etc.
        run.errors.append(f"table {identifier} could not be loaded: {first_line(exc)}")
        return Status(**empty, catalog=Reachability(True), table_exists=True, ingest=run.ingest(None, None),
                      maintenance=last_maintenance(config, catalog, run.shared), errors=run.errors)
    run.log = run.log.bind(snapshot=table.current_snapshot().snapshot_id if table.current_snapshot() else None)
    # The table's own streamberg.* settings over the config's: the backlog and clustering are
    # judged as the table is kept (its runtime: table_meta/table_runtime.py), and what is wrong with them named.
    kept = run.shared.runtime(config, table) if run.shared is not None else TableRuntime.of(config, table)
    config, policy_problems = kept.settings, list(kept.problems)
    run.config = config
    # A primary-key table's ingest writes its change log: the ingest's facts are read there.
    ingest_table, merge = table, None
    if has_changelog(config):
        changelog_name = changelog_identifier(config)
        ingest_table = run.part("change log", _load_if_present, catalog, changelog_name)
        merge = run.part("merge", table_stats.merge_facts, config, ingest_table, changelog_name, table, run.cache, now_ms)
    position = run.part("committed offsets", committed_position, ingest_table, config.kafka.topic) \
        if ingest_table is not None else None
    files = run.part("data files", lambda: live_data_files(table, run.cache)[0])
    ingest = run.ingest(position, ingest_table)
    return Status(
        table=identifier, checked_at=checked_at, catalog=Reachability(True), table_exists=True,
        ingest=ingest, merge=merge,
        files=run.part("file sizes", table_stats.file_facts, config, table, files) if files is not None else None,
        compactor=run.part("compactor backlog", table_stats.compactor_facts, config, table, run.cache, now_ms),
        clustering=run.part("clustering", table_stats.clustering_facts, config, table, files) if files is not None else None,
        snapshots=run.part("snapshots", table_stats.snapshot_facts, table, now_ms, run.cache),
        dead_letters=run.part("dead letters", run.dead_letters, catalog),
        maintenance=last_maintenance(config, catalog, run.shared), errors=run.errors,
        policy_problems=policy_problems, governor=governor_state(config, run.shared), settings=kept.origins(),
        queries=run.part("query statistics", _queries, kept, run.shared) if config.catalog.scan_reports_dir else None,
        tail_cache=run.part("kept tail", _tail_cache, config, position, ingest)
        if position is not None and cache_folder(config).is_dir() else None,
    )


def _tail_cache(config: StreambergConfig, position: Any, ingest: Any) -> dict[str, Any]:
    """What is kept of the table's tail (by `streamberg tail` or the ingest): the segments
    chained from its committed offsets (those a fresh read takes) and how far the records go
    past them."""
    from streamberg.table_meta.tail_segments import alive, chains, segments

    folder = cache_folder(config)
    committed = dict(position.offsets)
    chained = chains(folder, committed)
    kept = {p: (chain[-1].next - committed[p]) if chain else 0 for p, chain in chained.items()}
    files = segments(folder)
    size, newest = 0, None
    for segment in files:
        try:
            found = segment.path.stat()
        except OSError:
            continue
        size += found.st_size
        newest = found.st_mtime if newest is None else max(newest, found.st_mtime)
    lag = ingest.lag.total if ingest is not None and ingest.lag is not None else None
    past = max(0, lag - sum(kept.values())) if lag is not None else None
    # How far behind Kafka the kept tail is in time: none while it holds every record; else
    # since it last moved (its newest segment: the writers write one every poll that read any).
    behind = None if past is None else 0.0 if past == 0 else \
        round(max(0.0, time.time() - newest), 2) if newest is not None else None
    return {"alive": alive(folder), "kept_by": "ingest" if config.ingest.keep_tail else "streamberg tail",
            "segments": len(files), "bytes": size, "kept_records": sum(kept.values()),
            "past_kept_records": past, "behind_seconds": behind}


def _queries(kept: TableRuntime, shared: CollectionPass | None = None) -> dict[str, Any]:
    """The table's scan statistics, its unused columns and the clustering columns it is kept
    with (after `auto`)."""
    from streamberg.table_meta.query_stats import usage

    config = kept.settings
    folder = str(config.catalog.scan_reports_dir)
    found = usage(folder, config.table.identifier, kept.column_facts(), kept.policy.unused_after_days,
                  loaded=shared.query_stats(folder) if shared is not None else None) or {"scans_total": 0}
    return {**found, "cluster_columns": list(config.compactor.columns)}


def state_document(state_dir: str, name: str) -> dict[str, Any] | None:
    """A JSON object `streamberg govern` keeps in the state folder (its state, its heartbeat),
    or None when there is none or it is not one."""
    try:
        document = json.loads((Path(state_dir) / name).read_text())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def governor_document(state_dir: str) -> dict[str, Any] | None:
    """`streamberg govern`'s last state (<state_dir>/govern.json), or None."""
    return state_document(state_dir, GOVERN_STATE_FILE)


def governor_state(config: StreambergConfig, shared: CollectionPass | None = None) -> dict[str, Any] | None:
    """What `streamberg govern` last wrote about this table (<state_dir>/govern.json; read
    once for a whole pass of many tables)."""
    state_dir = config.ingest.state_dir
    document = shared.governor_document(state_dir) if shared is not None else governor_document(state_dir)
    if document is None:
        return None
    mine = config.table.identifier
    return {"written_age_seconds": round(time.time() - float(document.get("written_at", 0)), 1),
            "actions": [a for a in document.get("actions", []) if isinstance(a, dict) and a.get("table") == mine],
            "fleet": document.get("fleet")}
