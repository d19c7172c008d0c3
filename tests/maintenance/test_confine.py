"""Orphan removal stays inside the table: symlinks, foreign locations, nested tables (real Spark action).

docs/security.md, "What is deleted and when". Every file the table has is aged past the
safety age in these tests, so only the confinement checks (not youth) can protect a file.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamberg.cli.maintain import render
from streamberg.common.catalog import load_catalog
from streamberg.common.config import load_config
from streamberg.common.schema import schema_from_config
from streamberg.maintenance.app import MaintainOptions, run_maintain
from streamberg.maintenance.confine import outside_reason
from tests.compactor.helpers import FakeIngest, reload, row_multiset
from tests.maintenance.helpers import (
    ALL_OFF,
    age_files,
    files_on_disk,
    local_path,
    setup_maintained,
    write_maintained_config,
)

pytestmark = pytest.mark.spark

TWO_DAYS = 2 * 86400
ORPHANS_ON = {**ALL_OFF, "orphan": {"safety_age_seconds": 3600}}


def _maintain(spark, config) -> dict:
    summary = run_maintain(config, MaintainOptions(once=True), spark=spark)
    assert summary.runs == 1 and summary.last is not None
    return summary.last


def _old_parquet(path: Path, rows: int = 10) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": list(range(rows))}), path)
    age_files([path], TWO_DAYS)
    return path


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_orphan_removal_never_follows_a_symlink(spark, tmp_path: Path) -> None:
    config, _ = setup_maintained(tmp_path / "t", ORPHANS_ON)
    ingest = FakeIngest(config, seed=11)
    ingest.append(100)
    table = reload(config)
    rows = row_multiset(table)
    data_dir = local_path(table.location()) / "data"
    age_files(files_on_disk(table), TWO_DAYS)
    # Precious, old, unreferenced files outside the table, reachable through links inside it.
    precious = tmp_path / "precious"
    for name in ("a.parquet", "nested/b.parquet"):
        _old_parquet(precious / name)
    before = _tree(precious)
    (data_dir / "linked-dir").symlink_to(precious, target_is_directory=True)
    (data_dir / "linked-file.parquet").symlink_to(precious / "a.parquet")
    crashed = _old_parquet(data_dir / "00000-crashed-writer.parquet")  # a genuine orphan

    run = _maintain(spark, config)
    result = run["orphan_files"]

    assert _tree(precious) == before, "files behind a symlink were deleted"
    assert (data_dir / "linked-dir").is_symlink() and (data_dir / "linked-file.parquet").is_symlink()
    assert not crashed.exists() and result["removed"] == 1
    skipped = {Path(local_path(s["path"])).relative_to(data_dir).as_posix(): s["reason"] for s in result["skipped"]}
    # What Spark's listing offered (through the links) is reported, each with its reason.
    assert "linked-file.parquet" in skipped and skipped["linked-file.parquet"].endswith("is a symlink")
    assert {"linked-dir/a.parquet", "linked-dir/nested/b.parquet"} <= skipped.keys(), skipped
    assert all("linked-dir is a symlink" in skipped[k] for k in skipped if k.startswith("linked-dir/"))
    assert result["skipped_count"] == len(skipped)
    assert f"{len(skipped)} skipped, not the table's to delete" in render(run)
    assert row_multiset(reload(config)) == rows


def _create_at(config, identifier: str, location: str):
    catalog = load_catalog(config.catalog)
    catalog.create_namespace_if_not_exists(identifier.split(".")[0])
    return catalog.create_table(identifier, schema=schema_from_config(config.table), location=location)


def test_location_outside_the_warehouse_is_refused_unless_allowed(spark, tmp_path: Path) -> None:
    path = write_maintained_config(tmp_path / "t", ORPHANS_ON)
    config = load_config(path)
    elsewhere = tmp_path / "somebody-elses-folder"
    _create_at(config, config.table.identifier, f"file://{elsewhere}")
    FakeIngest(config, seed=12).append(50)
    age_files(files_on_disk(reload(config)), TWO_DAYS)
    stray = _old_parquet(elsewhere / "data" / "not-ours.parquet")

    result = _maintain(spark, config)

    assert stray.exists()
    step = result["orphan_files"]
    assert result["status"] == "failed" and step["ran"] is False
    assert "outside the catalog warehouse" in step["error"] and "allow_location_outside_warehouse" in step["error"]
    assert "outside the catalog warehouse" in render(result)

    allowed = load_config(path, maintenance={**ORPHANS_ON, "allow_location_outside_warehouse": True})
    assert _maintain(spark, allowed)["orphan_files"]["removed"] == 1 and not stray.exists()


def test_location_containing_another_table_is_refused(spark, tmp_path: Path) -> None:
    config, _ = setup_maintained(tmp_path / "t", ORPHANS_ON)
    FakeIngest(config, seed=13).append(50)
    outer = reload(config)
    inner = _create_at(config, "db.inner", outer.location() + "/inner")
    age_files(files_on_disk(outer), TWO_DAYS)  # the inner table's metadata too: unreferenced by outer
    inner_files = _tree(local_path(inner.location()))
    assert inner_files

    result = _maintain(spark, config)

    step = result["orphan_files"]
    assert result["status"] == "failed" and step["ran"] is False
    assert "contains table db.inner" in step["error"], step
    assert _tree(local_path(inner.location())) == inner_files
    load_catalog(config.catalog).load_table("db.inner")  # still loads


def test_a_table_whose_location_is_a_symlink_into_this_one_is_found(spark, tmp_path: Path) -> None:
    """Another table's location outside this one by name, inside it by its real path."""
    config, _ = setup_maintained(tmp_path / "t", ORPHANS_ON)
    FakeIngest(config, seed=17).append(50)
    outer = reload(config)
    hidden = Path(local_path(outer.location())) / "hidden"
    hidden.mkdir()
    link = tmp_path / "t" / "elsewhere"
    link.symlink_to(hidden)
    inner = _create_at(config, "db.linked", f"file://{link}")
    age_files(files_on_disk(outer), TWO_DAYS)
    inner_files = _tree(hidden)
    assert inner_files

    result = _maintain(spark, config)

    step = result["orphan_files"]
    assert result["status"] == "failed" and step["ran"] is False
    assert "contains table db.linked" in step["error"], step
    assert _tree(hidden) == inner_files
    load_catalog(config.catalog).load_table("db.linked")  # still loads
    assert inner.location().endswith("elsewhere")


@pytest.mark.parametrize(("path", "reason"), [
    ("file:///w/t/data/../../other/x.parquet", "the path contains '..'"),
    ("file:///w/other/x.parquet", "outside the table location"),
    ("file:///w/t", "outside the table location"),
    ("s3://bucket/w/t/data/x.parquet", "outside the table location"),  # another file system
    ("file:///w/t/data/x.parquet", None),
])
def test_candidate_paths_outside_the_location(path: str, reason: str | None) -> None:
    assert outside_reason(path, "file:///w/t") == reason


def test_one_bucket_under_two_schemes_is_one_store() -> None:
    from streamberg.maintenance.confine import is_within, place

    assert outside_reason("s3a://bucket/w/t/data/x.parquet", "s3://bucket/w/t") is None
    assert is_within(place("s3a://Bucket/w/t/inner"), place("s3://bucket/w/t"))
    assert is_within(place("abfss://c@acct.dfs.core.windows.net/w/t/i"), place("abfs://c@acct.dfs.core.windows.net/w/t"))
    assert not is_within(place("s3a://other/w/t/inner"), place("s3://bucket/w/t"))


def test_object_store_prefixes_need_a_path_boundary() -> None:
    assert outside_reason("s3://b/w/t-other/x.parquet", "s3://b/w/t") == "outside the table location"
    assert outside_reason("s3://b/w/t/data/x.parquet", "s3://b/w/t") is None


def test_a_catalog_stating_no_warehouse_location_needs_the_operators_word() -> None:
    """A REST catalog whose warehouse is a name states no location to hold orphan removal in:
    refused, naming the key, until maintenance.allow_location_outside_warehouse is set."""
    from streamberg.common.config.components import MaintenanceConfig
    from streamberg.common.errors import LocationRefused
    from streamberg.maintenance.confine import check_location

    class NoOtherTables:
        def list_namespaces(self) -> list:
            return []

    with pytest.raises(LocationRefused, match="allow_location_outside_warehouse"):
        check_location(MaintenanceConfig(), None, NoOtherTables(), "db.t", "s3://lake/db/t")
    check_location(MaintenanceConfig(allow_location_outside_warehouse=True), None, NoOtherTables(), "db.t",
                   "s3://lake/db/t")
    with pytest.raises(LocationRefused, match="outside the catalog warehouse"):
        check_location(MaintenanceConfig(), "s3://lake/warehouse", NoOtherTables(), "db.t", "s3://other/db/t")


def test_an_unreadable_table_elsewhere_never_stops_orphan_removal(tmp_path) -> None:
    """One table anywhere in the catalog whose metadata cannot be read (issue 38, item 7): it is
    placed by the catalog's record of its metadata file. Outside the table: named as passed
    over, orphan removal goes on. Inside it: still refused (its files would look orphaned)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    from streamberg.common.config.components import MaintenanceConfig
    from streamberg.common.errors import LocationRefused
    from streamberg.maintenance.confine import check_location

    warehouse = tmp_path / "warehouse"
    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{warehouse}")
    catalog.create_namespace("db")
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    ours = catalog.create_table("db.t", schema=schema)
    broken = catalog.create_table("db.broken", schema=schema)
    Path(broken.metadata_location.removeprefix("file://")).write_text("{not json")
    settings = MaintenanceConfig()
    unchecked = check_location(settings, f"file://{warehouse}", catalog, "db.t", ours.location())
    assert unchecked == []  # placed by its recorded metadata file: outside db.t, nothing passed over

    inner = catalog.create_table("db.inner", schema=schema, location=f"{ours.location()}/inner")
    Path(inner.metadata_location.removeprefix("file://")).write_text("{not json")
    with pytest.raises(LocationRefused, match="contains table db.inner"):
        check_location(settings, f"file://{warehouse}", catalog, "db.t", ours.location())
    catalog.drop_table("db.inner")

    class Unplaceable:  # a catalog that cannot say where an unreadable table lies
        name = "c"

        def list_namespaces(self):
            return catalog.list_namespaces()

        def list_tables(self, namespace):
            return catalog.list_tables(namespace)

        def load_table(self, identifier):
            return catalog.load_table(identifier)

    unchecked = check_location(settings, f"file://{warehouse}", Unplaceable(), "db.t", ours.location())
    assert len(unchecked) == 1 and unchecked[0].startswith("db.broken: cannot be read"), unchecked
