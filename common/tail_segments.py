"""The kept tail's files: the contract between `streamberg tail` (fresh/cache.py, which writes
them), fresh reads (which read them) and `status` (which reports them).

In `<ingest.state_dir>/tail-cache/<table>/` (a primary-key table's: its change log's):
- `seg-s<schema id>-p<partition>-<first offset>-<next offset>.arrow`: an Arrow IPC file with
  the decoded rows of every record of the partition in [first, next), each row with its
  offset in `__streamberg_offset`; written whole by rename;
- `heartbeat`: touched by a live keeper at least every HEARTBEAT_FRESH_SECONDS.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from streamberg.common.config import StreambergConfig

OFFSET_COLUMN = "__streamberg_offset"
HEARTBEAT = "heartbeat"
HEARTBEAT_FRESH_SECONDS = 10.0
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
