"""Readable names for what the report tables show: metrics (with their units), models and
datasets, and the label every number of ours carries about how many seeds it stands for.

One rule for every table: a metric key of the results (``delta_top1``) is shown as the words
of :data:`METRIC_LABELS` ("top-1 change vs dense"), a model key (``resnet20``) as the paper's
spelling ("ResNet-20"), and a number from one seed says so ("(n=1, seed 0)").
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# metric key of the results -> words (units are added by metric_label from the row's unit)
METRIC_LABELS: dict[str, str] = {
    "top1": "top-1",
    "best_top1": "best top-1",
    "base_top1": "dense top-1",
    "delta_top1": "top-1 change vs dense",
    "compression_ratio": "conv compression (total / nonzero)",
    "conv_sparsity": "conv sparsity",
    "inference_flops": "inference FLOPs",
    "inference_flops_saved": "inference FLOPs saved (nominal)",
    "train_flops": "training FLOPs",
    "train_flops_saved": "training FLOPs saved (nominal)",
    "train_flops_executed_saved": "training FLOPs saved (executed)",
    "train_time": "training time",
    "fwd_ms": "forward time per iteration",
    "bwd_ms": "backward time per iteration",
    "iter_ms": "time per iteration",
    "forward_speedup": "forward speedup vs dense",
    "backward_speedup": "backward speedup vs dense",
    "wall_seconds": "training wall time",
    "comm_bytes_per_iter": "Allreduce bytes per iteration",
    "peak_gpu_memory_mib": "peak GPU memory",
    "true_sparsity": "true sparsity",
    "train_flops_per_sample": "training FLOPs per sample (nominal)",
    "train_flops_executed_per_sample": "training FLOPs per sample (executed)",
    "inference_flops_per_sample": "inference FLOPs per sample (nominal)",
    "inference_flops_executed_per_sample": "inference FLOPs per sample (executed)",
    "time_to_accuracy": "time to target accuracy",
    "hard_prune_epoch": "hard-pruning epoch",
}

# units spelled out where a label shows them
_UNIT_WORDS: dict[str, str] = {"B": "bytes"}

MODEL_NAMES: dict[str, str] = {
    "resnet9": "ResNet-9",
    "resnet18": "ResNet-18",
    "resnet20": "ResNet-20",
    "resnet32": "ResNet-32",
    "resnet34": "ResNet-34",
    "resnet50": "ResNet-50",
    "resnet50_v1.5": "ResNet-50 v1.5",
    "resnet56": "ResNet-56",
    "resnet101": "ResNet-101",
    "regnetx_400mf": "RegNetX-400MF",
    "vgg11": "VGG-11",
    "vgg13": "VGG-13",
    "vgg16": "VGG-16",
    "vgg19": "VGG-19",
    "alexnet": "AlexNet",
}
DATA_NAMES: dict[str, str] = {
    "cifar10": "CIFAR-10",
    "cifar100": "CIFAR-100",
    "imagenet": "ImageNet",
    "tinyimagenet": "Tiny-ImageNet",
    "tiny_imagenet": "Tiny-ImageNet",
    "digits": "digits",
    "synthetic": "synthetic data",
}


def metric_label(metric: str, unit: str = "") -> str:
    """The words of ``metric`` (:data:`METRIC_LABELS`; an unknown key as it is) with its
    ``unit`` in parentheses: ``("delta_top1", "pp")`` -> "top-1 change vs dense (pp)",
    ``("train_flops_saved", "%")`` -> "training FLOPs saved (nominal, %)" (a label that ends
    in a parenthesis takes the unit inside it; a unit the label already names is left out:
    "Allreduce bytes per iteration")."""
    label = METRIC_LABELS.get(metric, metric)
    unit = _UNIT_WORDS.get(unit, unit)
    if not unit or re.search(rf"(^|[\s(]){re.escape(unit)}($|[\s),])", label, re.IGNORECASE):
        return label
    if label.endswith(")"):
        return f"{label[:-1]}, {unit})"
    return f"{label} ({unit})"


def model_name(key: str | None) -> str:
    """A model key as the papers spell it ("resnet20" -> "ResNet-20"); unknown keys as given."""
    if not key:
        return "?"
    if key in MODEL_NAMES:
        return MODEL_NAMES[key]
    m = re.fullmatch(r"(resnet|vgg)(\d+)", key)
    return f"{'ResNet' if m.group(1) == 'resnet' else 'VGG'}-{m.group(2)}" if m else key


def data_name(key: str | None) -> str:
    """A dataset key as the papers spell it ("cifar10" -> "CIFAR-10"); unknown keys as given."""
    if not key:
        return "?"
    return DATA_NAMES.get(key, key)


def seeds_text(seeds: Sequence[int]) -> str:
    """Seeds as a short text: "0" for one, "0-4" for a run of consecutive ones, else listed."""
    s = sorted(int(x) for x in seeds)
    if not s:
        return "-"
    if len(s) > 2 and s == list(range(s[0], s[-1] + 1)):
        return f"{s[0]}-{s[-1]}"
    return ", ".join(str(x) for x in s)


def n_label(n: int | None, seeds: Sequence[int] | None = None) -> str:
    """How many seeds (or measurements) a number stands for, as its table cell says it:
    "(n=5)", and for one: "(n=1, seed 0)" where the seed is known, else "(n=1)"; "" for none.
    Every number of ours carries it, so that one seed is never read as a mean."""
    if not n:
        return ""
    if n == 1 and seeds is not None and len(seeds) == 1:
        return f"(n=1, seed {int(seeds[0])})"
    return f"(n={n})"


__all__ = [
    "DATA_NAMES",
    "METRIC_LABELS",
    "MODEL_NAMES",
    "data_name",
    "metric_label",
    "model_name",
    "n_label",
    "seeds_text",
]
