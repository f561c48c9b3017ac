"""ClickTrain Fig. 12: total single-GPU training time of dense training and of ClickTrain,
and the time ClickTrain saves, on CIFAR-10 and ImageNet.

Scales: smoke, cpu and gpu read the wall time of the Table 1 runs (the paper gives hours
saved; ours are seconds at the run's scale); paper trains the Table 1 protocol.
"""

from __future__ import annotations

from pathlib import Path

from reproductions.clicktrain import method_rows
from reproductions.common import Row, Target, bar_vs_paper, reproduce


def time_saved_h(run, base) -> float:
    """Hours of training wall time ClickTrain saves against the dense run of the same seed."""
    return (base.summary["wall_seconds"] - run.summary["wall_seconds"]) / 3600.0


def rows(scale: str) -> list[Row]:
    """Dense and ClickTrain (higher compression) per model."""
    pairs = [("resnet50", "cifar10")]
    if scale == "paper":
        pairs = [(m, "cifar10") for m in ("resnet18", "resnet34", "resnet50", "vgg16")] + [
            (m, "imagenet") for m in ("resnet34", "resnet50", "resnet101", "vgg16")
        ]
    out = []
    for model, dataset in pairs:
        for r in method_rows(scale, model, dataset):
            if r.method == "prunetrain" or "lower" in r.label:
                continue
            if r.method == "clicktrain":
                r.paper = {"model": model, "dataset": dataset, "method": "clicktrain"}
            out.append(r)
    return out


TARGET = Target(
    key="clicktrain.fig12",
    title="ClickTrain Fig. 12: total training time (single device)",
    description=__doc__.split("\n\n")[0].replace("\n", " "),
    rows=rows,
    metrics=("wall_seconds", "train_hours_saved"),
    figures=bar_vs_paper("wall_seconds", "Total training time", "seconds"),
    notes=lambda scale: [
        "Hours saved at a small scale are tiny fractions of an hour; compare the share of "
        "time saved, not the hours, with the paper.",
        "Wall time includes evaluation after every epoch; on a shared CPU it is noisy.",
    ],
    extra_metrics={"train_hours_saved": ("h", time_saved_h)},
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run ClickTrain Fig. 12 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
