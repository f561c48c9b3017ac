"""Two gloo processes (torchrun) against one process: same weights, measured bytes, files.

One torchrun job runs every scenario of ``test_distributed_worker.py`` (one process group,
so the interpreter and torch start once per rank); the single-process references run here.
The float64 scenarios compare weights to 1e-5 relative; the float32 CLI run is
compared on its losses, because in float32 two runs of ResNet-20 that only differ in the
order of reductions drift apart by more than that within a few steps (docs/distributed.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import test_distributed_worker as worker
import torch

from impl import distributed, rundir

#: The module's tests read one 2-rank job (a module fixture): one xdist worker runs them all,
#: so that the job runs once, not once per worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ddp-job")]

TESTS_DIR = Path(__file__).resolve().parent
JOB_TIMEOUT_S = 900  # the whole job; each collective has its own 120 s timeout


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the 2-rank job once; return both ranks' results and the output directory."""
    out = tmp_path_factory.mktemp("ddp")
    path = os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": path, distributed.TIMEOUT_ENV: "120"}
    rc = distributed.launch(
        [str(out)],
        2,
        module="test_distributed_worker",
        env=env,
        threads=1,
        timeout_s=JOB_TIMEOUT_S,
    )
    assert rc == 0, f"the 2-process job failed with status {rc} (its output is above)"
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    return {"out": out, "ranks": ranks}


def result(job: dict[str, Any], name: str, rank: int = 0) -> dict[str, Any]:
    entry = job["ranks"][rank][name]
    assert entry["ok"], f"{name} failed on rank {rank}: {entry['error']}\n{entry['tb']}"
    return entry["result"]


def single_run(out: Path, values: dict[str, Any], float64: bool, monkeypatch) -> dict[str, Any]:
    """The same config in this one process (no process group)."""
    import impl.models

    if float64:
        monkeypatch.setattr(impl.models, "create", worker.float64_create(impl.models.create))
    torch.set_num_threads(1)
    return worker.train_run(out, values)


def test_sparse_hook_equals_dense_allreduce_at_kept_positions(job):
    for rank in (0, 1):
        res = result(job, "hook", rank)
        for mode in ("timed", "async", "channels_last"):
            r = res[mode]
            assert r["max_abs_diff"] <= 1e-6, (rank, mode)
            assert r["max_abs_pruned"] == 0.0, (rank, mode)
            # bytes handed to all_reduce = kept entries * 4 bytes, every iteration
            assert r["bytes"] == [r["expected_bytes"]] * 3
            assert r["expected_bytes"] < r["dense_bytes"]
            assert min(r["calls"]) >= 1
        assert all(s > 0 for s in res["timed"]["seconds"])


def test_ranks_with_different_masks_are_stopped(job):
    for rank in (0, 1):
        res = result(job, "mask_check", rank)
        assert res["same"] == "ok"
        assert res["different"] == (
            f"rank {rank}: the communication masks differ between ranks; sparse Allreduce "
            "needs the same kept positions on every rank"
        )


def test_ranks_share_their_decisions_and_not_their_random_draws(job):
    from impl.train import rank_rng_seed

    ranks = [result(job, "agreement", r) for r in (0, 1)]
    # the loss value is the global mean bit for bit on both ranks, whatever each one's own
    assert ranks[0]["loss_values"] == ranks[1]["loss_values"]
    assert ranks[0]["batch"] == ranks[1]["batch"] == 32  # rank 0's
    # each epoch's first draws: per rank and epoch, so a resumed run draws them again
    for rank, entry in enumerate(ranks):
        expected = []
        for epoch in range(worker.DENSE["epochs"]):
            torch.manual_seed(rank_rng_seed(0, epoch, rank))
            expected.append(torch.rand(2).tolist())
        assert entry["epoch_draws"] == expected
    assert ranks[0]["epoch_draws"] != ranks[1]["epoch_draws"]
    # rank 1 ended its run only once rank 0 had kept the divergence record (slowly)
    for entry in ranks:
        assert entry["diverged"] == "TrainingDiverged"
        assert entry["summary_there_when_raised"] is True


def test_dense_ddp_equals_one_process_float64(job, tmp_path, monkeypatch):
    ddp = result(job, "dense64")
    one = single_run(tmp_path / "one", worker.DENSE, True, monkeypatch)
    rel = worker.weights_rel_diff(job["out"] / "dense64", tmp_path / "one")
    assert rel <= 1e-5, rel
    assert ddp["world_size"] == 2 and one["world_size"] == 1
    assert ddp["comm_bytes_source"] == "measured"
    assert ddp["global_batchnorm"] is True
    # dense: every parameter's gradient, 8 bytes each (float64)
    assert ddp["comm_bytes_per_iter"] == ddp["parameters"] * 8 == one["comm_bytes_per_iter"]
    a = rundir.read_metrics(job["out"] / "dense64")
    b = rundir.read_metrics(tmp_path / "one")
    assert [r["train_loss"] for r in a] == pytest.approx([r["train_loss"] for r in b], rel=1e-6)
    assert [r["test_loss"] for r in a] == pytest.approx([r["test_loss"] for r in b], rel=1e-6)
    assert all(0 < r["comm_ms"] < 1e3 * r["train_seconds"] for r in a)  # a part of the epoch


def test_sdgp_ddp_equals_one_process_float64(job, tmp_path, monkeypatch):
    """SDGP prunes each rank's dL/dO inside the backward pass, before the Allreduce, and its
    rescale adds an eps (the authors' 1e-4 here): the weights equal one process's only if each
    rank's gradient has one process's scale there (unequal shares of 9 and 8 too)."""
    result(job, "sdgp64")
    single_run(tmp_path / "one", worker.SDGP64, True, monkeypatch)
    rel = worker.weights_rel_diff(job["out"] / "sdgp64", tmp_path / "one")
    assert rel <= 1e-5, rel


def test_only_rank_zero_writes_the_run_directory(job):
    assert job["ranks"][1]["rank_writes"] == []
    for name in ("dense64", "clicktrain64", "prunetrain64", "campfire", "sdgp", "cli"):
        assert (job["out"] / name / rundir.SUMMARY_FILE).exists(), name


def test_clicktrain_bytes_after_hard_pruning(job, tmp_path, monkeypatch):
    """ClickTrain Sec. 5.3: once hard-pruned, only the kept gradients travel."""
    total = result(job, "clicktrain64")["parameters"]
    run = job["out"] / "clicktrain64"
    rows = rundir.read_metrics(run)
    masks = rundir.load_checkpoint(run)["method"]["masks"]
    assert masks, "ClickTrain hard-pruned no layer"
    pruned = sum(int((~m).sum()) for m in masks.values())
    dense_bytes = 8 * total
    sparse_bytes = 8 * (total - pruned)
    hard = worker.CLICKTRAIN["method_options"]["hard_prune_epoch"]
    for row in rows:
        expect = dense_bytes if row["epoch"] < hard else sparse_bytes
        assert row["comm_bytes_per_iter"] == expect, row["epoch"]
        assert row["comm_sparse_iters"] == (row["iterations"] if row["epoch"] >= hard else 0)
    after = [r for r in rows if r["epoch"] >= hard]
    nonzero_fraction = (total - pruned) / total
    for row in after:
        assert row["comm_bytes_per_iter"] == pytest.approx(dense_bytes * nonzero_fraction, rel=0.01)
    one = single_run(tmp_path / "one", worker.CLICKTRAIN, True, monkeypatch)
    assert one["comm_bytes_per_iter"] == sparse_bytes  # computed the same way in one process
    rel = worker.weights_rel_diff(run, tmp_path / "one")
    assert rel <= 1e-5, rel


def test_prunetrain_reconfiguration_rebuilds_ddp(job, tmp_path, monkeypatch):
    ddp = result(job, "prunetrain64")
    assert ddp["ddp_rebuilds"] >= 2
    rows = rundir.read_metrics(job["out"] / "prunetrain64")
    bytes_ = [r["comm_bytes_per_iter"] for r in rows]
    assert bytes_[-1] < bytes_[0]
    assert bytes_[-1] == ddp["parameters"] * 8
    one = single_run(tmp_path / "one", worker.PRUNETRAIN, True, monkeypatch)
    assert one["parameters"] == ddp["parameters"]
    # Its training cost counts every rank's samples (it counted rank 0's half of each batch).
    assert ddp["train_flops_run"] == pytest.approx(one["train_flops_run"], rel=1e-9)
    rel = worker.weights_rel_diff(job["out"] / "prunetrain64", tmp_path / "one")
    assert rel <= 1e-5, rel


@pytest.mark.parametrize("name", ["campfire", "sdgp"], ids=["campfire", "sdgp"])
def test_other_methods_train_under_ddp(job, name):
    for rank in (0, 1):
        res = result(job, name, rank)
        assert res["status"] == "complete"
        if name == "sdgp":  # prunes data gradients only: every weight gradient travels
            assert res["comm_bytes_per_iter"] == res["parameters"] * 4
    if name == "campfire":
        # After the era Campfire's masks are fixed: only unpruned weights' gradients travel.
        state = torch.load(job["out"] / name / rundir.CHECKPOINT_FILE, weights_only=True)
        buffers = ("running_mean", "running_var", "num_batches_tracked")
        pruned = sum(
            int((v == 0).sum()) for k, v in state["model"].items() if not k.endswith(buffers)
        )
        res = result(job, name, 0)
        assert pruned > 0
        assert res["comm_bytes_per_iter"] == (res["parameters"] - pruned) * 4


def test_cli_nproc_path_float32(job, tmp_path):
    assert result(job, "cli")["rc"] == 0
    from impl import cli

    out = tmp_path / "one"
    assert cli.main(["train", *worker.CLI_ARGS, f"--out={out}"]) == 0
    ddp = rundir.read_json(job["out"] / "cli" / rundir.SUMMARY_FILE)
    one = rundir.read_json(out / rundir.SUMMARY_FILE)
    assert ddp["world_size"] == 2 and ddp["distributed_backend"] == "gloo"
    assert ddp["comm_bytes_per_iter"] == one["comm_bytes_per_iter"] == 4 * one["parameters"]
    a = rundir.read_metrics(job["out"] / "cli")
    b = rundir.read_metrics(out)
    assert a[0]["train_loss"] == pytest.approx(b[0]["train_loss"], rel=1e-5)
    assert worker.weights_rel_diff(job["out"] / "cli", out) <= 1e-3  # float32 noise, see docstring
