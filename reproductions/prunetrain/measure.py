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
