"""Reproductions of ClickTrain's tables and figures (ICS 2021), one module each.

Shared here: the rows every ClickTrain accuracy table trains (dense, PruneTrain and
ClickTrain at two compression levels), so that Tables 1-2 and Figs. 11, 12 and 15 reuse the
same runs at a scale.
"""

from __future__ import annotations

from typing import Any

from reproductions.common import Row, cifar_step_recipe

# The two ClickTrain rows per model of Table 1 differ in compression; here by the fraction of
# kernels removed whole (connectivity sparsity, Sec. 2.1): 0.55 and 0.75 (the authors' code
# uses 0.55 to 0.75 per layer).
CONNECTIVITY = {"lower compression": 0.55, "higher compression": 0.75}
GPU_MODEL = "resnet32"

# The networks Table 1's CIFAR rows name, as trained: PruneTrain's CIFAR models. Its CIFAR dense
# baselines are PruneTrain Table 1's, number for number (ResNet34 93.6 / 71.0% = PruneTrain's
# ResNet-32; ResNet50 94.1 / 73.1% against PruneTrain's ResNet-50 94.2 / 73.1%), and Fig. 2's
# legend names "Original ResNet32" for the network its text (Sec. 2.2) calls ResNet-34. The
# paper never describes its CIFAR ResNets otherwise; ImageNet rows keep torchvision's networks.
CIFAR_MODELS: dict[str, str] = {"resnet34": "resnet32", "resnet50": "prunetrain_resnet50"}


def has_bottlenecks(model: str, stem: str = "cifar") -> bool:
    """Whether network ``model`` (a name of :mod:`impl.models`) is built of bottleneck blocks
    (1x1 convs inside its residual paths), checked on the meta device."""
    import torch

    from impl.models import create
    from impl.models.resnet import Bottleneck

    with torch.device("meta"):
        net = create(model, stem=stem)
    return any(isinstance(m, Bottleneck) for m in net.modules())


def clicktrain_options(scale: str, train: dict[str, Any], setting: str) -> dict[str, Any]:
    """Options of a ClickTrain row at ``setting`` (its connectivity) for the network ``train``
    trains. At paper scale a bottleneck ResNet's 1x1 convs are pruned too (``prune_pointwise``):
    its 3x3 convs hold about half its conv weights, so pruning them alone compresses it at
    most 1.9x, against the paper's 4.1x (ImageNet ResNet-50) and 8.7-10.8x (CIFAR, Table 1)."""
    options: dict[str, Any] = {"connectivity": CONNECTIVITY[setting]}
    model = train.get("model")
    if scale == "paper" and model and has_bottlenecks(model, train.get("stem", "cifar")):
        options["prune_pointwise"] = True
    return options


def train_for(scale: str, model: str | None = None, dataset: str = "cifar10") -> dict[str, Any]:
    """TrainConfig fields of a ClickTrain accuracy row: the scale's defaults at smoke/cpu,
    ResNet-32 on digits at gpu, the paper's 190 epochs (CIFAR, lr 0.1, batch 128) or 90
    (ImageNet, batch 64 per GPU) at paper. ``model`` is the paper's name; on CIFAR, its
    ResNet34 and ResNet50 train PruneTrain's CIFAR networks (:data:`CIFAR_MODELS`)."""
    if scale in ("smoke", "cpu"):
        return {}
    if scale == "gpu":
        return {"model": model if model in ("resnet20", "resnet32", "resnet56") else GPU_MODEL}
    if dataset == "imagenet":
        return {"model": model, "data": "imagenet", "stem": "imagenet", "epochs": 90,
                "batch_size": 64, "lr": 0.1, "schedule": "step", "milestones": [30, 60],
                "nesterov": False, "weight_decay": 1e-4}  # fmt: skip
    return {"model": CIFAR_MODELS.get(model, model), **cifar_step_recipe(190, dataset)}


def prunetrain_options(scale: str) -> dict[str, Any]:
    """PruneTrain as ClickTrain compares with it (penalty ratio 0.2, reconfiguration every 10
    CIFAR epochs at paper scale): :func:`reproductions.prunetrain.options` at ``scale``."""
    from reproductions.prunetrain import options

    return options(scale, 0.2)


def method_rows(scale: str, model: str, dataset: str, needs: str | None = None) -> list[Row]:
    """Dense, PruneTrain and ClickTrain (both compression levels) for one model and dataset,
    with the paper's selectors of Table 1."""
    train = train_for(scale, model, dataset)
    sel = {"model": model, "dataset": dataset}
    tag = "" if scale != "paper" else f"{model} {dataset} "
    dense = f"{tag}dense"
    rows = [
        Row(dense, "dense", train=train, needs=needs),
        Row(f"{tag}PruneTrain", "prunetrain", options=prunetrain_options(scale), train=train,
            paper={**sel, "method": "prunetrain"}, baseline=dense, needs=needs),
    ]  # fmt: skip
    settings = ["higher compression"] if dataset == "imagenet" else list(CONNECTIVITY)
    for setting in settings:
        sel_ct = {**sel, "method": "clicktrain"}
        if dataset != "imagenet":
            sel_ct["setting"] = setting
        rows.append(
            Row(f"{tag}ClickTrain ({setting})", "clicktrain",
                options=clicktrain_options(scale, train, setting), train=train, paper=sel_ct,
                baseline=dense, needs=needs)
        )  # fmt: skip
    return rows


def hard_prune_epoch(run: Any, base: Any = None) -> float | None:
    """The epoch stage 5 (hard pruning) began, from ClickTrain's summary."""
    click = run.summary.get("clicktrain") or {}
    start = (click.get("stage_start_epoch") or {}).get("sparse")
    return None if start is None else float(start)
