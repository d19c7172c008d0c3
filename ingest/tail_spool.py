"""A lane's uncommitted records kept decoded for fresh reads (`ingest.keep_tail`).

The lane decodes every record once, for its Parquet files; under keep_tail it also hands
the decoded rows here, and they are written as the kept tail's segments
(table_meta/tail_segments.py: `<ingest.state_dir>/tail-cache/<table>/`), the files a fresh read
chains from its snapshot's offsets before it reads Kafka (fresh/cache.cached_rows). No
second consumer, no second decode: what `streamberg tail` costs again, the ingest has
already paid. The committer deletes the segments a commit covers.

A segment covers exactly what the lane read of its partition in [first, next): the rows it
wrote, the records it dead-lettered (no row) and the tombstones it skipped. Every decoded
batch is written at once, one segment a partition (no size or age threshold holds it back),
so under load the kept tail trails Kafka by one poll; the small segments are merged by tiers
(table_meta/tail_segments.mergeable), a few files a partition whatever the interval. Units end
on a segment's end too (a commit's offsets are always a segment's start: a reader's chain
starts on one). Where the lane's rows are not the table's final rows (records
held for a schema change), or its position jumped, nothing is kept for those records: the
partition's chain breaks there and a reader reads Kafka from that point, exact either way.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import pyarrow as pa

from streamberg.common.config import StreambergConfig
from streamberg.table_meta.tail_segments import (
    MERGE_FANOUT,
    OFFSET_COLUMN,
    Segment,
    TailIdentity,
    beat,
    cache_folder,
    drop,
    end_beat,
    make_folder,
    merge,
    mergeable,
    remove_foreign,
    write_segment,
)

HEARTBEAT_SECONDS = 1.0  # the folder's heartbeat is touched at most this often


class TailSpool:
    """The kept tail of one lane's partitions (see the module's notes)."""

    def __init__(self, config: StreambergConfig, partitions: list[int], log: Any, identity: TailIdentity) -> None:
        self.folder = cache_folder(config)
        self.identity = identity
        self.log = log
        self.schema_id = -1
        self.pending: dict[int, list[pa.Table]] = {}  # partition -> rows not written yet
        self.first: dict[int, int] = {}  # partition -> the offset its pending rows start at
        self.end: dict[int, int] = {}  # partition -> where its kept rows end (pending or written)
        self.written: dict[int, list[Segment]] = {}  # partition -> its segments, for merging
        self._beat = 0.0
        make_folder(self.folder)
        # Another table's or topic's segments (a table dropped and made again, a route moved
        # to another topic) are never a reader's: gone before anything is kept.
        remove_foreign(self.folder, identity)
        # An earlier run's segments of these partitions: the lane reads them again from the
        # table's offsets and keeps them anew (a configuration may have changed meanwhile).
        drop(self.folder, lambda s: s.partition in partitions)

    def decoding_with(self, schema_id: int) -> None:
        """The lane decodes against another schema from now on: what is pending is written
        under the schema it was decoded with; a reader takes the current schema's alone."""
        self.cut()
        if schema_id != self.schema_id:
            self.end.clear()  # the new schema's segments start a chain of their own
        self.schema_id = schema_id

    def take(self, rows: pa.Table, kept_partitions: np.ndarray, kept_offsets: np.ndarray,
             before: dict[int, int], after: dict[int, int], held: set[int]) -> None:
        """A decoded batch: `rows` (offsets and partitions of their records alongside), the
        partitions' positions before and after it (every record between them read), and the
        partitions with records held for a schema change (`gap`). Written at once."""
        self.gap(held)
        with_offsets = rows.append_column(OFFSET_COLUMN, pa.array(kept_offsets, type=pa.int64()))
        single = len(after) == 1
        for partition, next_offset in after.items():
            if partition in held:
                continue
            start = before[partition]
            if self.end.get(partition) != start:  # the position jumped (or a first batch): a chain of its own
                self._write(partition)
            if partition not in self.pending:  # the next segment starts here
                self.first[partition] = start
            mine = with_offsets if single else with_offsets.filter(pa.array(kept_partitions == partition))
            self.pending.setdefault(partition, []).append(mine)
            self.end[partition] = next_offset
        self.cut()

    def gap(self, partitions: set[int]) -> None:
        """Records of `partitions` the lane read but whose rows are not the table's yet (held
        for a schema change): nothing kept for them; the next batch starts a chain anew."""
        for partition in partitions:
            self._write(partition)
            self.end.pop(partition, None)

    def tick(self, now: float | None = None) -> None:
        """The heartbeat (the writer calls it after every poll, for every lane, records or not)."""
        now = time.monotonic() if now is None else now
        if now - self._beat >= HEARTBEAT_SECONDS:
            self._beat = now
            beat(self.folder)

    def close(self) -> None:
        """The lane stops: what is pending written, the heartbeat gone (readers read Kafka)."""
        try:
            self.cut()
        finally:
            end_beat(self.folder)

    def cut(self) -> None:
        """Everything pending written: at a unit's end (its offsets are where a commit may leave
        a reader's chain to start) and when the lane stops."""
        for partition in list(self.pending):
            self._write(partition)

    def _write(self, partition: int) -> None:
        parts = self.pending.pop(partition, None)
        if not parts:
            return
        first, end = self.first[partition], self.end[partition]
        try:
            segment = write_segment(self.folder, self.identity, self.schema_id, partition, first, end,
                                    pa.concat_tables(parts))
        except OSError as exc:  # a full disk: fresh reads read Kafka past the chain's end; the ingest goes on
            self.log.warning("kept tail not written", partition=partition, first=first, next=end,
                             error=str(exc)[:200])
            self.end.pop(partition, None)
            return
        chain = self.written.setdefault(partition, [])
        if len(chain) >= 4 * MERGE_FANOUT:  # segments a commit covered stay listed until looked at
            chain[:] = [s for s in chain if os.path.exists(s.path)]
        chain.append(segment)
        try:
            self._merge(chain)
        except OSError as exc:  # as above: the segments stay as they are
            self.log.warning("kept tail not merged", partition=partition, error=str(exc)[:200])

    def _merge(self, chain: list[Segment]) -> None:
        """Merge a full tier while there is one (a few files a partition, whatever the interval)."""
        while (run := mergeable(chain)) is not None:
            merged = merge(self.folder, self.identity, run)
            if merged is None:  # a commit covered some of them: forget what is gone
                chain[:] = [s for s in chain if os.path.exists(s.path)]
                continue
            at = chain.index(run[0])
            chain[at:at + len(run)] = [merged]
