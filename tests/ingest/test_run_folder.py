"""A run's folder (ingest/run_folder.py): read progress restart-safe and never fatal; markers."""

from __future__ import annotations

from pathlib import Path

from streamberg.ingest.run_folder import RunFolder


def test_read_counts_survive_a_restart_that_rewinds_to_the_table(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    first = folder.progress(0, {0: 100, 1: 50})
    folder.progress(1, {2: 0})
    first.update({0: 180, 1: 70})
    assert folder.records_read() == 100
    # Flink restarts the writer: it resumes from the committed offsets (behind what it read)
    # and keeps the offsets the run began at, so nothing is counted twice.
    again = folder.progress(0, {0: 150, 1: 60})
    assert again.started == {0: 100, 1: 50}
    assert folder.records_read() == 60
    again.update({0: 200, 1: 90})
    assert folder.records_read() == 140


def test_an_unwritable_run_folder_never_fails_the_writer(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    folder = RunFolder(blocker / "run")
    progress = folder.progress(0, {0: 5})  # the folder cannot be made
    progress.update({0: 9})
    assert progress.failed and folder.records_read() == 0


def test_a_record_bound_stop_holds_only_while_the_reads_reach_it(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    assert not folder.stop_due()  # no marker
    progress = folder.progress(0, {0: 0})
    progress.update({0: 120})
    folder.request_stop("max_records 100 read", until_read=100)
    assert folder.stop_due()
    # A Flink restart during the drain rewinds the writer to the committed offset (60): it
    # reads on to the bound before it finishes, so the run commits what it was asked for.
    folder.progress(0, {0: 60})
    assert not folder.stop_due()
    progress.update({0: 100})
    assert folder.stop_due()


def test_any_other_stop_holds_at_once(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    folder.request_stop("SIGTERM")
    assert folder.stop_due()
    (tmp_path / "stop").write_text("")  # a bare marker (older runs): stop
    assert folder.stop_due()


def test_markers_are_absent_until_written_and_carry_their_reason(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path / "runs" / "r1")
    assert (folder.fenced(), folder.lost_offsets(), folder.drained()) == (None, None, False)
    folder.mark_fenced("another instance committed\n")
    folder.mark_lost_offsets("partition 3: committed 10 below the low watermark 20")
    folder.mark_drained({0: 5, 1: 7})
    assert folder.fenced() == "another instance committed"
    assert folder.lost_offsets() == "partition 3: committed 10 below the low watermark 20"
    assert folder.drained() and (folder.path / "drained").read_text() == '{"offsets": {"0": 5, "1": 7}}'


def test_old_run_folders_are_pruned_and_recent_ones_kept(tmp_path) -> None:
    import os
    import time

    from streamberg.ingest.run_folder import KEEP_RUNS, RunFolder, prune_runs

    runs = tmp_path / "runs"
    old = time.time() - 7200
    for i in range(KEEP_RUNS + 15):
        folder = runs / f"run-{i:03d}"
        folder.mkdir(parents=True)
        (folder / "workers-1.log").write_text("x\n")
        # The first ones old, the last five touched just now (another instance may use them).
        stamp = old + i if i < KEEP_RUNS + 10 else time.time()
        os.utime(folder, (stamp, stamp))
    current = RunFolder(runs / "current").create()
    gone = prune_runs(current)
    left = sorted(p.name for p in runs.iterdir())
    assert current.path.name in left and len(gone) == 15
    assert [f"run-{i:03d}" for i in range(15)] == sorted(p.name for p in gone)
    assert len(left) == KEEP_RUNS + 1
