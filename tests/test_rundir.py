"""Tests of the run directory's metric lines: what a resume keeps of them."""

from __future__ import annotations

from impl import rundir


def test_a_resume_keeps_the_epochs_its_checkpoint_holds_and_drops_the_rest(tmp_path):
    """Killed after epoch 2's metrics were written but before its checkpoint: the checkpoint
    says two epochs (0 and 1) are done, so epoch 2 trains again and its old line must go."""
    for epoch in range(3):
        rundir.append_metrics(tmp_path, {"epoch": epoch, "test_top1": 10.0 * epoch})
    with open(tmp_path / rundir.METRICS_FILE, "a") as f:
        f.write('{"epoch": 3, "test_')  # and a line torn by the kill
    rundir.truncate_metrics(tmp_path, epochs_done=2)
    assert [r["epoch"] for r in rundir.read_metrics(tmp_path)] == [0, 1]
    rundir.truncate_metrics(tmp_path, epochs_done=0)
    assert rundir.read_metrics(tmp_path) == []
    assert (tmp_path / rundir.METRICS_FILE).read_text() == ""


def test_read_metrics_of_a_run_without_metrics_is_empty(tmp_path):
    assert rundir.read_metrics(tmp_path) == []


def test_taking_a_run_directorys_lock_removes_what_a_killed_writer_left(tmp_path):
    # a kill mid-checkpoint left .checkpoint.pt.XXXX.tmp (megabytes) in the run for good
    stale = tmp_path / ".checkpoint.pt.k3j2.tmp"
    stale.write_bytes(b"x" * 100)
    kept = tmp_path / "metrics.jsonl"
    kept.write_text("{}\n")
    users = tmp_path / ".notes.tmp"  # --out may name a directory holding a user's files
    users.write_text("mine")
    with rundir.locked(tmp_path):
        assert not stale.exists()
    assert kept.read_text() == "{}\n" and users.read_text() == "mine"
