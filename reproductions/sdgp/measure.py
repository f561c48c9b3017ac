"""SDGP Fig. 9's measurement: per-layer conv times of ResNet-18 (forward, data gradient,
weight gradient), through :func:`impl.methods.sdgp_timing.profile_conv_layers`."""

from __future__ import annotations

from typing import Any

import torch

from reproductions.common import device_name

SHAPES = {
    "smoke": {"model": "resnet20", "stem": "cifar", "batch": 4, "image": 32},
    "cpu": {"model": "resnet18", "stem": "imagenet", "batch": 8, "image": 112},
    "gpu": {"model": "resnet18", "stem": "imagenet", "batch": 256, "image": 224},
    "paper": {"model": "resnet18", "stem": "imagenet", "batch": 256, "image": 224},
}


def conv_times(
    *, scale: str, context: dict, n: int = 2, m: int = 4, repeats: int = 3
) -> dict[str, Any]:
    """Per-layer times (ms) and the data-gradient share of all conv time (%), with the
    paper's estimates of the runtime saved at sparsity ratios 2 and 4 (Sec. IV-C)."""
    from impl.methods.sdgp import sdgp_convert
    from impl.methods.sdgp_timing import profile_conv_layers
    from impl.models import create

    s = SHAPES[scale]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = create(s["model"], num_classes=1000 if s["stem"] == "imagenet" else 10,
                   in_channels=3, stem=s["stem"]).to(device)  # fmt: skip
    model = sdgp_convert(model, n=n, m=m)
    layers = profile_conv_layers(model, (3, s["image"], s["image"]), s["batch"], n, m, repeats)
    fwd = sum(r["fwd_ms"] for r in layers)
    dgrad = sum(r["dgrad_ms"] for r in layers if r["data_grad_needed"])
    wgrad = sum(r["wgrad_ms"] for r in layers)
    share = 100.0 * dgrad / (fwd + dgrad + wgrad)
    return {
        "layers": [
            {
                k: r[k]
                for k in ("name", "fwd_ms", "dgrad_ms", "wgrad_ms", "prune_ms", "data_grad_needed")
            }  # fmt: skip
            for r in layers
        ],  # fmt: skip
        "data_grad_time_share": share,
        "reduction_ratio2": share * (1 - 1 / 2),
        "reduction_ratio4": share * (1 - 1 / 4),
        "shape": f"{s['model']} B={s['batch']} 3x{s['image']}x{s['image']}",
        "device": device_name(),
    }
