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
    # shared by every target (reproductions.common.METRICS)
    "top1": "top-1",
    "best_top1": "best top-1",
    "base_top1": "dense top-1",
    "delta_top1": "top-1 change vs dense",
    "compression_ratio": "conv compression (total / nonzero)",
    "conv_sparsity": "conv sparsity",
    "inference_flops": "inference FLOPs",
    "inference_flops_saved": "inference FLOPs saved (nominal)",
    "train_flops": "training FLOPs",
    "train_flops_impl": "training FLOPs by impl.flops",
    "train_flops_saved": "training FLOPs saved (nominal)",
    "train_flops_executed_saved": "training FLOPs saved (executed)",
    "train_time": "training time (training steps: evaluation and epoch ends left out)",
    "fwd_ms": "forward time per iteration",
    "bwd_ms": "backward time per iteration",
    "step_ms": "optimizer step and per-step method work per iteration",
    "iter_ms": "time per iteration (forward + backward + step)",
    "run_iter_ms": "time per iteration over the whole run (epoch medians weighted by iterations)",
    "forward_speedup": "forward speedup vs dense",
    "backward_speedup": "backward speedup vs dense",
    "wall_seconds": "wall time incl. evaluation",
    "comm_bytes_per_iter": "Allreduce bytes per iteration",
    "peak_gpu_memory_mib": "peak GPU memory",
    "true_sparsity": "true sparsity (zero weights of the pruned layers)",
    "train_flops_per_sample": "final model's training FLOPs per sample (nominal)",
    "train_flops_executed_per_sample": "final model's training FLOPs per sample (executed)",
    "inference_flops_per_sample": "inference FLOPs per sample (nominal)",
    "inference_flops_executed_per_sample": "inference FLOPs per sample (executed)",
    "time_to_accuracy": "time to target accuracy",
    "hard_prune_epoch": "hard-pruning epoch",
    # ClickTrain
    "delta_top1_std": "sd of the top-1 change vs dense",
    "epochs_after_well_trained": "epochs after a well-trained model",
    "total_epochs": "total training epochs",
    "conversion_time": "dense-to-CSR conversion time (generic)",
    "pattern_conversion_time": "CSR conversion time (predefined positions)",
    "spmm_time": "SpMM time",
    "speedup_vs_cusparse": "speedup over the generic CSR routine (mean of per-sweep speedups)",
    "crossover_sparsity_vs_cublas_cudnn": (
        "lowest achieved sparsity where the pattern SpMM beats dense"
    ),
    "train_hours": "total training wall time (incl. evaluation)",
    "train_hours_saved": "wall time saved vs dense (incl. evaluation)",
    "wall_time_saved": "share of wall time saved vs dense (incl. evaluation)",
    "comm_time_saved": "Allreduce time saved",
    "bytes_saved": "Allreduce bytes saved",
    "compression_ratio_vs_prunetrain": "compression ratio over PruneTrain's",
    "end_to_end_time_longer_vs_prunetrain": "end-to-end time longer than PruneTrain's",
    "end_to_end_time_saved_vs_clicktrain": "end-to-end time saved vs ClickTrain",
    "top1_gain_vs_prunetrain": "top-1 gain over PruneTrain",
    "top1_gain": "top-1 gain",
    "train_flops_saved_min": "training FLOPs saved (low end)",
    "train_flops_saved_max": "training FLOPs saved (high end)",
    "inference_flops_saved_min": "inference FLOPs saved (low end)",
    "inference_flops_saved_max": "inference FLOPs saved (high end)",
    "compression_ratio_lower_bound": "compression ratio, at least",
    "compression_ratio_min": "compression ratio (low end)",
    "compression_ratio_max": "compression ratio (high end)",
    "beats_dense_above_65": "beat dense GEMM and conv at every sparsity above 65%",
    "train_speedup_vs_pat": "training time speedup vs pruning after training",
    "train_speedup_vs_pat_max": "training time speedup vs pruning after training (the most)",
    "computation_time_saved_vs_pat_max": (
        "most computation time saved vs prune-after-training methods"
    ),
    "top1_sacrificed_max": "largest top-1 loss",
    "top1_gap_vs_dense_max": "largest top-1 gap to dense",
    # PruneTrain
    "bn_traffic_saved": "BN-layer memory traffic saved",
    "bn_cost": "BN-layer memory traffic (% of dense)",
    "delta_top1_finetuned": "top-1 change vs dense after fine-tuning",
    "train_time_v100": "training time on V100s",
    "images_per_second_bs10": "inference throughput at batch 10",
    "images_per_second_bs100": "inference throughput at batch 100",
    "speedup_bs10": "inference speedup vs dense at batch 10",
    "speedup_bs100": "inference speedup vs dense at batch 100",
    "removed_layers": "conv layers removed",
    "removed_layers_fraction": "share of conv layers removed",
    "train_time_reduction": "training time saved vs dense (training steps)",
    "train_time_reduction_v100": "training time saved vs dense on V100s",
    "train_time_improvement_vs_naive": "training time saved vs naive PruneTrain",
    "train_time_improvement_vs_naive_v100": "training time saved vs naive PruneTrain on V100s",
    "train_cost_vs_dense": "training cost vs dense",
    "extra_train_flops_vs_prunetrain": "extra training FLOPs of one-time pruning vs PruneTrain",
    "pruned_flops_phase": "epoch by which most FLOPs are pruned",
    "inference_flops_difference_min": "inference FLOPs, union minus gating (least)",
    "inference_flops_difference_max": "inference FLOPs, union minus gating (most)",
    "conv_speedup_vs_dense": "conv time speedup of channel union vs dense",
    "gating_over_union": "conv time of channel gating over channel union",
    "inference_mflops": "inference FLOPs per sample (nominal)",
    "penalty_ratio": "group-lasso penalty ratio",
    "batch_size": "mini-batch size",
    "batch_size_per_gpu": "mini-batch size per GPU",
    "reconfig_interval": "reconfiguration interval",
    "comm_cost_saved": "communication cost saved over the run (projected)",
    "gpus": "GPU count",
    # SDGP
    "top1_change": "top-1 change vs 2:4",
    "data_grad_time_share": "share of conv time in data gradients",
    "estimated_runtime_reduction": "estimated conv time saved by data-gradient pruning",
    "estimated_tta": "estimated time to target accuracy",
    "tta_relative_speedup": "estimated time-to-accuracy speedup vs the reference setting",
    "target_top1": "target top-1",
    "training_time_reduction_min": "training time saved, estimated (low end)",
    "training_time_reduction_max": "training time saved, estimated (high end)",
    # Campfire
    "epoch_of_convergence": "epoch of convergence (within 0.5 pp of the best top-1)",
    "sparsity": "sparsity (Campfire: zero weights; PruneTrain: inference FLOPs saved)",
    "sparsity_pct": "true sparsity (zero weights of the pruned layers)",
    "top1_at_90": "top-1 at 90% of the epochs",
    "fgsm_top1": "top-1 under FGSM attack",
    "top1_gain_90_to_100": "top-1 gained in the last 10% of the epochs",
    "top1_gain_90_to_100_min": "top-1 gained in the last 10% of the epochs (low end)",
    "top1_gain_90_to_100_max": "top-1 gained in the last 10% of the epochs (high end)",
    "top1_lower_bound": "top-1, at least",
    "top1_loss_vs_dense_min": "top-1 lost vs dense (low end)",
    "top1_loss_vs_dense_max": "top-1 lost vs dense (high end)",
    "fgsm_top1_drop_min": "FGSM top-1 lost vs dense (low end)",
    "fgsm_top1_drop_max": "FGSM top-1 lost vs dense (high end)",
    "top1_improvement": "top-1 gain of the last lr drop at epoch 80 over 90",
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
    "resnet50_v1": "ResNet-50 v1",
    "prunetrain_resnet50": "ResNet-50 (PruneTrain's CIFAR layout)",
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
