"""PruneTrain Fig. 8: inference and training cost against validation accuracy for penalty
ratios 0.05 to 0.2 (ResNet-32/50, CIFAR-10/100), beside dense training (and SSL, not
implemented in pdtbench).

Scales: smoke/cpu train ResNet-20 on digits at ratios 0.05, 0.1, 0.15 and 0.2; gpu ResNet-32
on digits; paper ResNet-50 on CIFAR-10 (182 epochs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from impl.report.results import FigureSpec
from reproductions.common import (
    Row,
    RowResult,
    RunRecord,
    Target,
    described,
    figure_points,
    reproduce,
)
from reproductions.prunetrain import (
    bn_cost_pct,
    pair,
    ratio_label,
    train_flops_by_authors_formula,
)

RATIOS = (0.05, 0.1, 0.15, 0.2)


def inference_mflops(run: RunRecord, base: RunRecord | None) -> float:
    """Inference MFLOPs per sample of the final model (nominal)."""
    return float(run.summary["inference_flops"]) / 1e6


def rows(scale: str) -> list[Row]:
    """Dense, then PruneTrain at each ratio."""
    model = "resnet50" if scale == "paper" else "resnet32"
    dense = pair(scale, model, "cifar10")[0]
    dense.paper = {"method": "dense", "model": "resnet50"}
    dense.metrics = None
    dense.group = {"ratio": "dense"}
    out = [dense]
    for ratio in RATIOS:
        pt = pair(scale, model, "cifar10", ratio=ratio)[1]
        pt.paper = {}
        pt.group = {"ratio": ratio_label(scale, ratio)}
        out.append(pt)
    return out


def figures(results: list[RowResult], scale: str, paper: Any) -> list[FigureSpec]:
    """Top-1 against inference MFLOPs (Fig. 8a), against training FLOPs and against BN
    cost (Fig. 8b)."""
    by_inference = figure_points(results, ("inference_mflops", "top1"), scale)
    by_training = figure_points(results, ("train_flops", "top1"), scale)
    bn_acc = [  # a run saved before the BN cost was written has none: left out
        {"row": r.row.label, **r.row.group, "top1": float(run.summary["top1"]),
         "bn_cost": cost, "source": f"ours ({scale})"}
        for r in results
        if r.ok
        for run in r.runs
        if (cost := bn_cost_pct(run)) is not None
    ]  # fmt: skip
    return [
        FigureSpec(kind="scatter", x="inference_mflops", y="top1", hue="ratio", data=by_inference,
                   title="Top-1 against inference MFLOPs", xlabel="inference MFLOPs",
                   ylabel="top-1 (%)", caption=f"ours at scale {scale}"),
        FigureSpec(kind="scatter", x="train_flops", y="top1", hue="ratio", data=by_training,
                   title="Top-1 against training FLOPs", xlabel="training FLOPs (% of dense)",
                   ylabel="top-1 (%)", caption=f"ours at scale {scale}"),
        FigureSpec(kind="scatter", x="bn_cost", y="top1", hue="ratio", data=bn_acc,
                   title="Top-1 against BN cost", xlabel="BN-layer memory traffic (% of dense)",
                   ylabel="top-1 (%)", caption=f"Fig. 8b's second cost; ours at scale {scale}"),
    ]  # fmt: skip


TARGET = Target(
    key="prunetrain.fig8",
    title="PruneTrain Fig. 8: accuracy against inference and training cost (penalty sweep)",
    description=described(__doc__),
    rows=rows,
    metrics=("top1", "inference_mflops", "train_flops", "bn_cost"),
    figures=figures,
    notes=lambda scale: [
        "SSL (pruning a pre-trained model) is not implemented in pdtbench.",
        "The paper's figure has four panels (ResNet-32 and ResNet-50, CIFAR-10 and CIFAR-100); "
        "every scale here runs one model on one dataset (paper: ResNet-50 on CIFAR-10), at the "
        "paper's four ratios.",
        "Training FLOPs by the authors' cost formula (impl.flops.paper_training_cost), as "
        "the paper's, in % of dense training on the same samples.",
    ],
    extra_metrics={
        "inference_mflops": ("MFLOPs", inference_mflops),
        "train_flops": ("% of dense", train_flops_by_authors_formula),
        "bn_cost": ("% of dense", bn_cost_pct),
    },
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run PruneTrain Fig. 8 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
