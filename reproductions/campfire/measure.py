"""Campfire Table 6's measurement: top-1 under FGSM of trained runs, through
:func:`impl.robustness.eval_fgsm_run`."""

from __future__ import annotations

import statistics
from typing import Any

import torch


def fgsm(*, scale: str, context: dict, row: str, eps: list[float]) -> dict[str, Any]:
    """FGSM top-1 (%) of the runs of ``row`` at each ``eps`` (pixel units), one value per
    seed under ``eps_<e>``."""
    from impl.robustness import eval_fgsm_run

    runs = context["runs"].get(row) or []
    if not runs:
        raise ValueError(f"row {row!r} has no finished run to attack")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out: dict[str, Any] = {f"eps_{e}": [] for e in eps}
    for path in runs:
        for rec in eval_fgsm_run(path, eps, device=device):
            out[f"eps_{rec['eps']}"].append(float(rec["top1"]))
    out["mean"] = {k: statistics.fmean(v) for k, v in out.items() if v}
    return out
