"""SDGP Fig. 9: running time of every convolution of ResNet-18 (forward, data gradient,
weight gradient) for a batch of 256 images of 3 x 224 x 224, and the share of data-gradient
time that SDGP's estimate divides by the sparsity ratio.

Scales: smoke times ResNet-20 at batch 4 (32 x 32); cpu ResNet-18 at batch 8 (112 x 112) on
the CPU; gpu and paper the paper's shape on the GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from impl.report.results import FigureSpec
from reproductions.common import TIMING_SWEEPS, Row, RowResult, Target, described, reproduce

MEASURE = "reproductions.sdgp.measure:conv_times"


def rows(scale: str) -> list[Row]:
    """The measured share, and the two estimates the paper derives from it."""
    sweeps = {"sweeps": TIMING_SWEEPS[scale]}
    return [
        Row("data-gradient share of conv time", measure=MEASURE, params=sweeps,
            paper={"method": "dense"}, metrics=("data_grad_time_share",)),
        Row("estimate at ratio 2 (2:4)", measure=MEASURE, params=sweeps,
            paper={"setting": "ratio 2 (2:4)"},
            measure_keys={"estimated_runtime_reduction": "reduction_ratio2"},
            metrics=("estimated_runtime_reduction",)),
        Row("estimate at ratio 4", measure=MEASURE, params=sweeps, paper={"setting": "ratio 4"},
            measure_keys={"estimated_runtime_reduction": "reduction_ratio4"},
            metrics=("estimated_runtime_reduction",)),
    ]  # fmt: skip


def figures(results: list[RowResult], scale: str, paper: Any) -> list[FigureSpec]:
    """Per-layer time of the three passes (the paper's grouped bars); no data-gradient bar
    for a layer that never computes one in training (the first conv)."""
    measured = next((r.measured for r in results if r.measured), None)
    data = []
    for layer in (measured or {}).get("layers", []):
        for key, label in (
            ("fwd_ms", "forward"),
            ("dgrad_ms", "data gradient"),
            ("wgrad_ms", "weight gradient"),
        ):
            if key == "dgrad_ms" and not layer.get("data_grad_needed", True):
                continue
            data.append({"layer": layer["name"], "ms": layer[key], "pass": label})
    return [FigureSpec(kind="bar", x="layer", y="ms", hue="pass", data=data,
                       title=f"Conv time per layer ({(measured or {}).get('shape', '')})",
                       xlabel="", ylabel="ms (median)")]  # fmt: skip


TARGET = Target(
    key="sdgp.fig9",
    title="SDGP Fig. 9: per-layer conv time and the data-gradient share",
    description=described(__doc__),
    rows=rows,
    metrics=("data_grad_time_share", "estimated_runtime_reduction"),
    figures=figures,
    metric_units={"data_grad_time_share": "%", "estimated_runtime_reduction": "%"},
    notes=lambda scale: [
        "Estimates as the paper's: data-gradient share x (1 - 1/ratio). They assume hardware "
        "that runs the pruned data-gradient product proportionally faster; none does here.",
        "The first conv never computes a data gradient; its time is not counted.",
        "Timed in float16 (the 16-bit arithmetic the paper trains in, Sec. III-C; Fig. 9 "
        "names no dtype)"
        if scale in ("gpu", "paper")
        else "Timed in float32 on the CPU.",
    ],
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run SDGP Fig. 9 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
