"""Worker of the multi-process tests in ``test_distributed_ddp.py`` (holds no tests itself).

torchrun starts it on 2 gloo ranks (``python -m test_distributed_worker OUT``); it runs every
scenario in one process group and writes what it saw to ``OUT/rank{r}.json``:

- ``hook``: the sparse-Allreduce hook on a small model with masks, against a hand-made dense
  all-reduce, in both timing modes;
- ``dense64``, ``clicktrain64``, ``prunetrain64``: training runs in float64 (the models are
  converted by :func:`float64_create`), compared by the test with single-process runs;
- ``agreement``: what every rank must share (the loss value, a batch size, a divergence
  record written before any rank ends) and what none may (torch's generator in an epoch);
- ``campfire``, ``sdgp``: smoke runs that must finish under DDP;
- ``cli``: ``pdtbench train`` (float32) through the CLI's worker path; last, because the CLI
  leaves the process group when it is done.

On rank 1 every run-directory write is recorded (there must be none).
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
import types
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from impl import comm, distributed, rundir

#: Small settings shared with the single-process references of the test module.
SMOKE = dict(
    model="resnet20",
    data="synthetic",
    data_options=dict(image_size=8, in_channels=3, train_size=96, test_size=16),
    device="cpu",
    threads=1,
    schedule="constant",
    lr=0.002,
    augment=False,
    eval_batch_size=16,
)


def weights_rel_diff(a_dir: Path, b_dir: Path) -> float:
    """||a - b|| / ||b|| over every floating parameter and buffer of the two checkpoints."""
    a = rundir.load_checkpoint(a_dir)["model"]
    b = rundir.load_checkpoint(b_dir)["model"]
    assert a.keys() == b.keys()
    num = den = 0.0
    for k in a:
        if a[k].is_floating_point():
            assert a[k].shape == b[k].shape, k
            num += float(((a[k].double() - b[k].double()) ** 2).sum())
            den += float((b[k].double() ** 2).sum())
    return math.sqrt(num / den)


DENSE = dict(SMOKE, epochs=2, batch_size=33, max_steps_per_epoch=1, lr=0.02)
CLICKTRAIN = dict(
    SMOKE,
    method="clicktrain",
    epochs=4,
    batch_size=33,
    max_steps_per_epoch=2,
    method_options=dict(
        dense_epochs=0,
        pool_epochs=1,
        finalize_epochs=1,
        hard_prune_epoch=2,
        pool_size=4,
        connectivity=0.5,
        sparse_impl="ref",
    ),
)
PRUNETRAIN = dict(
    SMOKE,
    method="prunetrain",
    epochs=3,
    batch_size=32,
    max_steps_per_epoch=2,
    method_options=dict(reconfig_interval=1, threshold=0.2, reconfig_at_end=False),
)
CAMPFIRE = dict(
    SMOKE,
    method="campfire",
    epochs=3,  # dense epoch 0, pruned (and fixed) in epoch 1, sparse gradients in epoch 2
    batch_size=16,
    max_steps_per_epoch=1,
    method_options=dict(start_epoch=0, era_epochs=1, final_sparsity=0.5),
)
SDGP = dict(
    SMOKE,
    method="sdgp",
    epochs=1,
    batch_size=16,
    max_steps_per_epoch=1,
    method_options=dict(profile=False),
)
#: SDGP's rescaled pruning with the authors' literal eps (1e-4, added to sums of |dL/dO|):
#: equal to one process only where each rank's backward sees one process's gradient scale.
SDGP64 = dict(
    SMOKE,
    method="sdgp",
    epochs=2,
    batch_size=17,  # shares of 9 and 8
    max_steps_per_epoch=2,
    lr=0.02,
    method_options=dict(profile=False, rescale_eps=1e-4),
)
CLI_ARGS = [
    "--scale=smoke",
    "--model=resnet20",
    "--data=digits",
    "--epochs=1",
    "--max-steps-per-epoch=2",
    "--batch-size=9",
    "--lr=0.02",
    "--schedule=constant",
    "--device=cpu",
    "--threads=1",
    "--no-progress",
]


def float64_create(original: Any) -> Any:
    """``impl.models.create`` returning float64 models (inputs converted on entry), so that
    the comparison with one process is not lost in float32 rounding (see the docs)."""

    def create(*args: Any, **kwargs: Any) -> nn.Module:
        m = original(*args, **kwargs).double()
        m.register_forward_pre_hook(lambda mod, a: (a[0].double(), *a[1:]))
        return m

    return create


def hook_model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 3 * 3, 5), nn.Linear(5, 4)
    )


def hook_masks(model: nn.Module) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return {
        "0.weight": torch.rand(model[0].weight.shape, generator=g) < 0.4,
        "3.weight": torch.rand(model[3].weight.shape, generator=g) < 0.3,
    }


def scenario_hook(rank: int) -> dict[str, Any]:
    """Sparse hook vs a dense all-reduce (a sum) done by hand, over 3 iterations (buckets rebuilt);
    timed, async, and timed on channels_last weights (gradients in N, H, W, C order)."""
    out: dict[str, Any] = {}
    for key, timing, nhwc in (
        ("timed", True, False), ("async", False, False), ("channels_last", True, True)
    ):  # fmt: skip
        model = hook_model()
        ref = hook_model()
        if nhwc:
            model = model.to(memory_format=torch.channels_last)
        masks = hook_masks(model)
        state = comm.CommState(timing=timing)
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0003)
        comm.register(ddp, state)
        state.set_masks(model, masks)
        worst = zeros = 0.0
        for it in range(3):
            g = torch.Generator().manual_seed(100 * it + rank)
            x = torch.randn(4, 2, 5, 5, generator=g)
            for p in model.parameters():
                p.grad = None
            ddp(x).square().sum().backward()
            state.stats.end_iteration()
            ref.zero_grad()
            ref(x).square().sum().backward()
            for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                dense = q.grad.clone()
                dist.all_reduce(dense)
                keep = masks.get(name, torch.ones_like(dense, dtype=torch.bool))
                worst = max(worst, float((p.grad - dense * keep).abs().max()))
                zeros = max(zeros, float(p.grad[~keep].abs().max()) if (~keep).any() else 0.0)
        expected = sum(
            (int(masks[n].sum()) if n in masks else p.numel()) * p.element_size()
            for n, p in model.named_parameters()
        )
        out[key] = {
            "max_abs_diff": worst,
            "max_abs_pruned": zeros,
            "bytes": state.stats.bytes,
            "expected_bytes": expected,
            "dense_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "calls": state.stats.calls,
            "seconds": state.stats.seconds,
        }
    return out


def scenario_mask_check(info: distributed.DistInfo) -> dict[str, Any]:
    """DataParallel's check of the ranks' masks: the same masks pass; 4-of-9 patterns of
    equal count and position sum, (1,3,4,5) on rank 0 and (0,2,4,7) on rank 1, must not."""

    def prepared(pattern: tuple[int, ...]) -> str:
        kernel = torch.zeros(9, dtype=torch.bool)
        kernel[list(pattern)] = True
        torch.manual_seed(5)
        model = nn.Conv2d(8, 16, 3)
        ctx = types.SimpleNamespace(
            model=model, extra={"comm_masks": {"weight": kernel.reshape(3, 3).expand(16, 8, 3, 3)}}
        )
        try:
            distributed.DataParallel(info, torch.device("cpu"), timing=False).prepare(ctx)
        except distributed.DistributedError as err:
            return str(err)
        return "ok"

    other = (1, 3, 4, 5) if info.rank == 0 else (0, 2, 4, 7)
    return {"same": prepared((1, 3, 4, 5)), "different": prepared(other)}


def scenario_agreement(info: distributed.DistInfo, out: Path) -> dict[str, Any]:
    """What the ranks must share, and what they must not: the loss value a method decides
    from (200 steps of unequal local means), a batch size each rank chose itself, torch's
    global generator in each epoch of a run (dropout's draws), and a divergence record that
    rank 0 writes slowly before any rank may end the job."""
    import time

    from impl import train as T

    dp = distributed.DataParallel(info, torch.device("cpu"), timing=False)
    n_local = 3 + info.rank  # 3 and 4 of a global batch of 7
    x = torch.zeros(n_local, 2)
    dp.shard(x, torch.zeros(n_local, dtype=torch.long), n_global=7)
    g = torch.Generator().manual_seed(100 + info.rank)
    values = [
        dp.global_loss((torch.rand((), generator=g) * 3).requires_grad_(), x).item()
        for _ in range(200)
    ]
    batch = dp.broadcast_int(32 * (1 + info.rank))

    draws: list[list[float]] = []
    original = T.Trainer._train_epoch

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        draws.append(torch.rand(2).tolist())  # what dropout would draw first
        return original(self, *args, **kwargs)

    T.Trainer._train_epoch = spy
    try:
        train_run(out / "agreement-rng", DENSE)
    finally:
        T.Trainer._train_epoch = original

    write = rundir.write_json

    def slow_write(path: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(path).name == rundir.SUMMARY_FILE:
            time.sleep(1.0)  # a slow file system
        return write(path, *args, **kwargs)

    diverged_dir = out / "agreement-diverged"
    rundir.write_json = slow_write
    try:
        train_run(diverged_dir, dict(DENSE, lr=1e30, epochs=1, max_steps_per_epoch=3))
        raised = "no"
    except T.TrainingDiverged:
        raised = "TrainingDiverged"
    finally:
        rundir.write_json = write
    return {
        "loss_values": values,
        "batch": batch,
        "epoch_draws": draws,
        "diverged": raised,
        "summary_there_when_raised": (diverged_dir / rundir.SUMMARY_FILE).exists(),
    }


def train_run(out: Path, values: dict[str, Any]) -> dict[str, Any]:
    from impl.config import resolve
    from impl.train import train

    values = dict(values)
    scale = values.pop("scale", "smoke")
    cfg = resolve(scale, out=str(out), **values)
    summary = train(cfg, progress=False)
    return {k: v for k, v in summary.items() if k != "environment"}


def record_writes(calls: list[str]) -> None:
    """On ranks other than 0: note every call of a run-directory writer."""
    for name in ("write_json", "append_metrics", "save_checkpoint", "truncate_metrics"):
        original = getattr(rundir, name)

        def spy(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            calls.append(_name)
            return _original(*args, **kwargs)

        setattr(rundir, name, spy)


def main(out_dir: str) -> None:
    out = Path(out_dir)
    info = distributed.init_from_env("cpu")
    rank = info.rank
    writes: list[str] = []
    if rank != 0:
        record_writes(writes)
    results: dict[str, Any] = {"rank": rank, "world_size": info.world_size}

    def save() -> None:
        results["rank_writes"] = list(writes)
        path = out / f"rank{rank}.json"
        path.write_text(json.dumps(results, indent=1, default=str))

    scenarios = [
        ("hook", lambda: scenario_hook(rank)),
        ("mask_check", lambda: scenario_mask_check(info)),
        ("agreement", lambda: scenario_agreement(info, out)),
        ("campfire", lambda: train_run(out / "campfire", CAMPFIRE)),
        ("sdgp", lambda: train_run(out / "sdgp", SDGP)),
    ]
    float64 = [
        ("dense64", lambda: train_run(out / "dense64", DENSE)),
        ("clicktrain64", lambda: train_run(out / "clicktrain64", CLICKTRAIN)),
        ("prunetrain64", lambda: train_run(out / "prunetrain64", PRUNETRAIN)),
        ("sdgp64", lambda: train_run(out / "sdgp64", SDGP64)),
    ]
    only = set(filter(None, os.environ.get("PDT_WORKER_SCENARIOS", "").split(",")))
    for name, fn in scenarios:
        if not only or name in only:
            results[name] = _attempt(fn)
            save()
    import impl.models as models

    float32_create = models.create
    models.create = float64_create(float32_create)
    for name, fn in float64:
        if not only or name in only:
            results[name] = _attempt(fn)
            save()
    if only and "cli" not in only:
        return
    models.create = float32_create  # the CLI run is float32, as users run it
    from impl import cli

    results["cli"] = _attempt(
        lambda: {"rc": cli.main(["train", *CLI_ARGS, f"--out={out / 'cli'}"])}
    )
    save()


def _attempt(fn: Any) -> dict[str, Any]:
    try:
        return {"ok": True, "result": fn()}
    except Exception as err:  # recorded for the test to report
        return {"ok": False, "error": f"{type(err).__name__}: {err}", "tb": traceback.format_exc()}


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    main(sys.argv[1])
