"""PruneTrain Table 3: PruneTrain against AMC (AutoML for model compression) on ResNet-56,
CIFAR-10: accuracy drop, inference FLOPs and conv layers removed.

AMC is not implemented in pdtbench; its published numbers are shown. Scales: smoke/cpu train
ResNet-20 on digits (the Table 1 runs), gpu ResNet-56 on digits, paper ResNet-56 on
CIFAR-10 (182 epochs).
"""

from __future__ import annotations

from pathlib import Path

from reproductions.common import Row, Target, bar_vs_paper, described, reproduce
from reproductions.prunetrain import conv_layers_removed, pair, train_for


def rows(scale: str) -> list[Row]:
    """Dense and PruneTrain on ResNet-56 (the scale's model below gpu)."""
    dense, pt = pair(scale, "resnet32" if scale in ("smoke", "cpu") else "resnet56", "cifar10")
    if scale in ("gpu", "paper"):
        dense.train = pt.train = train_for(scale, "resnet56", "cifar10")
    dense.paper = {}
    pt.paper = {"model": "resnet56", "method": "prunetrain"}
    return [dense, pt]


TARGET = Target(
    key="prunetrain.table3",
    title="PruneTrain Table 3: PruneTrain vs AMC on ResNet-56",
    description=described(__doc__),
    rows=rows,
    metrics=("base_top1", "delta_top1", "inference_flops", "removed_layers"),
    figures=bar_vs_paper("inference_flops", "Inference FLOPs (% of dense)", "% of dense"),
    notes=lambda scale: [
        "AMC prunes a pre-trained model by reinforcement learning; pdtbench does not "
        "implement it, so only its published numbers are shown.",
        "Removed conv layers: 2 per removed residual path (BasicBlock ResNets).",
        "The paper does not state this table's penalty ratio; ours use 0.2, as Table 1's CIFAR "
        "rows.",
    ],
    extra_metrics={"removed_layers": ("layers", conv_layers_removed)},
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run PruneTrain Table 3 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
