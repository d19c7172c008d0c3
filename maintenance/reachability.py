"""Which files a set of snapshots references, with their sizes (pyiceberg metadata reads).

Expiring snapshots deletes the files that only they reference: their manifest lists, the
manifests no kept snapshot lists, and the data/delete files live in those manifests but in
no manifest of a kept snapshot (Iceberg's ExpireSnapshots computes the same difference).
Iceberg's procedure reports counts, not bytes; computing the difference here before the
run gives the sizes, and checking afterwards which of those files are really gone makes
the reported ``bytes_freed`` a measurement, not an estimate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from pyiceberg.manifest import DataFileContent, ManifestFile
from pyiceberg.table import Table

FileKind = Literal["data", "delete", "manifest", "manifest-list"]


@dataclass(frozen=True)
class FileRef:
    path: str
    size_bytes: int
    kind: FileKind


class ReferenceReader:
    """Reads each manifest once per run (manifests are immutable and shared between snapshots)."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self._manifests: dict[str, list[ManifestFile]] = {}
        self._content: dict[str, list[FileRef]] = {}

    def manifests_of(self, manifest_list: str) -> list[ManifestFile]:
        if manifest_list not in self._manifests:
            from pyiceberg.manifest import read_manifest_list

            self._manifests[manifest_list] = list(read_manifest_list(self.table.io.new_input(manifest_list)))
        return self._manifests[manifest_list]

    def content_of(self, manifest: ManifestFile) -> list[FileRef]:
        """Live (added or existing) data and delete files of one manifest."""
        if manifest.manifest_path not in self._content:
            refs = []
            for entry in manifest.fetch_manifest_entry(self.table.io, discard_deleted=True):
                f = entry.data_file
                kind: FileKind = "data" if f.content == DataFileContent.DATA else "delete"
                refs.append(FileRef(f.file_path, f.file_size_in_bytes, kind))
            self._content[manifest.manifest_path] = refs
        return self._content[manifest.manifest_path]

    def referenced(self, snapshot_ids: Iterable[int], *, with_content: bool = True) -> dict[str, FileRef]:
        """Every file the snapshots reference: manifest lists, manifests and (optionally) content."""
        out: dict[str, FileRef] = {}
        for sid in snapshot_ids:
            snapshot = self.table.snapshot_by_id(sid)
            if snapshot is None or not snapshot.manifest_list:
                continue
            out[snapshot.manifest_list] = FileRef(snapshot.manifest_list, self._size(snapshot.manifest_list),
                                                  "manifest-list")
            for manifest in self.manifests_of(snapshot.manifest_list):
                if manifest.manifest_path in out:
                    continue
                out[manifest.manifest_path] = FileRef(manifest.manifest_path, manifest.manifest_length, "manifest")
                if with_content:
                    for ref in self.content_of(manifest):
                        out.setdefault(ref.path, ref)
        return out

    def _size(self, path: str) -> int:
        size = file_size(self.table, path)
        return 0 if size is None else size


def only_referenced_by(table: Table, expired_ids: Iterable[int], kept_ids: Iterable[int]) -> dict[str, FileRef]:
    """Files that expiring `expired_ids` while keeping `kept_ids` leaves unreferenced."""
    expired_ids = list(expired_ids)
    if not expired_ids:
        return {}
    reader = ReferenceReader(table)
    kept = reader.referenced(kept_ids)
    gone = reader.referenced(expired_ids)
    return {path: ref for path, ref in gone.items() if path not in kept}


def still_present(table: Table, paths: Iterable[str]) -> set[str]:
    """The paths that still exist (one existence check each through the table's FileIO)."""
    present = set()
    for path in paths:
        try:
            if table.io.new_input(path).exists():
                present.add(path)
        except OSError:
            present.add(path)  # unknown: do not count it as freed
    return present


def file_size(table: Table, path: str) -> int | None:
    """A file's size through the table's FileIO; None when it is missing or unreadable."""
    try:
        return len(table.io.new_input(path))
    except (FileNotFoundError, OSError):
        return None


def file_sizes(table: Table, paths: Iterable[str]) -> dict[str, int]:
    """Sizes of existing files (missing ones are left out)."""
    sizes = {path: file_size(table, path) for path in paths}
    return {path: size for path, size in sizes.items() if size is not None}
