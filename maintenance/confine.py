"""Keep orphan-file deletion inside the table (docs/security.md, "What is deleted and when").

Orphan removal lists "everything under the table location" and deletes what no snapshot
references; the location comes from the catalog. Three things could make that delete files
that are not the table's:

1. a location outside the warehouse (a mistyped or hostile catalog entry: `/`, a home
   folder): refused unless `maintenance.allow_location_outside_warehouse` is true;
2. a location that contains another table's location (a table created at its parent's path,
   the dead-letter table under the main one): refused, always;
3. a symbolic link inside the location: Hadoop's local file system lists through it, so the
   files it points at would look like old, unreferenced files of this table. Every candidate
   is checked before it is deleted: inside the location after normalisation (no `..`), and
   no component from the location down to the file is a symlink (lstat). Failing ones are
   skipped and reported. Object stores have no symlinks; their paths get the prefix check.

Each check is made just before its delete as well (a link swapped in after the listing is
still caught, up to the moment of the lstat).
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from urllib.parse import urlsplit

from pyiceberg.catalog import Catalog

from streamberg.common.config import MaintenanceConfig
from streamberg.common.errors import LocationRefused


@dataclass(frozen=True)
class Place:
    """A storage location split into what identifies a file system and a normalised path."""

    filesystem: str  # "" for the local file system, else scheme://bucket
    path: str  # absolute, normalised, no trailing slash
    raw_path: str  # as given, to spot `..` segments

    @property
    def local(self) -> bool:
        return self.filesystem == ""


# Schemes that name the same store (Hadoop's connectors and their TLS variants): one bucket
# reached as s3:// and s3a:// is one file system, and a table inside it is inside it.
_SAME_STORE = {"s3a": "s3", "s3n": "s3", "abfss": "abfs", "wasbs": "wasb", "gcs": "gs"}


def place(location: str) -> Place:
    parts = urlsplit(location)
    if parts.scheme in ("", "file"):
        raw = parts.path if parts.scheme else location
        return Place("", posixpath.normpath(raw) if raw else "/", raw)
    raw = parts.path or "/"
    scheme = parts.scheme.lower()
    return Place(f"{_SAME_STORE.get(scheme, scheme)}://{parts.netloc.lower()}", posixpath.normpath(raw), raw)


def is_within(child: Place, parent: Place) -> bool:
    """`child` is `parent` or below it (same file system, path prefix on a `/` boundary)."""
    if child.filesystem != parent.filesystem:
        return False
    return child.path == parent.path or child.path.startswith(parent.path.rstrip("/") + "/")


def _real(p: Place) -> Place:
    # The warehouse check compares where folders really are: a warehouse reached through a
    # symlink still contains its tables.
    return Place("", os.path.realpath(p.path), p.raw_path) if p.local else p


def recorded_location(catalog: Catalog, identifier: tuple[str, ...]) -> str | None:
    """Where a table whose metadata cannot be read lies, from the catalog's own record of its
    metadata file (`<location>/metadata/<file>`): a SQL catalog keeps it in a row; None when
    the catalog cannot say without reading the metadata."""
    engine = getattr(catalog, "engine", None)
    if engine is None or len(identifier) < 2:
        return None
    import sqlalchemy as sa

    try:
        with engine.connect() as conn:
            row = conn.execute(sa.text(
                "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = :c AND table_namespace = :n "
                "AND table_name = :t"), {"c": catalog.name, "n": ".".join(identifier[:-1]), "t": identifier[-1]}).first()
    except Exception:  # noqa: BLE001 - not a catalog database of that shape: unknown
        return None
    if row is None or not row[0]:
        return None
    folder = posixpath.dirname(str(row[0]))
    return posixpath.dirname(folder) if posixpath.basename(folder) == "metadata" else folder


def check_location(settings: MaintenanceConfig, warehouse_path: str | None, catalog: Catalog, identifier: str,
                   location: str) -> list[str]:
    """Raise LocationRefused when orphan removal must not run on the table at `location`
    (in `catalog`, whose warehouse is `warehouse_path`: None when the catalog states no
    location for it, a REST catalog whose warehouse is a name). Returns what could not be
    checked: another table whose metadata cannot be read is placed by the catalog's record of
    its metadata file when there is one, else named here and passed over, so one broken table
    anywhere in the catalog never stops orphan removal of every other."""
    table_place = place(location)
    if warehouse_path is None and not settings.allow_location_outside_warehouse:
        raise LocationRefused(
            f"table {identifier} is located at {location}, and the catalog states no warehouse location to hold "
            "orphan removal inside (a REST catalog's warehouse is a name); set "
            "maintenance.allow_location_outside_warehouse: true once each table's location holds only its own files")
    if warehouse_path is not None and not is_within(_real(table_place), _real(place(warehouse_path))) \
            and not settings.allow_location_outside_warehouse:
        raise LocationRefused(
            f"table {identifier} is located at {location}, outside the catalog warehouse "
            f"{warehouse_path}; orphan removal deletes unreferenced files under the table location, "
            "so it refuses to run there. Move the table, or set maintenance.allow_location_outside_warehouse: true "
            "if that location holds only this table's files")
    if table_place.path == "/":
        raise LocationRefused(f"table {identifier} is located at the root of {location}; orphan removal refuses it")
    unchecked: list[str] = []
    for namespace in catalog.list_namespaces():
        for other in catalog.list_tables(namespace):
            name = ".".join(other)
            if name == identifier:
                continue
            try:
                other_location = catalog.load_table(other).location()
            except Exception as exc:  # noqa: BLE001 - placed by the catalog's record, or named and passed over
                recorded = recorded_location(catalog, tuple(other))
                if recorded is None:
                    unchecked.append(f"{name}: cannot be read ({type(exc).__name__}: {str(exc)[:160]}) and the catalog "
                                     "records no location for it")
                    continue
                other_location = recorded
            # Where the folders really are: another table's location may be a symlink into this one.
            if is_within(place(other_location), table_place) or \
                    is_within(_real(place(other_location)), _real(table_place)):
                raise LocationRefused(
                    f"table {identifier} at {location} contains table {name} (at {other_location}); orphan removal "
                    f"would delete {name}'s files as unreferenced, so it refuses to run. Give each table a "
                    "location of its own")
    return unchecked


def outside_reason(path: str, location: str) -> str | None:
    """Why orphan removal must not delete `path` of the table at `location`, or None if it may."""
    target, root = place(path), place(location)
    if ".." in target.raw_path.split("/"):
        return "the path contains '..'"
    if not is_within(target, root) or target.path == root.path:
        return "outside the table location"
    if not target.local:
        return None  # object stores have no symlinks
    relative = posixpath.relpath(target.path, root.path).split("/")
    current = root.path
    if os.path.islink(current):
        return f"the table location {current} is a symlink"
    for part in relative:
        current = posixpath.join(current, part)
        if os.path.islink(current):  # lstat: the link itself, never its target
            return f"{current} is a symlink"
    return None


def confine(paths: list[str], location: str) -> tuple[list[str], dict[str, str]]:
    """(paths that may be deleted, {skipped path: reason})."""
    kept, skipped = [], {}
    for path in paths:
        reason = outside_reason(path, location)
        if reason is None:
            kept.append(path)
        else:
            skipped[path] = reason
    return kept, skipped
