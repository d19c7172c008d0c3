"""Kept tail segments that cannot lie (table_meta/tail_segments.py): a segment names and carries
the table's UUID and its topic's identity, so a table dropped and fed again from another
topic never reads the old topic's rows; a file whose content disagrees with its name is
refused; files are private; a keeper's heartbeat is trusted only while its process lives and
goes on every exit. Real broker, real ingest and fresh reads, real `streamberg tail` process."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from streamberg.common.broker import ensure_topic
from streamberg.common.catalog import load_catalog
from streamberg.decode.envelopes import record_decoder
from streamberg.fresh import read
from streamberg.fresh.cache import cached_rows
from streamberg.fresh.tail import tail_identity
from streamberg.ingest.dead_letters import open_tables
from streamberg.table_meta.tail_segments import (
    HEARTBEAT,
    OFFSET_COLUMN,
    SegmentRefused,
    TailIdentity,
    alive,
    beat,
    cache_folder,
    end_beat,
    make_folder,
    read_segment,
    remove_foreign,
    segments,
    write_segment,
)
from tests.helpers import config_at, wait_for, write_config
from tests.runbooks.inprocess import event, ingest_until, produce_values

ONE = TailIdentity("00000000-0000-0000-0000-00000000000a", "events", "id-a")
OTHER = TailIdentity("00000000-0000-0000-0000-00000000000b", "events", "id-a")


def _rows(first: int, count: int) -> pa.Table:
    return pa.table({"id": list(range(first, first + count)),
                     OFFSET_COLUMN: pa.array(range(first, first + count), type=pa.int64())})


def test_a_dropped_table_fed_from_another_topic_never_reads_the_old_topics_rows(tmp_path: Path,
                                                                                broker: str) -> None:
    path = write_config(tmp_path, broker, ingest={"parallelism": 1})
    old = config_at(path)
    ensure_topic(broker, old.kafka.topic, 1)
    open_tables(old)
    produce_values(old, [event(i) for i in range(1000, 1050)], 0, 1)
    ingest_until(old, {0: 10})
    catalog = load_catalog(old.catalog)
    table = catalog.load_table(old.table.identifier)
    # What a keeper of the old table kept of its topic's [10, 50): real decoded rows.
    decoder = record_decoder(old, table.schema())
    values = [event(i) for i in range(1010, 1050)]
    decoded = decoder.decode(values, None, ([0] * 40, list(range(10, 50))))
    kept = decoded.table.append_column(OFFSET_COLUMN, pa.array(range(10, 50), type=pa.int64()))
    folder = cache_folder(old)
    make_folder(folder)
    write_segment(folder, tail_identity(old, table), table.schema().schema_id, 0, 10, 50, kept)
    beat(folder)  # a live keeper of the old table, as far as the folder can tell

    # The table is dropped and made again, fed from another topic.
    catalog.drop_table(old.table.identifier)
    new = config_at(write_config(tmp_path, broker, topic=f"{old.kafka.topic}-b", ingest={"parallelism": 1}))
    ensure_topic(broker, new.kafka.topic, 1)
    open_tables(new)
    produce_values(new, [event(i) for i in range(10)], 0, 1)
    ingest_until(new, {0: 10})
    produce_values(new, [event(i) for i in range(10, 60)], 0, 1)
    beat(folder)
    for until in ("now", "kept"):
        ids = sorted(read(new, fresh=True, until=until).rows.column("id").to_pylist())
        assert not [i for i in ids if i >= 1000], f"{until}: the old topic's rows came back"
        assert ids == list(range(60 if until == "now" else 10)), (until, ids)
    end_beat(folder)


def test_segments_of_another_identity_are_never_taken_and_are_removed(tmp_path: Path) -> None:
    folder = tmp_path / "tail"
    make_folder(folder)
    write_segment(folder, OTHER, 0, 0, 0, 10, _rows(0, 10))
    write_segment(folder, ONE, 0, 0, 10, 20, _rows(10, 10))
    (folder / "seg-s0-p0-0-10.arrow").write_bytes(b"an older name")
    beat(folder)
    assert cached_rows(folder, ONE, 0, {0: 0})[1] == {0: 0}  # OTHER's chain start is no chain of ONE
    parts, resume, _ = cached_rows(folder, ONE, 0, {0: 10})
    assert resume == {0: 20} and sorted(parts[0].column("id").to_pylist()) == list(range(10, 20))
    assert remove_foreign(folder, ONE) == 2
    assert [s.token for s in segments(folder)] == [ONE.token] and (folder / HEARTBEAT).exists()
    # Private: the folder 0700, each file 0600.
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for file in folder.iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file


def test_a_segment_whose_content_disagrees_with_its_name_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "tail"
    make_folder(folder)
    segment = write_segment(folder, OTHER, 0, 0, 0, 10, _rows(0, 10))
    renamed = folder / segment.path.name.replace(OTHER.token, ONE.token)
    segment.path.rename(renamed)  # another identity's rows under this identity's name
    beat(folder)
    (forged,) = segments(folder, ONE)
    with pytest.raises(SegmentRefused):
        read_segment(forged, ONE)
    assert cached_rows(folder, ONE, 0, {0: 0})[1] == {0: 0}  # Kafka from the start
    wide = write_segment(folder, ONE, 0, 1, 0, 5, _rows(0, 10))  # offsets 5..9 outside [0, 5)
    with pytest.raises(SegmentRefused):
        read_segment(wide, ONE)


def test_a_heartbeat_is_trusted_only_while_its_process_lives(tmp_path: Path) -> None:
    folder = tmp_path / "tail"
    make_folder(folder)
    code = ("import sys, time; from pathlib import Path; from streamberg.table_meta.tail_segments import beat; "
            "beat(Path(sys.argv[1])); print('beat', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "beat"
        assert alive(folder)
        child.send_signal(signal.SIGKILL)  # no chance to remove its heartbeat
        child.wait(10)
        assert (folder / HEARTBEAT).exists() and not alive(folder)  # fresh, but its process is gone
    finally:
        child.kill()


def test_streamberg_tail_removes_its_heartbeat_on_sigterm(tmp_path: Path, broker: str) -> None:
    path = write_config(tmp_path, broker, ingest={"parallelism": 1})
    config = config_at(path)
    ensure_topic(broker, config.kafka.topic, 1)
    open_tables(config)
    produce_values(config, [event(i) for i in range(20)], 0, 1)
    ingest_until(config, {0: 10})
    folder = cache_folder(config)
    keeper = subprocess.Popen([sys.executable, "-m", "streamberg.cli.main", "tail", "--config", str(path)],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: alive(folder), 60, "the keeper's heartbeat", every=0.1, proc=keeper,
                 log=lambda: keeper.stderr.read() if keeper.stderr else "")
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(60) == 0
        assert not (folder / HEARTBEAT).exists() and not alive(folder)
    finally:
        if keeper.poll() is None:
            os.kill(keeper.pid, signal.SIGKILL)
