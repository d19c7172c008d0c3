"""The statuses a long-running model keeps (monitoring/refresh.py): a table is read in full
when a commit is reported for it, its lag alone otherwise, and what it shows is what a full
collection shows; a stopped broker is asked once a pass.

Real tables committed by the ingest's committer (reporting each commit to the catalog's
report folder), a real broker, the test's own count of what was produced and committed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from streamberg.common.catalog import load_catalog
from streamberg.common.config import StreambergConfig
from streamberg.monitoring.collect import CollectionPass, collect_status
from streamberg.monitoring.refresh import StatusModel
from tests.helpers import count_column_facts
from tests.monitoring.helpers import Scenario, build_scenario, commit_units, produce_to


@pytest.fixture
def reported(tmp_path: Path, broker: str) -> Scenario:
    """One table, 40/30 of 50/30 produced records committed, its commits reported."""
    return build_scenario(tmp_path / "t", broker, {0: 50, 1: 30}, [[(0, 0, 40, ()), (1, 0, 30, ())]],
                          catalog={"scan_reports_dir": str(tmp_path / "reports")})


def _lag(status) -> dict[int, int]:
    return {int(p): v.lag for p, v in status.ingest.lag.partitions.items()}


def _current_snapshot(config: StreambergConfig) -> int:
    return load_catalog(config.catalog).load_table(config.table.identifier).current_snapshot().snapshot_id


def test_a_table_is_read_again_when_a_commit_is_reported_its_lag_alone_otherwise(reported: Scenario,
                                                                                 broker: str) -> None:
    config = reported.config
    model = StatusModel()
    (first,) = model.collect([config])
    assert (model.full_reads, model.lag_reads) == (1, 0)
    assert first.health is not None and first.health.verdict == "ok", first.health
    assert _lag(first) == reported.lag == {0: 10, 1: 0}

    # Records arrive, nothing is committed: the lag alone is read again, and it is the truth.
    produce_to(broker, config.kafka.topic, {1: 7})
    reported.produced[1] += 7
    (second,) = model.collect([config])
    assert (model.full_reads, model.lag_reads) == (1, 1)
    assert _lag(second) == reported.lag == {0: 10, 1: 7}
    assert second.ingest.lag.total == collect_status(config).ingest.lag.total == 17
    assert second.ingest.last_commit.snapshot_id == first.ingest.last_commit.snapshot_id == _current_snapshot(config)
    assert second.ingest.last_commit.age_seconds >= first.ingest.last_commit.age_seconds

    # A commit (reported by the committer): the table is read in full and shows it.
    commit_units(reported, [[(0, 40, 50, ()), (1, 30, 37, ())]])
    (third,) = model.collect([config])
    assert (model.full_reads, model.lag_reads) == (2, 1)
    assert _lag(third) == reported.lag == {0: 0, 1: 0}
    assert third.ingest.last_commit.snapshot_id == _current_snapshot(config) != first.ingest.last_commit.snapshot_id
    assert third.files.data_files == collect_status(config).files.data_files


def test_without_a_report_folder_or_past_the_age_bound_every_pass_reads_in_full(tmp_path: Path,
                                                                                broker: str,
                                                                                reported: Scenario) -> None:
    plain = build_scenario(tmp_path / "plain", broker, {0: 5}, [[(0, 0, 5, ())]])
    model = StatusModel()
    for _ in range(2):
        model.collect([plain.config, reported.config])
    assert (model.full_reads, model.lag_reads) == (3, 1)  # the reported table once in full, then its lag
    aged = StatusModel(full_every_seconds=0.0)
    for _ in range(2):
        aged.collect([reported.config])
    assert (aged.full_reads, aged.lag_reads) == (2, 0)


def test_a_stopped_broker_is_asked_once_a_pass_and_named_for_every_table(tmp_path: Path, broker: str,
                                                                         reported: Scenario) -> None:
    from streamberg.common.broker import free_port

    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    # Three tables' clients differing in their group id alone (each table's own): one broker.
    configs = [reported.config.model_copy(update={
        "kafka": reported.config.kafka.model_copy(update={"bootstrap_servers": dead, "group_id": f"group-{i}"}),
        "monitoring": reported.config.monitoring.model_copy(update={"broker_timeout_seconds": 2.0})})
        for i in range(3)]
    assert len({c.ingest_target.consumer_group for c in configs}) == 3
    with CollectionPass() as shared:
        statuses = [collect_status(c, shared=shared) for c in configs]
        assert len(shared._readers) == 1  # one reader for the broker, its failure kept for the pass
    assert all(not s.ingest.broker.reachable for s in statuses)
    assert len({s.ingest.broker.error for s in statuses}) == 1 and dead in statuses[0].ingest.broker.error
    assert all(s.table_exists for s in statuses)  # the catalog still answered for each


def test_a_tables_files_are_listed_once_a_metadata_file(reported: Scenario, monkeypatch) -> None:
    """Every pass reads the table in full here (no age bound), yet its manifests are listed
    again only when its metadata file changed: a quiet table's files, clustering and backlog
    come from the listing of its metadata file; a commit's are listed anew, and are the truth."""
    import streamberg.table_meta.table_files as table_files
    from tests.helpers import count_metadata_parses

    listings: list[int] = []
    real = table_files._live_data_files
    monkeypatch.setattr(table_files, "_live_data_files", lambda *a: listings.append(1) or real(*a))
    parses = count_metadata_parses(monkeypatch)
    from streamberg.table_meta.table_runtime import TableRuntime

    settings_parsed: list[str] = []
    real_of = TableRuntime.of.__func__
    monkeypatch.setattr(TableRuntime, "of", classmethod(
        lambda cls, c, t: settings_parsed.append(c.table.identifier) or real_of(cls, c, t)))
    config = reported.config
    model = StatusModel(full_every_seconds=0.0)
    (first,) = model.collect([config])
    parsed_first = len(parses)
    assert settings_parsed == [config.table.identifier]
    (second,) = model.collect([config])
    # Each pass opens its catalog anew; the table's metadata file is parsed once, across
    # passes, and its settings once a metadata version (its runtime kept by the model).
    assert model.full_reads == 2 and len(listings) == 1 and len(parses) == parsed_first >= 1
    assert settings_parsed == [config.table.identifier] and second.settings == first.settings
    assert second.files == first.files and second.compactor.pending_files == first.compactor.pending_files
    commit_units(reported, [[(0, 40, 50, ()), (1, 30, 30, ())]])
    current = load_catalog(config.catalog).load_table(config.table.identifier).metadata_location
    (third,) = model.collect([config])
    assert len(listings) == 2 and parses[-1] == current  # the commit's metadata file, parsed by the pass
    assert settings_parsed.count(config.table.identifier) == 2  # a new metadata version: its settings again
    truth = collect_status(config)  # a collection of its own: nothing kept
    assert third.files.data_files == truth.files.data_files == first.files.data_files + 1
    assert third.compactor.pending_files == truth.compactor.pending_files
    assert third.snapshots.manifests == truth.snapshots.manifests != first.snapshots.manifests


def test_a_pass_lists_a_namespace_once_and_the_next_pass_sees_a_table_made_since(reported: Scenario) -> None:
    """Dead-letter tables most tables never made are known absent from one listing of their
    namespace a pass (not a failed load each); one made since is found by the next pass."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    config = reported.config
    catalog = load_catalog(config.catalog)
    namespace = config.table.identifier.rsplit(".", 1)[0]
    later = f"{namespace}.made_later"
    with CollectionPass() as shared:
        assert not shared.surely_absent(catalog, config.table.identifier)
        assert not shared.surely_absent(catalog, config.table.identifier.upper())  # a name in another case: loaded
        assert shared.surely_absent(catalog, later)
        assert not shared.surely_absent(catalog, "no_such_namespace.t")  # no listing: loaded
        catalog.create_table(later, Schema(NestedField(1, "id", LongType(), required=False)))
        assert shared.surely_absent(catalog, later)  # this pass's listing
    with CollectionPass() as shared:
        assert not shared.surely_absent(catalog, later)


def test_dead_letters_are_counted_through_the_pass(tmp_path: Path, broker: str) -> None:
    scenario = build_scenario(tmp_path / "d", broker, {0: 20}, [[(0, 0, 20, (3, 7, 11))]])
    other = build_scenario(tmp_path / "o", broker, {0: 5}, [[(0, 0, 5, ())]])
    statuses = StatusModel().collect([scenario.config, other.config])
    assert statuses[0].dead_letters.exists and statuses[0].dead_letters.records == 3
    assert statuses[1].dead_letters.records == 0


def test_tables_of_one_topic_share_its_watermarks_in_a_pass(reported: Scenario, broker: str, monkeypatch) -> None:
    """A field-routed topic's tables: the topic's watermarks read once a pass, every table's lag
    the truth against them; the next pass reads them again."""
    from streamberg.common.watermarks import WatermarkReader

    reads = []
    real = WatermarkReader.read
    monkeypatch.setattr(WatermarkReader, "read", lambda self, topic, *a, **k: reads.append(topic) or real(self, topic, *a, **k))
    config = reported.config
    sibling = config.model_copy(update={"table": config.table.model_copy(update={"identifier": "mon.sibling"})})
    model = StatusModel()
    first, other = model.collect([config, sibling])
    assert reads == [config.kafka.topic]
    assert _lag(first) == reported.lag == {0: 10, 1: 0}
    assert not other.table_exists and other.ingest.topic_exists and other.ingest.broker.reachable
    produce_to(broker, config.kafka.topic, {0: 3})
    reported.produced[0] += 3
    again, _ = model.collect([config, sibling])
    assert reads == [config.kafka.topic] * 2 and _lag(again) == reported.lag == {0: 13, 1: 0}


def test_a_rest_catalogs_listing_is_not_trusted_to_be_whole(rest_catalog) -> None:
    """A REST server may page a listing unasked, and pyiceberg reads its first page alone: a
    table on a later page is loaded, never taken as absent."""
    import uuid

    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    catalog = RestCatalog("paged", uri=rest_catalog.url, credential=rest_catalog.credential)
    namespace = f"paged_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(namespace)
    names = [f"{namespace}.t{i}" for i in range(3)]
    for name in names:
        catalog.create_table(name, Schema(NestedField(1, "id", LongType(), required=False)))
    rest_catalog.list_page_size = 1
    try:
        assert len(catalog.list_tables(namespace)) == 1  # the server paged it: the client saw one
        with CollectionPass() as shared:
            assert not any(shared.surely_absent(catalog, name) for name in names)
    finally:
        rest_catalog.list_page_size = None


def test_a_pass_reads_maintenance_runs_and_scan_statistics_once_for_every_table(reported: Scenario,
                                                                                  monkeypatch) -> None:
    """Three tables in one pass: each one's last maintenance run is what it is read alone (a
    dry run newer than a real one not taken), from one query; the scan statistics are read
    once, not once a table."""
    import streamberg.table_meta.query_stats as query_stats
    from streamberg.common.catalog import state_engine
    from streamberg.table_meta.declared import ensure_table
    from streamberg.table_meta.maintenance_runs import last_maintenance_run, record_run

    base = reported.config
    configs = [base] + [base.model_copy(update={"table": base.table.model_copy(update={"identifier": f"lake.m{i}"})})
                        for i in range(2)]
    catalog = load_catalog(base.catalog)
    for config in configs[1:]:
        ensure_table(catalog, config.table)
    engine = state_engine(base.catalog)

    def run(table: str, run_id: str, finished: float, dry: bool = False) -> None:
        record_run(engine, base.catalog.name, {"run_id": run_id, "table": table, "dry_run": dry, "status": "ok",
                                               "bytes_freed": len(run_id)}, started_at=finished - 5, finished_at=finished)

    run(configs[0].table.identifier, "a-old", 1000.0)
    run(configs[0].table.identifier, "a-new", 2000.0)
    run(configs[0].table.identifier, "a-dry", 3000.0, dry=True)  # newer, but a dry run
    run(configs[1].table.identifier, "b-only", 1500.0)
    loads = []
    real_load = query_stats.load
    monkeypatch.setattr(query_stats, "load", lambda folder: loads.append(folder) or real_load(folder))
    statuses = StatusModel().collect(configs)
    assert [s.maintenance["last_run"]["run_id"] if s.maintenance["last_run"] else None for s in statuses] == \
        ["a-new", "b-only", None]
    for config, status in zip(configs, statuses):
        alone = last_maintenance_run(config, engine=engine)
        assert (status.maintenance["last_run"] or {}).get("run_id") == (alone or {}).get("run_id")
        if alone is not None:
            assert {k: v for k, v in status.maintenance["last_run"].items() if k != "age_seconds"} == \
                {k: v for k, v in alone.items() if k != "age_seconds"}
    assert len(loads) == 1, loads  # the scan statistics, once for the pass


def _origin(status, key: str) -> tuple[object, str]:
    (found,) = [s for s in status.settings if s["key"] == key]
    return found["value"], found["origin"]


def test_a_version_the_keeper_read_is_read_in_full_at_the_next_pass_through_its_runtime(reported: Scenario,
                                                                                       monkeypatch) -> None:
    """Under `govern` the model takes each table's runtime from its keeper: the same object
    while the metadata is the same, and a version the keeper read that the model has not (an
    action ended, a change no report announced) is read in full at the next pass, not a
    minute later; a model on its own shows the old settings until its age bound."""
    from streamberg.monitoring.collect import table_key
    from streamberg.table_meta.column_usage import ColumnFacts
    from streamberg.table_meta.table_runtime import TableRuntime

    config = reported.config
    catalog = load_catalog(config.catalog)
    identifier = config.table.identifier
    held = {"runtime": TableRuntime.of(config, catalog.load_table(identifier))}  # the keeper's
    model = StatusModel(known=lambda c: held["runtime"] if c is config else None)
    alone = StatusModel()
    derived = count_column_facts(monkeypatch)

    (first,) = model.collect([config])
    alone.collect([config])
    assert (model.full_reads, model.lag_reads) == (1, 0)
    assert model.runtimes[table_key(config)] is held["runtime"]  # one object for the table, one parse
    (second,) = model.collect([config])
    assert (model.full_reads, model.lag_reads) == (1, 1)
    key = "streamberg.compact.min_files"
    before = _origin(second, key)
    assert before[1] != "table property"

    # A change no commit report announces (a property set by another engine), which the keeper reads.
    with catalog.load_table(identifier).transaction() as change:
        change.set_properties({key: "7"})
    assert model.collect([config])[0].settings == second.settings  # nobody read it yet: the kept status
    assert (model.full_reads, model.lag_reads) == (1, 2)
    held["runtime"] = held["runtime"].refreshed(catalog.load_table(identifier))
    (third,) = model.collect([config])
    assert (model.full_reads, model.lag_reads) == (2, 2)
    assert _origin(third, key) == (7, "table property")
    assert model.runtimes[table_key(config)] is held["runtime"]
    (fourth,) = model.collect([config])
    assert (model.full_reads, model.lag_reads) == (2, 3)  # read once, not at every pass
    assert _origin(fourth, key) == (7, "table property")
    (lone,) = alone.collect([config])
    assert _origin(lone, key) == before and alone.full_reads == 1  # on its own: up to its age bound

    # The columns' facts: derived once a metadata version, by whoever reads them first.
    assert len(derived) == 3  # the model's two versions, the lone model's own runtime
    derived.clear()
    aged = StatusModel(full_every_seconds=0.0, known=lambda c: held["runtime"] if c is config else None)
    for _ in range(2):
        aged.collect([config])
    assert aged.full_reads == 2 and derived == []  # read in full twice, the keeper's facts both times
    cached, fresh = held["runtime"].column_facts(), ColumnFacts.of_table(catalog.load_table(identifier))
    assert dataclasses.replace(cached, loaded_at=0) == dataclasses.replace(fresh, loaded_at=0)
    assert cached.loaded_at <= fresh.loaded_at and fresh.loaded_at - cached.loaded_at < 60  # dated when asked
