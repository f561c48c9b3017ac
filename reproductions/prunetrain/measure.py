"""Measurements on PruneTrain's trained models (Table 2's inference throughput)."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from reproductions.common import device_name, time_ms


def _throughput(run_dir: str, batch: int, repeats: int) -> float:
    from impl.rundir import read_json
    from impl.train import load_trained_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, _ = load_trained_model(run_dir, device=device)
    spec = read_json(f"{run_dir}/summary.json").get("data_spec") or {}
    shape = (
        batch,
        spec.get("in_channels", 3),
        spec.get("image_size", 32),
        spec.get("image_size", 32),
    )
    x = torch.randn(shape, device=device)

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
    from impl.rundir import read_json
    from impl.train import load_trained_model

    def counts(run_dir: str) -> dict[str, Any]:
        model, cfg = load_trained_model(run_dir, device="cpu")
        spec = read_json(f"{run_dir}/summary.json").get("data_spec") or {}
        size = spec.get("image_size", 32)
        shape = (spec.get("in_channels", 3), size, size)
        threshold = cfg.method_options.get("threshold", PruneTrainConfig().threshold)
        return conv_flops_union_vs_gating(model, shape, threshold)

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
