"""Table metadata that stays bounded: old metadata files deleted after each commit.

Every Iceberg commit writes a new metadata JSON and keeps the old one. Iceberg Java deletes
the versions beyond `write.metadata.previous-versions-max` after each commit when
`write.metadata.delete-after-commit.enabled` is true; pyiceberg 0.8.1 trims its metadata log
to that many entries but deletes nothing, so a table committed every few seconds by the
ingest would keep every version (each larger than the last: a quadratic folder).

So the catalog streamberg opens commits through `PrunesMetadata`, which does what Iceberg
Java does: after a successful commit, the metadata files the previous version listed (its
log and itself) that the new version no longer lists are deleted, when the table says so.
Only `*.metadata.json` files under the table's own `metadata/` folder are ever deleted.

Every table streamberg creates carries `BOUNDED_METADATA` (below), and the
ingest and the merge set it on the tables they write when it is absent (`bound_metadata`):
an operator's explicit value is never changed.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import CommitTableResponse, Table

from streamberg.common.log import get_logger

# Iceberg's own table properties that keep a streaming table's metadata bounded, with the
# values streamberg sets on every table it creates (and on tables it writes that lack them):
# a commit every few seconds must not leave every metadata version behind.
METADATA_DELETE_AFTER_COMMIT = "write.metadata.delete-after-commit.enabled"
METADATA_PREVIOUS_VERSIONS_MAX = "write.metadata.previous-versions-max"
MANIFEST_MERGE_ENABLED = "commit.manifest-merge.enabled"
BOUNDED_METADATA = {
    # Old metadata files are deleted after each commit beyond the last few (Iceberg Java does
    # it itself; pyiceberg commits go through PrunesMetadata below).
    METADATA_DELETE_AFTER_COMMIT: "true",
    METADATA_PREVIOUS_VERSIONS_MAX: "10",
    # Appends merge small manifests once commit.manifest.min-count-to-merge (100) pile up, so
    # the manifest list stays bounded (Iceberg Java's default; pyiceberg's merge_append
    # honours it, its default is off).
    MANIFEST_MERGE_ENABLED: "true",
}


def _truthy(value: str | None) -> bool:
    return str(value).strip().lower() == "true"


def _same_form(path: str) -> str:
    """A path compared across writers: Iceberg Java writes local files as `file:/x`,
    pyiceberg as `file:///x`."""
    if path.startswith("file:"):
        return "file://" + "/" + path.removeprefix("file:").lstrip("/")
    return path


def dropped_metadata_files(before: Any, before_location: str | None, after: Any, after_location: str,
                           table_location: str) -> list[str]:
    """The metadata files the version before listed and the version after does not: the
    ones to delete (only `*.metadata.json` inside the table's `metadata/` folder)."""
    listed_before = {_same_form(e.metadata_file) for e in before.metadata_log}
    if before_location:
        listed_before.add(_same_form(before_location))
    listed_after = {_same_form(e.metadata_file) for e in after.metadata_log} | {_same_form(after_location)}
    folder = _same_form(table_location).rstrip("/") + "/metadata/"
    return sorted(p for p in listed_before - listed_after
                  if p.startswith(folder) and p.endswith(".metadata.json") and "/" not in p[len(folder):])


_VERSIONED = re.compile(r"^(\d+)-[0-9a-f-]+\.metadata\.json$")


def stray_metadata_files(metadata: Any, location: str) -> list[str]:
    """Metadata files in a local table's `metadata/` folder older than every version the log
    keeps and listed nowhere: the files of commits that lost their race (Iceberg Java's JDBC
    catalog leaves them; a commit in flight writes a version newer than the log's, never
    older). Object stores are left to orphan removal: pyiceberg's FileIO cannot list."""
    kept = [_same_form(e.metadata_file) for e in metadata.metadata_log] + [_same_form(location)]
    versions = [int(m.group(1)) for p in kept if (m := _VERSIONED.match(p.rsplit("/", 1)[-1]))]
    folder = _same_form(metadata.location).rstrip("/") + "/metadata/"
    if not versions or not folder.startswith("file:///"):
        return []
    try:
        names = os.listdir(folder.removeprefix("file://"))
    except OSError:
        return []
    oldest, listed = min(versions), set(kept)
    return [folder + n for n in names
            if (m := _VERSIONED.match(n)) and int(m.group(1)) < oldest and folder + n not in listed]


class PrunesMetadata:
    """A pyiceberg catalog mixin: commit, then delete the metadata files dropped from the log;
    and the metadata file of a commit that lost its race, which pyiceberg leaves behind."""

    _staged = threading.local()

    def _write_metadata(self, metadata: Any, io: Any, metadata_path: str) -> None:
        super()._write_metadata(metadata, io, metadata_path)  # type: ignore[misc]
        self._staged.path = metadata_path

    def commit_table(self, table: Table, requirements: Any, updates: Any) -> CommitTableResponse:
        self._staged.path = None
        try:
            response: CommitTableResponse = super().commit_table(table, requirements, updates)  # type: ignore[misc]
        except CommitFailedException:
            # The catalog refused the swap (another commit won): the file written for it is
            # referenced by nothing, ever. Any other failure may have landed: left alone.
            staged = self._staged.path
            if staged is not None:
                try:
                    table.io.delete(staged)
                except Exception:  # noqa: BLE001 - orphan removal gets it later
                    pass
            raise
        metadata = response.metadata
        if not _truthy(metadata.properties.get(METADATA_DELETE_AFTER_COMMIT)):
            return response
        base, base_location = table.metadata, table.metadata_location
        previous = metadata.metadata_log[-1].metadata_file if metadata.metadata_log else None
        if previous is not None and previous != base_location:
            # Another writer (Spark's expiry, the compactor) committed after `table` was read:
            # this commit's true base is that version, whose log is what to compare with.
            try:
                base = FromInputFile.table_metadata(table.io.new_input(previous))
                base_location = previous
            except Exception:  # noqa: BLE001 - unreadable: compare with what we have; orphans get the rest
                pass
        doomed = dropped_metadata_files(base, base_location, metadata, response.metadata_location,
                                        metadata.location)
        if doomed:
            doomed += stray_metadata_files(metadata, response.metadata_location)
        for path in doomed:
            try:
                table.io.delete(path)
            except FileNotFoundError:
                pass  # deleted already (another committer, or by hand)
            except Exception as exc:  # noqa: BLE001 - the commit stands; orphan removal gets the file later
                get_logger("catalog", table=".".join(table.name())).warning(
                    "an old metadata file could not be deleted; orphan removal will", path=path,
                    error=f"{type(exc).__name__}: {str(exc)[:200]}")
        return response


class ParsedMetadata:
    """Each table's latest parsed metadata file, by its location: what a SQL catalog builds a
    table on while the catalog's row names that file. A metadata file is never rewritten (a
    commit writes a new one and swaps the catalog's pointer), so a kept parse is the file.
    One entry a table (its latest), at most `max_tables`, oldest forgotten first. A catalog
    keeps its own; one that is opened again and again (a status pass's read-only catalog) is
    given its owner's (`KeepsParsedMetadata.parsed`)."""

    def __init__(self, max_tables: int = 8192) -> None:
        self.max_tables = max_tables
        self._by_table: dict[tuple[str, str], tuple[str, Any]] = {}
        self._lock = threading.Lock()

    def get(self, table: tuple[str, str], location: str) -> Any | None:
        found = self._by_table.get(table)
        return found[1] if found is not None and found[0] == location else None

    def keep(self, table: tuple[str, str], location: str, metadata: Any) -> None:
        with self._lock:
            if table not in self._by_table and len(self._by_table) >= self.max_tables:
                self._by_table.pop(next(iter(self._by_table)), None)  # parsed again when next loaded
            self._by_table[table] = (location, metadata)


class KeepsParsedMetadata:
    """A pyiceberg SqlCatalog mixin: a load whose row names the metadata file parsed last
    builds the table on that parse, so the row's one SELECT is the whole cost. The governor's
    probes, the opt-in listing and the status model load each of a thousand mostly idle
    tables again and again; the JSON parse was a third of each load. A commit through the
    catalog keeps the metadata it wrote."""

    @property
    def parsed(self) -> ParsedMetadata:
        kept = self.__dict__.get("_parsed")
        if kept is None:
            kept = self.__dict__.setdefault("_parsed", ParsedMetadata())
        return kept

    @parsed.setter
    def parsed(self, kept: ParsedMetadata) -> None:
        self.__dict__["_parsed"] = kept

    def _convert_orm_to_iceberg(self, orm_table: Any) -> Table:
        key, location = (orm_table.table_namespace, orm_table.table_name), orm_table.metadata_location
        metadata = self.parsed.get(key, location) if location else None
        if metadata is None:
            table: Table = super()._convert_orm_to_iceberg(orm_table)  # type: ignore[misc]
            self.parsed.keep(key, location, table.metadata)
            return table
        return Table(identifier=Catalog.identifier_to_tuple(orm_table.table_namespace) + (orm_table.table_name,),
                     metadata=metadata, metadata_location=location,
                     io=self._load_file_io(metadata.properties, location),  # type: ignore[attr-defined]
                     catalog=self)  # type: ignore[arg-type]

    def load_namespace_tables(self, namespace: str) -> list[tuple[tuple[str, ...], Table | Exception]]:
        """Every table of the namespace from one SELECT of the catalog's rows (a load a table
        is a SELECT a table), each built on its kept parse or parsed now; a table whose
        metadata cannot be read is its exception, the others are loaded. Raises as
        `list_tables` does (NoSuchNamespaceError)."""
        from pyiceberg.catalog.sql import IcebergTables
        from pyiceberg.exceptions import NoSuchNamespaceError
        from sqlalchemy import select
        from sqlalchemy.orm import Session

        if not self._namespace_exists(namespace):  # type: ignore[attr-defined]
            raise NoSuchNamespaceError(f"Namespace does not exist: {namespace}")
        statement = select(IcebergTables).where(IcebergTables.catalog_name == self.name,  # type: ignore[attr-defined]
                                                IcebergTables.table_namespace == namespace)
        with Session(self.engine) as session:  # type: ignore[attr-defined]
            rows = list(session.scalars(statement))
        out: list[tuple[tuple[str, ...], Table | Exception]] = []
        for row in rows:
            identifier = Catalog.identifier_to_tuple(row.table_namespace) + (row.table_name,)
            try:
                out.append((identifier, self._convert_orm_to_iceberg(row)))
            except Exception as exc:  # noqa: BLE001 - this table's metadata; the others are read
                out.append((identifier, exc))
        return out

    def commit_table(self, table: Table, requirements: Any, updates: Any) -> CommitTableResponse:
        response: CommitTableResponse = super().commit_table(table, requirements, updates)  # type: ignore[misc]
        identifier = table.name()
        key = (Catalog.namespace_to_string(Catalog.namespace_from(identifier)), Catalog.table_name_from(identifier))
        self.parsed.keep(key, response.metadata_location, response.metadata)
        return response


class PruningSqlCatalog(KeepsParsedMetadata, PrunesMetadata, SqlCatalog):
    """pyiceberg's SqlCatalog, deleting old metadata files after each commit as Iceberg Java
    does, and building a table on its kept parse while its metadata file is the same."""


def pruning_glue_catalog() -> type:
    """pyiceberg's Glue catalog with the same pruning (imported on use: boto3)."""
    from pyiceberg.catalog.glue import GlueCatalog

    return type("PruningGlueCatalog", (PrunesMetadata, GlueCatalog), {})


def pruning_hive_catalog() -> type:
    """pyiceberg's Hive catalog with the same pruning (imported on use: thrift)."""
    from pyiceberg.catalog.hive import HiveCatalog

    return type("PruningHiveCatalog", (PrunesMetadata, HiveCatalog), {})


def bound_metadata(table: Table) -> Table:
    """Set BOUNDED_METADATA's properties the table lacks (never one it has); the table again."""
    missing = {k: v for k, v in BOUNDED_METADATA.items() if k not in table.properties}
    if not missing:
        return table
    with table.transaction() as tx:
        tx.set_properties(missing)
    return table.refresh()
