"""ClickTrain Fig. 14: total distributed training time of dense training and ClickTrain on
4, 8 and 16 GPUs (ResNet-50, ResNet-101, VGG-16 on ImageNet, batch 64 per GPU).

It needs 4-16 GPUs and ImageNet: no scale below paper can fill it. At paper scale the rows
train ClickTrain and dense on ImageNet; launch them with torchrun on the GPU counts shown.
"""

from __future__ import annotations

from pathlib import Path

from reproductions.clicktrain import clicktrain_options, train_for
from reproductions.common import Row, RunRecord, Target, described, panels_vs_paper, reproduce

GPUS = (4, 8, 16)


def rows(scale: str) -> list[Row]:
    """Dense and ClickTrain per model and GPU count; all need multi-GPU ImageNet runs."""
    out = []
    for model in ("resnet50", "resnet101", "vgg16"):
        train = train_for("paper", model, "imagenet")
        ct = clicktrain_options("paper", train, "higher compression", model, "imagenet")
        for g in GPUS:
            needs = f"needs {g} GPUs (torchrun) and ImageNet: the paper scale on a GPU cluster"
            dense = f"{model} dense, {g} GPUs"
            on_g = {**train, "batch_size": 64 * g}  # 64 per GPU (Sec. 6.4): the global batch
            out.append(Row(dense, "dense", train=on_g, needs=needs))
            out.append(
                Row(f"{model} ClickTrain, {g} GPUs", "clicktrain",
                    options=ct, train=on_g,
                    needs=needs, baseline=dense, paper={"model": model, "setting": f"{g} GPUs"})
            )  # fmt: skip
    return out


def train_hours(run: RunRecord, base: RunRecord | None = None) -> float:
    """Hours of wall time of the run (the paper's Fig. 14 plots total training time)."""
    return run.summary["wall_seconds"] / 3600.0


def hours_saved(run: RunRecord, base: RunRecord | None) -> float:
    """Hours of wall time ClickTrain saves against dense."""
    return (base.summary["wall_seconds"] - run.summary["wall_seconds"]) / 3600.0


TARGET = Target(
    key="clicktrain.fig14",
    title="ClickTrain Fig. 14: total time of distributed training (4-16 GPUs)",
    description=described(__doc__),
    rows=rows,
    metrics=("train_hours", "train_hours_saved"),
    figures=panels_vs_paper(
        ("train_hours", "Total training time", "hours"),
        ("train_hours_saved", "Training hours saved", "hours"),
    ),
    notes=lambda scale: [
        "The speedups over pruning after training stated beside this figure are left out of "
        "the published values: their grouping by model or by GPU count is ambiguous "
        "(docs/reproductions.md).",
        "Running these rows in one process trains on one device; the multi-GPU launch "
        "(torchrun, DDP) is the user's. Each GPU count trains a global batch of 64 per GPU "
        "(the paper's); the paper does not say how its learning rate follows the batch, "
        "ours stays at 0.1.",
    ],
    extra_metrics={"train_hours": ("h", train_hours), "train_hours_saved": ("h", hours_saved)},
)


def main(scale: str = "paper", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run ClickTrain Fig. 14 (only fills at the paper scale on a cluster)."""
    return reproduce(TARGET, scale, runs_root, reports_root)
