"""Reproductions of PruneTrain's tables and figures (SC 2019), one module each.

Shared here: the training settings and the dense/PruneTrain rows the tables reuse.
"""

from __future__ import annotations

from typing import Any

from reproductions.common import METHOD_SCALE_NOTES, Row, cifar_step_recipe

# The network the paper's "ResNet50" names on CIFAR: its own 3-stage bottleneck layout
# (impl.models.resnet.prunetrain_resnet50, 230 MFLOPs per inference, Sec. 5.2), not the
# ImageNet ResNet-50 on a CIFAR stem (11x the FLOPs).
CIFAR_MODELS: dict[str, str] = {"resnet50": "prunetrain_resnet50"}
#: Epochs of the paper's CIFAR runs (Sec. 5.1: 182; the authors' code decays the rate from
#: its epochs 91 and 136, counted from 1, which the text does not say).
PAPER_CIFAR_EPOCHS = 182


def train_for(scale: str, model: str | None = None, dataset: str = "cifar10") -> dict[str, Any]:
    """TrainConfig fields: the scale's defaults at smoke/cpu, ResNet-32 on digits at gpu,
    the paper's recipe at paper (CIFAR: 182 epochs, batch 128, lr 0.1, decayed from epochs 91
    and 136 counted from 1 as the authors' code does; ImageNet: 90 epochs, batch 256, lr 0.1,
    and, as the text does not say them, the usual ImageNet ResNet decay at 30 and 60 and
    weight decay 1e-4). ``model`` is the paper's name; on CIFAR, ResNet-50 trains
    PruneTrain's layout (:data:`CIFAR_MODELS`)."""
    if scale in ("smoke", "cpu"):
        return {}
    if scale == "gpu":
        return {"model": model if model in ("resnet20", "resnet32", "resnet56") else "resnet32"}
    if dataset == "imagenet":
        return {"model": model, "data": "imagenet", "stem": "imagenet", "epochs": 90,
                "batch_size": 256, "lr": 0.1, "schedule": "step", "milestones": [30, 60],
                "nesterov": False, "weight_decay": 1e-4}  # fmt: skip
    recipe = cifar_step_recipe(PAPER_CIFAR_EPOCHS, dataset)
    return {"model": CIFAR_MODELS.get(model, model), **recipe}


# The short runs of the cpu and gpu scales take ~350 SGD steps, against ~71k in the paper's
# CIFAR runs. There the paper's penalty ratios (0.05-0.25) with its zero threshold 1e-4 remove
# no channel at all (measured at cpu scale: ratio 0.2 and even 0.6 leave 100% of the FLOPs),
# so these scales map each paper ratio onto a stronger one (same order, 0.2 -> 0.8), count a
# channel as zero below max|w| = 1e-2 and reconfigure every epoch (cpu) or 3 epochs (gpu).
# Measured at cpu scale (seed 0, 8 epochs, dense 99.44%): ratio 0.6 -> 99.44% at 100% of the
# dense FLOPs, 0.7 -> 99.17% / 98.4%, 0.8 -> 97.78% / 72.7%, 0.85 -> 91.39% / 59.5%.
SHORT_RUN_RATIO: dict[float, float] = {0.05: 0.6, 0.1: 0.7, 0.15: 0.75, 0.2: 0.8, 0.25: 0.85}
SHORT_RUN_THRESHOLD = 1e-2


def options(
    scale: str, ratio: float = 0.2, dataset: str = "cifar10", **extra: Any
) -> dict[str, Any]:
    """PruneTrain's options for the paper's penalty ``ratio`` at ``scale``: at paper scale the
    ratio as published, reconfiguration every 10 epochs (CIFAR) or 5 (ImageNet), threshold
    1e-4; on the short runs of the cpu and gpu scales the ratio mapped through
    :data:`SHORT_RUN_RATIO` and threshold :data:`SHORT_RUN_THRESHOLD`; smoke keeps the paper's
    values (it proves the pipeline only). ``extra`` overrides any field.

    Raises ``ValueError`` for a ratio the cpu/gpu map does not know.
    """
    if scale == "paper":
        out = {"penalty_ratio": ratio, "reconfig_interval": 5 if dataset == "imagenet" else 10}
    elif scale in ("cpu", "gpu"):
        if ratio not in SHORT_RUN_RATIO:
            raise ValueError(
                f"no {scale}-scale ratio for the paper's {ratio}; known: {sorted(SHORT_RUN_RATIO)}"
            )
        out = {"penalty_ratio": SHORT_RUN_RATIO[ratio], "threshold": SHORT_RUN_THRESHOLD,
               "reconfig_interval": 1 if scale == "cpu" else 3}  # fmt: skip
    else:
        out = {"penalty_ratio": ratio, "reconfig_interval": 2}
    return {**out, **extra}


#: The paper's ImageNet dynamic mini-batch: 32 samples per GPU on its 4 GPUs (64 -> 96 -> 128
#: per GPU, Sec. 5.3, Fig. 9a), as steps of the global batch of one process.
IMAGENET_GPUS = 4
IMAGENET_BATCH_STEP = 32 * IMAGENET_GPUS


def dynamic_batch_options(dataset: str) -> dict[str, Any]:
    """PruneTrain's dynamic mini-batch options for ``dataset``: growth in steps of 32 samples
    (CIFAR, one GPU) or of 32 per GPU on the paper's 4 GPUs (ImageNet)."""
    out: dict[str, Any] = {"dynamic_batch": True}
    if dataset == "imagenet":
        out["batch_step"] = IMAGENET_BATCH_STEP
    return out


def short_run_note(scale: str) -> str | None:
    """What a table with a PruneTrain run says at ``scale`` about its settings (None at the
    smoke and paper scales, which use the paper's)."""
    if scale not in ("cpu", "gpu"):
        return None
    mapping = ", ".join(f"{k} -> {v}" for k, v in SHORT_RUN_RATIO.items())
    return (
        f"PruneTrain at {scale} scale: the paper's penalty ratios remove no channel in a run of "
        f"a few hundred SGD steps (the paper's take ~71k), so each is run at a stronger one in "
        f"the same order ({mapping}), a channel counts as zero below max|w| = "
        f"{SHORT_RUN_THRESHOLD:g} (paper: 1e-4), and the network is reconfigured every "
        f"{1 if scale == 'cpu' else 3} epoch(s). The settings table under the results names the "
        f"paper's ratio and the one run."
    )


METHOD_SCALE_NOTES["prunetrain"] = short_run_note


def ratio_label(scale: str, ratio: float) -> str:
    """How a row names the paper's penalty ``ratio`` at ``scale``: "ratio 0.2", and on the
    short runs also the ratio they train with ("ratio 0.2, run at 0.8")."""
    if scale in ("cpu", "gpu") and ratio in SHORT_RUN_RATIO:
        return f"ratio {ratio}, run at {SHORT_RUN_RATIO[ratio]}"
    return f"ratio {ratio}"


def pair(
    scale: str,
    model: str,
    dataset: str,
    *,
    ratio: float = 0.2,
    setting: str | None = None,
    tag: str = "",
    needs: str | None = None,
    extra: dict[str, Any] | None = None,
) -> list[Row]:
    """The dense row and one PruneTrain row for ``model`` on ``dataset`` (paper selectors of
    Table 1; ``setting`` selects among the paper's rows of one model, e.g. a penalty ratio)."""
    train = train_for(scale, model, dataset)
    sel = {"model": model, "dataset": dataset}
    dense = f"{tag}dense"
    pt_sel = {**sel, "method": "prunetrain"}
    if setting:
        pt_sel["setting"] = setting
    return [
        Row(dense, "dense", train=train, needs=needs, paper={**sel, "method": "dense"},
            metrics=("base_top1",), baseline=dense),
        Row(f"{tag}PruneTrain ({ratio_label(scale, ratio)})", "prunetrain",
            options=options(scale, ratio, dataset, **(extra or {})), train=train, needs=needs,
            paper=pt_sel, baseline=dense),
    ]  # fmt: skip


def epoch_batches(run: Any) -> list[float]:
    """The mini-batch each epoch of ``run`` trained with: its config's for the first, then
    the one each epoch's end set for the next (``next_batch_size`` of a dynamic mini-batch
    run; the batch is fixed otherwise). Runs trained before the metrics' ``batch_size`` meant
    the epoch's own batch stored the next one there; this reading holds for both, except for
    such a run whose config is unknown, whose first epoch then reads the second's batch."""
    metrics = run.metrics
    first = run.config.get("batch_size") or (metrics[0]["batch_size"] if metrics else 0)
    out = [float(first)]
    for m in metrics[:-1]:
        out.append(float(m.get("next_batch_size", m["batch_size"])))
    return out[: len(metrics)]


def train_flops_by_authors_formula(run: Any, base: Any = None) -> float | None:
    """Training FLOPs of a PruneTrain run in % of dense training on the same samples, by the
    authors' cost formula (:func:`impl.flops.paper_training_cost`), the count behind the
    paper's "Train. FLOPs" (Table 1, Sec. 5.1; Fig. 8). Written by the method into the
    summary (``paper_train_flops_pct_of_dense``); a dense run is 100 by definition; a run
    without it has no value."""
    if run.summary.get("method") == "dense":
        return 100.0
    return run.summary["paper_train_flops_pct_of_dense"]


def unchanged_batch_note(result: Any) -> str:
    """A dynamic mini-batch row's note where no run's batch ever grew (the pruned model never
    freed enough memory for one more step of samples): the run then trained as a fixed-batch
    one, which the row's label alone would hide; "" otherwise."""
    if not unchanged_batch_flag(result):
        return ""
    first = epoch_batches(result.runs[0])
    size = f" of {first[0]:g}" if first else ""
    return f"the batch{size} never grew in this run: it trained as a fixed-batch run"


def unchanged_batch_flag(result: Any) -> str:
    """ "batch never grew" for a dynamic mini-batch row none of whose runs' batch grew (the
    label beside it at a glance and in the claim that reads it), "" otherwise."""
    if "dynamic" not in result.row.label or not result.runs:
        return ""
    if any(len(set(epoch_batches(run))) > 1 for run in result.runs):
        return ""
    return "batch never grew"


#: The ``row_note`` and ``row_flag`` of a target with a dynamic mini-batch row (Table 4,
#: Figs. 9 and 11).
UNCHANGED_BATCH_NOTES: dict[str, Any] = {
    "row_note": unchanged_batch_note,
    "row_flag": unchanged_batch_flag,
}


def bn_cost_pct(run: Any, base: Any = None) -> float | None:
    """Off-chip traffic of the BatchNorm layers of a PruneTrain run in % of the dense model's
    on the same samples (Fig. 8b's "BN cost"), as the method writes it into the summary
    (``bn_traffic_pct_of_dense``); a dense run is 100; a run without it has no value."""
    if run.summary.get("method") == "dense":
        return 100.0
    return run.summary.get("bn_traffic_pct_of_dense")


def bn_traffic_saved(run: Any, base: Any = None) -> float | None:
    """BN-layer memory traffic saved against dense (%): 100 minus :func:`bn_cost_pct` (the
    savings Sec. 5.1 states beside Table 1)."""
    cost = bn_cost_pct(run, base)
    return None if cost is None else 100.0 - cost


def conv_layers_removed(run: Any, base: Any = None) -> float:
    """Conv layers PruneTrain removed: the convolutions of the residual paths it removed, as
    each reconfiguration recorded them (2 per path of a BasicBlock ResNet, 3 of a Bottleneck
    one)."""
    history = run.summary.get("reconfigurations") or []
    return float(sum(len(h.get("removed_layers") or []) for h in history))
