"""Measurements on PruneTrain's trained models (Table 2's inference throughput)."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from reproductions.common import device_name, time_ms


def _sample_shape(run_dir: str) -> tuple[int, int, int]:
    """(C, H, W) of one input of a run, from its summary's ``data_spec``."""
    from impl.rundir import read_json

    spec = read_json(f"{run_dir}/summary.json").get("data_spec") or {}
    size = spec.get("image_size", 32)
    return spec.get("in_channels", 3), size, size


def _throughput(run_dir: str, batch: int, repeats: int) -> float:
    from impl.train import load_trained_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, _ = load_trained_model(run_dir, device=device)
    x = torch.randn(batch, *_sample_shape(run_dir), device=device)

    def step() -> None:
        with torch.no_grad(), torch.autocast(device, dtype=torch.float16, enabled=device == "cuda"):
            model(x)

    return batch / (statistics.median(time_ms(step, repeats=repeats, warmup=2)) / 1e3)


def inference_throughput(
    *, scale: str, context: dict, row: str, dense_row: str, batch: int, repeats: int = 10
) -> dict[str, Any]:
    """Images per second of the dense and the PruneTrain models at ``batch`` (mixed precision
    on a GPU, as the paper's Table 2; float32 on a CPU), mean over the rows' seeds."""
    dense = [_throughput(p, batch, repeats) for p in context["runs"][dense_row]]
    pruned = [_throughput(p, batch, repeats) for p in context["runs"][row]]
    d, p = statistics.fmean(dense), statistics.fmean(pruned)
    return {"dense": d, "prunetrain": p, "speedup": p / d, "batch": batch, "device": device_name()}


def union_vs_gating(
    *, scale: str, context: dict, rows: list[str], dense_row: str
) -> dict[str, Any]:
    """Inference conv FLOPs of channel union (the model as PruneTrain reconfigured it) and
    of channel gating (each conv on its own dense channels) for the PruneTrain runs of
    ``rows``, normalised to the dense model of ``dense_row`` (Fig. 6, Sec. 4.2), through
    :func:`impl.methods.prunetrain_gating.conv_flops_union_vs_gating`.

    Returns per row label ``{"union", "gating"}`` (% of dense conv FLOPs, mean over seeds)
    and ``difference_min`` / ``difference_max``: union minus gating in points of dense
    FLOPs, the smallest and largest over the rows.
    """
    from impl.methods.prunetrain import PruneTrainConfig
    from impl.methods.prunetrain_gating import conv_flops_union_vs_gating
    from impl.train import load_trained_model

    def counts(run_dir: str) -> dict[str, Any]:
        model, cfg = load_trained_model(run_dir, device="cpu")
        threshold = cfg.method_options.get("threshold", PruneTrainConfig().threshold)
        return conv_flops_union_vs_gating(model, _sample_shape(run_dir), threshold)

    dense_runs = context["runs"].get(dense_row) or []
    if not dense_runs:
        raise ValueError(f"row {dense_row!r} has no finished run")
    dense = statistics.fmean(counts(p)["union"] for p in dense_runs)
    out: dict[str, Any] = {"per_row": {}}
    diffs = []
    for label in rows:
        runs = context["runs"].get(label) or []
        if not runs:
            raise ValueError(f"row {label!r} has no finished run")
        res = [counts(p) for p in runs]
        union = statistics.fmean(100.0 * r["union"] / dense for r in res)
        gating = statistics.fmean(100.0 * r["gating"] / dense for r in res)
        out["per_row"][label] = {"union": union, "gating": gating}
        diffs.append(union - gating)
    out["difference_min"] = min(diffs)
    out["difference_max"] = max(diffs)
    return out


def _last_convs(model: torch.nn.Module) -> list[str]:
    """Names of the last convolution of each residual block ("layerK.B.convN", largest N)."""
    import re

    last: dict[str, tuple[int, str]] = {}
    for name, mod in model.named_modules():
        m = re.fullmatch(r"(layer\d+\.\d+)\.conv(\d+)", name)
        if m and isinstance(mod, torch.nn.Conv2d):
            block, k = m.group(1), int(m.group(2))
            if block not in last or k > last[block][0]:
                last[block] = (k, name)
    return [name for _, name in sorted(last.values(), key=lambda v: v[1])]


def _conv_inputs(model: torch.nn.Module, names: list[str], x: torch.Tensor) -> dict:
    """The input each named conv receives on a forward pass of ``x``."""
    seen: dict[str, torch.Tensor] = {}
    mods = dict(model.named_modules())
    hooks = [mods[n].register_forward_hook(
        lambda mod, inp, out, n=n: seen.__setitem__(n, inp[0].detach().clone()))
        for n in names if n in mods]  # fmt: skip
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return seen


def union_gating_layer_times(
    *, scale: str, context: dict, row: str, dense_row: str, batch: int, repeats: int = 10
) -> dict[str, Any]:
    """Forward + backward time (ms, median of ``repeats``) of the last convolution of each
    residual block (PruneTrain Fig. 7): dense (the dense run's model), channel union (the
    PruneTrain run's reconfigured model) and channel gating
    (:class:`impl.methods.prunetrain_gating.GatedConv` on the same weights: select, smaller
    convolution, scatter), at ``batch`` samples of the run's input size.

    Returns ``layers`` (name, dense_ms, union_ms, gating_ms), ``conv_speedup_vs_dense``
    (sum of dense over sum of union times) and ``gating_over_union``.
    """
    from impl.methods.prunetrain import PruneTrainConfig
    from impl.train import load_trained_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    pt_dir = (context["runs"].get(row) or [None])[0]
    dense_dir = (context["runs"].get(dense_row) or [None])[0]
    if pt_dir is None or dense_dir is None:
        raise ValueError(f"rows {row!r} and {dense_row!r} need finished runs")
    pruned, cfg = load_trained_model(pt_dir, device=device)
    dense, _ = load_trained_model(dense_dir, device=device)
    threshold = cfg.method_options.get("threshold", PruneTrainConfig().threshold)
    x = torch.randn(batch, *_sample_shape(pt_dir), device=device)
    return _layer_times(dense, pruned, threshold, x, repeats)


def union_gating_layer_times_at_shape(
    *,
    scale: str,
    context: dict,
    model: str,
    batch: int,
    image: int,
    stem: str = "imagenet",
    num_classes: int = 1000,
    repeats: int = 10,
) -> dict[str, Any]:
    """:func:`union_gating_layer_times` at a paper's shapes without training: ``model``
    (:func:`impl.models.create`) at ``image`` x ``image``, ``batch`` synthetic samples (timing
    needs no data), dense as created and reconfigured in PruneTrain's state of the benchmark
    suite (:func:`bench.method_states.build_state`: half of the channels inside every
    residual path removed, :data:`bench.method_states.PRUNETRAIN_CHANNEL_PRUNE`). Same
    return value, plus ``state``, which says so."""
    from bench.method_states import PRUNETRAIN_CHANNEL_PRUNE, build_state
    from impl.methods.prunetrain import PruneTrainConfig

    device = "cuda" if torch.cuda.is_available() else "cpu"
    kw = {"stem": stem, "num_classes": num_classes, "device": device}
    dense = build_state("dense", model, **kw).model
    pruned = build_state("prunetrain", model, **kw).model
    unused = unuse_shared_outputs(pruned, SHARED_UNUSED)
    x = torch.randn(batch, 3, image, image, device=device)
    out = _layer_times(dense, pruned, PruneTrainConfig().threshold, x, repeats)
    out["state"] = (
        f"{model} at {image}x{image}, synthetic inputs; PruneTrain's state reconfigured from "
        f"{PRUNETRAIN_CHANNEL_PRUNE:.0%} of the channels inside each residual path removed "
        "(bench.method_states), not trained; each block's last convolution leaves "
        f"{SHARED_UNUSED:.0%} of the shared channels it writes unused ({unused} in all: zero "
        "weights, which union computes and gating skips)"
    )
    return out


# 2: half of the shared channels each block's last convolution writes are left at zero
# (SHARED_UNUSED); a file saved for the earlier state, where gating kept union's channels,
# is measured again rather than read.
union_gating_layer_times_at_shape.measure_version = 2


#: gpu scale: the fraction of the shared node's channels that each residual block's last
#: convolution leaves at zero in the untrained state (chosen; a trained run's own). Union
#: keeps every channel some layer of the node uses, so it computes these zeros; gating
#: convolves this layer's own channels and scatters them, which is what Fig. 7 compares.
SHARED_UNUSED = 0.5


@torch.no_grad()
def unuse_shared_outputs(model: torch.nn.Module, fraction: float, seed: int = 0) -> int:
    """Zero ``fraction`` of the output channels (weights, bias) of the last convolution of
    each residual block of ``model``, drawn at random per block (seeded): the shared-node
    channels that layer does not use, while other layers of the node do (so channel union
    keeps them). Returns how many channels were zeroed in all."""
    import math

    gen = torch.Generator().manual_seed(seed)
    mods = dict(model.named_modules())
    zeroed = 0
    for name in _last_convs(model):
        conv = mods[name]
        n = int(math.floor(fraction * conv.out_channels))
        idx = torch.randperm(conv.out_channels, generator=gen)[:n].to(conv.weight.device)
        conv.weight[idx] = 0
        if conv.bias is not None:
            conv.bias[idx] = 0
        zeroed += n
    return zeroed


def _layer_times(
    dense: torch.nn.Module,
    pruned: torch.nn.Module,
    threshold: float,
    x: torch.Tensor,
    repeats: int,
) -> dict[str, Any]:
    """Dense, union and gating fwd + bwd times of the last conv of each residual block (the
    return value of :func:`union_gating_layer_times`) for the input batch ``x``."""
    from impl.methods.prunetrain_gating import GatedConv

    mods_p, mods_d = dict(pruned.named_modules()), dict(dense.named_modules())
    names = [n for n in _last_convs(dense) if n in mods_p]
    x_pruned = _conv_inputs(pruned, names, x)
    x_dense = _conv_inputs(dense, names, x)

    def fwd_bwd_ms(layer: torch.nn.Module, inp: torch.Tensor) -> float:
        inp = inp.clone().requires_grad_(True)
        grad = torch.randn_like(layer(inp))

        def step() -> None:
            layer(inp).backward(grad)

        return statistics.median(time_ms(step, repeats=repeats, warmup=2))

    layers = []
    for n in names:
        if n not in x_pruned or n not in x_dense:
            continue  # a residual path PruneTrain removed
        gated = GatedConv(mods_p[n], threshold)
        layers.append({"name": n, "dense_ms": fwd_bwd_ms(mods_d[n], x_dense[n]),
                       "union_ms": fwd_bwd_ms(mods_p[n], x_pruned[n]),
                       "gating_ms": fwd_bwd_ms(gated, x_pruned[n]),
                       "union_channels": [mods_p[n].in_channels, mods_p[n].out_channels],
                       "gating_channels": [len(gated.idx_in), len(gated.idx_out)]})  # fmt: skip
    if not layers:
        raise ValueError("no residual-block convolution left to time")
    total = {k: sum(r[k] for r in layers) for k in ("dense_ms", "union_ms", "gating_ms")}
    return {"layers": layers, "conv_speedup_vs_dense": total["dense_ms"] / total["union_ms"],
            "gating_over_union": total["gating_ms"] / total["union_ms"],
            "batch": int(x.shape[0]), "device": device_name()}  # fmt: skip
