"""ClickTrain's accounting for ``summary.json``: pool, pattern usage, sparsity, FLOPs.

Definitions:

* compression ratio (paper Sec. 6.2): total conv weights / nonzero conv weights, over every
  convolution of the model (pruned or not).
* FLOPs per sample (``impl.flops``, one multiply-add = 2 FLOPs): *dense* at density 1,
  *nominal* with every pruned conv at its kept fraction, *executed* with what this
  implementation runs (pattern-sparse convs at their kept fraction, masked dense convs at 1).
* over the run: epochs before hard pruning train dense, epochs after at the final model's
  cost, so ``train_flops_run = hard * dense + (epochs - hard) * final`` (per training sample
  per epoch); "saved" is ``1 - run / (epochs * dense)``, the quantity of the paper's Table 1
  ("Train./Inf. FLOPs ... saved"). The importance scores and the penalty are elementwise and
  not counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from impl.methods.masking import conv_weight_counts

if TYPE_CHECKING:
    from impl.methods.base import TrainContext
    from impl.methods.clicktrain import ClickTrain


def _layer_info(method: ClickTrain, model: nn.Module, name: str) -> dict[str, Any]:
    w = model.get_submodule(name).weight.detach()
    nz = int(torch.count_nonzero(w))
    info: dict[str, Any] = {
        "shape": list(w.shape),
        "weights": w.numel(),
        "nonzero": nz,
        "sparsity": 1.0 - nz / max(w.numel(), 1),
    }
    if name in method.removed:
        removed = method.removed[name]
        kept_per_filter = (~removed).sum(dim=1)
        info["kernels"] = removed.numel()
        info["kernels_removed"] = int(removed.sum())
        info["kept_kernels_per_filter_min"] = int(kept_per_filter.min())
        info["kept_kernels_per_filter_max"] = int(kept_per_filter.max())
    if name in method.sparse_layers:
        info.update(method.sparse_layers[name])
    return info


def _usage(method: ClickTrain) -> dict[str, Any]:
    """How many kept kernels use each pool pattern, over all pruned layers."""
    if not method.chosen:
        return {}
    n = method.pool.pattern_ids.numel()  # type: ignore[union-attr]
    counts = torch.zeros(n, dtype=torch.int64)
    removed_total = 0
    for name, chosen in method.chosen.items():
        removed = method.removed[name].cpu()
        removed_total += int(removed.sum())
        if name not in method.pointwise:  # a 1x1 kernel uses no pool pattern
            counts += torch.bincount(chosen[~removed].flatten(), minlength=n)
    return {"kept_kernels_per_pattern": counts.tolist(), "removed_kernels": removed_total}


def _flops(method: ClickTrain, ctx: TrainContext) -> dict[str, Any]:
    from impl.flops import training_flops

    report = training_flops(ctx.model, ctx.input_shape, density=method.cost(ctx.model))
    epochs = int(ctx.config.epochs)
    hard = method.stage_start.get("sparse", epochs)
    sparse_epochs = max(epochs - hard, 0)
    dense, nominal, executed = report.dense, report.nominal, report.executed
    run_nominal = hard * dense.total + sparse_epochs * nominal.total
    run_executed = hard * dense.total + sparse_epochs * executed.total
    run_dense = epochs * dense.total
    return {
        "per_sample_final": {
            "dense": {"forward": dense.forward, "train": dense.total},
            "nominal": {"forward": nominal.forward, "train": nominal.total},
            "executed": {"forward": executed.forward, "train": executed.total},
        },
        "train_flops_run_per_sample": {
            "dense": run_dense,
            "nominal": run_nominal,
            "executed": run_executed,
        },
        "train_flops_saved_nominal": 1.0 - run_nominal / max(run_dense, 1e-30),
        "train_flops_saved_executed": 1.0 - run_executed / max(run_dense, 1e-30),
        "inference_flops_saved_nominal": 1.0 - nominal.forward / max(dense.forward, 1e-30),
        "inference_flops_saved_executed": 1.0 - executed.forward / max(dense.forward, 1e-30),
    }


def clicktrain_summary(method: ClickTrain, ctx: TrainContext) -> dict[str, Any]:
    """Everything ClickTrain adds to ``summary.json``, under the key ``"clicktrain"``."""
    model = ctx.model
    total, nonzero = conv_weight_counts(model)
    pruned_total = sum(model.get_submodule(n).weight.numel() for n in method.layers)
    pruned_nz = sum(
        int(torch.count_nonzero(model.get_submodule(n).weight.detach())) for n in method.layers
    )
    s = method.schedule
    out: dict[str, Any] = {
        "final_stage": method.stage,
        "stage_start_epoch": dict(method.stage_start),
        "schedule": None
        if s is None
        else {
            "epochs": s.epochs,
            "dense_epochs": s.dense_epochs,
            "max_dense_epochs": s.max_dense_epochs,
            "pool_epochs": s.pool_epochs,
            "finalize_epochs": s.finalize_epochs,
            "hard_prune_epoch": s.hard_prune_epoch,
        },
        "epoch_train_loss": list(method.epoch_losses),
        "compression_ratio": total / max(nonzero, 1),
        "compression_ratio_pruned_layers": pruned_total / max(pruned_nz, 1),
        "conv_weights": total,
        "conv_weights_nonzero": nonzero,
        "pruned_layers": list(method.layers),
        "layers": {name: _layer_info(method, model, name) for name in method.layers},
        "pool_competitive_scores": method.pool.scores.tolist(),
    }
    if method.pool.finalized:
        out["pool"] = method.pool.patterns().to(torch.int64).tolist()
        out["pool_pattern_ids"] = method.pool.pattern_ids.tolist()  # type: ignore[union-attr]
    out["pattern_usage"] = _usage(method)
    out["flops"] = _flops(method, ctx)
    out["pattern_conv_paths"] = pattern_conv_paths(model)
    return {"clicktrain": out}


def pattern_conv_paths(model: torch.nn.Module) -> dict[str, int]:
    """How many of ``model``'s pattern convs run on each implementation, as their ``impl``
    resolves for their weight now: ``"cpu"`` (the compiled direct sparse conv,
    impl/cpu/pattern_conv.c), ``"ref"`` (im2col and torch's CSR SpMM) or ``"cuda"``. Timings
    of the sparse stage depend on it."""
    from impl.ops import PatternConv2d, resolve_conv_impl

    paths: dict[str, int] = {}
    for module in model.modules():
        if isinstance(module, PatternConv2d):
            operands = [module.weight] + ([] if module.bias is None else [module.bias])
            path = resolve_conv_impl(module.impl, *operands)
            paths[path] = paths.get(path, 0) + 1
    return dict(sorted(paths.items()))
