"""Campfire Table 1: best top-1, epoch of convergence and true sparsity of ResNet-50 on
Tiny-ImageNet with window and CK pruning at target sparsities 0-80% (pruning era 0-10 of 40
epochs).

Tiny-ImageNet is not in impl.data: the paper scale cannot fill this table. Scales: smoke
trains window and CK at 60% (ResNet-20, digits); cpu at 40% and 80%; gpu ResNet-32 on
digits at 20, 40, 60 and 80%. The era is the first quarter of the run, as 0-10 of 40.
The paper trains with Adam at lr 1e-3 (App. B.1); pdtbench trains with SGD, so a paper-scale
row keeps the paper's epochs, batch, weight decay and drop at epoch 30 with SGD's rate.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from reproductions.common import (
    Row,
    RunRecord,
    Target,
    bar_vs_paper,
    curves_per_epoch,
    described,
    figures_of,
    reproduce,
)

SPARSITIES = {"smoke": (60,), "cpu": (40, 80), "gpu": (20, 40, 60, 80), "paper": (20, 40, 60, 80)}


def epoch_of_convergence(run: RunRecord, base: RunRecord | None = None) -> float:
    """First epoch (1-based) whose test top-1 is within 0.5 pp of the run's best."""
    best = max(m["test_top1"] for m in run.metrics)
    return float(next(i + 1 for i, m in enumerate(run.metrics) if m["test_top1"] >= best - 0.5))


def _mask_or_dense(mask: str) -> Callable[[Row], bool]:
    """Fig. 6's panel of ``mask``: dense and that mask at each target sparsity."""
    return lambda row: row.label == "dense" or row.group.get("mask") == mask


def rows(scale: str) -> list[Row]:
    """Dense, then window and CK pruning at each target sparsity."""
    needs = "Tiny-ImageNet is not in impl.data" if scale == "paper" else None
    epochs = {"smoke": 4, "cpu": 8, "gpu": 30, "paper": 40}[scale]
    train: dict = {"epochs": epochs}
    if scale == "gpu":
        train["model"] = "resnet32"
    if scale == "paper":  # App. B.1: batch 64, weight decay 1e-4, rate x0.1 after epoch 30
        train.update(model="resnet50_v1", batch_size=64, weight_decay=1e-4, schedule="step",
                     milestones=[30])  # fmt: skip
    era = max(1, epochs // 4)
    out = [
        Row(
            "dense",
            "dense",
            train=train,
            needs=needs,
            paper={"setting": "window, target 0%"},
            metrics=("top1", "epoch_of_convergence"),
        )
    ]
    for mask in ("window", "ck"):
        for sp in SPARSITIES[scale]:
            out.append(Row(f"{mask}, target {sp}%", "campfire", train=train, needs=needs,
                           options={"mask": mask, "final_sparsity": sp / 100, "start_epoch": 0,
                                    "era_epochs": era},
                           paper={"setting": f"{mask}, target {sp}%"}, baseline="dense",
                           group={"mask": mask, "sparsity": sp}))  # fmt: skip
    return out


TARGET = Target(
    key="campfire.table1",
    title="Campfire Table 1: window and CK pruning on Tiny-ImageNet (ResNet-50)",
    description=described(__doc__),
    rows=rows,
    metrics=("top1", "epoch_of_convergence", "true_sparsity"),
    figures=figures_of(
        bar_vs_paper("top1", "Top-1 per mask and target sparsity", "top-1 (%)"),
        *(
            curves_per_epoch(
                "test_top1",
                f"Fig. 6 ({side}): top-1 per epoch, {name} pruning",
                "test top-1 (%)",
                "Campfire Fig. 6",
                rows=_mask_or_dense(mask),
            )
            for side, name, mask in (("left", "window", "window"), ("right", "CK", "ck"))
        ),
    ),
    extra_metrics={
        "epoch_of_convergence": ("epoch", epoch_of_convergence),
        "top1": ("%", lambda run, base: run.summary.get("best_top1")),
    },
    notes=lambda scale: [
        "Epoch of convergence: the first epoch within 0.5 pp of the run's best top-1 (the "
        "paper does not define it).",
        "Top-1 is the best of each run, as the paper's.",
        "The paper's two 0% runs (window 52.03, CK 51.84) are both dense training: our dense "
        "row stands beside the window one; the CK one is listed below as a row of the paper's "
        "only.",
        "The paper trains with Adam (lr 1e-3); ours with the scale's SGD recipe.",
        "True sparsity: the paper's window pruning overshoots its targets (0.48 at 20%, 0.58 "
        "at 40%, 0.84 at 80%), which the paper does not explain; Algorithm 3 caps the "
        "nonzeros per kernel (max_non_zero, its value not printed), which would raise it. "
        "Ours run without a cap (window_max_nonzero=None) and so meet the target.",
    ],
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run Campfire Table 1 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
