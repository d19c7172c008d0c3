"""Helpers for maintenance tests: a config with a maintenance section, files on disk, references."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pyiceberg.table import Table

from streamberg.common.catalog import load_catalog
from streamberg.common.config import StreambergConfig, load_config
from streamberg.maintenance.reachability import ReferenceReader
from streamberg.table_meta.declared import ensure_table
from tests.compactor.helpers import write_config

# Steps off unless a test turns them on, so each test exercises what it names.
ALL_OFF = {"expire": {"enabled": False}, "orphan": {"enabled": False}, "manifests": {"enabled": False}}


def write_maintained_config(directory: Path, maintenance: dict[str, Any] | None, **kwargs: Any) -> Path:
    """The compactor helpers' config file with a `maintenance:` section (written as given)."""
    path = write_config(directory, **kwargs)
    document = yaml.safe_load(path.read_text())
    if maintenance is not None:
        document["maintenance"] = maintenance
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def setup_maintained(directory: Path, maintenance: dict[str, Any] | None = None,
                     **kwargs: Any) -> tuple[StreambergConfig, Table]:
    """A table (compactor helpers' schema) whose config carries `maintenance` on top of ALL_OFF."""
    config = load_config(write_maintained_config(directory, {**ALL_OFF, **(maintenance or {})}, **kwargs))
    return config, ensure_table(load_catalog(config.catalog), config.table)


def local_path(uri: str) -> Path:
    return Path(uri.removeprefix("file://").removeprefix("file:"))


def _hadoop_checksum(name: str) -> bool:
    # Hadoop's local file system writes ".<file>.crc" next to each file Java writes and
    # deletes it with the file; it is not an Iceberg file and maintenance does not count it.
    return name.startswith(".") and name.endswith(".crc")


def files_on_disk(table: Table) -> dict[str, int]:
    """Every file under the table location (but Hadoop's .crc sidecars): absolute path -> size."""
    root = local_path(table.location())
    return {str(Path(d) / f): (Path(d) / f).stat().st_size
            for d, _, names in os.walk(root) for f in names if not _hadoop_checksum(f)}


def referenced_paths(table: Table) -> set[str]:
    """Local paths of every file any snapshot of the table references, plus its metadata files."""
    reader = ReferenceReader(table)
    refs = reader.referenced(s.snapshot_id for s in table.metadata.snapshots)
    paths = {str(local_path(p)) for p in refs}
    paths.add(str(local_path(table.metadata_location)))
    paths.update(str(local_path(entry.metadata_file)) for entry in table.metadata.metadata_log)
    return paths


def age_files(paths: Any, seconds: float) -> None:
    """Backdate modification times, so only references (not youth) can protect a file."""
    import time

    moment = time.time() - seconds
    for path in paths:
        os.utime(path, (moment, moment))
