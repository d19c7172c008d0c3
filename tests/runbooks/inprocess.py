"""The real ingest code (Writer -> Committers) driven in-process, without Flink.

The writer and committer are engine-neutral; the PyFlink job only wraps them in operators.
Driving them directly here makes ingest-shaped commits (same files, same offsets, same
dead letters, same summaries) in well under a second, where a PyFlink run costs ~25 s. Tests
use it to *set up* a situation; what a runbook tells an operator to run (`streamberg
ingest`) is still run as the real command.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import time
from collections.abc import Callable

from confluent_kafka import Producer

from streamberg.common.broker import ensure_topic
from streamberg.common.config import StreambergConfig
from streamberg.common.config.loading import as_fleet
from streamberg.ingest.committers import Committers
from streamberg.ingest.dead_letters import open_tables
from streamberg.ingest.writer import Writer


def produce_values(config: StreambergConfig, values: list[bytes], partition: int, partitions: int) -> None:
    """Produce raw values, in order, to one partition (offsets are then predictable)."""
    ensure_topic(config.kafka.bootstrap_servers, config.kafka.topic, partitions)
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap_servers, "linger.ms": 5})
    for value in values:
        producer.produce(config.kafka.topic, value=value, partition=partition)
    assert producer.flush(30) == 0, "records left undelivered"


def event(i: int, **fields) -> bytes:
    """A valid sample event (tests.helpers.EVENT_SCHEMA) with id `i`; `fields` override or drop (None)."""
    body = {"id": i, "ts": "2026-11-22T01:00:00+00:00", "user_id": f"u{i % 7}", "city": "c", "amount": 1.5}
    for name, value in fields.items():
        if value is None:
            body.pop(name, None)
        else:
            body[name] = value
    return json.dumps(body).encode()


def schema_change_events(valid: range, anonymous: range, with_device: range, poison: bytes) -> list[bytes]:
    """Events as producers send them after a schema change: some without user_id (required in
    the sample schema), some with a field `device` the table lacks, and one poison record."""
    return ([event(i) for i in valid] + [event(i, user_id=None) for i in anonymous]
            + [event(i, device="phone") for i in with_device] + [poison])


def ingest_until(config: StreambergConfig, ends: dict[int, int], timeout: float = 60.0) -> None:
    """Consume every partition up to `ends` (next offsets) and commit it as one snapshot."""
    topic = config.kafka.topic
    deadline = time.monotonic() + timeout

    def done(writer: Writer) -> bool:
        if time.monotonic() > deadline:
            raise TimeoutError(f"in-process ingest reached {writer.position}, wanted {ends}")
        return all(writer.position.get(f"{topic}/{p}", 0) >= end for p, end in ends.items())

    ingest_while(config, done)


def ingest_while(config: StreambergConfig, done: Callable[[Writer], bool], run_id: str | None = None) -> None:
    """The real writer and committer of one table in this process, as a job runs them: poll and
    commit until `done(writer)`, then the writer's final units (a bounded run's last commit)."""
    open_tables(config)
    run_id = run_id or f"inprocess-{time.monotonic_ns()}"
    tables = as_fleet(config)  # one table: a config of one route, as the job runs it
    writer = Writer(tables, 0, 1, run_id)
    committer = Committers(tables, 1, run_id)
    writer.open()
    committer.open()
    try:
        while not done(writer):
            for unit in writer.poll():
                committer.offer(unit)
        for unit in writer.finish():
            committer.offer(unit)
    finally:
        writer.close()
        committer.close()


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """The real `streamberg` entry point (parser, handlers, exit codes) called in this process.

    A subprocess costs ~2.5 s of imports per call; tests that make dozens of calls use this
    and keep a few real subprocess runs for what only a process shows.
    """
    from streamberg.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    proc = subprocess.CompletedProcess(["streamberg", *args], code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"streamberg {' '.join(args)} exited {code}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc
