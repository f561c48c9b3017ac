"""Campfire's pruning masks: window, CK and combined for convolutions; block and fine for FC.

Gamboa et al., "Campfire: Compressible, Regularization-Free, Structured Sparse Training for
Hardware Accelerators" (2020), Sec. 2.1 and Appendix A (Algorithms 1, 3, 4). Every function
returns a boolean *keep*-mask shaped like the weight (``True`` keeps a weight) and never
modifies the weight. Ranking is by magnitude ``|w|`` of the values given, so weights already at
zero rank lowest and are pruned first; ties are broken by position (stable sorts), which makes
every mask deterministic.

Counting rule, shared by all functions: a layer of ``N`` weights at sparsity ``s`` prunes
``round_half_up(s * N)`` weights (``floor(s * N + 0.5)``). Where whole kernels or blocks are
removed the count is met to within one kernel or block (never below it).

Readings of the paper's garbled parts (see also shared/PAPERS.md, "Campfire"):

* Algorithm 1 (CK) as printed computes, for each input channel ``c``, a cutoff over the ``K``
  kernels of that channel, with ``n = max(cutoff_index, size - max_non_zero - 1)`` and "the
  n-th *largest* value" as the cutoff; kept where ``kernel_max > cutoff``. Taken literally it
  would keep only the ``n`` largest kernels, the opposite of the text ("prune the smallest
  magnitude weights"). The intended rule: kernels are ranked by ``max |w|`` over their R*S
  weights and the smallest are removed. The text ranks "each layer individually" (Sec. 2.1),
  so :func:`ck_mask` ranks all ``K*C`` kernels of a layer together by default
  (``scope="layer"``); ``scope="input_channel"`` ranks the ``K`` kernels of each input channel
  separately, as the loops of Algorithm 1 do.
* Algorithm 3 (window) likewise cuts per kernel at "the n-th largest" value. Intended: inside
  each R x S kernel the largest ``|w|`` are kept, with at most a fixed number of nonzeros per
  kernel (Sec. 2.1.1: "we allow a maximum number of non-zero values for each kernel ... so
  that a hardware accelerator could allocate a fixed dataflow"). See :func:`window_mask` for
  the two roundings offered.
* Algorithm 4 (combined) builds both masks with the CK routine at the full threshold and ANDs
  them. The text (Sec. 2.1.1 and Appendix A) says window pruning at ``window_fraction`` (0.8)
  of the threshold first, then CK pruning "for the remaining fraction": :func:`combined_mask`
  does that, so the total reaches the threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

WINDOW_ROUNDINGS: tuple[str, ...] = ("layer", "kernel")
CK_SCOPES: tuple[str, ...] = ("layer", "input_channel")


# -- helpers ---------------------------------------------------------------------------------
def count_at(fraction: float, n: int) -> int:
    """``floor(fraction * n + 0.5)`` clipped to ``[0, n]``: how many of ``n`` items a fraction is.

    The small epsilon absorbs binary-float error (``0.7 * 10`` is ``7.000000000000001``).
    """
    return min(n, max(0, math.floor(fraction * n + 0.5 + 1e-9)))


def _check_sparsity(sparsity: float, name: str = "sparsity") -> float:
    if not isinstance(sparsity, int | float) or not 0.0 <= float(sparsity) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {sparsity!r}")
    return float(sparsity)


def _kernels(weight: torch.Tensor) -> torch.Tensor:
    """``|w|`` as ``[K*C, R*S]``: one row per kernel (a 2-D weight has kernels of one weight)."""
    if weight.dim() < 2:
        raise ValueError(
            f"a conv weight needs >= 2 dims [K, C, ...], got shape {tuple(weight.shape)}"
        )
    k, c = weight.shape[:2]
    return weight.detach().abs().reshape(k * c, -1)


def _ranks(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: indices by decreasing value (stable), and each entry's rank (0 = largest)."""
    order = torch.argsort(a, dim=1, descending=True, stable=True)
    rank = torch.empty_like(order)
    idx = torch.arange(a.shape[1], device=a.device).expand_as(order)
    rank.scatter_(1, order, idx)
    return order, rank


# -- convolutions ----------------------------------------------------------------------------
def window_mask(
    weight: torch.Tensor,
    sparsity: float,
    *,
    rounding: str = "layer",
    max_nonzero: int | None = None,
) -> torch.Tensor:
    """Window pruning (Sec. 2.1.1, Fig. 2a, Algorithm 3): keep the largest ``|w|`` in each kernel.

    ``weight`` is ``[K, C, R, S]`` (any ``R*S``; a 1x1 kernel has a single weight). Every kernel
    keeps at most a fixed number of its largest-magnitude weights:

    * ``rounding="layer"`` (default): the layer keeps ``n = N - round(s*N)`` weights, spread as
      evenly as integers allow: every kernel keeps its ``floor(n / (K*C))`` largest weights and
      the remaining ``n mod (K*C)`` slots go to the kernels whose next-largest weight is the
      largest. So each kernel holds ``floor`` or ``ceil`` of ``n / (K*C)`` nonzeros (the fixed
      per-kernel maximum is the ceiling), and the layer sparsity is exact.
    * ``rounding="kernel"``: every kernel keeps exactly ``k = round_half_up((1 - s) * R*S)``
      weights (the paper's fixed per-kernel budget, Fig. 2a keeps 4 of 9); the layer's sparsity
      is then ``1 - k / (R*S)``, which can miss the target by up to ``0.5 / (R*S)``.

    ``max_nonzero`` additionally caps the nonzeros per kernel (Algorithm 3's ``max_non_zero``),
    which raises the sparsity above the target when it binds.

    Returns:
        Boolean keep-mask shaped like ``weight``.
    """
    s = _check_sparsity(sparsity)
    if rounding not in WINDOW_ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; valid: {', '.join(WINDOW_ROUNDINGS)}")
    if max_nonzero is not None and max_nonzero < 0:
        raise ValueError(f"max_nonzero must be >= 0 or None, got {max_nonzero}")
    a = _kernels(weight)
    nk, m = a.shape
    order, rank = _ranks(a)
    if rounding == "kernel":
        keep = rank < count_at(1.0 - s, m)
    else:
        n_keep = a.numel() - count_at(s, a.numel())
        lo, extra = divmod(n_keep, nk) if nk else (0, 0)
        keep = rank < lo
        if extra:
            nxt = order[:, lo]  # position of each kernel's (lo+1)-th largest weight
            cand = a.gather(1, nxt[:, None]).squeeze(1)
            winners = torch.argsort(cand, descending=True, stable=True)[:extra]
            keep[winners, nxt[winners]] = True
    if max_nonzero is not None:
        keep &= rank < max_nonzero
    return keep.reshape(weight.shape)


def kernel_scores(weight: torch.Tensor) -> torch.Tensor:
    """CK score of every kernel: ``max |w|`` over its R*S weights (Sec. 2.1.1), shape ``[K, C]``."""
    a = _kernels(weight)
    return a.amax(dim=1).reshape(weight.shape[0], weight.shape[1])


def ck_mask(weight: torch.Tensor, sparsity: float, *, scope: str = "layer") -> torch.Tensor:
    """CK pruning (Sec. 2.1.1, Fig. 2b, Algorithm 1): remove whole kernels ranked by ``max |w|``.

    ``weight`` is ``[K, C, R, S]``; a kernel is one ``R x S`` slice ``w[k, c]`` and its score
    is :func:`kernel_scores`. The ``round(s * K*C)`` lowest-scoring kernels of the layer are
    removed (``scope="layer"``, default), or the ``round(s * K)`` lowest of each input channel
    (``scope="input_channel"``, Algorithm 1's loops). A 1x1 convolution is pruned by the same
    rule with single-weight kernels, which is magnitude pruning of its weights.

    Returns:
        Boolean keep-mask shaped like ``weight``; each kernel is wholly kept or wholly removed.
    """
    s = _check_sparsity(sparsity)
    if scope not in CK_SCOPES:
        raise ValueError(f"unknown scope {scope!r}; valid: {', '.join(CK_SCOPES)}")
    score = kernel_scores(weight)
    k, c = score.shape
    if scope == "layer":
        flat = score.reshape(-1)
        order = torch.argsort(flat, stable=True)
        keep_k = torch.ones_like(flat, dtype=torch.bool)
        keep_k[order[: count_at(s, flat.numel())]] = False
        keep_k = keep_k.reshape(k, c)
    else:
        order = torch.argsort(score, dim=0, stable=True)
        rank = torch.empty_like(order)
        rank.scatter_(0, order, torch.arange(k, device=score.device)[:, None].expand(k, c))
        keep_k = rank >= count_at(s, k)
    return keep_k.reshape(k, c, *([1] * (weight.dim() - 2))).expand(weight.shape).clone()


def combined_mask(
    weight: torch.Tensor,
    sparsity: float,
    window_fraction: float = 0.8,
    *,
    rounding: str = "layer",
) -> torch.Tensor:
    """Combined pruning (Sec. 2.1.1, Appendix A, Algorithm 4 as the text describes it).

    First window pruning (:func:`window_mask`) at ``window_fraction * sparsity``; then CK
    pruning of the window-pruned weights removes whole kernels, ranked by the ``max |w|`` of
    what the window left, smallest first, until the layer reaches ``round(s * N)`` pruned
    weights. A kernel removed in the second phase holds several kept weights, so the total can
    exceed the target by less than one kernel. (Algorithm 4 as printed builds both masks with
    the CK routine at the full threshold and ANDs them; that is not what the text describes.)

    Returns:
        Boolean keep-mask shaped like ``weight``.
    """
    s = _check_sparsity(sparsity)
    wf = _check_sparsity(window_fraction, "window_fraction")
    keep = window_mask(weight, wf * s, rounding=rounding)
    flat = keep.reshape(keep.shape[0] * keep.shape[1], -1).clone()
    need = count_at(s, flat.numel()) - int((~flat).sum())
    if need <= 0:
        return keep
    kept = flat.sum(dim=1)
    score = (_kernels(weight) * flat).amax(dim=1)
    order = torch.argsort(score, stable=True)
    cum = kept[order].cumsum(0)
    n_remove = int(torch.searchsorted(cum, torch.tensor(need, device=cum.device))) + 1
    flat[order[:n_remove]] = False
    return flat.reshape(weight.shape)


# -- fully connected layers ------------------------------------------------------------------
def fc_mask(
    weight: torch.Tensor,
    sparsity: float,
    *,
    block: int = 1,
    block_fraction: float = 1.0,
    dead_inputs: torch.Tensor | None = None,
) -> torch.Tensor:
    """FC pruning (Sec. 2.1.2, Fig. 2c/2d/3): dead inputs, then n x n blocks, then single weights.

    ``weight`` is ``[out_features, in_features]``. The layer prunes ``round(s * N)`` weights:

    1. Columns of ``dead_inputs`` (a bool vector over inputs; see
       :func:`classifier_feeds`) are pruned without being scored, and count towards the target.
    2. Each output neuron (row) keeps its largest-magnitude live weight: "every column in the
       weight matrix ... has at least one non-zero element" (the paper's figure stores the
       transpose). These protected weights are never pruned.
    3. Block pruning (``block`` = n in 2..4): the matrix is tiled by n x n blocks (the last row
       and column of blocks may be smaller), each scored by the sum of ``|w|`` of its live
       weights; blocks are removed, smallest score first, until ``round(block_fraction * r)``
       of the ``r`` weights still to prune are gone (to within one block). A removed block
       keeps its protected weights.
    4. Fine pruning: the remaining count is taken from the smallest live, unprotected weights
       of the whole layer ("we compare the magnitude of all the weights to each other").

    ``block=1`` is fine pruning only. When the target exceeds what steps 1-3 allow (more than
    ``N - out_features`` weights) every unprotected weight is pruned and the sparsity stays
    below the target.

    Returns:
        Boolean keep-mask shaped like ``weight``.
    """
    s = _check_sparsity(sparsity)
    bf = _check_sparsity(block_fraction, "block_fraction")
    if weight.dim() != 2:
        raise ValueError(f"an FC weight must be 2-D [out, in], got shape {tuple(weight.shape)}")
    if not isinstance(block, int) or not 1 <= block <= 4:
        raise ValueError(f"block must be an int in 1..4 (n < 5, Sec. 2.1.2), got {block!r}")
    out_f, in_f = weight.shape
    a = weight.detach().abs()
    live = torch.ones_like(a, dtype=torch.bool)
    if dead_inputs is not None:
        dead = dead_inputs.to(device=a.device, dtype=torch.bool).reshape(-1)
        if dead.numel() != in_f:
            raise ValueError(f"dead_inputs has {dead.numel()} entries, weight has {in_f} inputs")
        live[:, dead] = False
    keep = live.clone()
    need = count_at(s, a.numel()) - int((~live).sum())
    if need <= 0:
        return keep
    rows = live.any(dim=1).nonzero().squeeze(1)
    best = a.masked_fill(~live, -1.0).argmax(dim=1)
    protected = torch.zeros_like(keep)
    protected[rows, best[rows]] = True
    prunable = live & ~protected

    if block > 1 and bf > 0:
        need_b = count_at(bf, need)
        ob, ib = -(-out_f // block), -(-in_f // block)
        pad = (0, ib * block - in_f, 0, ob * block - out_f)
        score = torch.nn.functional.pad(a * live, pad).reshape(ob, block, ib, block).sum((1, 3))
        count = (
            torch.nn.functional.pad(prunable.to(a.dtype), pad)
            .reshape(ob, block, ib, block)
            .sum((1, 3))
            .reshape(-1)
        )
        order = torch.argsort(score.reshape(-1), stable=True)
        order = order[count[order] > 0]
        if need_b > 0 and order.numel():
            cum = count[order].cumsum(0)
            idx = int(
                torch.searchsorted(
                    cum, torch.tensor(float(need_b), dtype=cum.dtype, device=cum.device)
                )
            )
            removed = torch.zeros(ob * ib, dtype=torch.bool, device=a.device)
            removed[order[: idx + 1]] = True
            removed = removed.reshape(ob, 1, ib, 1).expand(ob, block, ib, block)
            removed = removed.reshape(ob * block, ib * block)[:out_f, :in_f]
            keep &= ~(removed & prunable)
    remaining = need - int((live & ~keep).sum())
    if remaining > 0:
        cand = (prunable & keep).reshape(-1)
        vals = a.reshape(-1).masked_fill(~cand, float("inf"))
        n = min(remaining, int(cand.sum()))
        idx = torch.argsort(vals, stable=True)[:n]
        keep.reshape(-1)[idx] = False
    return keep


# -- dead classifier inputs (Sec. 2.1.2, Fig. 3) ---------------------------------------------
_PASS_MODULES = (
    nn.AdaptiveAvgPool2d,
    nn.AvgPool2d,
    nn.MaxPool2d,
    nn.AdaptiveMaxPool2d,
    nn.Dropout,
    nn.Dropout2d,
    nn.Flatten,
    nn.Identity,
)
_PASS_FUNCTIONS = {
    torch.flatten,
    torch.nn.functional.adaptive_avg_pool2d,
    torch.nn.functional.avg_pool2d,
    torch.nn.functional.max_pool2d,
    torch.nn.functional.adaptive_max_pool2d,
    torch.nn.functional.dropout,
}
_RELU_FUNCTIONS = {torch.relu, torch.nn.functional.relu}
_PASS_METHODS = {"flatten", "view", "reshape", "contiguous"}


@dataclass(frozen=True)
class ClassifierFeed:
    """A linear layer that reads one convolution's output through zero-preserving steps only.

    Args:
        linear: qualified name of the ``nn.Linear``.
        conv: qualified name of the ``nn.Conv2d`` whose output channels it reads.
        steps: what lies between them, in forward order: ``("bn", name)`` (only right after the
            conv) and ``("relu", "")``; pooling, dropout and flattening change no constant's
            sign and are not listed.
    """

    linear: str
    conv: str
    steps: tuple[tuple[str, str], ...]


def classifier_feeds(model: nn.Module) -> list[ClassifierFeed]:
    """Find the linear layers whose inputs are one conv's output channels, by ``torch.fx``.

    A linear layer qualifies when the chain from a conv to it consists only of an optional
    BatchNorm right after the conv, ReLUs, pooling, dropout and flattening (VGG's classifier).
    Input feature ``i`` of such a layer then belongs to channel ``i // L`` of the conv, where
    ``L = in_features / out_channels`` (NCHW flattening). A chain through anything else (a
    residual addition, a concatenation, another linear layer) does not qualify: in a ResNet the
    classifier reads the sum of the last block's residual branch and its shortcut, so a removed
    filter does not silence a feature, and no ResNet classifier qualifies. A model that
    ``torch.fx`` cannot trace has no qualifying layer.
    """
    try:
        gm = torch.fx.symbolic_trace(model)
    except Exception:  # noqa: BLE001 - untraceable models simply get no dead-input rule
        return []
    modules = dict(gm.named_modules())
    feeds = []
    for node in gm.graph.nodes:
        if node.op != "call_module" or not isinstance(modules.get(node.target), nn.Linear):
            continue
        steps: list[tuple[str, str]] = []
        cur = node.args[0] if node.args else None
        conv = None
        while isinstance(cur, torch.fx.Node):
            if cur.op == "call_module":
                mod = modules.get(cur.target)
                if isinstance(mod, nn.Conv2d):
                    conv = cur.target
                    break
                if isinstance(mod, nn.ReLU):
                    steps.append(("relu", ""))
                elif isinstance(mod, nn.BatchNorm2d):
                    steps.append(("bn", cur.target))
                elif not isinstance(mod, _PASS_MODULES):
                    break
            elif cur.op == "call_function":
                if cur.target in _RELU_FUNCTIONS:
                    steps.append(("relu", ""))
                elif cur.target not in _PASS_FUNCTIONS:
                    break
            elif cur.op == "call_method":
                if cur.target == "relu":
                    steps.append(("relu", ""))
                elif cur.target not in _PASS_METHODS:
                    break
            else:
                break
            cur = cur.args[0] if cur.args else None
        if conv is None:
            continue
        steps.reverse()
        bns = [i for i, (kind, _) in enumerate(steps) if kind == "bn"]
        if bns and bns != [0]:  # BatchNorm only right after the conv
            continue
        out_channels = modules[conv].out_channels
        if modules[node.target].in_features % out_channels:
            continue
        feeds.append(ClassifierFeed(node.target, conv, tuple(steps)))
    return feeds


@torch.no_grad()
def dead_inputs(model: nn.Module, feed: ClassifierFeed) -> torch.Tensor:
    """Inputs of ``feed.linear`` that are exactly zero for every input image (Sec. 2.1.2, Fig. 3).

    Channel ``j`` of the conv is dead when every kernel of its filter ``j`` is zero *and* the
    constant the channel then carries is zero after the steps in between, in training mode and
    in eval mode: the conv gives its bias ``b_j`` (or 0); BatchNorm gives ``beta_j`` in
    training mode (a constant has zero batch variance) and
    ``(b_j - mean_j) / sqrt(var_j + eps) * gamma_j + beta_j`` with its running statistics in
    eval mode; ReLU clamps at 0. So behind BatchNorm and ReLU a channel is dead when its
    filter is zero and both constants are <= 0. Pooling, dropout and flattening keep a zero
    constant zero.

    Returns:
        Bool vector over ``in_features`` of the linear layer (``True`` = dead input).
    """
    conv = model.get_submodule(feed.conv)
    linear = model.get_submodule(feed.linear)
    w = conv.weight
    zero_filter = (w.reshape(w.shape[0], -1) == 0).all(dim=1)
    base = (
        conv.bias.detach()
        if conv.bias is not None
        else torch.zeros_like(zero_filter, dtype=w.dtype)
    )
    values = base[None, :]  # [possible constants, channels]
    for kind, name in feed.steps:
        if kind == "bn":
            bn = model.get_submodule(name)
            beta = bn.bias.detach() if bn.bias is not None else torch.zeros_like(base)
            gamma = bn.weight.detach() if bn.weight is not None else torch.ones_like(base)
            rows = [beta[None, :]]
            if bn.running_mean is not None and bn.running_var is not None:
                scale = gamma / torch.sqrt(bn.running_var + bn.eps)
                rows.append((values - bn.running_mean) * scale + beta)
            else:
                rows.append(beta[None, :].expand_as(values))
            values = torch.cat(rows)
        elif kind == "relu":
            values = values.clamp_min(0)
    dead_channel = zero_filter & (values == 0).all(dim=0)
    per_channel = linear.in_features // w.shape[0]
    return dead_channel.repeat_interleave(per_channel)


__all__ = [
    "CK_SCOPES",
    "ClassifierFeed",
    "WINDOW_ROUNDINGS",
    "ck_mask",
    "classifier_feeds",
    "combined_mask",
    "count_at",
    "dead_inputs",
    "fc_mask",
    "kernel_scores",
    "window_mask",
]
