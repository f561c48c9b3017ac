"""Each method's model in the state that its per-iteration cost is measured in.

The per-iteration benchmarks time a model *after* each method has done its structural work
(the state a long run spends most of its iterations in), built in seconds from a freshly
initialised :func:`impl.models.create` model rather than by training:

* ``dense``: the model as created.
* ``clicktrain``: after hard pruning (ClickTrain Sec. 4.3, 5.2): every 3x3 convolution with
  more than 3 input channels outside the shortcuts (the authors prune only those; the stem,
  shortcut convs and the classifier stay dense) becomes a :class:`impl.ops.PatternConv2d`
  whose forward and backward run as pattern SpMM on the im2col matrix. The mask prunes
  :data:`CLICKTRAIN_KERNEL_PRUNE` of each layer's kernels (the middle of the authors'
  per-layer ratios 55/65/75%) and keeps 4-entry patterns in the others, a weight sparsity of
  ``1 - 0.35 * 4/9 = 84.4%`` (above the paper's 65% threshold for the sparse forward).
* ``prunetrain``: after a reconfiguration (Lym et al. Sec. 4.2) that removed
  :data:`PRUNETRAIN_CHANNEL_PRUNE` of the channels inside every residual path (ResNets) and of
  every layer but the last (VGG): those channels are zeroed, as group lasso drives them, and
  :func:`impl.methods.prunetrain.reconfigure` makes the model physically smaller. The loss
  keeps the group-lasso term (coefficient :data:`PRUNETRAIN_LASSO_COEFF`, the authors' stored
  value for r = 0.2), so its forward and backward are timed too.
* ``sdgp``: :func:`impl.methods.sdgp.sdgp_convert` with 2:4 rescaled magnitude (the paper's
  default): backward prunes each conv's output gradient before the data gradient.
* ``campfire``: after the pruning era, masks fixed at the paper's 70% target sparsity
  (Campfire abstract and Sec. 4): the method's own hooks mask the gradients after backward
  and the weights and momentum after the step; convolutions stay dense.

Each state also gives the bytes a data-parallel step all-reduces (:func:`allreduce_payload`).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from bench import Unavailable
from bench.sparsity import pattern_mask

METHOD_STATES: tuple[str, ...] = ("dense", "clicktrain", "prunetrain", "sdgp", "campfire")

#: Fraction of kernels ClickTrain's kernel pruning removes per layer (authors: 55/65/75%).
CLICKTRAIN_KERNEL_PRUNE = 0.65
#: Weight sparsity of a ClickTrain layer: kernel pruning, then 4 of 9 positions kept.
CLICKTRAIN_SPARSITY = 1.0 - (1.0 - CLICKTRAIN_KERNEL_PRUNE) * 4.0 / 9.0
#: Fraction of the prunable channels removed before PruneTrain's reconfiguration: chosen
#: here, not read from the paper (how many channels a run removes depends on its training;
#: the rows say so in ``state_channel_prune_source``).
PRUNETRAIN_CHANNEL_PRUNE = 0.5
#: Group-lasso coefficient (the authors' stored value for CIFAR ResNet-32, penalty ratio 0.2).
PRUNETRAIN_LASSO_COEFF = 3.79e-4
#: SDGP's N:M setting and pruning function (the paper's default).
SDGP_N, SDGP_M, SDGP_METHOD = 2, 4, "rescaled"
#: Its backward: the pruning, then the same dense data-gradient GEMM as dense training.
SDGP_BACKEND = "reference"
#: Campfire's target sparsity (the paper's 70%).
CAMPFIRE_SPARSITY = 0.7


@dataclass
class MethodState:
    """A model in a method's post-pruning state, with the per-iteration work the method adds.

    Args:
        method: one of :data:`METHOD_STATES`.
        model: the network (on its device, training mode).
        regularizer: extra loss term added to the cross-entropy each iteration, or None.
        after_backward: the method's work between backward and the optimizer step, or None.
        after_step: the method's work after the optimizer step, or None.
        masks: parameter name -> boolean keep-mask of a parameter whose pruned positions stay
            zero (a sparse Allreduce sends only the kept values); other parameters are dense.
        cost: nominal :class:`impl.flops.LayerDensity` per module name, where the weights'
            nonzero fraction does not say what the method saves (SDGP's data gradient).
        info: description of the state (sparsity, channels, settings) for the result rows.
    """

    method: str
    model: nn.Module
    regularizer: Any = None
    after_backward: Any = None
    after_step: Any = None
    masks: dict[str, torch.Tensor] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def _import(module: str, *names: str) -> list[Any]:
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise Unavailable(f"{module} is not available in this build ({exc})") from exc
    missing = [n for n in names if not hasattr(mod, n)]
    if missing:
        raise Unavailable(f"{module} has no {', '.join(missing)} in this build")
    return [getattr(mod, n) for n in names]


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def _conv_sparsity(model: nn.Module) -> float:
    total = zeros = 0
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            total += m.weight.numel()
            zeros += int((m.weight.detach() == 0).sum())
    return zeros / max(total, 1)


# -- ClickTrain -------------------------------------------------------------------------------
def clicktrain_layers(model: nn.Module) -> list[str]:
    """Names of the convs ClickTrain pattern-prunes: 3x3, groups 1, > 3 inputs, not a shortcut."""
    return [
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.Conv2d)
        and tuple(m.kernel_size) == (3, 3)
        and m.groups == 1
        and m.in_channels > 3
        and "downsample" not in name.split(".")
    ]


def _clicktrain(model: nn.Module, seed: int) -> MethodState:
    (pattern_conv,) = _import("impl.ops", "PatternConv2d")
    names = clicktrain_layers(model)
    masks: dict[str, torch.Tensor] = {}
    for i, name in enumerate(names):
        conv = model.get_submodule(name)
        mask = pattern_mask(tuple(conv.weight.shape), CLICKTRAIN_SPARSITY, seed + i)
        new = pattern_conv.from_conv(conv, mask.to(conv.weight.device))
        _set_submodule(model, name, new)
        masks[f"{name}.weight"] = mask
    info = {
        "pattern_layers": len(names),
        "layer_sparsity": round(CLICKTRAIN_SPARSITY, 4),
        "kernel_prune": CLICKTRAIN_KERNEL_PRUNE,
    }
    return MethodState("clicktrain", model, masks=masks, info=info)


# -- PruneTrain -------------------------------------------------------------------------------
@torch.no_grad()
def _zero_channels(writer: nn.Conv2d, norm: nn.Module | None, reader: nn.Conv2d, idx) -> None:
    writer.weight[idx] = 0
    if writer.bias is not None:
        writer.bias[idx] = 0
    if isinstance(norm, nn.BatchNorm2d):
        norm.weight[idx] = 0
        norm.bias[idx] = 0
    reader.weight[:, idx] = 0


def prunable_spaces(model: nn.Module) -> list[tuple[nn.Conv2d, nn.Module | None, nn.Conv2d]]:
    """(writer conv, its BatchNorm, reader conv) of every channel space zeroed for PruneTrain.

    ResNets: the spaces inside each residual path (BasicBlock conv1->conv2; Bottleneck
    conv1->conv2 and conv2->conv3), never a stage's shared node. VGG: between consecutive
    convs of ``features``.
    """
    from impl.models.resnet import BasicBlock, Bottleneck
    from impl.models.vgg import VGG

    spaces = []
    for m in model.modules():
        if isinstance(m, BasicBlock):
            spaces.append((m.conv1, m.bn1, m.conv2))
        elif isinstance(m, Bottleneck):
            spaces += [(m.conv1, m.bn1, m.conv2), (m.conv2, m.bn2, m.conv3)]
        elif isinstance(m, VGG):
            layers = list(m.features)
            convs = [(i, x) for i, x in enumerate(layers) if isinstance(x, nn.Conv2d)]
            for (i, conv), (_, nxt) in zip(convs, convs[1:]):
                norm = layers[i + 1] if i + 1 < len(layers) else None
                spaces.append((conv, norm, nxt))
    return spaces


def _prunetrain(model: nn.Module, seed: int) -> MethodState:
    reconfigure, group_lasso = _import("impl.methods.prunetrain", "reconfigure", "group_lasso")
    spaces = prunable_spaces(model)
    if not spaces:
        raise Unavailable(f"no prunable channel space found in {type(model).__name__}")
    gen = torch.Generator().manual_seed(seed)
    for writer, norm, reader in spaces:
        c = writer.out_channels
        n = int(math.floor(PRUNETRAIN_CHANNEL_PRUNE * c))
        idx = torch.randperm(c, generator=gen)[:n].to(writer.weight.device)
        _zero_channels(writer, norm, reader, idx)
    params_before = sum(p.numel() for p in model.parameters())
    report = reconfigure(model, None, threshold=1e-4)
    params_after = sum(p.numel() for p in model.parameters())
    info = {
        "channel_prune": PRUNETRAIN_CHANNEL_PRUNE,
        "channel_prune_source": "chosen: half of every residual path's channels (or every "
        "VGG layer's but the last) at random, shared nodes kept; not a trained run's",
        "params_before": params_before,
        "params_after": params_after,
        "lasso_coeff": PRUNETRAIN_LASSO_COEFF,
    }
    for key in ("channels_before", "channels_after"):
        value = getattr(report, key, None)
        if isinstance(value, int):
            info[key] = value

    def regularizer(m: nn.Module) -> torch.Tensor:
        return PRUNETRAIN_LASSO_COEFF * group_lasso(m)

    return MethodState("prunetrain", model, regularizer=regularizer, info=info)


# -- SDGP -------------------------------------------------------------------------------------
def _sdgp(model: nn.Module) -> MethodState:
    (convert,) = _import("impl.methods.sdgp", "sdgp_convert")
    convert(model, n=SDGP_N, m=SDGP_M, method=SDGP_METHOD, backend=SDGP_BACKEND)
    converted = [n for n, m in model.named_modules() if type(m).__name__ == "SDGPConv2d"]
    cost = {}
    try:
        from impl.flops import LayerDensity

        cost = {n: LayerDensity(1.0, SDGP_N / SDGP_M, 1.0) for n in converted}
    except ImportError:  # nominal FLOPs then count the data gradient densely
        pass
    info = {
        "nm": f"{SDGP_N}:{SDGP_M}",
        "prune": SDGP_METHOD,
        "sdgp_layers": len(converted),
        # what the backward runs: the pruning, then the same dense data-gradient GEMM as
        # dense training, so the row cannot be faster than dense; the paper's saving is an
        # estimate for sparse hardware (bench.sdgp_semi times 2:4 sparse tensor cores)
        "backend": f"{SDGP_BACKEND}: N:M pruning, then a dense data-gradient GEMM",
    }
    return MethodState("sdgp", model, cost=cost, info=info)


# -- Campfire ---------------------------------------------------------------------------------
def _campfire(model: nn.Module, device: torch.device) -> MethodState:
    (campfire_cls,) = _import("impl.methods.campfire", "Campfire")
    (ctx_cls,) = _import("impl.methods.base", "TrainContext")
    method = campfire_cls(campfire_cls.Config(final_sparsity=CAMPFIRE_SPARSITY))
    for attr in ("update_masks", "setup", "after_backward", "after_step"):
        if not hasattr(method, attr):
            raise Unavailable(f"impl.methods.campfire.Campfire has no {attr} in this build")
    ctx = ctx_cls(model=model, optimizer=None, config=SimpleNamespace(epochs=90), device=device)
    method.setup(ctx)
    method.on_epoch_start(ctx)
    method.update_masks(model, CAMPFIRE_SPARSITY)
    method.fixed = True  # after the era: masks are fixed, only enforced
    mask_set = getattr(method, "masks", None)
    masks = {name: mask.clone() for name, mask in mask_set.items()} if mask_set is not None else {}

    def after_backward(optimizer: torch.optim.Optimizer | None) -> None:
        ctx.optimizer = optimizer
        method.after_backward(ctx)

    def after_step(optimizer: torch.optim.Optimizer | None) -> None:
        ctx.optimizer = optimizer
        method.after_step(ctx)

    info = {"target_sparsity": CAMPFIRE_SPARSITY, "masked_params": len(masks)}
    return MethodState(
        "campfire",
        model,
        after_backward=after_backward,
        after_step=after_step,
        masks=masks,
        info=info,
    )


def build_state(
    method: str,
    model_name: str,
    *,
    stem: str = "cifar",
    num_classes: int = 10,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> MethodState:
    """Build ``model_name`` (:func:`impl.models.create`) on ``device`` in ``method``'s state.

    Raises ValueError for an unknown method and :class:`bench.Unavailable` when a part the
    method needs is not in this build.
    """
    if method not in METHOD_STATES:
        raise ValueError(f"unknown method {method!r}; valid: {', '.join(METHOD_STATES)}")
    from impl.models import create

    device = torch.device(device)
    torch.manual_seed(seed)
    model = create(model_name, num_classes=num_classes, stem=stem).to(device).train()
    if method == "dense":
        state = MethodState("dense", model)
    elif method == "clicktrain":
        state = _clicktrain(model, seed)
    elif method == "prunetrain":
        state = _prunetrain(model, seed)
    elif method == "sdgp":
        state = _sdgp(model)
    else:
        state = _campfire(model, device)
    state.info.setdefault("conv_sparsity", round(_conv_sparsity(state.model), 4))
    return state


def allreduce_payload(state: MethodState, dense_model: nn.Module | None = None) -> dict[str, Any]:
    """Bytes of gradients one data-parallel step all-reduces, per rank, for ``state``.

    The payload is the sum over trainable parameters of the values sent times their element
    size: all values for a dense Allreduce; only the kept positions for a parameter with a
    mask in ``state.masks`` (the sparse Allreduce of fixed masks, ClickTrain Sec. 5.3: the
    positions are known to every rank, so no index travels). A ring Allreduce over ``p``
    ranks sends ``2 (p - 1) / p`` times the payload per rank. Buffers (BatchNorm statistics)
    are not all-reduced and not counted.

    Returns ``{"payload_bytes", "dense_bytes", "payload_fraction", "params_sent"}``, where
    ``dense_bytes`` is the payload of ``dense_model`` (default: the state's own model sent
    densely).
    """
    payload = 0
    sent = 0
    for name, p in state.model.named_parameters():
        if not p.requires_grad:
            continue
        mask = state.masks.get(name)
        n = p.numel() if mask is None else int(mask.sum())
        payload += n * p.element_size()
        sent += n
    reference = dense_model if dense_model is not None else state.model
    dense = sum(p.numel() * p.element_size() for p in reference.parameters() if p.requires_grad)
    return {
        "payload_bytes": int(payload),
        "dense_bytes": int(dense),
        "payload_fraction": payload / dense if dense else math.nan,
        "params_sent": int(sent),
    }
