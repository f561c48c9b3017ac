"""ClickTrain Fig. 11: forward and backward time per iteration of dense training and of
ClickTrain after hard pruning (pattern-sparse convolutions), per model, on CIFAR and ImageNet
shapes.

Scales: smoke and cpu read the Trainer's median times of the last epoch of the Table 1 runs
(ResNet-20, digits; ClickTrain is in its sparse stage then); gpu trains ResNet-18/34/50 and
VGG-16 on synthetic 32 x 32 inputs (batch 128) and ResNet-34/50/101 and VGG-16 on synthetic
224 x 224 inputs (batch 64, 1000 classes) for 4 short epochs, ClickTrain hard-pruning at the
start of the fourth; paper trains the full Table 1 protocol.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reproductions.clicktrain import CONNECTIVITY, method_rows
from reproductions.common import Row, Target, bar_vs_paper, reproduce

SHORT_CLICKTRAIN = {"dense_epochs": 1, "pool_epochs": 1, "finalize_epochs": 1,
                    "hard_prune_epoch": 3}  # fmt: skip


def _synthetic(model: str, imagenet: bool) -> dict[str, Any]:
    size, classes, batch = (224, 1000, 64) if imagenet else (32, 10, 128)
    return {"model": model, "data": "synthetic", "stem": "imagenet" if imagenet else "cifar",
            "data_options": {"image_size": size, "in_channels": 3, "num_classes": classes,
                             "train_size": batch * 12, "test_size": batch},
            "epochs": 4, "batch_size": batch, "eval_batch_size": batch,
            "max_steps_per_epoch": 12}  # fmt: skip


def rows(scale: str) -> list[Row]:
    """Dense and ClickTrain rows whose fwd/bwd times are compared."""
    if scale in ("smoke", "cpu"):
        rs = [r for r in method_rows(scale, "resnet50", "cifar10")
              if r.method == "dense" or "higher" in r.label]  # fmt: skip
        for r in rs:  # the scale's model stands for ResNet-50 on CIFAR
            if r.method == "clicktrain":
                r.paper = {"model": "resnet50", "dataset": "cifar10", "method": "clicktrain"}
        return rs
    out = []
    for dataset, models in (
        ("cifar10", ("resnet18", "resnet34", "resnet50", "vgg16")),
        ("imagenet", ("resnet34", "resnet50", "resnet101", "vgg16")),
    ):
        for model in models:
            train = _synthetic(model, dataset == "imagenet")
            dense = f"{model} {dataset} dense"
            out.append(Row(dense, "dense", train=train))
            out.append(
                Row(f"{model} {dataset} ClickTrain", "clicktrain",
                    options={**SHORT_CLICKTRAIN,
                             "connectivity": CONNECTIVITY["higher compression"]},
                    train=train, baseline=dense,
                    paper={"model": model, "dataset": dataset, "method": "clicktrain"})
            )  # fmt: skip
    return out


TARGET = Target(
    key="clicktrain.fig11",
    title="ClickTrain Fig. 11: forward and backward time per iteration",
    description=__doc__.split("\n\n")[0].replace("\n", " "),
    rows=rows,
    metrics=("fwd_ms", "bwd_ms", "forward_speedup", "backward_speedup"),
    figures=bar_vs_paper("iter_ms", "Forward + backward time per iteration", "ms"),
    notes=lambda scale: [
        "Times are the Trainer's medians over the last epoch's iterations (ClickTrain in its "
        "sparse stage). The paper's speedups are per iteration on a Quadro RTX 5000.",
        "Paper rows hold one phase each (setting forward/backward); ours give both speedups.",
    ],
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run ClickTrain Fig. 11 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
