"""SDGP Fig. 9's measurement: per-layer conv times of ResNet-18 (forward, data gradient,
weight gradient), through :func:`impl.methods.sdgp_timing.profile_conv_layers`."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from reproductions.common import check_sweeps, device_name, per_sweep

SHAPES = {
    "smoke": {"model": "resnet20", "stem": "cifar", "batch": 4, "image": 32},
    "cpu": {"model": "resnet18", "stem": "imagenet", "batch": 8, "image": 112},
    "gpu": {"model": "resnet18", "stem": "imagenet", "batch": 256, "image": 224},
    "paper": {"model": "resnet18", "stem": "imagenet", "batch": 256, "image": 224},
}
# The dtype each scale times in: on a GPU float16, the arithmetic the paper trains in on its
# A100s (Sec. III-C: 16-bit floats, "roughly halves the training time"; Fig. 9 itself names
# none); on a CPU float32 (float16 convolutions there run a slow fallback kernel).
DTYPES: dict[str, torch.dtype | None] = {
    "smoke": None, "cpu": None, "gpu": torch.float16, "paper": torch.float16,
}  # fmt: skip


def conv_times(
    *, scale: str, context: dict, n: int = 2, m: int = 4, repeats: int = 3, sweeps: int = 1
) -> dict[str, Any]:
    """Per-layer times (ms) and the data-gradient share of all conv time (%), with the
    paper's estimates of the runtime saved at sparsity ratios 2 and 4 (Sec. IV-C), timed in
    the scale's dtype (:data:`DTYPES`; ``dtype`` in the result).

    ``sweeps`` profiles the whole network that many times: the share and the estimates are
    one value per sweep (so the report carries their spread and a claim its confidence
    interval); the per-layer times are the medians over the sweeps."""
    from impl.methods.sdgp import sdgp_convert
    from impl.methods.sdgp_timing import profile_conv_layers
    from impl.models import create

    check_sweeps(sweeps)
    s = SHAPES[scale]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = create(s["model"], num_classes=1000 if s["stem"] == "imagenet" else 10,
                   in_channels=3, stem=s["stem"]).to(device)  # fmt: skip
    model = sdgp_convert(model, n=n, m=m)
    runs = [
        profile_conv_layers(
            model, (3, s["image"], s["image"]), s["batch"], n, m, repeats, amp_dtype=DTYPES[scale]
        )
        for _ in range(sweeps)
    ]
    shares = []
    for layers in runs:
        fwd = sum(r["fwd_ms"] for r in layers)
        dgrad = sum(r["dgrad_ms"] for r in layers if r["data_grad_needed"])
        wgrad = sum(r["wgrad_ms"] for r in layers)
        shares.append(100.0 * dgrad / (fwd + dgrad + wgrad))
    keys = ("fwd_ms", "dgrad_ms", "wgrad_ms", "prune_ms")
    merged = []
    for i, first in enumerate(runs[0]):
        row = {"name": first["name"], "data_grad_needed": first["data_grad_needed"]}
        for k in keys:
            row[k] = statistics.median(run[i][k] for run in runs)
        merged.append(row)

    return {
        "layers": merged,
        "data_grad_time_share": per_sweep(shares),
        "reduction_ratio2": per_sweep([x * (1 - 1 / 2) for x in shares]),
        "reduction_ratio4": per_sweep([x * (1 - 1 / 4) for x in shares]),
        "sweeps": sweeps,
        "shape": f"{s['model']} B={s['batch']} 3x{s['image']}x{s['image']}",
        "dtype": str(DTYPES[scale] or torch.float32).removeprefix("torch."),
        "device": device_name(),
    }


# 2: timed in the scale's dtype, float16 at gpu and paper (1, unversioned: float32 everywhere,
# no "dtype" in the values; such a file read back would stand under the float16 notes)
conv_times.measure_version = 2
