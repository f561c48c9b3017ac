"""Training that diverges stops in the epoch it happens, keeps the last finite checkpoint,
says so in its run directory and on the command line, and is not resumed into the same
place; a few non-finite losses under fp16, whose steps were skipped, are not a divergence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from impl import rundir
from impl.config import resolve
from impl.methods.dense import Dense
from impl.train import (
    RunExistsError,
    TrainingDiverged,
    divergence_reason,
    nonfinite_state,
    resume,
    train,
)


def _cfg(out: Path, **kw):
    values = dict(
        method="dense", model="resnet20", data="digits", out=str(out), threads=1, epochs=3,
        batch_size=8, max_steps_per_epoch=2, data_options={"image_size": 8},
    )  # fmt: skip
    values.update(kw)
    return resolve("smoke", **values)


def _poison_in_epoch(monkeypatch: pytest.MonkeyPatch, epoch: int) -> None:
    """From the first step of ``epoch`` on, the first convolution's weight holds a NaN."""

    def after_step(self, ctx):
        if ctx.epoch >= epoch:
            with torch.no_grad():
                ctx.model.conv1.weight[0, 0, 0, 0] = float("nan")

    monkeypatch.setattr(Dense, "after_step", after_step)


def test_a_diverging_epoch_stops_training_and_keeps_the_last_finite_checkpoint(
    tmp_path, monkeypatch
):
    _poison_in_epoch(monkeypatch, 1)
    run = tmp_path / "run"
    with pytest.raises(TrainingDiverged) as caught:
        train(_cfg(run), progress=False)
    message = str(caught.value)
    assert "diverged in epoch 2 of 3" in message and "conv1.weight" in message
    assert "the checkpoint of epoch 1" in message and "lower --lr" in message
    # the diverged epoch left no metrics line and did not overwrite the checkpoint
    assert [r["epoch"] for r in rundir.read_metrics(run)] == [0]
    state = rundir.load_checkpoint(run)
    assert state["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
    record = json.loads((run / rundir.SUMMARY_FILE).read_text())
    assert record["status"] == "diverged" and record["diverged_epoch"] == 1
    assert rundir.diverged_summary(run) == record and rundir.complete_summary(run) is None
    # found at the end of epoch 2, after two steps of each epoch
    assert record["found_at_step"] == 4 and record["iterations"] == 2
    assert "(found at its end, step 4;" in message
    json.dumps(record, allow_nan=False)  # a valid JSON file: no bare NaN in it


def test_a_diverged_run_is_neither_resumed_nor_overwritten(tmp_path, monkeypatch):
    _poison_in_epoch(monkeypatch, 0)
    run = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match="no epoch had finished"):
        train(_cfg(run), progress=False)
    monkeypatch.undo()  # the same code would diverge again; resume must not even try
    with pytest.raises(TrainingDiverged, match="diverged in epoch 1 of 3"):
        resume(run, progress=False)
    assert not (run / rundir.CHECKPOINT_FILE).exists()
    with pytest.raises(RunExistsError, match="diverged in epoch 1"):
        train(_cfg(run), progress=False)


def test_the_command_line_names_the_divergence_and_exits_1(tmp_path, capsys):
    from impl import cli

    run = tmp_path / "run"
    args = ["train", "--scale", "smoke", "--lr", "1e12", "--epochs", "2", "--out", str(run)]
    assert cli.main([*args, "--batch-size", "8", "--no-progress"]) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "pdtbench train: error: training diverged in epoch 1 of 2" in err
    assert "this run's peak was 1e+12" in err
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == cli.EXIT_FAILED


def test_fgsm_refuses_a_diverged_run_without_sending_it_to_resume(tmp_path, monkeypatch):
    from impl.robustness import eval_fgsm_run

    _poison_in_epoch(monkeypatch, 0)
    with pytest.raises(TrainingDiverged):
        train(_cfg(tmp_path / "run"), progress=False)
    with pytest.raises(ValueError, match="diverged in epoch 1 .* no trained model to attack"):
        eval_fgsm_run(tmp_path / "run", [0.0])


def test_the_report_lists_a_diverged_run_with_its_reason(tmp_path, monkeypatch):
    from impl.report.runs import load_runs

    _poison_in_epoch(monkeypatch, 0)
    with pytest.raises(TrainingDiverged):
        train(_cfg(tmp_path / "run"), progress=False)
    frame = load_runs([tmp_path])
    assert len(frame) == 0
    (entry,) = frame.attrs["incomplete"]
    assert entry["status"] == "diverged" and "conv1.weight" in entry["reason"]


def test_a_reproduction_does_not_train_a_diverged_run_again(tmp_path, monkeypatch):
    from reproductions import common

    _poison_in_epoch(monkeypatch, 0)
    cfg = _cfg(tmp_path / "run")
    with pytest.raises(TrainingDiverged):
        common.run_or_reuse(cfg)
    monkeypatch.undo()
    monkeypatch.setattr("impl.train.Trainer.run", lambda *a, **k: pytest.fail("trained again"))
    with pytest.raises(TrainingDiverged):
        common.run_or_reuse(_cfg(tmp_path / "run"))


def test_a_divergence_record_holds_no_nan_and_its_message_reads_without_a_rate():
    """An epoch of no step has no learning rate (NaN in the row): the record says null, which
    JSON can hold, and the message does without it."""
    from impl.train import Trainer

    trainer = Trainer.__new__(Trainer)
    trainer.cfg = _cfg(Path("unused"))
    ctx = type("Ctx", (), {"step": 0})()
    row = {"lr": float("nan"), "train_loss": float("nan"), "iterations": 0}
    record = trainer._divergence_record(ctx, Dense(), 0, row, "non-finite values in x")
    assert record["lr"] is None and record["train_loss"] is None
    json.dumps(record, allow_nan=False)
    message = str(TrainingDiverged(Path("run"), record))
    assert "(found at its end, step 0; no step)" in message and "peak was 0.2" in message


def test_nonfinite_state_names_parameters_and_buffers():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Linear(2, 2))
    assert nonfinite_state(model) == []
    model[1].running_var[1] = float("inf")
    model[2].weight.data[0, 0] = float("nan")
    assert nonfinite_state(model) == ["1.running_var", "2.weight"]
    assert nonfinite_state(model, limit=1) == ["1.running_var"]


def test_divergence_reason_needs_bad_weights_or_no_finite_loss():
    model = nn.Linear(2, 2)
    assert divergence_reason(model, {"iterations": 4, "nonfinite_loss_steps": 3}) is None
    assert "every one of the epoch's 4 steps" in divergence_reason(
        model, {"iterations": 4, "nonfinite_loss_steps": 4}
    )
    model.bias.data[0] = float("nan")
    why = divergence_reason(model, {"iterations": 4, "nonfinite_loss_steps": 1})
    assert why == "non-finite values in bias (1 of 4 steps had a non-finite loss)"


def test_a_skipped_fp16_step_with_an_infinite_loss_is_counted_not_averaged(tmp_path, monkeypatch):
    """Under fp16 a step whose loss is infinite is skipped by the gradient scaler: the epoch's
    training loss is the mean of the finite ones, the step is counted, and training goes on."""
    import torch.nn.functional as F

    real = F.cross_entropy
    seen = []

    def first_step_infinite(out, y, **kw):
        loss = real(out, y, **kw)
        if torch.is_grad_enabled():
            seen.append(float(loss.detach()))
            if len(seen) == 1:
                return loss * float("inf")
        return loss

    monkeypatch.setattr(F, "cross_entropy", first_step_infinite)
    train(_cfg(tmp_path / "run", epochs=1, fp16=True), progress=False)
    (row,) = rundir.read_metrics(tmp_path / "run")
    assert row["nonfinite_loss_steps"] == 1 and row["amp_skipped_steps"] == 1
    assert row["train_loss"] == pytest.approx(seen[1], rel=1e-6)


def test_an_epoch_of_no_step_is_no_divergence():
    """An epoch that ran no step (an empty loader) has no loss at all: with finite weights
    that is not "every step had a non-finite loss"."""
    model = nn.Linear(2, 2)
    assert divergence_reason(model, {"iterations": 0, "nonfinite_loss_steps": 0}) is None
    assert divergence_reason(model, {}) is None
