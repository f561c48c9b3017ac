"""Campfire's pruning masks: window, CK and combined for convolutions; block and fine for FC.

Gamboa et al., "Campfire: Compressible, Regularization-Free, Structured Sparse Training for
Hardware Accelerators" (2020), Sec. 2.1 and Appendix A (Algorithms 1, 3, 4). Every function
returns a boolean *keep*-mask shaped like the weight (``True`` keeps a weight) and never
modifies the weight. Ranking is by magnitude ``|w|`` of the values given, so weights already at
zero rank lowest and are pruned first; ties are broken by position (the lower flat index ranks
first, as in a stable sort), which makes every mask deterministic and the same on CPU and GPU.
Weights must be finite (no NaN): the selections compare values with ``<`` and ``==``.

Speed: these masks are recomputed whenever the target rises inside the pruning era (at one
step per era epoch under Campfire's default per-epoch target, after every step under
``schedule_every="step"``), so where only
"the n smallest (or largest)" of a set is needed the functions select rather than sort
(``torch.kthvalue`` finds the threshold, then ties at the threshold are taken by position):
exactly the set a stable sort would give, in linear rather than ``n log n`` time.

Counting rule: a layer of ``N`` weights at sparsity ``s`` prunes ``round_half_up(s * N)``
weights (``floor(s * N + 0.5)``): exactly for window pruning at its default layer rounding
(``rounding="kernel"`` counts per kernel instead) and for the FC layers (below it only where
the target exceeds what their protected weights allow: :func:`fc_mask`); combined pruning
meets it to within one kernel, never below it. CK pruning alone counts kernels, not
weights: it removes ``round_half_up(s * K*C)`` whole kernels (or ``round_half_up(s * K)``
per input channel), which can miss the weight count either way by up to half a kernel's
weights per ranking group.

Readings of the paper's garbled parts (see also docs/methods.md, "Campfire"):

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
    return weight.detach().abs().reshape(k * c, math.prod(weight.shape[2:]))


def _times(mask: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``values * mask`` (``values`` where kept, 0 elsewhere), via a free uint8 view of the
    bool mask: several times faster on a CPU than promoting the bool mask."""
    return values * mask.view(torch.uint8).to(values.dtype)


# Kernels of at most this many weights, in layers of at least this many kernels, are ranked by
# pairwise comparison (m * (m - 1) / 2 vector operations over all kernels) rather than by
# sorting every kernel; the same ranks, about 5x faster for 3x3 kernels on a CPU.
_PAIRWISE_MAX_WEIGHTS = 16
_PAIRWISE_MIN_KERNELS = 4096


def _pairwise(m: int, nk: int) -> bool:
    """Whether :func:`_ranks_t` ranks ``nk`` kernels of ``m`` weights pairwise."""
    return m <= _PAIRWISE_MAX_WEIGHTS and nk >= _PAIRWISE_MIN_KERNELS


def _kernels_t(weight: torch.Tensor) -> torch.Tensor:
    """``|w|`` as ``[R*S, K*C]``: one column per kernel; contiguous where :func:`_ranks_t`
    compares rows, else the transpose of contiguous rows (kernels) that it sorts."""
    if weight.dim() < 2:
        return _kernels(weight)  # raises the error
    nk, m = math.prod(weight.shape[:2]), math.prod(weight.shape[2:])
    if not _pairwise(m, nk):
        return _kernels(weight).t()
    at = torch.empty((m, nk), dtype=weight.dtype, device=weight.device)  # never the weight
    return torch.abs(weight.detach().reshape(nk, m).t(), out=at)  # one transposing pass


def _ranks_t(at: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each weight's rank in its kernel (a column of ``at``, ``[R*S, K*C]``), by decreasing value.

    0 is the largest; ties go to the lower row (position in the kernel) first: the ranks of
    ``argsort(at, dim=0, descending=True, stable=True)``, shaped like ``at``. Also that order
    itself as ``[K*C, R*S]`` where it was sorted, else ``None`` (ranked pairwise).
    """
    m, nk = at.shape
    if _pairwise(m, nk):
        rank = torch.zeros(m, nk, dtype=torch.uint8, device=at.device)
        # NaN ranks first, as the sort puts it (a comparison with NaN is False both ways, which
        # would give two weights one rank): only a diverged step makes one
        nan = at.isnan()
        nan = nan if bool(nan.any()) else None  # one pass over the layer, not two
        for j in range(1, m):
            for i in range(j):
                first = at[i] >= at[j]  # weight i ranks before weight j
                if nan is not None:
                    first |= nan[i]
                rank[j] += first.view(torch.uint8)
                rank[i] += (~first).view(torch.uint8)
        return rank, None
    a = at.t()  # rows are kernels: sort each one
    order = torch.argsort(a, dim=1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(m, device=at.device).expand_as(order))
    return rank.t(), order


# _select sorts at most _SORT_SMALL values; it narrows more than _SAMPLE_ABOVE values to a band
# around the threshold, read off a strided sample of at most _SAMPLE values, one in at least
# _SAMPLE_STRIDE (the band reaches _SAMPLE_MARGIN standard deviations of a sample quantile
# either side), before its kthvalue; in between it takes the kthvalue of all values.
_SORT_SMALL = 1024
_SAMPLE = 8192
_SAMPLE_STRIDE = 32
_SAMPLE_ABOVE = 32768
_SAMPLE_MARGIN = 6.0


def _take_ties(chosen: torch.Tensor, ties: torch.Tensor, k: int) -> torch.Tensor:
    """Mark the first ``k`` positions of ``ties`` (ascending positions) in ``chosen``."""
    chosen[ties[:k]] = True
    return chosen


def _select_sampled(values: torch.Tensor, n: int) -> torch.Tensor | None:
    """:func:`_select` through a band of ``values`` guessed from a strided sample.

    Every value at or below the sample's lower bound is chosen, the ``n``-th smallest is found
    by ``kthvalue`` among the values in the band up to the upper bound. ``None`` when the
    sample misses (the ``n``-th smallest lies outside the band): the caller searches all.
    """
    numel = values.numel()
    # odd: no aliasing with power-of-two channel counts
    stride = max(_SAMPLE_STRIDE, numel // _SAMPLE) | 1
    sample = torch.sort(values[::stride]).values
    s = sample.numel()
    pos = n * s / numel
    margin = math.ceil(_SAMPLE_MARGIN * math.sqrt(pos * (s - pos) / s)) + 1
    lo, hi = math.floor(pos) - margin, math.ceil(pos) + margin
    if lo < 0 and hi >= s:
        return None
    if lo >= 0:
        chosen = values <= sample[lo]
        n_below = int(torch.count_nonzero(chosen))
        if n_below >= n:  # the threshold is at most the lower bound
            chosen = values < sample[lo]
            n_below = int(torch.count_nonzero(chosen))
            if n_below >= n:
                return None
            ties = (values == sample[lo]).nonzero().squeeze(1)  # the threshold is the bound
            return _take_ties(chosen, ties, n - n_below)
        in_band = ~chosen
    else:
        chosen = torch.zeros(numel, dtype=torch.bool, device=values.device)
        n_below = 0
        in_band = torch.ones_like(chosen)
    if hi < s:
        in_band &= values <= sample[hi]
    band = in_band.nonzero().squeeze(1)
    if n_below + band.numel() < n:
        return None
    v = values[band]
    k = n - n_below
    thr = torch.kthvalue(v, k).values
    lt = v < thr
    chosen[band[lt]] = True
    ties = band[(v == thr).nonzero().squeeze(1)]
    return _take_ties(chosen, ties, k - int(torch.count_nonzero(lt)))


def _select(values: torch.Tensor, n: int) -> torch.Tensor:
    """Bool mask of the ``n`` smallest values of a 1-D tensor; ties go to the lowest positions.

    Exactly the set ``argsort(values, stable=True)[:n]`` (for the ``n`` largest, pass
    ``-values``: ``argsort(values, descending=True, stable=True)[:n]``). Values must not be NaN.
    A few values are sorted; else the threshold is ``torch.kthvalue`` of the values, or of a
    narrow band around it for large tensors (:func:`_select_sampled`); every value below it is
    chosen, and of the values equal to it the first ones by position until ``n`` are chosen.
    """
    numel = values.numel()
    if n <= 0:
        return torch.zeros(numel, dtype=torch.bool, device=values.device)
    if n >= numel:
        return torch.ones(numel, dtype=torch.bool, device=values.device)
    if numel <= _SORT_SMALL:
        chosen = torch.zeros(numel, dtype=torch.bool, device=values.device)
        chosen[torch.argsort(values, stable=True)[:n]] = True
        return chosen
    if numel > _SAMPLE_ABOVE:
        chosen = _select_sampled(values, n)
        if chosen is not None:
            return chosen
    thr = torch.kthvalue(values, n).values
    chosen = values < thr
    ties = (values == thr).nonzero().squeeze(1)
    return _take_ties(chosen, ties, n - int(torch.count_nonzero(chosen)))


def _select_dim0(values: torch.Tensor, n: int) -> torch.Tensor:
    """Bool mask of the ``n`` smallest entries of every column of a 2-D tensor (ties: lower row).

    Exactly the rows ``argsort(values, dim=0, stable=True)[:n]`` of each column.
    """
    rows = values.shape[0]
    if n <= 0 or n >= rows or values.numel() == 0:
        return torch.full_like(values, n >= rows, dtype=torch.bool)
    thr = torch.kthvalue(values, n, dim=0, keepdim=True).values
    below = values < thr
    eq = values == thr
    return below | (eq & (eq.cumsum(0) <= n - below.sum(0, keepdim=True)))


# Below this many items :func:`_weighted_prefix` sorts what is left instead of narrowing it.
_SORT_BELOW = 8192


def _sorted_prefix(score: torch.Tensor, weight: torch.Tensor, need: int) -> torch.Tensor:
    """:func:`_weighted_prefix` by a stable sort."""
    order = torch.argsort(score, stable=True)
    cum = weight[order].cumsum(0)
    j = int(torch.searchsorted(cum, torch.tensor(need, dtype=cum.dtype, device=cum.device)))
    chosen = torch.zeros(score.numel(), dtype=torch.bool, device=score.device)
    chosen[order[: j + 1]] = True
    return chosen


def _weighted_prefix(score: torch.Tensor, weight: torch.Tensor, need: int) -> torch.Tensor:
    """The shortest prefix of the stable ascending order of ``score`` whose ``weight`` sums to
    at least ``need`` (a bool mask over ``score``); all items when the weights sum to less.

    ``weight`` holds non-negative integers, ``need`` is positive. Among the items of positive
    weight, exactly those of ``order = argsort(score, stable=True)``,
    ``order[: searchsorted(cumsum(weight[order]), need) + 1]``. Items of weight 0 count for
    nothing, and whether one is chosen is left open: removing one changes nothing for the
    callers (a kernel the window emptied, a block without prunable weights). For many items
    the prefix is found by narrowing (it holds between ``ceil(r / max w)`` and
    ``ceil(r / min w)`` items of the ``r`` still needed; else bisection) and sorting only the
    last few thousand items.
    """
    if score.numel() <= _SORT_BELOW:
        return _sorted_prefix(score, weight, need)
    positive = weight > 0
    chosen = torch.zeros(score.numel(), dtype=torch.bool, device=score.device)
    idx = None  # positions (in score) of what is left; None: all of score
    s, w = score, weight
    if int(torch.count_nonzero(positive)) < score.numel():
        idx = positive.nonzero().squeeze(1)
        s, w = score[idx], weight[idx]
    r = int(need)
    while r > 0:
        m = s.numel()
        if m <= _SORT_BELOW:
            sel = _sorted_prefix(s, w, r)
            r = 0  # this is the rest of the prefix
        elif int(w.sum()) <= r:
            sel = torch.ones(m, dtype=torch.bool, device=s.device)
            r = 0
        else:
            lo, hi = torch.aminmax(w)
            k_lo = -(-r // int(hi))  # the prefix holds at least k_lo items ...
            k_hi = min(m, -(-r // int(lo)))  # ... and at most k_hi
            if max(m - k_hi, k_lo) * 2 >= m:  # one bound alone halves what is left
                n = k_lo if k_lo > m - k_hi else k_hi
            else:
                n = m // 2
            sel = _select(s, n)
            taken = int((w * sel.view(torch.uint8)).sum())
            if taken >= r and n > k_lo:  # the prefix ends inside these n items: search them
                left = sel.nonzero().squeeze(1)
                idx = left if idx is None else idx[left]
                s, w = s[left], w[left]
                continue
            r -= taken  # all n items are in the prefix (if n = k_lo, they are the prefix)
        if idx is None:
            chosen |= sel
        else:
            chosen[idx[sel]] = True
        if r <= 0:
            break
        left = (~sel).nonzero().squeeze(1)
        idx = left if idx is None else idx[left]
        s, w = s[left], w[left]
    return chosen


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
      per-kernel maximum is the ceiling), and the layer sparsity is exact. Above
      ``1 - 1 / (R*S)`` (88.9% for 3x3) the floor is 0: some kernels lose every weight (10%
      of them at 90%), which the paper's fixed per-kernel budget (Fig. 2a) never does.
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
    keep_t = _window_keep_t(_kernels_t(weight), s, rounding, max_nonzero)
    return keep_t.t().reshape(weight.shape).contiguous()


def _window_keep_t(
    at: torch.Tensor, s: float, rounding: str, max_nonzero: int | None
) -> torch.Tensor:
    """:func:`window_mask` of the kernels ``at = |w|`` as ``[R*S, K*C]``, shaped like ``at``."""
    m, nk = at.shape
    rank, order = _ranks_t(at)
    if rounding == "kernel":
        keep = rank < count_at(1.0 - s, m)
    else:
        n_keep = at.numel() - count_at(s, at.numel())
        lo, extra = divmod(n_keep, nk) if nk else (0, 0)
        keep = rank < lo
        if extra:
            # the kernels whose (lo+1)-th largest weight is among the extra largest keep it too
            if order is not None:  # sorted kernels: index them (fewer steps for small layers)
                pos = order[:, lo]  # position of each kernel's (lo+1)-th largest weight
                cand = at.gather(0, pos[None]).squeeze(0)  # its value
                if nk <= _SORT_SMALL:
                    win = torch.argsort(cand, descending=True, stable=True)[:extra]
                else:
                    win = _select(-cand, extra).nonzero().squeeze(1)
                keep.t()[win, pos[win]] = True
            else:
                nxt = rank == lo  # each kernel's (lo+1)-th largest weight
                small = torch.int16 if m < 2**15 else torch.int64
                pos = (
                    nxt.view(torch.uint8) * torch.arange(m, dtype=small, device=at.device)[:, None]
                )
                cand = at.gather(0, pos.sum(dim=0, dtype=small).long()[None]).squeeze(0)
                keep |= nxt & _select(-cand, extra)
    if max_nonzero is not None:
        keep &= rank < max_nonzero
    return keep


def kernel_scores(weight: torch.Tensor) -> torch.Tensor:
    """CK score of every kernel: ``max |w|`` over its R*S weights (Sec. 2.1.1), shape ``[K, C]``."""
    a = _kernels(weight)
    if a.shape[1] != 1:  # a kernel of one weight (1x1) is its own max
        a = a.amax(dim=1)
    return a.reshape(weight.shape[0], weight.shape[1])


def ck_mask(weight: torch.Tensor, sparsity: float, *, scope: str = "layer") -> torch.Tensor:
    """CK pruning (Sec. 2.1.1, Fig. 2b, Algorithm 1): remove whole kernels ranked by ``max |w|``.

    ``weight`` is ``[K, C, R, S]``; a kernel is one ``R x S`` slice ``w[k, c]`` and its score
    is this module's :func:`kernel_scores` (``max |w|``; not ClickTrain's Eq. (2) score of
    the same name, :func:`impl.methods.clicktrain.kernel_scores`). The ``round(s * K*C)``
    lowest-scoring kernels of the layer are removed (``scope="layer"``, default), or the
    ``round(s * K)`` lowest of each input channel (``scope="input_channel"``, Algorithm 1's
    loops). A 1x1 convolution is pruned by the same rule with single-weight kernels, which is
    magnitude pruning of its weights.

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
        keep_k = ~_select(flat, count_at(s, flat.numel())).reshape(k, c)
    else:
        keep_k = ~_select_dim0(score, count_at(s, k))
    return keep_k.reshape(k, c, *([1] * (weight.dim() - 2))).expand(weight.shape).clone()


def combined_mask(
    weight: torch.Tensor,
    sparsity: float,
    window_fraction: float = 0.8,
    *,
    rounding: str = "layer",
    max_nonzero: int | None = None,
    scope: str = "layer",
) -> torch.Tensor:
    """Combined pruning (Sec. 2.1.1, Appendix A, Algorithm 4 as the text describes it).

    First window pruning (:func:`window_mask`, with its ``rounding`` and ``max_nonzero``) at
    ``window_fraction * sparsity``; then CK
    pruning of the window-pruned weights removes whole kernels, ranked by the ``max |w|`` of
    what the window left, smallest first, until the layer reaches ``round(s * N)`` pruned
    weights (``scope="layer"``, default), or until each input channel reaches ``round(s * K
    * R * S)`` of its own (``scope="input_channel"``: Algorithm 4 calls Algorithm 1's CK
    routine, whose loops run over input channels). A kernel removed in the second phase holds
    several kept weights, so the CK phase takes the layer (or each input channel) past its
    target by less than one kernel. Per input channel the window phase can overshoot first,
    as its rounding comes before: with ``rounding="layer"`` its spare kept weights go to the
    layer's largest next weights, so a channel of small weights can lose several kernels'
    worth in the window phase alone; ``rounding="kernel"`` prunes every kernel alike, every
    channel by the same count (past a low target by its per-kernel rounding, up to half a
    weight a kernel).
    (Algorithm 4 as printed builds both masks with the CK routine at the full threshold and
    ANDs them; that is not what the text describes.)
    Under the max score the paper defines, the window phase changes how many weights each
    removed kernel frees, not which kernels go: they go in plain CK's order. Appendix A's
    "guides the subsequent CK pruning towards the less important kernels" would need another
    score (an L1 sum, say); this follows the definitions.

    Returns:
        Boolean keep-mask shaped like ``weight``.
    """
    s = _check_sparsity(sparsity)
    wf = _check_sparsity(window_fraction, "window_fraction")
    if scope not in CK_SCOPES:
        raise ValueError(f"unknown scope {scope!r}; valid: {', '.join(CK_SCOPES)}")
    at = _kernels_t(weight)
    keep = _window_keep_t(at, wf * s, rounding, max_nonzero)  # [R*S, K*C]
    if scope == "input_channel":
        _remove_kernels_per_input_channel(keep, at, weight.shape[0], s)
        return keep.t().reshape(weight.shape).contiguous()
    need = count_at(s, keep.numel()) - (keep.numel() - int(torch.count_nonzero(keep)))
    if need > 0:
        small = torch.int16 if keep.shape[0] < 2**15 else torch.int64
        kept = keep.view(torch.uint8).sum(dim=0, dtype=small)
        # max |w| of what the window kept: the window keeps each kernel's largest weights, so
        # that is the kernel's max |w| (where it kept nothing, the score does not matter)
        keep[:, _weighted_prefix(at.amax(dim=0), kept, need)] = False
    return keep.t().reshape(weight.shape).contiguous()


def _remove_kernels_per_input_channel(
    keep: torch.Tensor, at: torch.Tensor, k: int, sparsity: float
) -> None:
    """Combined pruning's CK phase per input channel, in place on ``keep`` (``[R*S, K*C]``,
    column ``k * C + c`` the kernel ``w[k, c]``; ``at`` its ``|w|``): in every input channel
    the kernels of smallest ``max |w|`` (stable order) are removed until the channel's pruned
    weights reach ``round(s * K * R * S)``, as :func:`_weighted_prefix` does for the layer."""
    rs = keep.shape[0]
    kept = keep.sum(dim=0).reshape(k, -1)  # [K, C] weights the window kept, per kernel
    need = count_at(sparsity, k * rs) - (k * rs - kept.sum(dim=0))  # [C] still to prune
    order = torch.argsort(at.amax(dim=0).reshape(k, -1), dim=0, stable=True)
    freed = kept.gather(0, order).cumsum(0)  # what removing the first j+1 kernels frees
    length = torch.where(need > 0, (freed < need).sum(dim=0) + 1, 0).clamp(max=k)
    first = torch.arange(k, device=keep.device).unsqueeze(1) < length  # sorted positions
    remove = torch.zeros_like(first).scatter_(0, order, first)
    keep[:, remove.reshape(-1)] = False


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
    n_live = int(torch.count_nonzero(live))
    need = count_at(s, a.numel()) - (a.numel() - n_live)
    if need <= 0:
        return keep
    all_live = n_live == a.numel()  # then the masked copies below equal ``a`` itself
    if all_live:
        rows = torch.arange(out_f, device=a.device)
        best = a.argmax(dim=1)
    else:
        rows = live.any(dim=1).nonzero().squeeze(1)
        best = a.masked_fill(~live, -1.0).argmax(dim=1)
    protected = torch.zeros_like(keep)
    protected[rows, best[rows]] = True
    prunable = live & ~protected

    if block > 1 and bf > 0:
        need_b = count_at(bf, need)
        ob, ib = -(-out_f // block), -(-in_f // block)
        pad = (0, ib * block - in_f, 0, ob * block - out_f)
        padded = any(pad)
        score = a if all_live else _times(live, a)
        if padded:
            score = torch.nn.functional.pad(score, pad)
        score = score.reshape(ob, block, ib, block).sum((1, 3))
        count = prunable.view(torch.uint8)  # per block, summed exactly in int16 (<= 16)
        if padded:
            count = torch.nn.functional.pad(count, pad)
        count = count.reshape(ob * block * ib, block).sum(dim=1, dtype=torch.int16)
        count = count.reshape(ob, block, ib).sum(dim=1, dtype=torch.int16).reshape(-1)
        if need_b > 0:
            removed = _weighted_prefix(score.reshape(-1), count, need_b)
            removed = removed.reshape(ob, 1, ib, 1).expand(ob, block, ib, block)
            removed = removed.reshape(ob * block, ib * block)[:out_f, :in_f]
            keep &= ~(removed & prunable)
    remaining = need - int(torch.count_nonzero(live & ~keep))
    if remaining > 0:
        cand = (prunable & keep).reshape(-1)
        vals = a.reshape(-1).masked_fill(~cand, float("inf"))
        n = min(remaining, int(torch.count_nonzero(cand)))
        keep.reshape(-1)[_select(vals, n)] = False
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
