"""PruneTrain Fig. 10: inference FLOPs and validation accuracy for different reconfiguration
intervals (ResNet-32 and ResNet-50, CIFAR-10): both are insensitive to the interval.

Scales: smoke trains ResNet-20 on digits with intervals 1 and 2 epochs (of 4), cpu with 1, 2
and 4 (of 8); gpu ResNet-32 on digits with 2, 5 and 10 (of 30); paper ResNet-50 on CIFAR-10
with 5, 10 and 20.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from impl.report.results import FigureSpec
from reproductions.common import Row, RowResult, Target, described, figure_points, reproduce
from reproductions.prunetrain import pair

INTERVALS = {"smoke": (1, 2), "cpu": (1, 2, 4), "gpu": (2, 5, 10), "paper": (5, 10, 20)}


def rows(scale: str) -> list[Row]:
    """Dense, then PruneTrain (ratio 0.2) at each interval."""
    model = "resnet50" if scale == "paper" else "resnet32"
    dense = pair(scale, model, "cifar10")[0]
    dense.paper, dense.metrics = {}, None
    out = [dense]
    for k in INTERVALS[scale]:
        pt = pair(scale, model, "cifar10", extra={"reconfig_interval": k})[1]
        pt.label = f"PruneTrain, interval {k}"
        pt.paper = {}
        pt.group = {"interval": k}
        out.append(pt)
    return out


def figures(results: list[RowResult], scale: str, paper: Any) -> list[FigureSpec]:
    """Top-1 against inference FLOPs, one point per interval."""
    acc = figure_points(results, ("inference_flops", "top1"), scale)
    return [FigureSpec(kind="scatter", x="inference_flops", y="top1", hue="row", data=acc,
                       title="Top-1 against inference FLOPs per interval",
                       xlabel="inference FLOPs (% of dense)", ylabel="top-1 (%)")]  # fmt: skip


TARGET = Target(
    key="prunetrain.fig10",
    title="PruneTrain Fig. 10: reconfiguration interval",
    description=described(__doc__),
    rows=rows,
    metrics=("top1", "inference_flops"),
    figures=figures,
    notes=lambda scale: [
        "The paper states no point of this figure in its text, only its conclusion "
        "(insensitive) and the intervals it recommends, listed as its rows.",
        "The paper plots ResNet-32 (left) and ResNet-50 (right) on CIFAR-10; the paper scale "
        "here runs ResNet-50 only.",
    ],
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run PruneTrain Fig. 10 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
