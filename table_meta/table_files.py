"""A table's live data files as every component reads them: the files, which are pending
(added by an ingest append, not optimized yet), the manifest cache, the target file size,
partition names and the record of sealed runs.

Pending files are derived from the table itself, never from a side ledger: a live data file
is *pending* when the snapshot that added it is an ``append`` (ingest) or a merge of a
primary-key table's change log (SummaryKeys.CHANGELOG_APPLIED, an ``overwrite``). Files added by
``replace`` snapshots (the compactor, or any other rewrite) are optimized and an incremental
pass never touches them again. (A file whose adding snapshot has been expired cannot be
classified and is treated as optimized.) Maintenance never expires the snapshots that added
a pending file; monitoring counts them as the compactor's backlog.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus, ManifestFile
from pyiceberg.table import Table, TableProperties

from streamberg.common.config.table import DEFAULT_TARGET_FILE_SIZE_BYTES
from streamberg.table_meta.summary_keys import SummaryKeys, TablePropertyKeys

APPEND = "append"
TARGET_SIZE_PROPERTY = TableProperties.WRITE_TARGET_FILE_SIZE_BYTES


def target_file_size(table: Table, configured: int | None = None,
                     default: int = DEFAULT_TARGET_FILE_SIZE_BYTES) -> int:
    """The one rule for the size of a data file, wherever it is asked: `configured` (the
    compactor's own compactor.target_file_size_bytes, for rewrites), else the table's
    write.target-file-size-bytes, else `default` (table.target_file_size_bytes). Ingest
    writers, rewrites, and `streamberg status` (small files) all measure against it."""
    if configured is not None:
        return configured
    prop = table.properties.get(TARGET_SIZE_PROPERTY)
    return int(prop) if prop else default


@dataclass(frozen=True)
class DataFileInfo:
    """One live data file."""

    path: str
    size_bytes: int
    record_count: int
    spec_id: int
    partition: tuple[Any, ...]
    snapshot_id: int  # the snapshot that added it
    sequence_number: int  # its data sequence number (a rewrite's files keep the plan's)
    added_at_ms: int | None  # that snapshot's commit time (None when it has been expired)
    # Serialized per-column min/max from the manifest (field id -> bytes; absent: unknown).
    lower_bounds: dict[int, bytes] = field(default_factory=dict, compare=False, hash=False, repr=False)
    upper_bounds: dict[int, bytes] = field(default_factory=dict, compare=False, hash=False, repr=False)


@dataclass(frozen=True)
class DeleteFileInfo:
    """One live delete file (position or equality deletes) and the partition it applies to."""

    path: str
    spec_id: int
    partition: tuple[Any, ...]
    record_count: int  # deletes it holds (a position delete file: rows deleted)


def adds_new_data(snapshot: Any) -> bool:
    """Whether a snapshot brings new data the compactor has not laid out: an ingest append, or
    a merge into a primary-key table (its inserted and updated rows)."""
    summary = snapshot.summary
    if summary is None:
        return False
    return summary.operation.value == APPEND or SummaryKeys.CHANGELOG_APPLIED in summary.additional_properties


class ManifestCache:
    """Parsed live entries per manifest file. Manifests are immutable, so a long-running
    process reads each one once and later listings only read the manifests that are new."""

    def __init__(self, max_manifests: int = 4096) -> None:
        self._entries: dict[str, list[tuple[Any, ...]]] = {}
        self._deletes: dict[str, list[DeleteFileInfo]] = {}
        self._derived: dict[tuple[Any, ...], Any] = {}
        self._latest: dict[str, tuple[str, Any]] = {}  # thing -> (its version, the fact of that version)
        self._max = max_manifests

    def derived(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """A fact read only from immutable files, named by `key` (a table and a snapshot id, say):
        made once, served after (the oldest forgotten past the cache's size)."""
        if key in self._derived:
            return self._derived[key]
        value = make()
        if len(self._derived) >= self._max:
            self._derived.pop(next(iter(self._derived)))
        self._derived[key] = value
        return value

    def latest(self, thing: str, version: str, make: Callable[[], Any]) -> Any:
        """A fact of `thing` (a table) at `version` (its metadata file: immutable), kept for the
        latest version only: a table committing every few seconds holds one entry, not one a
        commit (the oldest thing forgotten past the cache's size)."""
        kept = self._latest.get(thing)
        if kept is not None and kept[0] == version:
            return kept[1]
        value = make()
        self._latest.pop(thing, None)
        if len(self._latest) >= self._max:
            self._latest.pop(next(iter(self._latest)))
        self._latest[thing] = (version, value)
        return value

    def delete_entries(self, table: Table, manifest: ManifestFile) -> list[DeleteFileInfo]:
        cached = self._deletes.get(manifest.manifest_path)
        if cached is not None:
            return cached
        rows = [DeleteFileInfo(entry.data_file.file_path, manifest.partition_spec_id,
                               tuple(entry.data_file.partition[i] for i in range(len(entry.data_file.partition))),
                               entry.data_file.record_count)
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)]
        if len(self._deletes) >= self._max:
            self._deletes.pop(next(iter(self._deletes)))
        self._deletes[manifest.manifest_path] = rows
        return rows

    def has(self, manifest: ManifestFile) -> bool:
        """Whether the manifest's live entries are kept (read before, not forgotten since)."""
        return manifest.manifest_path in self._entries

    def entries(self, table: Table, manifest: ManifestFile) -> list[tuple[Any, ...]]:
        cached = self._entries.get(manifest.manifest_path)
        if cached is not None:
            return cached
        rows = []
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            data_file = entry.data_file
            if data_file.content != DataFileContent.DATA:
                continue
            rows.append((
                data_file.file_path, data_file.file_size_in_bytes, data_file.record_count,
                manifest.partition_spec_id, tuple(data_file.partition[i] for i in range(len(data_file.partition))),
                entry.snapshot_id, entry.sequence_number,
                dict(data_file.lower_bounds or {}), dict(data_file.upper_bounds or {}),
            ))
        if len(self._entries) >= self._max:
            self._entries.pop(next(iter(self._entries)))
        self._entries[manifest.manifest_path] = rows
        return rows


def snapshot_entries(io: Any, snapshot: Any, status: ManifestEntryStatus) -> Iterator[tuple[int, Any]]:
    """(partition spec id, data file) of each manifest entry `snapshot` itself recorded with
    `status` (ADDED: the files it added; DELETED: the files it removed), from the manifests it
    wrote (a manifest carried over from an earlier snapshot records none of its entries)."""
    for manifest in snapshot.manifests(io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
            if entry.status == status and entry.snapshot_id == snapshot.snapshot_id:
                yield manifest.partition_spec_id, entry.data_file


def live_data_files(table: Table, cache: ManifestCache | None = None) -> tuple[list[DataFileInfo], bool]:
    """All live data files of the current snapshot, and whether any delete files are live.
    With a cache, listed once a metadata file (a status pass reads them for the files, the
    clustering and the compactor's backlog; an idle table's again only when it changes)."""
    if table.current_snapshot() is None:
        return [], False
    if cache is None:
        return _live_data_files(table, ManifestCache())
    files, has_deletes = cache.latest(f"live files|{table.metadata.table_uuid}", table.metadata_location,
                                      lambda: _live_data_files(table, cache))
    return list(files), has_deletes  # a copy: the kept list is never changed by a caller


def _live_data_files(table: Table, cache: ManifestCache) -> tuple[list[DataFileInfo], bool]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    manifests = list(snapshot.manifests(table.io))
    has_deletes = any(m.content == ManifestContent.DELETES and (m.added_files_count or m.existing_files_count)
                      for m in manifests)
    data_manifests = [m for m in manifests if m.content == ManifestContent.DATA]
    by_id = {s.snapshot_id: s for s in table.metadata.snapshots}
    # The manifests not read before are read side by side; the cached ones are not worth a
    # thread: a pool a call (eight threads started and joined) was a sixth of a governor's
    # CPU over 1,000 mostly idle tables, nearly every manifest cached.
    unread = [m for m in data_manifests if not cache.has(m)]
    read: dict[str, list[tuple[Any, ...]]] = {}
    if len(unread) > 1:
        with ThreadPoolExecutor(max_workers=min(8, len(unread))) as pool:
            read = dict(zip((m.manifest_path for m in unread), pool.map(lambda m: cache.entries(table, m), unread)))
    chunks = [read[m.manifest_path] if m.manifest_path in read else cache.entries(table, m) for m in data_manifests]
    files = []
    for rows in chunks:
        for path, size, records, spec_id, part, snapshot_id, seq, lower, upper in rows:
            added = by_id.get(snapshot_id)
            files.append(DataFileInfo(
                path=path, size_bytes=size, record_count=records, spec_id=spec_id, partition=part,
                snapshot_id=snapshot_id, sequence_number=seq if seq is not None else 0,
                added_at_ms=added.timestamp_ms if added is not None else None,
                lower_bounds=lower, upper_bounds=upper,
            ))
    return files, has_deletes


def live_delete_files(table: Table, cache: ManifestCache | None = None) -> list[DeleteFileInfo]:
    """All live delete files of the current snapshot (a primary-key table's merges write them)."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    cache = cache or ManifestCache()
    return [d for m in snapshot.manifests(table.io) if m.content == ManifestContent.DELETES
            for d in cache.delete_entries(table, m)]


def pending_files(table: Table, files: list[DataFileInfo]) -> list[DataFileInfo]:
    """The files among `files` that new data brought (adds_new_data): not optimized yet."""
    fresh = {s.snapshot_id for s in table.metadata.snapshots if adds_new_data(s)}
    return [f for f in files if f.snapshot_id in fresh]


def partition_path(table: Table, spec_id: int, partition: tuple[Any, ...]) -> str:
    """Human-readable partition, e.g. ``ts_day=19723/user_id_bucket=2`` (``<unpartitioned>``)."""
    spec = table.specs()[spec_id]
    if not spec.fields:
        return "<unpartitioned>"
    return "/".join(f"{f.name}={v}" for f, v in zip(spec.fields, partition))


def sealed_key(spec_id: int, path: str) -> str:
    return f"{spec_id}|{path}"


def sealed_sequence_numbers(table: Table) -> dict[str, int]:
    """The table's record of sealed runs: partition key -> data sequence number sealed up to."""
    text = table.properties.get(TablePropertyKeys.COMPACTOR_SEALED)
    if not text:
        return {}
    try:
        data = json.loads(text)
        return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (ValueError, TypeError):
        return {}  # unreadable: nothing is treated as sealed (more rewriting, never less data)
