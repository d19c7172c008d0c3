"""The kept tail's files: the contract between their writers (the ingest's lanes under
`ingest.keep_tail`, ingest/tail_spool.py, or `streamberg tail`, fresh/cache.py), fresh reads
(which read them), the ingest's committer (which deletes what a commit covers) and `status`
(which reports them).

In `<ingest.state_dir>/tail-cache/<table>/` (a primary-key table's: its change log's):
- `seg-s<schema id>-p<partition>-<first offset>-<next offset>.arrow`: an Arrow IPC file with
  the decoded rows of every record of the partition in [first, next), each row with its
  offset in `__streamberg_offset`; written whole by rename;
- `heartbeat`: touched by a live writer of them at least every HEARTBEAT_FRESH_SECONDS.

Segments of one partition are kept few by size tiers, as a log-structured store keeps them:
MERGE_FANOUT contiguous segments of one tier (offset span within a power of MERGE_FANOUT)
become one of the next, so a partition holds a few dozen files whatever the commit interval,
and each record is rewritten a few times at most. A merged file appears before its parts go:
a reader meanwhile takes either (it chains from the widest segment at its position).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from streamberg.common.config import StreambergConfig

OFFSET_COLUMN = "__streamberg_offset"
HEARTBEAT = "heartbeat"
HEARTBEAT_FRESH_SECONDS = 10.0
MERGE_FANOUT = 8  # segments of one size tier merged into one of the next
_SEGMENT = re.compile(r"seg-s(\d+)-p(\d+)-(\d+)-(\d+)\.arrow")


def cache_folder(config: StreambergConfig) -> Path:
    """Where the table's tail is kept: the tail of the table the ingest writes (a primary-key
    table's is its change log's: change rows, as a fresh read of it takes them)."""
    from streamberg.common.changelog import ingest_config

    return Path(config.ingest.state_dir) / "tail-cache" / ingest_config(config).table.identifier


def segment_name(schema_id: int, partition: int, first: int, next_offset: int) -> str:
    return f"seg-s{schema_id}-p{partition}-{first}-{next_offset}.arrow"


@dataclass(frozen=True)
class Segment:
    path: Path
    schema_id: int
    partition: int
    first: int
    next: int


def segments(folder: Path) -> list[Segment]:
    """The folder's segments by partition, then offset (the widest first where two start together)."""
    out = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        if (m := _SEGMENT.fullmatch(name)) is not None:
            out.append(Segment(folder / name, *(int(g) for g in m.groups())))
    return sorted(out, key=lambda s: (s.partition, s.first, -s.next))


def alive(folder: Path, now: float | None = None) -> bool:
    try:
        beat = (folder / HEARTBEAT).stat().st_mtime
    except OSError:
        return False
    return (time.time() if now is None else now) - beat <= HEARTBEAT_FRESH_SECONDS


def chains(folder: Path, starts: dict[int, int], schema_id: int | None = None) -> dict[int, list[Segment]]:
    """Per partition, the segments that chain from its start (those a reader would take)."""
    by_partition: dict[int, list[Segment]] = {}
    for segment in segments(folder):
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


def write_segment(folder: Path, schema_id: int, partition: int, first: int, next_offset: int,
                  rows: pa.Table) -> Segment:
    """Rows (with OFFSET_COLUMN) of every record of `partition` in [first, next_offset),
    written whole: a reader sees the file complete or not at all."""
    name = segment_name(schema_id, partition, first, next_offset)
    temporary = folder / f".{name}.tmp"
    with pa.OSFile(str(temporary), "wb") as sink, pa.ipc.new_file(sink, rows.schema) as writer:
        writer.write_table(rows)
    os.replace(temporary, folder / name)
    return Segment(folder / name, schema_id, partition, first, next_offset)


def read_segment(segment: Segment) -> pa.Table | None:
    """A segment's rows, or None when it is gone (a commit covered it, a merge replaced it)."""
    try:
        with pa.memory_map(str(segment.path)) as source:
            return pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid):
        return None


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


def merge(folder: Path, run: list[Segment]) -> Segment | None:
    """`run` (contiguous, one schema) as one segment; None when a part went meanwhile (a
    commit covered it: the next merge takes what is left)."""
    tables = []
    for segment in run:
        rows = read_segment(segment)
        if rows is None:
            return None
        tables.append(rows)
    merged = write_segment(folder, run[0].schema_id, run[0].partition, run[0].first, run[-1].next,
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
