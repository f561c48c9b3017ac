"""PruneTrain through the Trainer: a run killed after a reconfiguration resumes to the same
result as an uninterrupted run (the shrunken architecture is rebuilt from the checkpoint)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from impl import rundir

KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from impl.methods.prunetrain import PruneTrain
    from impl import cli

    KILL_AT = int(os.environ["KILL_AT_STEP"])

    def after_step(self, ctx):
        if ctx.step == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)

    PruneTrain.after_step = after_step
    sys.exit(cli.main(sys.argv[1:]))
    """
)
# metrics that must agree: the Trainer's results and everything PruneTrain logs
SAME = (
    "epoch", "train_loss", "test_loss", "test_top1", "batch_size", "lasso_lambda", "lasso_loss",
    "stage", "params", "inference_flops", "train_flops_epoch", "train_flops_run",
    "bn_traffic_bytes_run", "channels", "reconfigured", "removed_paths", "removed_channels",
)  # fmt: skip


def _cli(args: list[str], env_extra: dict | None = None, code: str | None = None):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "impl.cli"]
    return subprocess.run(cmd + args, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.timeout(900)  # three CLI runs; ~20 s on an idle machine, far more on a shared one
def test_resume_after_kill_rebuilds_the_pruned_model(tmp_path) -> None:
    # A threshold of 0.3 removes channels of the freshly initialised network (Kaiming
    # weights have std ~0.1), so a smoke run reconfigures for real after every epoch.
    common = [
        "train", "--method", "prunetrain", "--model", "resnet20", "--data", "digits",
        "--scale", "smoke", "--epochs", "3", "--max-steps-per-epoch", "3", "--threads", "1",
        "--no-progress", "--reconfig-interval", "1", "--threshold", "0.3",
    ]  # fmt: skip
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    done = _cli(common + ["--out", str(whole)])
    assert done.returncode == 0, done.stderr
    summary = json.loads((whole / "summary.json").read_text())
    first = summary["reconfigurations"][0]
    assert first["params_after"] < first["params_before"]

    # killed in the second epoch, after the first reconfiguration was checkpointed
    dead = _cli(common + ["--out", str(killed)], {"KILL_AT_STEP": "4"}, code=KILLER)
    assert dead.returncode == -9
    assert torch.load(killed / "checkpoint.pt", weights_only=True)["epoch"] == 1
    again = _cli(["train", "--resume", str(killed), "--no-progress"])
    assert again.returncode == 0, again.stderr

    a = torch.load(whole / "checkpoint.pt", weights_only=True)
    b = torch.load(killed / "checkpoint.pt", weights_only=True)
    assert a["model"].keys() == b["model"].keys()
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    ma, mb = rundir.read_metrics(whole), rundir.read_metrics(killed)
    for ra, rb in zip(ma, mb, strict=True):
        assert {k: ra.get(k) for k in SAME} == {k: rb.get(k) for k in SAME}
        assert ra["params"] > 0 and "channels" in ra
    sb = json.loads((killed / "summary.json").read_text())
    assert sb["reconfigurations"] == summary["reconfigurations"]
    assert sb["lasso_lambda"] == summary["lasso_lambda"]
    assert sb["inference_flops"] == summary["inference_flops"] < summary["inference_flops_dense"]
    # compression against the dense model it started from, not the pruned one it resumed with
    assert sb["compression_ratio"] == summary["compression_ratio"] > 1.0
