"""A database's change stream, as Debezium writes it, kept as the source's current rows
through kill -9 of the ingest and of the merge stage.

The stream (inserts, several updates per key, deletes with their tombstones, re-inserts,
key changes both ways Debezium can send them, a snapshot resync, JSON with and without the
JsonConverter's schema/payload wrapper, and hostile events) is spread over three partitions
by key. The test computes the final state itself, applying the events in the order it made
them. The real `streamberg ingest` (PyFlink) is killed with SIGKILL mid-stream and the real
`streamberg merge` (Spark) at the moment it holds the last changes but has not merged them
(common/faults.py); after restarts the table equals the state, read by Spark, DuckDB's
iceberg_scan and pyiceberg, and no change-log snapshot was applied twice.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from streamberg.common.catalog import load_catalog
from streamberg.merge.app import MergeOptions, run_merge
from streamberg.table_meta.changelog import applied_snapshot_id, ingest_config, merge_position
from streamberg.table_meta.offsets import committed_position, summary_properties
from streamberg.table_meta.summary_keys import SummaryKeys
from streamberg.table_meta.table_facts import table_facts
from tests.cdc.helpers import USERS_SCHEMA, assert_table_holds, cdc_config, delete_files, rows_by_pyiceberg
from tests.helpers import dead_letters, streamberg
from tests.runbooks.inprocess import ingest_until, produce_values

pytestmark = pytest.mark.flink

PARTITIONS = 3
CONNECT_SCHEMA = {"type": "struct", "name": "dbserver1.inventory.users.Envelope", "optional": False, "fields": [
    {"type": "struct", "field": "before", "optional": True, "fields": [
        {"type": "int64", "field": "id", "optional": False}, {"type": "string", "field": "name", "optional": False}]},
    {"type": "struct", "field": "after", "optional": True, "fields": []},
    {"type": "string", "field": "op", "optional": False}]}


class Source:
    """A table in a database and the change events Debezium makes of it."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.rows: dict[int, dict[str, Any]] = {}
        self.gone: list[int] = []
        self.next_id = 0
        self.ts = 1_764_000_000_000
        self.lsn = 0
        self.events: list[list[bytes | None]] = [[] for _ in range(PARTITIONS)]
        self.tombstones = 0

    def _send(self, key: int, op: str, before: dict | None, after: dict | None) -> None:
        self.ts += self.rng.randrange(1, 5)  # the source's commit times only move forward
        self.lsn += 1
        event = {"before": before, "after": after, "op": op, "ts_ms": self.ts + 3,
                 "source": {"version": "2.7.0.Final", "connector": "postgresql", "ts_ms": self.ts, "lsn": self.lsn,
                            "db": "inventory", "table": "users"}}
        if self.rng.random() < 0.5:  # JsonConverter with schemas.enable=true
            event = {"schema": CONNECT_SCHEMA, "payload": event}
        self.events[key % PARTITIONS].append(json.dumps(event).encode())

    def _row(self, key: int) -> dict[str, Any]:
        row = {"id": key, "name": f"user-{key}-{self.lsn}", "score": self.rng.randrange(-10**6, 10**6),
               "city": self.rng.choice(["ams", "bcn", "lis", None])}
        if row["city"] is None:
            del row["city"]  # an absent optional column reads as null
        return row

    def insert(self, key: int | None = None, op: str = "c") -> None:
        if key is None:
            key, self.next_id = self.next_id, self.next_id + 1
        row = self._row(key)
        self.rows[key] = row
        self._send(key, op, None, row)

    def update(self) -> None:
        key = self.rng.choice(list(self.rows))
        before, after = self.rows[key], {**self._row(key)}
        self.rows[key] = after
        self._send(key, "u", before, after)

    def delete(self, key: int | None = None) -> None:
        key = self.rng.choice(list(self.rows)) if key is None else key
        before = self.rows.pop(key)
        self._send(key, "d", {"id": key, "name": before["name"]}, None)  # REPLICA IDENTITY DEFAULT: not every column
        self.events[key % PARTITIONS].append(None)  # the tombstone Debezium sends after a delete
        self.tombstones += 1
        self.gone.append(key)

    def change_key(self) -> None:
        old = self.rng.choice(list(self.rows))
        new, self.next_id = self.next_id, self.next_id + 1
        if self.rng.random() < 0.5:  # as Debezium sends it: a delete of the old key, a create of the new
            self.delete(old)
            self.insert(new)
        else:  # one update whose before and after keys differ, on the new key's partition
            before = self.rows.pop(old)
            after = {**self._row(new)}
            self.rows[new] = after
            self._send(new, "u", before, after)

    def reinsert(self) -> None:
        if self.gone:
            self.insert(self.gone.pop(self.rng.randrange(len(self.gone))))

    def resync(self) -> None:
        """A new snapshot of the table: every row read again (op r)."""
        for key in sorted(self.rows):
            self._send(key, "r", None, self.rows[key])

    def changes(self, count: int) -> None:
        for _ in range(count):
            pick = self.rng.random()
            if pick < 0.25 or len(self.rows) < 20:
                self.insert()
            elif pick < 0.75:
                self.update()
            elif pick < 0.85:
                self.delete()
            elif pick < 0.93:
                self.reinsert()
            else:
                self.change_key()

    def take(self) -> list[list[bytes | None]]:
        events, self.events = self.events, [[] for _ in range(PARTITIONS)]
        return events

    def expected(self) -> dict[int, dict[str, Any]]:
        return {k: {f["name"]: row.get(f["name"]) for f in USERS_SCHEMA} for k, row in self.rows.items()}


HOSTILE = [
    b'{"op": "t", "before": null, "after": null, "source": {"ts_ms": 1}}',  # a truncate: not a row change
    b'{"op": "c", "before": null, "after": {"name": "no key"}}',
    b'{"op": "u", "before": null, "after": {"id": "seven", "name": "x"}}',
    b'{"op": "d", "before": null, "after": null}',
    b'{"schema": {}, "payload": null}',
    b'[1, 2, 3]',
    b'{"op": "c", "after": {"id": 1e400, "name": "x"}}',
    b'\xff\xfe not json',
]


def _produce(config, events: list[list[bytes | None]]) -> None:
    for p, values in enumerate(events):
        produce_values(config, values, p, PARTITIONS)


def _consumed(config) -> int:
    view = ingest_config(config)
    catalog = load_catalog(view.catalog)
    if not catalog.table_exists(view.table.identifier):
        return 0
    return sum(committed_position(catalog.load_table(view.table.identifier), view.kafka.topic).offsets.values())


def _uncommitted_changelog_files(config) -> set[str]:
    """Parquet files in the change log's folder it does not reference: written, never committed."""
    table = load_catalog(config.catalog).load_table(ingest_config(config).table.identifier)
    live = {t.file.file_path for t in table.scan().plan_files()}
    on_disk = {f"file://{p}" for p in Path(table.location().removeprefix("file://")).rglob("*.parquet")}
    return on_disk - live


def _killed_at(args: list[str], env: dict[str, str], ready, log: Path, what: str, meanwhile=None) -> None:
    """Run `streamberg <args>` in its own process group and SIGKILL the group once `ready()`
    (after `meanwhile()`, work done while it runs)."""
    exe = Path(sys.executable).parent / "streamberg"
    proc = subprocess.Popen([str(exe), *args], stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "STREAMBERG_LOG_FORMAT": "json", **env})
    try:
        deadline = time.monotonic() + 240
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{what} never reached the moment to kill it (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        if meanwhile is not None:
            meanwhile()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_debezium_stream_through_kill_9_of_ingest_and_merge(tmp_path: Path, broker: str, spark) -> None:
    config = cdc_config(tmp_path, broker, "debezium")
    path = Path(config.config_path or tmp_path / "streamberg.yaml")
    source = Source(7)
    source.changes(2500)
    first = source.take()
    first[0] += HOSTILE
    _produce(config, first)
    total = sum(len(e) for e in first)
    produced = [first]

    # kill -9 the ingest while it reads the stream, after a commit and in the middle of the
    # next interval: proven by Parquet files it wrote and never committed. A kill that landed
    # between intervals (none left behind) is tried again with the next slice of changes.
    consumed = 0
    for attempt in range(3):
        source.changes(1500)
        second = source.take()
        log = tmp_path / f"ingest-{attempt}.log"

        def part_of(second: list, part: int) -> list:
            return [e[len(e) * part // 5:len(e) * (part + 1) // 5] for e in second]

        # A retry follows a kill that came after everything was committed: nothing would be
        # left to read until `meanwhile`, which waits for a commit. Its first slice goes first.
        first_part = 1 if attempt else 0
        if attempt:
            _produce(config, part_of(second, 0))

        def more_while_it_runs(second=second, first_part=first_part) -> None:
            # In slices over about two commit intervals; the kill follows the last at once, so
            # it comes with records read and not committed.
            for part in range(first_part, 5):
                _produce(config, part_of(second, part))  # in order
                time.sleep(0.4)

        before = consumed
        _killed_at(["ingest", "--config", str(path), "--quiet"], {}, lambda before=before: _consumed(config) > before,
                   log, "the ingest", more_while_it_runs)
        total += sum(len(e) for e in second)
        produced.append(second)
        consumed = _consumed(config)
        if _uncommitted_changelog_files(config):
            break
    else:
        pytest.fail("three kills of the ingest all landed between intervals (no uncommitted file left)")
    assert consumed > 0

    # kill -9 the merge holding the last changes of what is committed, before its MERGE.
    marker = tmp_path / "merge-paused"
    _killed_at(["merge", "--config", str(path)], {"STREAMBERG_FAULT_PAUSE": "merge-commit",
                                                 "STREAMBERG_FAULT_MARKER": str(marker)},
               marker.exists, tmp_path / "merge.log", "the merge")
    catalog = load_catalog(config.catalog)
    assert applied_snapshot_id(catalog.load_table(config.table.identifier)) is None  # killed before its commit

    if total > consumed:  # else the kill came after the last commit: nothing to catch up
        streamberg("ingest", "--config", str(path), "--max-records", str(total - consumed), "--quiet", timeout=600)
    assert _consumed(config) == total
    print(f"ingest killed after committing {consumed} of {total} records")
    run_merge(config, MergeOptions(once=True), spark=spark)
    assert rows_by_pyiceberg(config) == source.expected()  # each key once (the helper refuses twice)

    # A resync of the source (every row read again, op r) and more changes, merged on top.
    source.resync()
    source.changes(800)
    third = source.take()
    _produce(config, third)
    produced.append(third)
    ends = {p: sum(len(e[p]) for e in produced) for p in range(PARTITIONS)}
    ingest_until(ingest_config(config), ends)
    run_merge(config, MergeOptions(once=True), spark=spark)

    expected = source.expected()
    assert len(expected) > 300
    assert_table_holds(spark, config, expected)
    assert delete_files(config) > 0  # updates and deletes on the existing rows were position deletes

    changelog = catalog.load_table(f"{config.table.identifier}_changelog")
    target = catalog.load_table(config.table.identifier)
    assert merge_position(changelog, target).up_to_date
    applied = [int(summary_properties(s)[SummaryKeys.CHANGELOG_APPLIED]) for s in target.snapshots()
               if SummaryKeys.CHANGELOG_APPLIED in summary_properties(s)]
    assert len(applied) == 2 and len(set(applied)) == 2  # one merge per run, no change-log snapshot twice
    assert applied[-1] == changelog.current_snapshot().snapshot_id
    # Every record accounted: changes, dead letters and the skipped tombstones.
    skipped = int(summary_properties(changelog.current_snapshot())[SummaryKeys.SKIPPED_TOMBSTONES_TOTAL])
    dead = dead_letters(config).to_pylist()
    assert skipped == source.tombstones
    assert changelog.scan().to_arrow().num_rows + len(dead) + skipped == sum(ends.values())
    facts = table_facts(ingest_config(config))  # what `streamberg table` says
    assert facts["reconciles"] and facts["consumed"] == sum(ends.values()) and facts["skipped_tombstones"] == skipped
    reasons = sorted(d["reason"] for d in dead)
    assert len(dead) == len(HOSTILE), reasons
    for needle in ("unknown op \"t\"", "missing required field 'id'", "field 'id'", "op d without its before image",
                   "not a Debezium change event", "not JSON"):
        assert any(needle in r for r in reasons), (needle, reasons)
