"""The relay of local worker log lines to the driver's stderr (ingest/local/worker_logs.py).

Real files, real appends from two processes; the end-to-end side (worker lines of a real
PyFlink run reaching `streamberg ingest`'s stderr) is checked by every ingest test that reads
"lane opened" from the command's output, e.g. tests/ingest/test_ingest_hostile.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from streamberg.ingest.local.worker_logs import WorkerLogRelay


def test_only_complete_lines_are_relayed_and_the_rest_at_stop(tmp_path: Path) -> None:
    path = tmp_path / "workers.log"
    out: list[str] = []
    relay = WorkerLogRelay(path, write=out.append)
    relay.pump()  # no file yet: nothing, no error
    assert out == []
    with path.open("ab") as f:
        f.write(b'{"a": 1}\n{"b": ')
    relay.pump()
    assert "".join(out) == '{"a": 1}\n'
    with path.open("ab") as f:
        f.write(b'2}\n{"c": 3}')
    relay.pump()
    assert "".join(out) == '{"a": 1}\n{"b": 2}\n'
    relay.stop()  # the last line, unterminated, is not lost
    assert "".join(out).splitlines() == ['{"a": 1}', '{"b": 2}', '{"c": 3}']


def test_lines_of_two_worker_processes_arrive_whole(tmp_path: Path) -> None:
    """Each worker appends through the same logging set-up the job uses (structlog to a
    line-buffered file); the relay's thread sees every line once and whole."""
    path = tmp_path / "workers.log"
    out: list[str] = []
    relay = WorkerLogRelay(path, write=out.append, interval=0.01).start()
    script = (
        "import sys\n"
        "from streamberg.ingest.local.worker_logs import WorkerLogTarget\n"
        "from streamberg.common.log import get_logger\n"
        f"WorkerLogTarget({str(path)!r}, json=True).configure()\n"
        "log = get_logger('ingest.writer', writer=int(sys.argv[1]))\n"
        "for i in range(2000):\n"
        "    log.info('line', i=i, pad='x' * 200)\n"
    )
    workers = [subprocess.Popen([sys.executable, "-c", script, str(w)]) for w in (0, 1)]
    assert [w.wait(timeout=120) for w in workers] == [0, 0]
    relay.stop()
    lines = [json.loads(line) for line in "".join(out).splitlines()]
    assert len(lines) == 4000
    for writer in (0, 1):
        assert [e["i"] for e in lines if e["writer"] == writer] == list(range(2000))


def test_relayed_lines_are_redacted(tmp_path: Path) -> None:
    """A forked worker's traceback or Beam's own line is not structlog's: the relay redacts it."""
    from streamberg.common.redact import register_secret

    register_secret("relay-secret-77")
    path = tmp_path / "workers.log"
    out: list[str] = []
    relay = WorkerLogRelay(path, write=out.append)
    path.write_bytes(b"Traceback (most recent call last):\n  psycopg2: postgresql://u:relay-secret-77@db/c\n"
                     b"sasl.password=other-secret-88\n")
    relay.stop()
    text = "".join(out)
    assert "relay-secret-77" not in text and "other-secret-88" not in text and text.count("***") == 2


def test_a_rotated_worker_file_is_relayed_to_its_end_and_stays_bounded(tmp_path: Path) -> None:
    """A worker's file is rotated at its bound (here 4 KB) into `.1`, the older one dropped;
    the relay follows each file by inode, so every line arrives once, and the disk holds at
    most the file and its `.1`."""
    from streamberg.common.log import RotatingLineFile

    out: list[str] = []
    relay = WorkerLogRelay(tmp_path / "workers.log", write=out.append)
    log = RotatingLineFile(tmp_path / "workers-7.log", max_bytes=4096)
    for i in range(3000):
        log.write(f'{{"i": {i}, "pad": "{"x" * 40}"}}\n')
        if i % 37 == 0:
            relay.pump()  # the relay reads while the worker rotates
    relay.stop()
    assert [json.loads(line)["i"] for line in "".join(out).splitlines()] == list(range(3000))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["workers-7.log", "workers-7.log.1"]
    assert all((tmp_path / f).stat().st_size <= 4096 for f in files)
