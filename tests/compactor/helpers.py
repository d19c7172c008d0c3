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

from streamberg.common.catalog import load_catalog
from streamberg.common.config import StreambergConfig, load_config
from streamberg.table_meta.declared import ensure_table
from streamberg.table_meta.summary_keys import SummaryKeys, kafka_offsets_key
from streamberg.table_meta.table_files import live_data_files, snapshot_entries

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
        # Merges and sealing off: the pure incremental pass these tests check (each pass
        # rewrites exactly the new files). Runs, merges and sealing: test_runs.py.
        "compactor": {"checkpoint_dir": "checkpoint", "min_files": 1, "max_delay_seconds": None,
                      "every_n_snapshots": None, "columns": ["user_id", "city"], "merge_factor": 64,
                      "seal_after_commits": None, "seal_after_seconds": None, **(compactor or {})},
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
              cities: int = 12, day_offset: int = 0) -> pa.Table:
    rng = random.Random(seed)
    start = BASE_TS + dt.timedelta(days=day_offset)
    return pa.Table.from_pydict({
        "id": list(range(start_id, start_id + n)),
        "ts": [start + dt.timedelta(seconds=rng.randrange(days * 86400)) for _ in range(n)],
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
            props = {kafka_offsets_key(TOPIC): json.dumps({"0": self.offset + rows}), SummaryKeys.JOB_ID: "ingest:test"}
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
            if s.summary is not None and SummaryKeys.COMPACTOR_RUN_ID in s.summary.additional_properties]


def summary(snapshot: Snapshot) -> dict[str, str]:
    return dict(snapshot.summary.additional_properties) if snapshot.summary else {}


def removed_by(table: Table, snapshot: Snapshot) -> set[str]:
    """Data files a snapshot removed (its DELETED manifest entries)."""
    return {f.file_path for _, f in snapshot_entries(table.io, snapshot, ManifestEntryStatus.DELETED)}


def added_by(table: Table, snapshot: Snapshot) -> set[str]:
    return {f.file_path for _, f in snapshot_entries(table.io, snapshot, ManifestEntryStatus.ADDED)}


def file_sizes(table: Table) -> dict[str, int]:
    files, _ = live_data_files(table)
    return {f.path: f.size_bytes for f in files}


class CommitterIngest:
    """Commits through the product's own ingest `Committer` (one writer): Parquet files written
    by the ingest's file writer, offsets chained and fenced, and commit conflicts retried by
    the committer's own loop. For concurrency tests, where the retry under test is the product's,
    not a test helper's (FakeIngest retries by itself)."""

    def __init__(self, config: StreambergConfig, seed: int = 0) -> None:
        from streamberg.ingest.committer import Committer

        self.config, self.seed = config, seed
        self.next_id = self.offset = self.commits = self.retries = 0
        self.committer = Committer(config, parallelism=1, run_id=f"test-{uuid.uuid4().hex[:6]}")
        self.committer.open()

    def append(self, rows: int, **row_kwargs: Any) -> int:
        """Commit `rows` new rows as one ingest interval; return the snapshot id."""
        from streamberg.ingest.files import PartitionedFileWriter
        from streamberg.ingest.units import FlushUnit

        table = reload(self.config)
        data = make_rows(table, rows, self.next_id, seed=self.seed * 100003 + self.commits, **row_kwargs)
        files = PartitionedFileWriter(table.io, table.location(), table.schema(), table.spec(), table.properties,
                                      1 << 30, 100_000, f"{self.committer.run_id}-{self.commits}")
        files.write(data)
        unit = FlushUnit(run_id=self.committer.run_id, writer=0, epoch=self.commits + 1, topic=self.config.kafka.topic,
                         ranges={0: (self.offset, self.offset + rows)}, files=files.flush(), messages=rows)
        result = self.committer.commit([unit])
        self.next_id += rows
        self.offset += rows
        self.commits += 1
        self.retries += result.attempts - 1
        return result.snapshot_id

    def close(self) -> None:
        self.committer.close()
