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
