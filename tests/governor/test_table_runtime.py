"""The table runtime (table_meta/table_runtime.py): a table's settings parsed once per version of
its metadata, with where each value came from; and the process runtime (common/runtime.py)
owning the catalogs and closing them once. A real SQL catalog (SQLite) and a real table."""

from __future__ import annotations

from pathlib import Path

from streamberg.common.catalog import load_catalog
from streamberg.common.runtime import Runtime
from streamberg.ingest.dead_letters import open_tables
from streamberg.table_meta.table_runtime import TableRuntime
from tests.helpers import config_at, count_column_facts, write_config


def _table(tmp_path: Path):
    path = write_config(tmp_path, "127.0.0.1:1", extra={"compactor": {"columns": ["city"], "min_files": 7}})
    config = config_at(path)
    open_tables(config)
    return config, load_catalog(config.catalog)


def test_settings_are_parsed_once_a_metadata_version_and_say_where_they_came_from(tmp_path: Path) -> None:
    config, catalog = _table(tmp_path)
    table = catalog.load_table(config.table.identifier)
    with table.transaction() as tx:
        tx.set_properties({"streamberg.cluster.columns": "user_id", "streamberg.compact.merge_factor": "-3",
                           "streamberg.maintain.enabled": "false"})
    table = catalog.load_table(config.table.identifier)
    kept = TableRuntime.of(config, table)
    assert kept.settings.compactor.columns == ["user_id"] and kept.policy.maintain_enabled is False
    assert any(p.startswith("streamberg.compact.merge_factor") for p in kept.problems), kept.problems
    origins = {o["key"]: o for o in kept.origins()}
    assert origins["streamberg.cluster.columns"]["origin"] == "table property"
    assert origins["streamberg.compact.min_files"] == {"key": "streamberg.compact.min_files", "value": 7,
                                                       "setting": "compactor.min_files", "origin": "config"}
    # A refused value keeps the config's (or the default) and says so.
    assert origins["streamberg.compact.merge_factor"]["origin"] == "default"
    assert origins["streamberg.maintain.enabled"] == {"key": "streamberg.maintain.enabled", "value": False,
                                                      "setting": "maintain_enabled", "origin": "table property"}
    assert origins["streamberg.snapshots.keep"]["origin"] == "default"
    # The same metadata: the same object (not parsed again); a change: parsed anew.
    assert kept.refreshed(catalog.load_table(config.table.identifier)) is kept
    with table.transaction() as tx:
        tx.set_properties({"streamberg.cluster.columns": "city,user_id"})
    again = kept.refreshed(catalog.load_table(config.table.identifier))
    assert again is not kept and again.settings.compactor.columns == ["city", "user_id"]
    # Not made yet: the config's settings, no table.
    assert TableRuntime.of(config, None).settings.compactor.columns == ["city"]


def test_the_runtime_opens_one_catalog_per_config_and_closes_it_once(tmp_path: Path) -> None:
    config, _ = _table(tmp_path)
    with Runtime() as runtime:
        from streamberg.common.catalog import shared_catalog, state_engine

        first = shared_catalog(config.catalog)  # through the runtime of the command running
        assert shared_catalog(config.catalog) is first and runtime.catalog(config.catalog) is first
        state_engine(config.catalog, first)
        assert runtime.held()["catalogs"] == 1 and runtime.opened["catalogs"] == 1
        first.load_table(config.table.identifier)
    assert runtime.held() == {"catalogs": 0, "engines": 0, "consumers": 0, "admins": 0, "spark": 0}
    from streamberg.common.runtime import current

    assert current() is not runtime  # the command's runtime is gone with it


def test_column_facts_are_derived_once_a_version_and_afresh_from_a_handle_moved_on(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    from pyiceberg.types import StringType

    config, catalog = _table(tmp_path)
    table = catalog.load_table(config.table.identifier)
    kept = TableRuntime.of(config, table)
    derived = count_column_facts(monkeypatch)
    first, again = kept.column_facts(), kept.column_facts()
    assert len(derived) == 1 and again.top == first.top and again.loaded_at >= first.loaded_at
    assert "region" not in first.ids_of_name
    # A transaction through the same handle moves it on in place: its facts are the new
    # metadata's, read afresh (never the cached ones of the version the runtime was made from).
    with table.update_schema() as update:
        update.add_column("region", StringType())
    moved = kept.column_facts()
    assert len(derived) == 2 and "region" in moved.ids_of_name
    assert "region" in kept.refreshed(catalog.load_table(config.table.identifier)).column_facts().ids_of_name
