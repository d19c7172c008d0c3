"""What the governor's replan costs for tables that did not change (issue 50: the governor's
CPU over a thousand mostly idle tables).

- The SQL catalog builds a table on its kept parse while the catalog's row names the same
  metadata file: loaded again, nothing is parsed; a commit by another process (another
  catalog instance), one through this catalog, and a table dropped and made again under the
  same name are each seen as they are.
- The opt-in listing builds a table's config once per config file: listed again, no config
  is built and the same objects come back (the keeper's comparison is an identity); a table
  whose policy keys are removed leaves the listing, and a changed config file builds every
  table again with its new value.

Real SQLite catalog, real tables; the parse and the build are counted by wrapping the real
functions (they still run).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

import streamberg.governor.tables as governed
from streamberg.common.catalog import load_catalog
from streamberg.common.catalog_open import close_catalog
from streamberg.common.metadata_files import PruningSqlCatalog
from streamberg.governor.tables import GovernedTables
from streamberg.table_meta.declared import ensure_table
from tests.compactor.helpers import make_rows, write_config
from tests.helpers import FakeClock, config_at, count_metadata_parses

NAMES = [f"lake.t{i}" for i in range(4)]


@pytest.fixture
def parses(monkeypatch) -> list[str]:
    return count_metadata_parses(monkeypatch)


def _made(tmp_path: Path) -> tuple[Path, object]:
    path = write_config(tmp_path)
    document = yaml.safe_load(path.read_text())
    document["govern"] = {"namespaces": ["lake"]}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    config = config_at(path)
    catalog = load_catalog(config.catalog)
    ensure_table(catalog, config.table)
    for name in [*NAMES, "lake.plain"]:  # lake.plain carries no policy: never kept
        table = ensure_table(catalog, config.table.model_copy(update={"identifier": name}))
        if name != "lake.plain":
            with table.transaction() as tx:
                tx.set_properties({"streamberg.compact.min_files": "3"})
    return path, catalog


def _append(table, rows: int, start: int) -> None:
    table.append(make_rows(table, rows, start, seed=start))


def test_a_table_loaded_again_is_not_parsed_again(tmp_path: Path, parses: list[str]) -> None:
    path, made = _made(tmp_path)
    config = config_at(path)
    catalog = load_catalog(config.catalog)
    first = catalog.load_table("lake.t0")
    parses.clear()
    again = catalog.load_table("lake.t0")
    assert parses == [] and again.metadata is first.metadata and again.metadata_location == first.metadata_location

    # Another process commits (its own catalog instance): the row names a new file, parsed once.
    other = load_catalog(config.catalog)
    assert other is not catalog
    _append(other.load_table("lake.t0"), 5, 0)
    written = other.load_table("lake.t0")
    parses.clear()
    seen = catalog.load_table("lake.t0")
    assert parses == [written.metadata_location]
    assert seen.current_snapshot().snapshot_id == written.current_snapshot().snapshot_id
    assert len(seen.scan().to_arrow()) == 5
    parses.clear()
    assert catalog.load_table("lake.t0").metadata is seen.metadata and parses == []

    # A commit through this catalog keeps what it wrote: the next load parses nothing and
    # sees the commit (5 + 7 rows, two snapshots).
    _append(seen, 7, 100)
    parses.clear()
    after = catalog.load_table("lake.t0")
    assert parses == [] and after.metadata_location == seen.metadata_location
    assert len(after.metadata.snapshots) == 2 and len(after.scan().to_arrow()) == 12

    # Dropped and made again under the same name: a new table, not the kept one.
    other.drop_table("lake.t0")
    ensure_table(other, config.table.model_copy(update={"identifier": "lake.t0"}))
    remade = catalog.load_table("lake.t0")
    assert remade.metadata_location != after.metadata_location
    assert remade.current_snapshot() is None and len(remade.scan().to_arrow()) == 0

    # Other tables are kept apart: each its own metadata, by its own row.
    tables = {name: catalog.load_table(name) for name in NAMES[1:]}
    assert len({t.metadata.table_uuid for t in tables.values()}) == 3
    assert all(t.metadata.location.rstrip("/").endswith(name.split(".")[1]) for name, t in tables.items())
    for opened in (catalog, other, made):
        close_catalog(opened)


def test_the_opt_in_listing_builds_a_tables_config_once(tmp_path: Path, monkeypatch, parses: list[str]) -> None:
    path, catalog = _made(tmp_path)
    built: list[str] = []
    real = governed.config_from_dump

    def counting(document, *args, **kwargs):
        built.append(document["table"]["identifier"])
        return real(document, *args, **kwargs)

    monkeypatch.setattr(governed, "config_from_dump", counting)
    clock = FakeClock()
    tables = GovernedTables(path, ["lake"], replan_seconds=60, clock=clock)
    first = {c.table.identifier: c for c in tables.current()}
    assert sorted(first) == sorted(["db.events", *NAMES]) and sorted(built) == sorted(NAMES)
    assert all(first[n].compactor.checkpoint_dir != first["db.events"].compactor.checkpoint_dir for n in NAMES)

    # Listed again past replan_seconds, nothing changed: nothing built, nothing parsed, the same
    # objects, and no table loaded one by one (the namespace's rows come in one SELECT).
    loads: list[str] = []
    real_load = PruningSqlCatalog.load_table
    monkeypatch.setattr(PruningSqlCatalog, "load_table",
                        lambda self, identifier: loads.append(identifier) or real_load(self, identifier))
    built.clear()
    parses.clear()
    clock.advance(61)
    second = {c.table.identifier: c for c in tables.current()}
    assert built == [] and parses == [] and loads == []
    assert sorted(second) == sorted(first) and all(second[n] is first[n] for n in NAMES)

    # A table whose metadata cannot be read is refused under its own name; the others are kept.
    broken = ensure_table(catalog, config_at(path).table.model_copy(update={"identifier": "lake.broken"}))
    with broken.transaction() as tx:
        tx.set_properties({"streamberg.compact.min_files": "3"})
    engine = sa.create_engine(config_at(path).catalog.uri)
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE iceberg_tables SET metadata_location = :gone WHERE table_name = 'broken'"),
                           {"gone": str(tmp_path / "gone.metadata.json")})
    engine.dispose()
    clock.advance(61)
    listed = {c.table.identifier: c for c in tables.current()}
    assert "lake.broken" not in listed and all(listed[n] is first[n] for n in NAMES)
    assert "cannot be read" in tables.refusals()["lake.broken"] and "gone.metadata.json" in tables.refusals()["lake.broken"]
    catalog.drop_table("lake.broken")

    # A table's policy keys removed (by another writer): it leaves the listing; the others stay as they were.
    other = load_catalog(config_at(path).catalog)
    with other.load_table("lake.t2").transaction() as tx:
        tx.remove_properties("streamberg.compact.min_files")
    clock.advance(61)
    third = {c.table.identifier: c for c in tables.current()}
    assert "lake.t2" not in third and built == [] and all(third[n] is first[n] for n in NAMES if n != "lake.t2")

    # The config file changed: every opted-in table built again, with the new setting.
    document = yaml.safe_load(path.read_text())
    document["compactor"]["merge_factor"] = 8
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    clock.advance(61)
    fourth = {c.table.identifier: c for c in tables.current()}
    assert sorted(built) == sorted(n for n in NAMES if n != "lake.t2")
    assert all(fourth[n].compactor.merge_factor == 8 for n in fourth)
    assert all(fourth[n] is not first[n] for n in NAMES if n != "lake.t2")

    # Its keys set again: kept again, built from the current config.
    with other.load_table("lake.t2").transaction() as tx:
        tx.set_properties({"streamberg.compact.min_files": "2"})
    built.clear()
    clock.advance(61)
    fifth = {c.table.identifier: c for c in tables.current()}
    assert built == ["lake.t2"] and fifth["lake.t2"].compactor.merge_factor == 8
    for opened in (catalog, other):
        close_catalog(opened)
