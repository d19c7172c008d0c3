"""The lane's kept tail (ingest/tail_spool.py) against a model: whatever the batches, jumps,
records held for a schema change, unit ends, merges and commits, a reader chaining from any
offset (fresh/cache.cached_rows, as fresh reads do) gets exactly the rows of the records in
[start, where its chain ends), and its chain never spans a record that is not a row yet or
one the lane never read.

Real files, real Arrow IPC; the lane's decoding is what the model stands for (the broker-backed
test is tests/fresh/test_fresh_read.py::test_the_ingests_own_kept_tail_serves_reads_exactly).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamberg.common.log import get_logger
from streamberg.fresh.cache import cached_rows
from streamberg.ingest.tail_spool import TailSpool
from streamberg.table_meta.tail_segments import TailIdentity, cache_folder, drop_committed, segments
from tests.helpers import config_at, write_config

IDENTITY = TailIdentity("00000000-0000-0000-0000-000000000001", "events", "")

ROW, REJECTED, HELD, UNREAD = "row", "rejected", "held", "unread"

# One step of a lane: a batch of records of partitions 0 and 1 (each record a row, a dead
# letter or held; a jump first: records the lane never reads), a unit's end, a commit up to
# a recent unit end, or a schema change.
batch = st.tuples(st.just("batch"), st.lists(st.tuples(st.sampled_from([0, 1]),
                                                       st.sampled_from([ROW, ROW, ROW, ROW, REJECTED])),
                                             min_size=1, max_size=30),
                  st.sampled_from([0, 0, 0, 0, 3]), st.sampled_from([None, None, None, None, None, 0, 1]))
# Batches and unit ends mostly: a schema change leaves a reader the newest schema's segments alone.
step = st.one_of(batch, batch, batch, st.just(("cut",)), st.just(("cut",)), st.just(("commit",)),
                 st.just(("schema",)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(step, min_size=1, max_size=60), st.data())
def test_a_reader_gets_exactly_the_rows_below_where_its_chain_ends(steps, data) -> None:
    with tempfile.TemporaryDirectory() as directory:
        config = config_at(write_config(Path(directory), "127.0.0.1:9"))
        config = config.model_copy(update={"ingest": config.ingest.model_copy(update={
            "state_dir": str(Path(directory) / "state")})})
        spool = TailSpool(config, [0, 1], get_logger("test"), IDENTITY)
        schema = 0
        spool.decoding_with(schema)
        kind: dict[tuple[int, int], str] = {}  # (partition, offset) -> what the record is
        schema_of: dict[tuple[int, int], int] = {}  # a row's schema (a reader takes the current one's)
        position, unit_ends, committed = {0: 0, 1: 0}, [{0: 0, 1: 0}], {0: 0, 1: 0}
        for action in steps:
            if action[0] == "batch":
                _, records, jump, held_partition = action
                if held_partition is not None:  # a record with a field the table lacks, held
                    records = [*records, (held_partition, HELD)]
                for p in (0, 1):  # a jump: records Kafka lost, never read
                    for o in range(position[p], position[p] + jump):
                        kind[(p, o)] = UNREAD
                    position[p] += jump
                partitions = sorted({p for p, _ in records})
                before = {p: position[p] for p in partitions}
                offsets, parts, kept, held = [], [], [], set()
                for p, what in records:
                    o = position[p]
                    position[p] += 1
                    kind[(p, o)] = what
                    if what == ROW:
                        kept.append(len(offsets))
                        schema_of[(p, o)] = schema
                    elif what == HELD:
                        held.add(p)
                    offsets.append(o)
                    parts.append(p)
                index = np.asarray(kept, dtype=np.int64)
                kept_offsets = np.asarray(offsets, dtype=np.int64)[index]
                kept_parts = np.asarray(parts)[index]
                rows = pa.table({"id": pa.array(kept_offsets * 10 + kept_parts, type=pa.int64())})
                spool.take(rows, kept_parts, kept_offsets, before, {p: position[p] for p in partitions}, held)
            elif action[0] == "cut":
                spool.cut()
                unit_ends.append(dict(position))
            elif action[0] == "commit":
                committed = data.draw(st.sampled_from(unit_ends[-3:]))
                drop_committed(spool.folder, committed)
            else:
                spool.cut()
                unit_ends.append(dict(position))
                schema += 1
                spool.decoding_with(schema)
        spool.tick()  # the heartbeat
        for start in [*unit_ends, committed]:
            parts_read, resume, _ = cached_rows(spool.folder, IDENTITY, schema, dict(start))
            got = sorted(i for t in parts_read for i in t.column("id").to_pylist())
            expected = []
            for p in (0, 1):
                span = [kind[(p, o)] for o in range(start[p], resume[p])]
                assert HELD not in span and UNREAD not in span, (p, start[p], resume[p], span)
                assert all(schema_of[(p, o)] == schema for o in range(start[p], resume[p]) if kind[(p, o)] == ROW)
                expected += [o * 10 + p for o in range(start[p], resume[p]) if kind[(p, o)] == ROW]
            assert got == sorted(expected)
        assert len(segments(spool.folder)) <= 4 * 8 + len(unit_ends)  # merged, not one per batch


def test_the_spool_keeps_its_partitions_alone(tmp_path: Path) -> None:
    """A lane starting drops an earlier run's segments of its own partitions, not the other
    writers'; a reader needs the heartbeat."""
    config = config_at(write_config(tmp_path, "127.0.0.1:9"))
    folder = cache_folder(config)
    first = TailSpool(config, [0], get_logger("test"), IDENTITY)
    other = TailSpool(config, [1], get_logger("test"), IDENTITY)
    for spool, p in ((first, 0), (other, 1)):
        spool.decoding_with(0)
        spool.take(pa.table({"id": [1, 2]}), np.array([p, p]), np.array([5, 6]), {p: 5}, {p: 7}, set())
        spool.cut()
        spool.tick()  # the heartbeat, as the writer's poll gives it
    assert sorted(s.partition for s in segments(folder)) == [0, 1]
    assert cached_rows(folder, IDENTITY, 0, {0: 5, 1: 5})[1] == {0: 7, 1: 7}
    TailSpool(config, [0], get_logger("test"), IDENTITY)  # writer 0 again, after a restart
    assert [s.partition for s in segments(folder)] == [1]
    (folder / "heartbeat").unlink()
    assert cached_rows(folder, IDENTITY, 0, {1: 5})[1] == {1: 5}  # no heartbeat: nothing taken from the files
