"""PruneTrain Table 1: training FLOPs and time, inference FLOPs and accuracy drop of
PruneTrain against dense training (CIFAR-10, CIFAR-100, ImageNet).

Scales: smoke/cpu train ResNet-20 on digits, gpu ResNet-32 on digits (beside the paper's
ResNet-32 CIFAR-10 row); paper trains ResNet-32/50 and VGG-11/13 on CIFAR-10/100 (182
epochs) and ResNet-50 on ImageNet at penalty ratios 0.25, 0.2 and 0.1 (90 epochs).
"""

from __future__ import annotations

from pathlib import Path

from reproductions.common import Row, Target, bar_vs_paper, described, reproduce
from reproductions.prunetrain import bn_traffic_saved, pair, train_flops_by_authors_formula

MODELS = ("resnet32", "resnet50", "vgg11", "vgg13")


def rows(scale: str) -> list[Row]:
    """Dense and PruneTrain per model and dataset."""
    if scale != "paper":
        return pair(scale, "resnet32", "cifar10")
    out = []
    for dataset in ("cifar10", "cifar100"):
        for model in MODELS:
            out += pair(scale, model, dataset, tag=f"{model} {dataset} ")
    dense, *_ = pair(scale, "resnet50", "imagenet", tag="resnet50 imagenet ")
    out.append(dense)
    for ratio in (0.25, 0.2, 0.1):
        out.append(pair(scale, "resnet50", "imagenet", ratio=ratio, tag="resnet50 imagenet ",
                        setting=f"penalty ratio {ratio}")[1])  # fmt: skip
    return out


TARGET = Target(
    key="prunetrain.table1",
    title="PruneTrain Table 1: training FLOPs and time, inference FLOPs, accuracy",
    description=described(__doc__),
    rows=rows,
    metrics=(
        "base_top1",
        "delta_top1",
        "train_flops",
        "train_flops_impl",
        "train_time",
        "inference_flops",
        "bn_traffic_saved",
    ),
    figures=bar_vs_paper("train_flops", "Training FLOPs (% of dense)", "% of dense"),
    extra_metrics={
        "train_flops": ("% of dense", train_flops_by_authors_formula),
        "bn_traffic_saved": ("%", bn_traffic_saved),
    },
    notes=lambda scale: [
        "Training FLOPs: nominal, whole run (each epoch's model times its samples), in % of "
        "the dense model on the same samples (by impl.flops: of the dense run of the same "
        "seed); the model physically shrinks, so executed = nominal.",
        "Training FLOPs are counted, as the paper's, by the authors' cost formula "
        "(impl.flops.paper_training_cost: convolutions' forward, weight gradient and data "
        "gradient as a full convolution over the padded input, the first conv's included; "
        "fully connected 3 x N x K x C; BatchNorm as memory traffic, not FLOPs). Beside "
        "them, 'training FLOPs by impl.flops' counts the same runs as the cross-method "
        "table does (BatchNorm's arithmetic included, no data gradient for the first conv, "
        "the data gradient as 2 x MACs over the output); the two differ by where the "
        "pruning lands, the formula weighing the data gradients of strided and "
        "small-feature-map layers more.",
        "Training time: the seconds of the training steps against dense's (evaluation and "
        "the epochs' ends, where the model is reconfigured, left out: Sec. 5.1 leaves the "
        "reconfiguration out); on a shared CPU it is noisy.",
        "The CIFAR rows of the paper do not state their penalty ratio; ours use 0.2.",
        "The paper trains CIFAR on one TITAN Xp and ImageNet on four 1080 Ti (64 samples per "
        "GPU; * = four V100); ours train in one process on the device in the footer, so "
        "times compare as ratios to our dense run only.",
    ],
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run PruneTrain Table 1 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
