"""Reproductions of ClickTrain's tables and figures (ICS 2021), one module each.

Shared here: the rows every ClickTrain accuracy table trains (dense, PruneTrain and
ClickTrain at two compression levels), so that Tables 1-2 and Figs. 11, 12 and 15 reuse the
same runs at a scale.
"""

from __future__ import annotations

import functools
from typing import Any

from reproductions.common import Row, cifar_step_recipe

# The two ClickTrain rows per model of Table 1 differ in compression. A row's connectivity
# (the fraction of kernels removed whole, Sec. 2.1) is set so that the network it trains
# reaches the paper's conv compression for that row (Tables 1-2: :func:`paper_compression`,
# :func:`connectivity_for`); these fractions stand in where the paper gives no compression
# (the authors' code uses 0.55 to 0.75 per layer).
CONNECTIVITY = {"lower compression": 0.55, "higher compression": 0.75}
GPU_MODEL = "resnet32"
# What the smaller scales' rows stand for: ClickTrain Table 1's ResNet-50 CIFAR-10 rows (and
# in Table 2, its ResNet-50 ImageNet row: :data:`STAND_IN_IMAGENET`).
STAND_IN = ("resnet50", "cifar10")
STAND_IN_IMAGENET = ("resnet50", "imagenet")
# connectivity_for refuses a target the network cannot reach within this relative error.
COMPRESSION_TOLERANCE = 0.03

# The networks Table 1's CIFAR rows name, as trained: PruneTrain's CIFAR models. Its CIFAR dense
# baselines are PruneTrain Table 1's, number for number (ResNet34 93.6 / 71.0% = PruneTrain's
# ResNet-32; ResNet50 94.1 / 73.1% against PruneTrain's ResNet-50 94.2 / 73.1%), and Fig. 2's
# legend names "Original ResNet32" for the network its text (Sec. 2.2) calls ResNet-34. The
# paper never describes its CIFAR ResNets otherwise; ImageNet rows keep torchvision's networks.
CIFAR_MODELS: dict[str, str] = {"resnet34": "resnet32", "resnet50": "prunetrain_resnet50"}


@functools.cache
def has_bottlenecks(model: str, stem: str = "cifar") -> bool:
    """Whether network ``model`` (a name of :mod:`impl.models`) is built of bottleneck blocks
    (1x1 convs inside its residual paths), checked on the meta device."""
    import torch

    from impl.models import create
    from impl.models.resnet import Bottleneck

    with torch.device("meta"):
        net = create(model, stem=stem)
    return any(isinstance(m, Bottleneck) for m in net.modules())


@functools.cache
def _clicktrain_value(
    metric: str, model: str, dataset: str, setting: str | None, items: tuple[str, ...]
) -> float | None:
    """The published value of ClickTrain's row for the paper's ``model`` on ``dataset`` at
    ``setting`` (CIFAR: "lower/higher compression"; ImageNet rows have none) in the first of
    ``items`` that holds exactly one; None where none does. Cached: the tables' files are read
    once, not on every row's call."""
    from reproductions.published import lookup, paper_values

    for item in items:
        frame = lookup(paper_values("clicktrain", item), model=model, dataset=dataset,
                       method="clicktrain", metric=metric)  # fmt: skip
        if setting is not None and dataset != "imagenet":
            frame = frame[frame["setting"] == setting]
        if len(frame) == 1:
            return float(frame["value"].iloc[0])
    return None


def paper_compression(model: str, dataset: str, setting: str | None = None) -> float | None:
    """ClickTrain's conv compression ratio (x) for the paper's ``model`` on ``dataset`` at
    ``setting`` ("lower compression" / "higher compression"; Table 1, Sec. 6.2), or its ImageNet
    row (Table 1, else Table 2, where one row per model has no setting); None where the paper
    gives none."""
    return _clicktrain_value("compression_ratio", model, dataset, setting, ("table1", "table2"))


def paper_hard_prune_epoch(model: str, dataset: str, setting: str | None = None) -> int | None:
    """The epoch of hard pruning of ClickTrain's Table 1 row for the paper's ``model`` on
    ``dataset`` at ``setting`` (CIFAR: "lower/higher compression"; ImageNet: its one row);
    None where the table gives none."""
    value = _clicktrain_value("hard_prune_epoch", model, dataset, setting, ("table1",))
    return None if value is None else int(value)


@functools.cache
def _conv_layers(
    model: str, stem: str, pointwise: bool, in_channels: int
) -> tuple[tuple[int, int, int, int], ...]:  # (weights, F, C, kept per kernel)
    """``(weights, filters, channels, kept weights per kept kernel or 0 if dense)`` of every
    conv of ``model`` as ClickTrain prunes it (built once per model, on the meta device)."""
    import torch

    from impl.methods.clicktrain import prunable_layers
    from impl.models import create

    with torch.device("meta"):
        net = create(model, stem=stem, in_channels=in_channels)
    pruned = set(prunable_layers(net, pointwise))
    out = []
    for name, m in net.named_modules():
        if isinstance(m, torch.nn.Conv2d):
            f, c, r, s = m.weight.shape
            per_kernel = (4 if (r, s) == (3, 3) else 1) if name in pruned else 0
            out.append((m.weight.numel(), f, c, per_kernel))
    return tuple(out)


def compression_at(
    model: str,
    stem: str,
    connectivity: float,
    pointwise: bool = False,
    in_channels: int = 3,
    balanced: bool = True,
) -> float:
    """Conv compression (total / nonzero weights) of ``model`` once ClickTrain hard-prunes it
    at ``connectivity``: with the balanced ranking (the default) each pruned filter keeps ``C -
    removal_count(C, connectivity)`` kernels, with ``kernel_ranking="layer"`` (``balanced=False``)
    the layer keeps ``F*C - removal_count(F*C, connectivity)``; a kept 3x3 kernel keeps 4 of
    its 9 weights, a 1x1 one its weight; the other convs stay dense. Exact, from the shapes."""
    from impl.methods.clicktrain_patterns import removal_count

    total = nonzero = 0
    for weights, f, c, per_kernel in _conv_layers(model, stem, pointwise, in_channels):
        total += weights
        if not per_kernel:
            nonzero += weights
        elif balanced:
            nonzero += f * (c - removal_count(c, connectivity)) * per_kernel
        else:
            nonzero += (f * c - removal_count(f * c, connectivity)) * per_kernel
    return total / nonzero


def connectivity_for(
    model: str, stem: str, target: float, pointwise: bool = False, in_channels: int = 3
) -> float:
    """The connectivity (multiple of 1/400 in [0, 0.99]) at which ``model`` reaches conv
    compression ``target`` most closely (:func:`compression_at`; the lowest such). Raises
    ``ValueError`` when even the closest misses ``target`` by more than
    :data:`COMPRESSION_TOLERANCE` (a network whose dense layers cap its compression)."""
    reached = {
        c: compression_at(model, stem, c, pointwise, in_channels)
        for c in (i / 400 for i in range(0, 397))
    }
    best = min(reached, key=lambda c: abs(reached[c] - target))
    got = reached[best]
    if abs(got / target - 1) > COMPRESSION_TOLERANCE:
        raise ValueError(
            f"{model} cannot be hard-pruned to {target:g}x (closest: {got:.2f}x at "
            f"connectivity {best:g}{', 1x1 convs pruned too' if pointwise else ''})"
        )
    return best


def clicktrain_options(
    scale: str,
    train: dict[str, Any],
    setting: str,
    paper_model: str | None = None,
    dataset: str | None = None,
    stand_in: tuple[str, str] = STAND_IN,
) -> dict[str, Any]:
    """Options of a ClickTrain row at ``setting`` for the network ``train`` trains.

    The connectivity is the one at which that network reaches the paper's compression for
    the row (:func:`paper_compression` of ``paper_model`` on ``dataset``; at the smaller
    scales of the paper row the row stands for, ``stand_in``), so that accuracy is
    compared at the paper's compression; :data:`CONNECTIVITY` where the paper gives none. At
    paper scale a bottleneck ResNet's 1x1 convs are pruned too (``prune_pointwise``): its 3x3
    convs hold about half its conv weights, so pruning them alone compresses it at most 1.9x,
    against the paper's 4.1x (ImageNet ResNet-50) and 8.7-10.8x (CIFAR, Table 1). At paper
    scale the row also hard-prunes at its Table 1 epoch (:func:`paper_hard_prune_epoch`)."""
    from impl.config import resolve

    cfg = resolve(scale, **{k: v for k, v in train.items() if k in ("model", "stem", "data")})
    model, stem = cfg.model, cfg.stem
    options: dict[str, Any] = {}
    if scale == "paper":
        if has_bottlenecks(model, stem):
            options["prune_pointwise"] = True
        # Table 1 gives each row's epoch of hard pruning: a setting there
        hard = paper_hard_prune_epoch(paper_model or model, dataset or cfg.data, setting)
        if hard is not None:
            options["hard_prune_epoch"] = hard
        target = paper_compression(paper_model or model, dataset or cfg.data, setting)
    else:
        target = paper_compression(*stand_in, setting)
    if target is None:
        options["connectivity"] = CONNECTIVITY[setting]
    else:
        channels = 1 if cfg.data in ("digits", "mnist5k") else 3
        pointwise = bool(options.get("prune_pointwise"))
        options["connectivity"] = connectivity_for(model, stem, target, pointwise, channels)
    return dict(sorted(options.items()))


def train_for(scale: str, model: str | None = None, dataset: str = "cifar10") -> dict[str, Any]:
    """TrainConfig fields of a ClickTrain accuracy row: the scale's defaults at smoke/cpu,
    ResNet-32 on digits at gpu, the paper's 190 epochs (CIFAR, lr 0.1, batch 128) or 90
    (ImageNet, batch 64 per GPU) at paper. The learning-rate decay (CIFAR: from epochs 95
    and 142 counted from 1, see :func:`reproductions.common.cifar_step_recipe`; ImageNet: 30
    and 60) and ImageNet's weight decay 1e-4 are this project's choices: the text names
    neither. ``model`` is the
    paper's name; on CIFAR, its ResNet34 and ResNet50 train PruneTrain's CIFAR networks
    (:data:`CIFAR_MODELS`)."""
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
    """PruneTrain as ClickTrain's rows below paper scale compare with it (the paper's penalty
    ratio 0.2, mapped for the scale): :func:`reproductions.prunetrain.options` at ``scale``
    (at paper scale :func:`prunetrain_rows` trains PruneTrain's own protocol)."""
    from reproductions.prunetrain import options

    return options(scale, 0.2)


def prunetrain_rows(
    scale: str,
    model: str,
    dataset: str,
    train: dict[str, Any],
    tag: str,
    dense: str,
    needs: str | None,
) -> list[Row]:
    """The PruneTrain row of a Table 1 model and dataset (beside the paper's PRT numbers,
    which are PruneTrain's own). At paper scale it trains PruneTrain's protocol, with a dense
    baseline of that recipe (182 CIFAR epochs; ImageNet at batch 256, reconfiguration every 5
    epochs, and penalty ratio 0.25, the ratio of PruneTrain Table 1's ImageNet row these
    numbers are: -1.87, 60% / 47% FLOPs); below it, ClickTrain's rows' recipe ``train``
    beside their baseline ``dense``."""
    sel = {"model": model, "dataset": dataset, "method": "prunetrain"}
    if scale != "paper":
        return [Row(f"{tag}PruneTrain", "prunetrain", options=prunetrain_options(scale),
                    train=train, paper=sel, baseline=dense,
                    needs=needs)]  # fmt: skip
    from reproductions.prunetrain import pair

    ratio = 0.25 if dataset == "imagenet" else 0.2
    own_dense, pt = pair(scale, CIFAR_MODELS.get(model, model) if dataset != "imagenet"
                         else model, dataset, ratio=ratio, needs=needs)  # fmt: skip
    own_dense.label = f"{tag}dense (PruneTrain's recipe)"
    own_dense.paper, own_dense.metrics, own_dense.baseline = {}, None, None
    pt.label, pt.paper, pt.baseline = f"{tag}PruneTrain", sel, own_dense.label
    return [own_dense, pt]


def method_rows(scale: str, model: str, dataset: str, needs: str | None = None) -> list[Row]:
    """Dense, PruneTrain and ClickTrain (both compression levels) for one model and dataset,
    with the paper's selectors of Table 1."""
    train = train_for(scale, model, dataset)
    sel = {"model": model, "dataset": dataset}
    tag = "" if scale != "paper" else f"{model} {dataset} "
    dense = f"{tag}dense"
    rows = [
        Row(dense, "dense", train=train, needs=needs),
        *prunetrain_rows(scale, model, dataset, train, tag, dense, needs),
    ]
    settings = ["higher compression"] if dataset == "imagenet" else list(CONNECTIVITY)
    for setting in settings:
        sel_ct = {**sel, "method": "clicktrain"}
        if dataset != "imagenet":
            sel_ct["setting"] = setting
        rows.append(
            Row(f"{tag}ClickTrain ({setting})", "clicktrain",
                options=clicktrain_options(scale, train, setting, model, dataset), train=train,
                paper=sel_ct,
                baseline=dense, needs=needs)
        )  # fmt: skip
    return rows


def hard_prune_epoch(run: Any, base: Any = None) -> float | None:
    """The epoch stage 5 (hard pruning) began, from ClickTrain's summary."""
    click = run.summary.get("clicktrain") or {}
    start = (click.get("stage_start_epoch") or {}).get("sparse")
    return None if start is None else float(start)
