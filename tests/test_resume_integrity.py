"""A killed run resumed: its damaged metrics are refused before anything is rewritten, and
it continues with the torch thread count it began with, so that it ends as an uninterrupted
run does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from impl import rundir
from impl.config import resolve
from impl.train import resume, train


def _cfg(out: Path, **kw):
    values = dict(
        method="dense", model="resnet20", data="digits", out=str(out), epochs=3,
        batch_size=8, max_steps_per_epoch=2, data_options={"image_size": 8},
    )  # fmt: skip
    values.update(kw)
    return resolve("smoke", **values)


def _killed_after_epoch(monkeypatch: pytest.MonkeyPatch, cfg, epoch: int) -> None:
    """Train ``cfg`` until the checkpoint of ``epoch`` epochs is written, then stop as a
    kill would (no summary)."""
    real = rundir.save_checkpoint

    def save_then_die(run_dir, state, digest):
        real(run_dir, state, digest)
        if state["epoch"] == epoch:
            raise KeyboardInterrupt

    monkeypatch.setattr(rundir, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, progress=False)
    monkeypatch.undo()


def test_a_resume_over_damaged_metrics_refuses_and_rewrites_nothing(tmp_path, monkeypatch):
    """It used to keep the lines before the damaged one, rewrite the file without the rest
    and record the run complete, with the top-1 of an early epoch."""
    run = tmp_path / "run"
    _killed_after_epoch(monkeypatch, _cfg(run, threads=1), 2)
    path = run / rundir.METRICS_FILE
    damaged = path.read_text().replace('"epoch": 0', '"epoch": 0,,', 1)
    path.write_text(damaged)
    with pytest.raises(rundir.MetricsError, match="line 1 of 2 is not JSON"):
        resume(run, progress=False)
    assert path.read_text() == damaged and not (run / rundir.SUMMARY_FILE).exists()

    from impl import cli

    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_USAGE


def test_a_resume_continues_with_the_thread_count_the_run_began_with(tmp_path, monkeypatch, capsys):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # the run's config leaves the count to torch
        train(_cfg(tmp_path / "whole"), progress=False)
        _killed_after_epoch(monkeypatch, _cfg(tmp_path / "killed"), 1)
        torch.set_num_threads(2)  # resumed elsewhere, or under another --jobs
        capsys.readouterr()
        resume(tmp_path / "killed", progress=False)
        assert "resuming with 1 torch threads, as the run began (not 2)" in capsys.readouterr().err
        assert torch.get_num_threads() == 2  # the caller's count is back after the run
    finally:
        torch.set_num_threads(before)

    def losses(run: Path) -> list[tuple[float, float]]:
        return [(r["train_loss"], r["test_loss"]) for r in rundir.read_metrics(run)]

    assert losses(tmp_path / "killed") == losses(tmp_path / "whole")
    whole = json.loads((tmp_path / "whole" / rundir.SUMMARY_FILE).read_text())
    assert rundir.complete_summary(tmp_path / "killed")["top1"] == whole["top1"]


def test_resume_and_loading_read_name_equals_dir_as_the_runs_datasets(tmp_path, monkeypatch):
    """``--data-dir NAME=DIR`` (as PDTBENCH_DATA_DIR takes it) names the dataset it is for:
    another dataset's directory is refused, not read as a path; for a run on embedded data
    (digits) any directory is, as one it would not read."""
    from impl.train import load_trained_model

    run = tmp_path / "run"
    _killed_after_epoch(monkeypatch, _cfg(run, threads=1), 1)
    with pytest.raises(ValueError, match="digits is not read from a directory"):
        resume(run, progress=False, data_dir="cifar10=/elsewhere")
    with pytest.raises(ValueError, match="digits is not read from a directory"):
        load_trained_model(run, data_dir="imagenet=/elsewhere")
