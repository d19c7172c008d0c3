"""Read progress of a bounded run (ingest/read_progress.py): restart-safe, never fatal."""

from __future__ import annotations

from pathlib import Path

from streamberg.ingest.read_progress import ReadProgress, records_read


def test_read_counts_survive_a_restart_that_rewinds_to_the_table(tmp_path: Path) -> None:
    first = ReadProgress(tmp_path, 0, {0: 100, 1: 50})
    ReadProgress(tmp_path, 1, {2: 0})
    first.update({0: 180, 1: 70})
    assert records_read(tmp_path) == 100
    # Flink restarts the writer: it resumes from the committed offsets (behind what it read)
    # and keeps the offsets the run began at, so nothing is counted twice.
    again = ReadProgress(tmp_path, 0, {0: 150, 1: 60})
    assert again.started == {0: 100, 1: 50}
    assert records_read(tmp_path) == 60
    again.update({0: 200, 1: 90})
    assert records_read(tmp_path) == 140


def test_an_unwritable_run_folder_never_fails_the_writer(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    progress = ReadProgress(blocker / "run", 0, {0: 5})  # the folder cannot be made
    progress.update({0: 9})
    assert progress.failed and records_read(blocker / "run") == 0


def test_a_record_bound_stop_holds_only_while_the_reads_reach_it(tmp_path: Path) -> None:
    from streamberg.ingest.read_progress import request_stop, stop_due

    assert not stop_due(tmp_path)  # no marker
    progress = ReadProgress(tmp_path, 0, {0: 0})
    progress.update({0: 120})
    request_stop(tmp_path, "max_records 100 read", until_read=100)
    assert stop_due(tmp_path)
    # A Flink restart during the drain rewinds the writer to the committed offset (60): it
    # reads on to the bound before it finishes, so the run commits what it was asked for.
    ReadProgress(tmp_path, 0, {0: 60})
    assert not stop_due(tmp_path)
    progress.update({0: 100})
    assert stop_due(tmp_path)


def test_any_other_stop_holds_at_once(tmp_path: Path) -> None:
    from streamberg.ingest.read_progress import request_stop, stop_due

    request_stop(tmp_path, "SIGTERM")
    assert stop_due(tmp_path)
    (tmp_path / "stop").write_text("")  # a bare marker (older runs): stop
    assert stop_due(tmp_path)
