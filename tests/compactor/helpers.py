"""Helpers for compactor tests: isolated catalogs, simulated ingest commits, table facts."""

from __future__ import annotations

import collections
import datetime as dt
import json
import random
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from streamberg.common.catalog import ensure_table, load_catalog
from streamberg.common.config import StreambergConfig, load_config
from streamberg.common.offsets import JOB_ID_KEY, offsets_key
from streamberg.compactor import record as R
from streamberg.compactor.planner import live_data_files

SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "ts", "type": "timestamptz", "required": True},
    {"name": "user_id", "type": "string", "required": True},
    {"name": "city", "type": "string"},
    {"name": "amount", "type": "double"},
]
DAY = [{"source": "ts", "transform": "day"}]
BASE_TS = dt.datetime(2024, 3, 1, tzinfo=dt.timezone.utc)
TOPIC = "events"


def write_config(directory: Path, *, partition_spec: list | None = None, compactor: dict | None = None,
                 table_properties: dict | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {
        "kafka": {"topic": TOPIC},
        # A catalog name of its own: Spark keeps one catalog instance per name per session.
        "catalog": {"name": f"c{uuid.uuid4().hex[:10]}", "uri": "sqlite:///catalog.db", "warehouse": "warehouse"},
        "table": {"identifier": "db.events", "schema": SCHEMA, "partition_spec": partition_spec or [],
                  "properties": table_properties or {}},
        "compactor": {"checkpoint_dir": "checkpoint", "min_files": 1, "max_delay_seconds": None,
                      "every_n_snapshots": None, "columns": ["user_id", "city"], **(compactor or {})},
    }
    path = directory / "streamberg.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def setup_table(directory: Path, **kwargs: Any) -> tuple[StreambergConfig, Table]:
    config = load_config(write_config(directory, **kwargs))
    return config, ensure_table(load_catalog(config.catalog), config.table)


def reload(config: StreambergConfig) -> Table:
    return load_catalog(config.catalog).load_table(config.table.identifier)


def make_rows(table: Table, n: int, start_id: int, *, seed: int, days: int = 2, users: int = 400,
              cities: int = 12) -> pa.Table:
    rng = random.Random(seed)
    return pa.Table.from_pydict({
        "id": list(range(start_id, start_id + n)),
        "ts": [BASE_TS + dt.timedelta(seconds=rng.randrange(days * 86400)) for _ in range(n)],
        "user_id": [f"user-{rng.randrange(users):05d}" for _ in range(n)],
        "city": [f"city-{rng.randrange(cities):02d}" for _ in range(n)],
        "amount": [round(rng.random() * 100, 2) for _ in range(n)],
    }, schema=schema_to_pyarrow(table.schema()))


class FakeIngest:
    """Commits like the ingest job: appends carrying Kafka offsets and the job id."""

    def __init__(self, config: StreambergConfig, seed: int = 0) -> None:
        self.config = config
        self.next_id = 0
        self.offset = 0
        self.seed = seed
        self.commits = 0

    def append(self, rows: int, *, retries: int = 20, **row_kwargs: Any) -> Snapshot:
        from pyiceberg.exceptions import CommitFailedException

        for attempt in range(retries + 1):
            table = reload(self.config)
            data = make_rows(table, rows, self.next_id, seed=self.seed * 100003 + self.commits, **row_kwargs)
            props = {offsets_key(TOPIC): json.dumps({"0": self.offset + rows}), JOB_ID_KEY: "ingest:test"}
            try:
                table.append(data, snapshot_properties=props)
            except CommitFailedException:
                if attempt == retries:
                    raise
                continue
            self.next_id += rows
            self.offset += rows
            self.commits += 1
            return table.current_snapshot()
        raise AssertionError("unreachable")


def row_multiset(table: Table) -> collections.Counter:
    return collections.Counter(tuple(sorted(r.items())) for r in table.scan().to_arrow().to_pylist())


def live_files(table: Table) -> dict[str, int]:
    """path -> id of the snapshot that added it, for every live data file."""
    files, _ = live_data_files(table)
    return {f.path: f.snapshot_id for f in files}


def compactor_snapshots(table: Table) -> list[Snapshot]:
    return [s for s in table.metadata.snapshots
            if s.summary is not None and R.RUN_ID in s.summary.additional_properties]


def summary(snapshot: Snapshot) -> dict[str, str]:
    return dict(snapshot.summary.additional_properties) if snapshot.summary else {}


def removed_by(table: Table, snapshot: Snapshot) -> set[str]:
    """Data files a snapshot removed (its DELETED manifest entries)."""
    removed = set()
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
            if entry.status == ManifestEntryStatus.DELETED and entry.snapshot_id == snapshot.snapshot_id:
                removed.add(entry.data_file.file_path)
    return removed


def added_by(table: Table, snapshot: Snapshot) -> set[str]:
    added = set()
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
            if entry.status == ManifestEntryStatus.ADDED:
                added.add(entry.data_file.file_path)
    return added


def file_sizes(table: Table) -> dict[str, int]:
    files, _ = live_data_files(table)
    return {f.path: f.size_bytes for f in files}
