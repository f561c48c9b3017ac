"""The Trainer: run directories, summary keys, resume after SIGKILL, checkpoint errors."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from impl import rundir
from impl.config import resolve
from impl.train import (
    RunExistsError,
    conv_weight_counts,
    gradient_bytes,
    load_trained_model,
    pick_device,
    resume,
    seed_everything,
    train,
)

SUMMARY_KEYS = {
    "summary_version",
    "status",
    "method",
    "model",
    "data",
    "scale",
    "epochs",
    "top1",
    "compression_ratio",
    "inference_flops",
    "train_flops_nominal",
    "train_flops_executed",
    "fwd_ms",
    "bwd_ms",
    "step_ms",
    "iter_ms",
    "comm_bytes_per_iter",
    "wall_seconds",
    "environment",
}
TIMING_KEYS = {
    "fwd_ms",
    "bwd_ms",
    "step_ms",
    "iter_ms",
    "epoch_seconds",
    "eval_seconds",
    "wall_seconds",
    "train_seconds",
    "samples_per_second",
}


def _smoke_cfg(out: Path, **kw):
    values = dict(method="dense", model="resnet20", data="digits", out=str(out), threads=1)
    values.update(kw)
    return resolve("smoke", **values)


def test_run_directory_has_config_metrics_checkpoint_and_complete_summary(tmp_path):
    cfg = _smoke_cfg(tmp_path / "run", epochs=2)
    summary = train(cfg, progress=False)
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["model"] == "resnet20"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [0, 1]
    assert (run / "checkpoint.pt").exists()
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk["status"] == "complete"
    assert SUMMARY_KEYS <= set(on_disk)
    assert summary["top1"] == on_disk["top1"]
    assert 0.0 <= summary["top1"] <= 100.0
    assert summary["fwd_ms"] > 0 and summary["bwd_ms"] > 0
    assert summary["compression_ratio"] == pytest.approx(1.0)
    assert summary["best_top1"] == max(json.loads(line)["test_top1"] for line in lines)
    from impl.flops import training_flops
    from impl.models import create

    spec = summary["data_spec"]
    dense = training_flops(
        create("resnet20", spec["num_classes"], spec["in_channels"]),
        (spec["in_channels"], spec["image_size"], spec["image_size"]),
    )
    assert summary["inference_flops"] == summary["inference_flops_executed"] == dense.forward
    assert summary["train_flops_nominal"] == pytest.approx(dense.total)
    for row in map(json.loads, lines):  # per epoch: samples per second, training top-1 in %
        seen = row["samples_per_second"] * row["train_seconds"]
        assert seen == pytest.approx(round(seen), abs=1e-6)
        assert row["iterations"] <= round(seen) <= row["iterations"] * row["batch_size"]
        correct = row["train_top1"] * round(seen) / 100
        assert 0.0 <= row["train_top1"] <= 100.0
        assert correct == pytest.approx(round(correct), abs=1e-6)
        # the test pass, timed apart (time to accuracy leaves it out), is part of the epoch
        assert 0.0 < row["eval_seconds"] < row["epoch_seconds"] - row["train_seconds"] + 1e-9
    # No temporary files are left behind by the atomic writes.
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_a_masked_run_reports_nominal_inference_flops_below_the_executed(tmp_path):
    # Campfire masks weights but runs dense convolutions: the summary's inference FLOPs are
    # what the sparsity would cost on hardware that exploits it, the executed ones dense's
    opts = {"final_sparsity": 0.5, "start_epoch": 0, "era_epochs": 1}
    summary = train(_smoke_cfg(tmp_path / "run", method="campfire", method_options=opts),
                    progress=False)  # fmt: skip
    dense = train(_smoke_cfg(tmp_path / "dense"), progress=False)
    assert summary["inference_flops_executed"] == dense["inference_flops"]
    assert summary["inference_flops"] < 0.8 * summary["inference_flops_executed"]


def test_every_epoch_records_its_training_flops_per_sample(tmp_path):
    run = tmp_path / "run"
    summary = train(_smoke_cfg(run, epochs=2), progress=False)
    metrics = rundir.read_metrics(run)
    assert len(metrics) == 2
    assert summary["method_class"] == "impl.methods.dense:Dense"
    assert "peak_gpu_memory_mib" in summary and summary["peak_gpu_memory_mib"] is None  # CPU
    for row in metrics:  # dense: the cost never changes, nominal = executed = the summary's
        assert row["train_flops_nominal"] == summary["train_flops_nominal"]
        assert row["train_flops_executed"] == summary["train_flops_executed"]


@pytest.mark.gpu
def test_a_gpu_run_records_its_peak_memory(tmp_path):
    summary = train(_smoke_cfg(tmp_path / "run", device="cuda"), progress=False)
    weights_mib = summary["parameters"] * 4 / 2**20
    assert summary["device"].startswith("cuda")
    assert summary["peak_gpu_memory_mib"] > weights_mib  # weights, gradients, activations


def test_existing_run_is_never_overwritten(tmp_path):
    cfg = _smoke_cfg(tmp_path / "run", epochs=1)
    train(cfg, progress=False)
    before = (tmp_path / "run" / "summary.json").read_bytes()
    with pytest.raises(RunExistsError, match="already holds a finished run .* another --out"):
        train(_smoke_cfg(tmp_path / "run", epochs=1), progress=False)
    assert (tmp_path / "run" / "summary.json").read_bytes() == before
    (tmp_path / "run" / "summary.json").unlink()  # as if killed before the end: resumable
    with pytest.raises(RunExistsError, match="continue it with `pdtbench train --resume"):
        train(_smoke_cfg(tmp_path / "run", epochs=1), progress=False)


def test_corrupt_checkpoint_is_a_clear_error_and_nothing_is_overwritten(tmp_path):
    run = tmp_path / "run"
    cfg = _smoke_cfg(run, epochs=2)
    train(cfg, progress=False)
    (run / "summary.json").unlink()  # make it look killed
    (run / "checkpoint.pt").write_bytes(b"not a checkpoint")
    metrics_before = (run / "metrics.jsonl").read_bytes()
    with pytest.raises(rundir.CheckpointError, match="cannot be read"):
        resume(run, progress=False)
    assert (run / "checkpoint.pt").read_bytes() == b"not a checkpoint"
    assert (run / "metrics.jsonl").read_bytes() == metrics_before


def test_foreign_checkpoint_is_rejected(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    train(_smoke_cfg(a, epochs=1), progress=False)
    train(_smoke_cfg(b, epochs=1, seed=1), progress=False)
    (b / "summary.json").unlink()
    (b / "checkpoint.pt").write_bytes((a / "checkpoint.pt").read_bytes())
    with pytest.raises(rundir.CheckpointError, match="another run"):
        resume(b, progress=False)


def test_load_trained_model_gives_the_run_weights(tmp_path):
    run = tmp_path / "run"
    train(_smoke_cfg(run, epochs=1), progress=False)
    model, cfg = load_trained_model(run)
    state = torch.load(run / "checkpoint.pt", weights_only=True)["model"]
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key
    assert cfg.model == "resnet20" and not model.training


def test_conv_weight_counts_counts_zeros():
    conv = torch.nn.Conv2d(3, 4, 3, bias=False)
    with torch.no_grad():
        conv.weight[:2].zero_()
    assert conv_weight_counts(torch.nn.Sequential(conv)) == (108, 54)


def test_conv_weight_counts_ignores_layers_other_than_convs():
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 1), torch.nn.Linear(5, 7))
    assert conv_weight_counts(model) == (6, 6)


def test_gradient_bytes_counts_trainable_parameters_at_their_element_size():
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3).double())
    model[0].bias.requires_grad_(False)
    # Linear(5, 7) weight in float32 (35 x 4 B) + Linear(7, 3) weight and bias in float64.
    assert gradient_bytes(model) == 35 * 4 + (21 + 3) * 8


def test_seed_everything_makes_python_numpy_and_torch_repeat():
    import random

    import numpy as np

    def draw():
        return random.random(), np.random.rand(), torch.rand(3).tolist()  # noqa: NPY002

    seed_everything(1234)
    first = draw()
    seed_everything(1234)
    assert draw() == first
    seed_everything(1235)
    assert draw() != first


def test_pick_device_auto_follows_cuda_availability():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "x.json"
    rundir.atomic_write_bytes(path, b"old")
    rundir.atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_atomic_write_that_fails_keeps_the_old_content(tmp_path):
    path = tmp_path / "checkpoint.pt"
    rundir.atomic_write_bytes(path, b"complete")

    def half_then_fail(f):
        f.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        rundir.atomic_write(path, half_then_fail)
    assert path.read_bytes() == b"complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from impl.methods.dense import Dense
    from impl import cli

    KILL_AT = int(os.environ["KILL_AT_STEP"])

    def after_step(self, ctx):
        if ctx.step == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)

    Dense.after_step = after_step
    sys.exit(cli.main(sys.argv[1:]))
    """
)


def _cli(args, env_extra=None, code=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "impl.cli"]
    return subprocess.run(cmd + args, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_resume_after_sigkill_mid_epoch_equals_uninterrupted_run(tmp_path):
    common = [
        "train", "--method", "dense", "--model", "resnet20", "--data", "digits",
        "--scale", "smoke", "--epochs", "3", "--max-steps-per-epoch", "4",
        "--threads", "1", "--no-progress",
    ]  # fmt: skip
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    done = _cli(common + ["--out", str(whole)])
    assert done.returncode == 0, done.stderr

    # Killed by SIGKILL at step 6: in the middle of the second epoch (4 steps per epoch).
    dead = _cli(common + ["--out", str(killed)], {"KILL_AT_STEP": "6"}, code=KILLER)
    assert dead.returncode == -9
    assert not (killed / "summary.json").exists()
    assert len(rundir.read_metrics(killed)) == 1
    assert torch.load(killed / "checkpoint.pt", weights_only=True)["epoch"] == 1

    again = _cli(["train", "--resume", str(killed), "--no-progress"])
    assert again.returncode == 0, again.stderr
    assert json.loads((killed / "summary.json").read_text())["status"] == "complete"

    a = torch.load(whole / "checkpoint.pt", weights_only=True)
    b = torch.load(killed / "checkpoint.pt", weights_only=True)
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for pa, pb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(pa["momentum_buffer"], pb["momentum_buffer"])
    ma, mb = rundir.read_metrics(whole), rundir.read_metrics(killed)
    assert len(ma) == len(mb) == 3
    for ra, rb in zip(ma, mb):
        assert {k: v for k, v in ra.items() if k not in TIMING_KEYS} == {
            k: v for k, v in rb.items() if k not in TIMING_KEYS
        }


@pytest.mark.slow
def test_sigterm_stops_training_as_ctrl_c_does_and_names_the_resume(tmp_path):
    """A batch scheduler's time limit (SIGTERM) ended the process silently with 143; it now
    stops as Ctrl-C does: what finished is kept, the command says how to continue, and the
    exit status still says SIGTERM."""
    run = tmp_path / "run"
    args = [
        "train",
        "--method",
        "dense",
        "--scale",
        "smoke",
        "--epochs",
        "3",
        "--max-steps-per-epoch",
        "4",
        "--threads",
        "1",
        "--no-progress",
        "--out",
        str(run),
    ]
    code = KILLER.replace("signal.SIGKILL", "signal.SIGTERM")
    stopped = _cli(args, {"KILL_AT_STEP": "6"}, code=code)  # in the second epoch
    assert stopped.returncode == 143, stopped.stderr
    assert "1 finished epoch(s) are saved: continue with `pdtbench train --resume" in (
        stopped.stderr
    )
    assert "Traceback" not in stopped.stderr
    assert torch.load(run / "checkpoint.pt", weights_only=True)["epoch"] == 1
    again = _cli(["train", "--resume", str(run), "--no-progress"])
    assert again.returncode == 0, again.stderr


def test_bad_method_option_fails_before_anything_is_written(tmp_path):
    cfg = _smoke_cfg(tmp_path / "run", method="campfire", method_options={"final_sparsity": 1.5})
    with pytest.raises(ValueError, match="final"):
        train(cfg, progress=False)
    assert not (tmp_path / "run" / "config.json").exists()


def test_resume_continues_from_the_checkpoint_when_the_summary_is_unreadable(tmp_path):
    from impl.config import resolve
    from impl.train import resume, train

    cfg = resolve("smoke", epochs=1, max_steps_per_epoch=1, threads=1)
    cfg.out = str(tmp_path / "run")
    first = train(cfg, progress=False)
    (tmp_path / "run" / "summary.json").write_text("")  # e.g. a copy cut short
    again = resume(tmp_path / "run", progress=False)
    assert again["status"] == "complete" and again["top1"] == first["top1"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "complete"


def test_cpu_epochs_record_no_peak_memory_and_the_checkpoint_carries_zero(tmp_path):
    run = tmp_path / "run"
    train(_smoke_cfg(run, epochs=2), progress=False)
    assert [row["peak_gpu_memory_mib"] for row in rundir.read_metrics(run)] == [None, None]
    assert rundir.load_checkpoint(run)["peak_gpu_memory_bytes"] == 0


@pytest.mark.gpu
def test_a_gpu_runs_peak_is_the_largest_epoch_peak_even_when_prunetrain_probes(tmp_path):
    run = tmp_path / "run"
    options = {"reconfig_interval": 1, "dynamic_batch": True}  # a memory probe every epoch
    cfg = _smoke_cfg(run, method="prunetrain", epochs=3, device="cuda", method_options=options)
    summary = train(cfg, progress=False)
    epochs = [row["peak_gpu_memory_mib"] for row in rundir.read_metrics(run)]
    assert all(p is not None and p > 0 for p in epochs)
    assert summary["peak_gpu_memory_mib"] == pytest.approx(max(epochs))
    assert rundir.load_checkpoint(run)["peak_gpu_memory_bytes"] == round(max(epochs) * 2**20)


def test_time_per_iteration_counts_the_methods_per_step_work(tmp_path, monkeypatch):
    from impl.methods.dense import Dense

    pause_ms = 30.0

    def slow_after_step(self, ctx):  # a method whose per-step work (say, new masks) is costly
        time.sleep(pause_ms / 1e3)

    from impl import timing

    timers: list[timing.PhaseTimer] = []

    class RecordedTimer(timing.PhaseTimer):
        def __init__(self, device):
            super().__init__(device)
            timers.append(self)

    monkeypatch.setattr(Dense, "after_step", slow_after_step)
    monkeypatch.setattr("impl.train.PhaseTimer", RecordedTimer)
    run = tmp_path / "run"
    summary = train(_smoke_cfg(run, epochs=1), progress=False)
    row = rundir.read_metrics(run)[0]
    (timer,) = timers
    fwd, bwd, step = timer.times("fwd"), timer.times("bwd"), timer.times("step")
    assert min(step) >= pause_ms  # outside forward and backward ...
    assert row["step_ms"] == statistics.median(step)
    # ... but counted: each iteration's time is its forward + backward + step (medians of the
    # parts need not add up to the median of the whole, so compare iteration by iteration)
    whole = [f + b + t for f, b, t in zip(fwd, bwd, step, strict=True)]
    assert row["iter_ms"] == pytest.approx(statistics.median(whole))
    assert row["iter_ms"] >= pause_ms + min(f + b for f, b in zip(fwd, bwd, strict=True))
    assert summary["step_ms"] == row["step_ms"] and summary["iter_ms"] == row["iter_ms"]


@pytest.mark.parametrize(
    "content, complete",
    [
        (None, False),
        ("{not json", False),
        ('["a list"]', False),
        ('{"status": "running"}', False),
        ('{"status": "complete", "top1": 91.0}', True),
    ],
    ids=["missing", "unreadable", "not-an-object", "not-complete", "complete"],
)
def test_complete_summary_is_the_summary_of_a_finished_run_only(tmp_path, content, complete):
    if content is not None:
        (tmp_path / rundir.SUMMARY_FILE).write_text(content)
    got = rundir.complete_summary(tmp_path)
    assert got == ({"status": "complete", "top1": 91.0} if complete else None)


@pytest.mark.slow
def test_last_loss_is_the_last_epochs_mean_whatever_the_progress_display(tmp_path, monkeypatch):
    # A plug-in reading ctx.last_loss saw values that depended on whether a progress bar was
    # shown (it was updated every fifth step, only with the bar): now it is the mean training
    # loss of the last finished epoch, NaN during the first, with or without the display.
    from impl.methods.dense import Dense

    seen: list[float] = []
    monkeypatch.setattr(Dense, "after_step", lambda self, ctx: seen.append(ctx.last_loss))
    runs = []
    for progress in (True, False):
        seen.clear()
        train(_smoke_cfg(tmp_path / f"p{progress}", epochs=2), progress=progress)
        runs.append(list(seen))
    as_seen = [[None if math.isnan(v) else v for v in r] for r in runs]
    assert as_seen[0] == as_seen[1]
    steps = len(runs[1]) // 2
    assert all(math.isnan(v) for v in runs[1][:steps])  # the first epoch: none finished yet
    losses = [r["train_loss"] for r in rundir.read_metrics(tmp_path / "pFalse")]
    assert runs[1][steps:] == [pytest.approx(losses[0])] * steps


def test_each_metrics_row_records_the_batch_its_own_steps_used(tmp_path):
    # A method that grows the batch at an epoch's end (PruneTrain's dynamic mini-batch) made
    # that epoch's row record the next epoch's batch beside its own iterations and samples.
    from impl.methods import register_method, unregister_method
    from impl.methods.dense import Dense

    class _Doubling(Dense):
        name = "doubling"

        def on_epoch_end(self, ctx):
            ctx.batch_size *= 2

    register_method("doubling", _Doubling)
    try:
        cfg = _smoke_cfg(tmp_path / "run", method="doubling", epochs=3, batch_size=8)
        summary = train(cfg, progress=False)
    finally:
        unregister_method("doubling")
    rows = rundir.read_metrics(tmp_path / "run")
    assert [r["batch_size"] for r in rows] == [8, 16, 32]
    for row in rows:  # the whole batches of the epoch's steps
        seen = round(row["samples_per_second"] * row["train_seconds"])
        assert seen == row["iterations"] * row["batch_size"]
    assert summary["batch_size"] == 64  # the batch the run ended with, as its checkpoint


class _DoublingAndCrashing:
    """A dense method that doubles the batch at every epoch's end and, when ``crash`` is
    set, raises at the start of epoch 1 once (a run stopped there, to be resumed)."""

    crash = False

    @staticmethod
    def make():
        from impl.methods.dense import Dense

        class DoublingAndCrashing(Dense):
            name = "doubling_crashing"

            def on_epoch_start(self, ctx):
                if _DoublingAndCrashing.crash and ctx.epoch == 1:
                    _DoublingAndCrashing.crash = False
                    raise RuntimeError("stopped at epoch 1")

            def on_epoch_end(self, ctx):
                ctx.batch_size *= 2
                ctx.extra["ended"] = ctx.extra.get("ended", 0) + 1  # per-run scratch
                self.draw = float(torch.rand(()))  # torch's global generator

            def epoch_metrics(self, ctx):
                return {"ended": ctx.extra["ended"], "draw": self.draw}

        return DoublingAndCrashing


@pytest.fixture
def doubling_method():
    from impl.methods import register_method, unregister_method

    register_method("doubling_crashing", _DoublingAndCrashing.make())
    yield "doubling_crashing"
    _DoublingAndCrashing.crash = False
    unregister_method("doubling_crashing")


def test_the_learning_rate_follows_the_batch_linearly(tmp_path, doubling_method):
    # the rate scaled by old/new batch would shrink as PruneTrain's dynamic batch grows
    cfg = _smoke_cfg(tmp_path / "run", method=doubling_method, epochs=2, batch_size=8,
                     schedule="constant")  # fmt: skip
    train(cfg, progress=False)
    rows = rundir.read_metrics(tmp_path / "run")
    assert [r["lr"] for r in rows] == [pytest.approx(cfg.lr), pytest.approx(2 * cfg.lr)]


@pytest.mark.slow
def test_a_resumed_run_keeps_its_grown_batch_and_its_step_count(tmp_path, doubling_method):
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    values = dict(method=doubling_method, epochs=3, batch_size=8)
    train(_smoke_cfg(whole, **values), progress=False)
    _DoublingAndCrashing.crash = True
    with pytest.raises(RuntimeError, match="stopped at epoch 1"):
        train(_smoke_cfg(stopped, **values), progress=False)
    resume(stopped, progress=False)
    assert [r["batch_size"] for r in rundir.read_metrics(stopped)] == [8, 16, 32]
    a = torch.load(whole / "checkpoint.pt", weights_only=True)
    b = torch.load(stopped / "checkpoint.pt", weights_only=True)
    assert (b["step"], b["batch_size"]) == (a["step"], a["batch_size"]) and a["step"] > 0
    # the method's scratch (ctx.extra) and torch's generator continue where they were
    rows_a, rows_b = rundir.read_metrics(whole), rundir.read_metrics(stopped)
    assert [r["ended"] for r in rows_b] == [1, 2, 3]
    assert [r["draw"] for r in rows_b] == [r["draw"] for r in rows_a]
    # the wall clock goes on from the checkpoint's, as an uninterrupted run's
    walls = [r["wall_seconds"] for r in rows_b]
    for before, row in zip(walls, rows_b[1:]):
        assert row["wall_seconds"] == pytest.approx(before + row["epoch_seconds"])


def test_a_resume_under_another_config_is_refused(tmp_path):
    """``Trainer.run(resume=True)`` on a run directory whose config.json differs."""
    from impl.train import Trainer

    run = tmp_path / "run"
    train(_smoke_cfg(run, epochs=1), progress=False)
    other = _smoke_cfg(run, epochs=1, lr=0.05)
    with pytest.raises(rundir.CheckpointError, match="does not match the run's config"):
        Trainer(other, progress=False).run(resume=True)


def test_the_schedule_is_read_at_each_steps_start(tmp_path):
    # a step schedule dropping at epoch 1: the first epoch's last step still runs at the full
    # rate (read one step ahead, it would already be dropped)
    cfg = _smoke_cfg(tmp_path / "run", epochs=2, schedule="step", milestones=[1])
    train(cfg, progress=False)
    rows = rundir.read_metrics(tmp_path / "run")
    assert rows[0]["lr"] == pytest.approx(cfg.lr) and rows[1]["lr"] < cfg.lr


@pytest.mark.slow
def test_a_step_cap_above_the_loaders_length_changes_nothing(tmp_path):
    values = dict(epochs=2, schedule="cosine", batch_size=512, data_options={"image_size": 8})
    uncapped = _smoke_cfg(tmp_path / "a", **values)
    uncapped.max_steps_per_epoch = None
    train(uncapped, progress=False)
    train(_smoke_cfg(tmp_path / "b", max_steps_per_epoch=100_000, **values), progress=False)
    a, b = rundir.read_metrics(tmp_path / "a"), rundir.read_metrics(tmp_path / "b")
    assert [r["iterations"] for r in a] == [r["iterations"] for r in b]
    assert [r["lr"] for r in a] == pytest.approx([r["lr"] for r in b])


@pytest.mark.parametrize("name", ["resnet20", "resnet9"])
def test_the_input_check_changes_no_weight_statistic_mode_or_random_state(name: str) -> None:
    """The image-size check runs the run's own model once: nothing of it may change."""
    from types import SimpleNamespace

    from impl.models import create
    from impl.train import check_input_fits

    torch.manual_seed(3)
    model = create(name)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    cfg = SimpleNamespace(model=name, data="digits")
    check_input_fits(model, cfg, SimpleNamespace(in_channels=3, image_size=32))
    assert model.training and all(m.training for m in model.modules())
    assert torch.equal(torch.get_rng_state(), rng)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    if name == "resnet9":  # too small for it: refused, and the mode is still restored
        with pytest.raises(ValueError, match="cannot take 8x8 images of 'digits'"):
            check_input_fits(model, cfg, SimpleNamespace(in_channels=3, image_size=8))
        assert model.training


def test_a_gpu_run_resumes_where_fewer_gpus_are_visible(monkeypatch):
    # The checkpoint held every visible GPU's random state and the resume restored them all:
    # a run saved with 8 GPUs visible and resumed with one died with IndexError.
    from impl import train as T

    states = [torch.full((16,), i, dtype=torch.uint8) for i in range(8)]
    set_calls: list[tuple[torch.Tensor, torch.device]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda d: states[torch.device(d).index])
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, d: set_calls.append((s, d)))

    saved = T.cuda_rng_state(torch.device("cuda:3"))
    assert saved is states[3]  # the training GPU's state alone
    assert T.cuda_rng_state(torch.device("cpu")) is None
    T.restore_cuda_rng(saved, torch.device("cuda:0"))
    assert set_calls[-1][0] is states[3] and set_calls[-1][1] == torch.device("cuda:0")
    # a checkpoint of the earlier form (one state per visible GPU when it was saved)
    T.restore_cuda_rng(states, torch.device("cuda:0"))
    assert set_calls[-1][0] is states[0]
    T.restore_cuda_rng(states[:2], torch.device("cuda:5"))  # no state for that GPU: none set
    T.restore_cuda_rng(None, torch.device("cuda:0"))
    T.restore_cuda_rng(states[1], torch.device("cpu"))
    assert len(set_calls) == 2


def test_the_input_check_leaves_a_model_in_eval_mode_in_eval_mode():
    """check_input_fits restores the mode the model had, not training mode."""
    from types import SimpleNamespace

    from impl.train import check_input_fits

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 2, 3), torch.nn.BatchNorm2d(2)).eval()
    cfg = SimpleNamespace(model="tiny", data="digits")
    check_input_fits(model, cfg, SimpleNamespace(in_channels=3, image_size=8))
    assert not model.training and not any(m.training for m in model.modules())


def test_evaluate_restores_the_mode_the_model_had():
    """evaluate() scores in eval mode and hands the model back in the mode it came in."""
    from impl.train import evaluate

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    x, y = torch.randn(6, 1, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2])
    modes: list[bool] = []
    model.register_forward_hook(lambda m, i, o: modes.append(m.training))
    for mode in (True, False):
        model.train(mode)
        loss, top1 = evaluate(model, [(x[:4], y[:4]), (x[4:], y[4:])], torch.device("cpu"))
        assert model.training is mode
    assert modes == [False] * 4  # every batch scored in eval mode
    with torch.no_grad():
        out = model(x)
    assert loss == pytest.approx(float(torch.nn.functional.cross_entropy(out, y)), rel=1e-6)
    assert top1 == pytest.approx(100.0 * int((out.argmax(1) == y).sum()) / 6)


def test_pick_device_refuses_a_cuda_index_the_machine_does_not_have(monkeypatch):
    """With N CUDA devices, indices 0 to N-1 are taken and index N is refused."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert pick_device("cuda:1") == torch.device("cuda:1")
    assert pick_device("cuda") == torch.device("cuda")
    with pytest.raises(ValueError, match="this machine has 2 CUDA device"):
        pick_device("cuda:2")
    with pytest.raises(ValueError, match="is not a device"):
        pick_device("nonsense")


def test_an_old_checkpoints_per_gpu_states_restore_the_resuming_gpus_own(monkeypatch):
    """A checkpoint holding one random state per visible GPU gives the resuming GPU the state
    at its index, the last one included; an index past the list sets none."""
    from impl import train as T

    states = [torch.full((16,), i, dtype=torch.uint8) for i in range(3)]
    set_calls: list[tuple[torch.Tensor, torch.device]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, d: set_calls.append((s, d)))
    T.restore_cuda_rng(states, torch.device("cuda:2"))
    assert len(set_calls) == 1 and set_calls[0][0] is states[2]
    T.restore_cuda_rng(states, torch.device("cuda:3"))
    assert len(set_calls) == 1


def test_plain_sgd_without_momentum_takes_no_nesterov_flag(tmp_path):
    """Nesterov (the default) needs momentum: a config of momentum 0 trains with plain SGD
    instead of being refused by torch's optimizer."""
    from impl.train import Trainer

    cfg = _smoke_cfg(tmp_path / "run", momentum=0.0, weight_decay=1e-3)
    assert cfg.nesterov
    model = torch.nn.Linear(3, 2)
    opt = Trainer(cfg, progress=False)._optimizer(model)
    (group,) = opt.param_groups
    assert (group["nesterov"], group["momentum"], group["lr"]) == (False, 0.0, cfg.lr)
    assert group["weight_decay"] == 1e-3
    with_momentum = Trainer(_smoke_cfg(tmp_path / "b", momentum=0.5), progress=False)
    assert with_momentum._optimizer(model).param_groups[0]["nesterov"] is True


def test_a_resumed_run_continues_the_step_count_and_the_wall_clock(tmp_path, monkeypatch):
    """A run stopped after its first epoch and resumed ends at the step count of its three
    epochs, and its wall clock goes on from the first epoch's: each row's wall_seconds is the
    previous row's plus its own epoch_seconds, and the summary's is the last row's."""
    from impl.methods.dense import Dense

    stop = {"once": True}

    def on_epoch_start(self, ctx):
        if ctx.epoch == 1 and stop.pop("once", False):
            raise RuntimeError("stopped at epoch 1")

    monkeypatch.setattr(Dense, "on_epoch_start", on_epoch_start)
    run = tmp_path / "run"
    cfg = _smoke_cfg(run, epochs=3, batch_size=8, max_steps_per_epoch=2,
                     data_options={"image_size": 8})  # fmt: skip
    with pytest.raises(RuntimeError, match="stopped at epoch 1"):
        train(cfg, progress=False)
    assert rundir.load_checkpoint(run)["step"] == 2
    summary = resume(run, progress=False)
    assert rundir.load_checkpoint(run)["step"] == 6  # three epochs of two steps
    rows = rundir.read_metrics(run)
    assert [r["epoch"] for r in rows] == [0, 1, 2]
    assert rows[0]["wall_seconds"] == pytest.approx(rows[0]["epoch_seconds"])
    for before, row in zip(rows, rows[1:]):
        assert row["wall_seconds"] == pytest.approx(before["wall_seconds"] + row["epoch_seconds"])
    assert summary["wall_seconds"] == pytest.approx(rows[-1]["wall_seconds"])


def _cubic_step_cost(monkeypatch) -> list[int]:
    """Makes the Trainer's per-sample training cost one that changes every step: ``k**3``
    nominal and ``2 * k**3`` executed at step k. Returns the steps it is read at."""
    read_at: list[int] = []

    def cubic_cost(ctx, method):
        read_at.append(ctx.step)
        return float(ctx.step**3), 2.0 * ctx.step**3

    monkeypatch.setattr("impl.train._step_cost", cubic_cost)
    return read_at


def test_an_epochs_cost_is_read_at_its_start_step_1_the_middle_step_and_the_last(
    tmp_path, monkeypatch
):
    """The per-sample training cost of an epoch of five steps is read as it begins and at the
    start of steps 1, 2 and 3 (the two middle ones of steps 1-4) and 4 (the last), and the
    row's figure is the first step at the starting cost plus steps 1-4 along the cubic through
    the four read costs: exact for a cost that is cubic in the step."""
    read_at = _cubic_step_cost(monkeypatch)
    run = tmp_path / "run"
    cfg = _smoke_cfg(run, epochs=1, batch_size=8, max_steps_per_epoch=5,
                     data_options={"image_size": 8})  # fmt: skip
    train(cfg, progress=False)
    assert read_at == [0, 1, 2, 3, 4]
    (row,) = rundir.read_metrics(run)
    # k^3 at every step: (0 + 1 + 8 + 27 + 64) / 5
    assert row["train_flops_nominal"] == pytest.approx(20.0)
    assert row["train_flops_executed"] == pytest.approx(40.0)


def test_the_compression_ratio_is_dense_conv_weights_over_the_nonzero_ones(tmp_path, monkeypatch):
    """A run whose method zeroes the first convolution reports its convolution weights before
    and after, and a compression ratio of the dense count over the nonzero count (above 1)."""
    from impl.methods.dense import Dense

    def zero_conv1(self, ctx):
        with torch.no_grad():
            ctx.model.conv1.weight.zero_()

    monkeypatch.setattr(Dense, "after_step", zero_conv1)
    run = tmp_path / "run"
    cfg = _smoke_cfg(run, epochs=1, batch_size=8, max_steps_per_epoch=1,
                     data_options={"image_size": 8})  # fmt: skip
    summary = train(cfg, progress=False)
    state = rundir.load_checkpoint(run)["model"]
    convs = [v for k, v in state.items() if k.endswith("weight") and v.dim() == 4]
    dense = sum(v.numel() for v in convs)
    nonzero = sum(int(torch.count_nonzero(v)) for v in convs)
    assert nonzero == dense - state["conv1.weight"].numel()
    assert (summary["conv_weights_dense"], summary["conv_weights_nonzero"]) == (dense, nonzero)
    assert summary["compression_ratio"] == pytest.approx(dense / nonzero)
    assert summary["compression_ratio"] > 1.0


def test_a_loader_that_ends_early_has_its_cost_read_after_its_last_step(tmp_path, monkeypatch):
    """A loader that delivers 3 of the 7 batches its length promised: the reads at steps 3, 4
    and 6 never happen in the loop, so the cost is read after the last step (at step 3), and
    the epoch's figure runs along the line through steps 1 and 3 over its 3 steps."""
    import itertools

    from impl import data

    class EndsEarly:
        def __init__(self, loader):
            self._loader = loader

        def __getattr__(self, name):
            return getattr(self._loader, name)

        def __len__(self):
            return 7

        def __iter__(self):
            return itertools.islice(iter(self._loader), 3)

    real = data.make_loaders

    def make_loaders(*args, **kwargs):
        train_loader, test_loader, spec = real(*args, **kwargs)
        return EndsEarly(train_loader), test_loader, spec

    read_at = _cubic_step_cost(monkeypatch)
    monkeypatch.setattr(data, "make_loaders", make_loaders)
    run = tmp_path / "run"
    cfg = _smoke_cfg(run, epochs=1, batch_size=8, data_options={"image_size": 8})
    cfg.max_steps_per_epoch = None
    train(cfg, progress=False)
    (row,) = rundir.read_metrics(run)
    assert row["iterations"] == 3 and read_at == [0, 1, 3]
    # the line through (1, 1), (3, 27) is 14 at step 2: (0 + 1 + 14) / 3
    assert row["train_flops_nominal"] == pytest.approx(5.0)


def test_each_phase_time_is_the_median_of_its_own_iterations(tmp_path, monkeypatch):
    """fwd_ms, bwd_ms and step_ms are the medians of their own phase; iter_ms the median of
    the iterations' sums (here 263 ms, not 3 + 40 + 200); the summary takes the last epoch's."""
    phase_ms = {"fwd": [1.0, 5.0, 3.0], "bwd": [20.0, 40.0, 60.0], "step": [300.0, 100.0, 200.0]}

    class FixedTimer:
        def __init__(self, device):
            self.stopped: dict[str, int] = {}

        def start(self, phase):
            pass

        def stop(self, phase):
            self.stopped[phase] = self.stopped.get(phase, 0) + 1

        def times(self, phase):
            return phase_ms[phase][: self.stopped.get(phase, 0)]

    monkeypatch.setattr("impl.train.PhaseTimer", FixedTimer)
    run = tmp_path / "run"
    cfg = _smoke_cfg(run, epochs=1, batch_size=4, data_options={"image_size": 8})
    summary = train(cfg, progress=False)
    (row,) = rundir.read_metrics(run)
    assert row["iterations"] == 3  # the smoke preset's step cap
    got = (row["fwd_ms"], row["bwd_ms"], row["step_ms"], row["iter_ms"])
    assert got == (3.0, 40.0, 200.0, 263.0)  # iterations of 321, 145 and 263 ms
    assert tuple(summary[k] for k in ("fwd_ms", "bwd_ms", "step_ms", "iter_ms")) == got


def test_the_summary_keeps_the_last_epochs_accuracy_and_the_best_one(tmp_path, monkeypatch):
    """top1 is the last epoch's test accuracy, best_top1 the highest of any epoch, even where
    accuracy fell after it."""
    scores = iter([(1.0, 70.0), (2.0, 40.0)])
    monkeypatch.setattr("impl.train.evaluate", lambda *a, **k: next(scores))
    run = tmp_path / "run"
    cfg = _smoke_cfg(
        run, epochs=2, batch_size=4, max_steps_per_epoch=1, data_options={"image_size": 8}
    )
    summary = train(cfg, progress=False)
    assert [r["test_top1"] for r in rundir.read_metrics(run)] == [70.0, 40.0]
    assert (summary["top1"], summary["best_top1"]) == (40.0, 70.0)


def test_a_resumed_run_goes_on_with_the_last_loss_and_pythons_and_numpys_generators(
    tmp_path, monkeypatch
):
    """What a method reads at an epoch's start (``ctx.last_loss``, draws from Python's and
    NumPy's global generators, which the run seeds) is the same in a run stopped after two
    epochs and resumed as in the run that was never stopped."""
    import random

    import numpy as np

    from impl.methods.dense import Dense

    seen: list[tuple[int, float, float, float]] = []
    stop: dict[str, bool] = {}

    def on_epoch_start(self, ctx):
        if ctx.epoch == 2 and stop.pop("once", False):
            raise RuntimeError("stopped at epoch 2")
        seen.append((ctx.epoch, ctx.last_loss, random.random(), float(np.random.rand())))  # noqa: NPY002

    monkeypatch.setattr(Dense, "on_epoch_start", on_epoch_start)
    values = dict(epochs=3, batch_size=8, max_steps_per_epoch=2, data_options={"image_size": 8})
    train(_smoke_cfg(tmp_path / "whole", **values), progress=False)
    whole = list(seen)
    seen.clear()
    stop["once"] = True
    with pytest.raises(RuntimeError, match="stopped at epoch 2"):
        train(_smoke_cfg(tmp_path / "cut", **values), progress=False)
    seen.clear()
    resume(tmp_path / "cut", progress=False)
    assert [s[0] for s in whole] == [0, 1, 2] and math.isfinite(whole[2][1])
    assert seen == [whole[2]]  # the loss of epoch 1, and the third draws, not the first


def test_training_time_waits_for_the_devices_queued_work(tmp_path, monkeypatch):
    """An epoch's clock starts and stops, and each reading of the step cost begins, after the
    device has finished what was queued (on a GPU the work of earlier steps would otherwise
    be counted as cost reading or left out): 1 + 3 + 1 waits for 4 steps."""
    from impl import train as train_module

    waits: list[str] = []
    monkeypatch.setattr(train_module, "synchronize", lambda d: waits.append(str(d)))
    cfg = _smoke_cfg(tmp_path / "run", epochs=1, batch_size=8, max_steps_per_epoch=4,
                     data_options={"image_size": 8})  # fmt: skip
    train(cfg, progress=False)
    assert waits == ["cpu"] * 5


def test_the_progress_bar_is_none_where_it_would_show_nothing(monkeypatch):
    import io

    from impl.train import _progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file: no bar, no loss read
    assert _progress(3, "epoch 1/1", True) is None
    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = _progress(3, "epoch 1/1", True)
    assert bar is not None and not bar.disable
    bar.close()
    assert _progress(3, "epoch 1/1", False) is None


def test_whether_a_process_shows_progress_is_told_to_the_method_and_not_checkpointed(tmp_path):
    """``ctx.progress`` is how this process runs: the method reads it (SDGP says so
    before its end-of-run profile), and a resumed run takes the resuming process's."""
    from impl.methods import Method, register_method, unregister_method

    seen: list[bool] = []

    class Watches(Method):
        name = "watches_progress"

        def on_epoch_start(self, ctx):
            seen.append(ctx.progress)
            if ctx.epoch == 1 and len(seen) == 2:  # the first process stops in epoch 2
                raise RuntimeError("stopped at epoch 1")

    register_method("watches_progress", Watches)
    try:
        run = tmp_path / "run"
        with pytest.raises(RuntimeError, match="stopped at epoch 1"):
            train(_smoke_cfg(run, method="watches_progress", epochs=2), progress=True)
        state = torch.load(run / "checkpoint.pt", weights_only=True)
        assert state["ctx_extra"]["seed"] == 0 and "progress" not in state["ctx_extra"]
        resume(run, progress=False)
        assert seen == [True, True, False]  # the resuming process's, not the saved one's
    finally:
        unregister_method("watches_progress")
