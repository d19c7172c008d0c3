"""Small helpers shared by tests: configs in a temp dir, reading tables back, running the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import yaml

from streamberg.cli.sample_events import SAMPLE_EVENT_SCHEMA, produce_events
from streamberg.common.catalog import load_catalog
from streamberg.common.config import StreambergConfig, load_config

EVENT_SCHEMA = SAMPLE_EVENT_SCHEMA


class FakeClock:
    """A monotonic clock a test moves (`advance`) where the code under test waits on time
    passing: no sleep, and the test says how much time passed."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def count_metadata_parses(monkeypatch: Any) -> list[str]:
    """The table metadata files parsed from now on, in order (pyiceberg's real parse still
    runs): what a test of the kept parses counts."""
    from pyiceberg.serializers import FromInputFile

    seen: list[str] = []
    real = FromInputFile.table_metadata

    def counting(input_file: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(input_file.location)
        return real(input_file, *args, **kwargs)

    monkeypatch.setattr(FromInputFile, "table_metadata", staticmethod(counting))
    return seen


def count_column_facts(monkeypatch: Any) -> list[str]:
    """The metadata files a table's column facts were derived from from now on, in order
    (ColumnFacts.of_table's real derivation still runs): what a test of the kept facts counts."""
    from streamberg.table_meta.column_usage import ColumnFacts

    seen: list[str] = []
    real = ColumnFacts.of_table.__func__  # type: ignore[attr-defined]

    def counting(cls: Any, table: Any) -> Any:
        seen.append(table.metadata_location)
        return real(cls, table)

    monkeypatch.setattr(ColumnFacts, "of_table", classmethod(counting))
    return seen


def wait_for(condition: Callable[[], Any], timeout: float, what: str, *, every: float = 0.2,
             proc: Any = None, log: Path | Callable[[], str] | None = None) -> Any:
    """The tests' one wait: poll `condition` every `every` seconds until it returns something
    truthy and return that; fail naming `what` at `timeout`, or at once when `proc` (anything
    with `poll()`) has exited, with the tail of `log` (a file, or a function giving the text)."""
    def tail() -> str:
        if log is None:
            return ""
        text = log() if callable(log) else (log.read_text(errors="replace") if log.exists() else "")
        return "\n" + text[-4000:]

    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited {proc.poll()} while waiting for {what}{tail()}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{tail()}")
        time.sleep(every)


def write_config(directory: Path, bootstrap: str, topic: str | None = None, *, partition_spec: list | None = None,
                 ingest: dict | None = None, table: str | None = None, extra: dict | None = None,
                 catalog: dict | None = None) -> Path:
    """A config file for an isolated catalog/warehouse under `directory` (`catalog`: more
    catalog settings); returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {
        "kafka": {"bootstrap_servers": bootstrap, "topic": topic or f"t-{uuid.uuid4().hex[:8]}"},
        # A catalog name of its own: Spark caches catalogs by name for the whole session.
        "catalog": {"name": f"c{uuid.uuid4().hex[:8]}", "uri": "sqlite:///catalog.db", "warehouse": "warehouse",
                    **(catalog or {})},
        "table": {"identifier": table or "db.events", "schema": EVENT_SCHEMA,
                  "partition_spec": partition_spec or []},
        "ingest": {"commit_interval_seconds": 2, "parallelism": 2, "state_dir": "state", **(ingest or {})},
        **(extra or {}),
    }
    path = directory / "streamberg.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def config_at(path: Path) -> StreambergConfig:
    return load_config(path)


def table_ids(config: StreambergConfig) -> list[int]:
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    return sorted(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())


def dead_letters(config: StreambergConfig):
    return load_catalog(config.catalog).load_table(config.ingest_target.dead_letter_table).scan().to_arrow()


def committed_records(config: StreambergConfig) -> int:
    """Records (rows and dead letters) the table's offsets say it committed; 0 before it exists."""
    from streamberg.table_meta.offsets import committed_position

    catalog = load_catalog(config.catalog)
    if not catalog.table_exists(config.table.identifier):
        return 0
    return sum(committed_position(catalog.load_table(config.table.identifier), config.kafka.topic).offsets.values())


def assert_every_record_once(config: StreambergConfig, producer: BackgroundProducer, partitions: int) -> None:
    """After a run that read the whole topic: every valid id `producer` delivered is in the
    table once, the malformed rest in the dead-letter table, and the table's offsets are the
    topic's ends (read to the end, not asked)."""
    from streamberg.table_meta.offsets import committed_position

    ids = table_ids(config)
    assert not duplicates(ids)
    assert sorted(ids) == sorted(producer.ids)
    assert dead_letters(config).num_rows == producer.produced - len(producer.ids) > 0
    table = load_catalog(config.catalog).load_table(config.table.identifier)
    offsets = committed_position(table, config.kafka.topic).offsets
    assert {str(p): o for p, o in offsets.items()} == \
        end_offsets_by_reading(config.kafka.bootstrap_servers, config.kafka.topic, partitions)


def streamberg(*args: str, timeout: float = 600, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real `streamberg` command in a subprocess."""
    exe = Path(sys.executable).parent / "streamberg"
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "STREAMBERG_LOG_FORMAT": "json", **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"streamberg {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-5000:]}")
    return proc


def duplicates(values: list[int]) -> list[int]:
    import collections

    return sorted(v for v, n in collections.Counter(values).items() if n > 1)


def distinct(values) -> int:
    return pc.count_distinct(values).as_py()


def spark_table(spark, config: StreambergConfig, identifier: str):
    """A Spark DataFrame of an Iceberg table, read through Spark's own JdbcCatalog."""
    from streamberg.common.spark import register_catalog

    return spark.table(f"{register_catalog(spark, config.catalog)}.{identifier}")


def end_offsets_by_reading(bootstrap: str, topic: str, partitions: int) -> dict[str, int]:
    """Each partition's end offset, found by reading to the end.

    tansu 0.6 (the embedded broker) reports a high watermark that can lag the true end by a
    record batch, so tests that need the exact end read it instead of asking for it.
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "verify-ends", "enable.partition.eof": True})
    ends = {}
    for p in range(partitions):
        consumer.assign([TopicPartition(topic, p, 0)])
        last = -1
        while True:
            messages = consumer.consume(10000, timeout=5.0)
            if not messages:
                break
            eof = [m for m in messages if m.error() is not None]
            last = max([last] + [m.offset() for m in messages if m.error() is None])
            if eof:
                break
        ends[str(p)] = last + 1
    consumer.close()
    return ends


class JvmSentinel:
    """Records every JVM a subprocess starts: a `java` shim first on PATH (JAVA_HOME unset, so
    spark-submit and PyFlink both resolve `java` through PATH) appends its arguments to a file,
    then execs the real java. `launched()` lists the JVMs that ran a program (a bare
    `java -version` probe is not one)."""

    def __init__(self, tmp_path: Path):
        import shutil

        home = os.environ.get("JAVA_HOME")
        real = shutil.which("java", path=os.path.join(home, "bin")) if home else shutil.which("java")
        assert real, "java not found"
        self.bin_dir = tmp_path / "jvm-sentinel"
        self.bin_dir.mkdir()
        self.record = self.bin_dir / "launches"
        shim = self.bin_dir / "java"
        shim.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{self.record}"\nexec "{real}" "$@"\n')
        shim.chmod(0o755)

    @property
    def env(self) -> dict:
        env = {**os.environ, "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.pop("JAVA_HOME", None)
        return env

    def launched(self) -> list[str]:
        if not self.record.exists():
            return []
        return [line for line in self.record.read_text().splitlines() if line.strip() not in ("-version", "")]


def json_events(text: str) -> list[dict]:
    """The JSON-object lines of a log (`STREAMBERG_LOG_FORMAT=json`); other lines are skipped."""
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


class BackgroundProducer:
    """Sample events produced from a thread, `batch` records at `rate` per second per batch,
    until stop() (or `max_batches`). `ids`: the valid ids delivered; `produced`: every record
    delivered, malformed ones included. Batches get consecutive ids from `first_id` and their
    own seed."""

    def __init__(self, config: StreambergConfig, batch: int, rate: float, bad_fraction: float = 0.0,
                 max_batches: int | None = None, first_id: int = 0) -> None:
        self.config, self.batch, self.rate, self.bad_fraction = config, batch, rate, bad_fraction
        self.max_batches, self.first_id = max_batches, first_id
        self.ids: list[int] = []
        self.produced = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-producer", daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set() and (self.max_batches is None or n < self.max_batches):
            result = produce_events(self.config, self.batch, rate=self.rate, bad_fraction=self.bad_fraction,
                                    start_id=self.first_id + n * self.batch, seed=n)
            self.ids.extend(result.valid_ids)
            self.produced += result.produced
            n += 1

    def start(self) -> BackgroundProducer:
        self._thread.start()
        return self

    def join(self) -> None:
        """Wait for the last batch (after stop(), or for `max_batches`)."""
        if self._thread.is_alive():
            self._thread.join()

    def stop(self) -> None:
        self._stop.set()
        self.join()


def account_for_every_record(result, size: int, seen: dict[str, int]) -> None:
    """A decoded batch of `size` records: each one a row or a dead letter with a reason, once;
    the counts added to `seen` (kept, rejected)."""
    rejected = [i for i, _ in result.rejected]
    assert sorted(result.kept.tolist() + rejected) == list(range(size))
    assert all(isinstance(r, str) and r for _, r in result.rejected)
    assert result.table.num_rows == len(result.kept)
    seen["kept"] += len(result.kept)
    seen["rejected"] += len(rejected)
