"""The kept tail's files: the contract between their writers (the ingest's lanes under
`ingest.keep_tail`, ingest/tail_spool.py, or `streamberg tail`, fresh/cache.py), fresh reads
(which read them), the ingest's committer (which deletes what a commit covers) and `status`
(which reports them).

In `<ingest.state_dir>/tail-cache/<table>/` (a primary-key table's: its change log's), a
folder of mode 0700 holding files of mode 0600:
- `seg-<identity>-s<schema id>-p<partition>-<first offset>-<next offset>.arrow`: an Arrow IPC
  file with the decoded rows of every record of the partition in [first, next), each row with
  its offset in `__streamberg_offset`; written whole by rename. `<identity>` is a digest of
  what the rows are of (`TailIdentity`): the table's UUID and the topic's name and id (a
  table dropped and made again, or fed from another topic, or a topic deleted and made again
  under the same name, has another). The same facts are written in the file's schema metadata,
  and a reader refuses a file whose content disagrees with its name (identity, partition,
  offsets outside [first, next)). A writer removes every file of another identity when it starts;
  a reader never takes one.
- `heartbeat`: written by a live writer of them at least every HEARTBEAT_FRESH_SECONDS, naming
  its process (pid, host, start time); removed on every exit. A reader trusts it only while it
  is fresh and, on the same host, while that process is alive.

Segments of one partition are kept few by size tiers, as a log-structured store keeps them:
MERGE_FANOUT contiguous segments of one tier (offset span within a power of MERGE_FANOUT)
become one of the next, so a partition holds a few dozen files whatever the commit interval,
and each record is rewritten a few times at most. A merged file appears before its parts go:
a reader meanwhile takes either (it chains from the widest segment at its position).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from streamberg.common.config import StreambergConfig

OFFSET_COLUMN = "__streamberg_offset"
HEARTBEAT = "heartbeat"
HEARTBEAT_FRESH_SECONDS = 10.0
MERGE_FANOUT = 8  # segments of one size tier merged into one of the next
_SEGMENT = re.compile(r"seg-([0-9a-f]{20})-s(\d+)-p(\d+)-(\d+)-(\d+)\.arrow")
_META = b"streamberg.tail"  # the segment's schema metadata key: its identity and range, JSON


@dataclass(frozen=True)
class TailIdentity:
    """What a kept tail's rows are of: the table (its UUID, not its name) and the topic (its
    name and, where the broker gives one, its id)."""

    table_uuid: str
    topic: str
    topic_id: str = ""

    @property
    def token(self) -> str:
        text = f"{self.table_uuid}\0{self.topic}\0{self.topic_id}".encode()
        return hashlib.sha256(text).hexdigest()[:20]


def cache_folder(config: StreambergConfig) -> Path:
    """Where the table's tail is kept: the tail of the table the ingest writes (a primary-key
    table's is its change log's: change rows, as a fresh read of it takes them)."""
    from streamberg.table_meta.changelog import ingest_config

    return Path(config.ingest.state_dir) / "tail-cache" / ingest_config(config).table.identifier


def make_folder(folder: Path) -> None:
    """The table's tail folder and the tail-cache root above it, private to this user (0700)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for path in (folder.parent, folder):
        try:
            os.chmod(path, 0o700)
        except OSError:
            continue


def segment_name(identity: TailIdentity, schema_id: int, partition: int, first: int, next_offset: int) -> str:
    return f"seg-{identity.token}-s{schema_id}-p{partition}-{first}-{next_offset}.arrow"


@dataclass(frozen=True)
class Segment:
    path: Path
    token: str
    schema_id: int
    partition: int
    first: int
    next: int


def segments(folder: Path, identity: TailIdentity | None = None) -> list[Segment]:
    """The folder's segments (of `identity` alone, given one) by partition, then offset (the
    widest first where two start together)."""
    out = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        if (m := _SEGMENT.fullmatch(name)) is not None and (identity is None or m.group(1) == identity.token):
            out.append(Segment(folder / name, m.group(1), *(int(g) for g in m.groups()[1:])))
    return sorted(out, key=lambda s: (s.partition, s.first, -s.next))


def remove_foreign(folder: Path, identity: TailIdentity) -> int:
    """Remove what is not this identity's segments (another table's or topic's, files of older
    names, leftovers of a write): a writer calls it when it starts; how many went."""
    gone = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        if name == HEARTBEAT:
            continue
        m = _SEGMENT.fullmatch(name)
        if m is None or m.group(1) != identity.token:
            try:
                (folder / name).unlink()
                gone += 1
            except OSError:
                continue
    return gone


def _process_started(pid: int) -> str | None:
    """A process's start time (clock ticks since boot, /proc/<pid>/stat), None when it is gone:
    with the pid it names one process, never a later one given the same pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def beat(folder: Path) -> None:
    """The heartbeat of this process as the folder's writer (written whole, 0600)."""
    document = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                           "started": _process_started(os.getpid())})
    temporary = folder / f".{HEARTBEAT}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(document)
    os.replace(temporary, folder / HEARTBEAT)


def end_beat(folder: Path) -> None:
    """Remove the heartbeat if this process wrote it (a writer's every exit)."""
    path = folder / HEARTBEAT
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def alive(folder: Path, now: float | None = None) -> bool:
    """Whether a live writer keeps the folder: a fresh heartbeat, and on this host its process
    still running (a writer killed with SIGKILL leaves its heartbeat behind)."""
    path = folder / HEARTBEAT
    try:
        written = path.stat().st_mtime
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if (time.time() if now is None else now) - written > HEARTBEAT_FRESH_SECONDS or not isinstance(document, dict):
        return False
    pid = document.get("pid")
    if document.get("host") != socket.gethostname():
        return True  # another host's writer (a shared volume): its heartbeat's age alone tells
    return isinstance(pid, int) and pid > 0 and _process_started(pid) == document.get("started")


def chains(folder: Path, starts: dict[int, int], schema_id: int | None = None,
           identity: TailIdentity | None = None) -> dict[int, list[Segment]]:
    """Per partition, the segments (of `identity`) that chain from its start (those a reader
    would take)."""
    by_partition: dict[int, list[Segment]] = {}
    for segment in segments(folder, identity):
        if schema_id is None or segment.schema_id == schema_id:
            by_partition.setdefault(segment.partition, []).append(segment)
    out: dict[int, list[Segment]] = {}
    for partition, start in starts.items():
        position, chain = start, []
        for segment in by_partition.get(partition, []):
            if segment.first <= position < segment.next:
                chain.append(segment)
                position = segment.next
        out[partition] = chain
    return out


def tier(segment: Segment) -> int:
    span, level = max(1, segment.next - segment.first), 0
    while span >= MERGE_FANOUT:
        span //= MERGE_FANOUT
        level += 1
    return level


def _facts(identity: TailIdentity, schema_id: int, partition: int, first: int, next_offset: int) -> dict[str, object]:
    return {"table_uuid": identity.table_uuid, "topic": identity.topic, "topic_id": identity.topic_id,
            "schema_id": schema_id, "partition": partition, "first": first, "next": next_offset}


def write_segment(folder: Path, identity: TailIdentity, schema_id: int, partition: int, first: int,
                  next_offset: int, rows: pa.Table) -> Segment:
    """Rows (with OFFSET_COLUMN) of every record of `partition` in [first, next_offset),
    written whole (a reader sees the file complete or not at all), 0600, its identity and
    range in its schema metadata."""
    name = segment_name(identity, schema_id, partition, first, next_offset)
    temporary = folder / f".{name}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    os.close(fd)
    facts = json.dumps(_facts(identity, schema_id, partition, first, next_offset)).encode()
    schema = rows.schema.with_metadata({**(rows.schema.metadata or {}), _META: facts})
    with pa.OSFile(str(temporary), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(rows.replace_schema_metadata(schema.metadata))
    os.replace(temporary, folder / name)
    return Segment(folder / name, identity.token, schema_id, partition, first, next_offset)


class SegmentRefused(Exception):
    """A segment whose content disagrees with its name."""


def read_segment(segment: Segment, identity: TailIdentity | None = None) -> pa.Table | None:
    """A segment's rows, or None when it is gone (a commit covered it, a merge replaced it).
    SegmentRefused when its content is not what its name (and `identity`) say: another
    identity's facts, another partition or range, an offset outside [first, next)."""
    try:
        with pa.memory_map(str(segment.path)) as source:
            rows = pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid):
        return None
    try:
        facts = json.loads((rows.schema.metadata or {}).get(_META, b""))
    except ValueError:
        facts = None
    expected = None if identity is None else \
        _facts(identity, segment.schema_id, segment.partition, segment.first, segment.next)
    if not isinstance(facts, dict) or (expected is not None and facts != expected) or \
            [facts.get(k) for k in ("schema_id", "partition", "first", "next")] != \
            [segment.schema_id, segment.partition, segment.first, segment.next]:
        raise SegmentRefused(f"{segment.path.name}: its content names another table, topic or range")
    if OFFSET_COLUMN not in rows.column_names:
        raise SegmentRefused(f"{segment.path.name}: no {OFFSET_COLUMN} column")
    if rows.num_rows:
        low, high = pc.min_max(rows[OFFSET_COLUMN]).values()
        if low.as_py() is None or low.as_py() < segment.first or high.as_py() >= segment.next:
            raise SegmentRefused(f"{segment.path.name}: offsets {low} to {high} outside [{segment.first}, "
                                 f"{segment.next})")
    return rows.replace_schema_metadata({k: v for k, v in (rows.schema.metadata or {}).items() if k != _META})


def mergeable(chain: list[Segment]) -> list[Segment] | None:
    """The first MERGE_FANOUT contiguous segments of one tier in a partition's chain."""
    run: list[Segment] = []
    for segment in chain:
        if run and (segment.first != run[-1].next or tier(segment) != tier(run[0])):
            run = []
        run.append(segment)
        if len(run) == MERGE_FANOUT:
            return run
    return None


def merge(folder: Path, identity: TailIdentity, run: list[Segment]) -> Segment | None:
    """`run` (contiguous, one schema, of `identity`) as one segment; None when a part went
    meanwhile (a commit covered it: the next merge takes what is left) or was refused."""
    tables = []
    for segment in run:
        try:
            rows = read_segment(segment, identity)
        except SegmentRefused:
            segment.path.unlink(missing_ok=True)
            return None
        if rows is None:
            return None
        tables.append(rows)
    merged = write_segment(folder, identity, run[0].schema_id, run[0].partition, run[0].first, run[-1].next,
                           pa.concat_tables(tables))
    for segment in run:
        segment.path.unlink(missing_ok=True)
    return merged


def drop(folder: Path, covered: Callable[[Segment], bool]) -> int:
    """Delete the folder's segments `covered` says; how many went."""
    gone = 0
    for segment in segments(folder):
        if covered(segment):
            try:
                segment.path.unlink(missing_ok=True)
            except OSError:
                continue  # left for the next look; a reader never chains past its own offsets
            gone += 1
    return gone


def drop_committed(folder: Path, offsets: dict[int, int]) -> int:
    """Delete the segments a commit at `offsets` (partition -> next offset) covers whole."""
    return drop(folder, lambda s: s.next <= offsets.get(s.partition, -1))
