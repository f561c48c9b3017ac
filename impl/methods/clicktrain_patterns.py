"""ClickTrain's importance scores, dynamic pattern pool and adaptive finalization (Sec. 4.1-4.4).

Shapes: a conv weight ``W`` and its gradient ``G`` are ``[F, C, 3, 3]`` (filters, channels,
kernel rows, kernel columns). A *pattern* is a ``3 x 3`` boolean mask keeping 4 of the 9
positions of a kernel; positions are numbered row-major, ``p = 3*r + s``. There are
``C(9, 4) = 126`` patterns; :func:`all_patterns` lists them in lexicographic order of their
kept positions, and a pattern's *id* is its index in that list.

Importance (Sec. 4.1, after Molchanov et al.): a weight ``w`` with gradient ``g`` scores
``(g*w)^2``. A pattern scores the sum over its kept positions (Eq. 1), a kernel the sum over
all 9 positions (Eq. 2). The gradient is whatever is in ``.grad`` after ``backward`` of the
loss being trained (cross-entropy plus the method's penalty).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

KERNEL_SIZE = 3
"""Kernel side the pattern machinery works on (the paper demonstrates 3x3, Sec. 4.2)."""
KEEP = 4
"""Positions every pattern keeps (Sec. 2.1 and 4.2)."""
N_POSITIONS = KERNEL_SIZE * KERNEL_SIZE
N_PATTERNS = math.comb(N_POSITIONS, KEEP)  # 126
GROUP_LASSO_EPS = 1e-8
"""Added under each group's square root, as in the authors' public code."""


# -- importance (Sec. 4.1) ---------------------------------------------------------------------


def _check_pair(weight: torch.Tensor, grad: torch.Tensor) -> None:
    if weight.dim() != 4:
        raise ValueError(f"weight must be [F, C, R, S], got shape {tuple(weight.shape)}")
    if grad.shape != weight.shape:
        raise ValueError(f"grad {tuple(grad.shape)} must match weight {tuple(weight.shape)}")


def weight_importance(weight: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Per-weight importance ``(g*w)^2`` (Sec. 4.1), same shape as ``weight``."""
    _check_pair(weight, grad)
    return (grad * weight).square()


def pattern_scores(
    weight: torch.Tensor, grad: torch.Tensor, patterns: torch.Tensor
) -> torch.Tensor:
    """Importance of every pattern for every kernel, Eq. (1): ``sum_{r,s} (g*w*p)^2``.

    Args:
        weight: ``[F, C, R, S]`` conv weight.
        grad: its gradient, same shape.
        patterns: ``[P, R, S]`` masks (boolean or real-valued; a real ``p`` enters squared).

    Returns:
        ``[F, C, P]`` scores in the units of ``(gradient * weight)^2``, in the dtype of
        ``weight * grad``.
    """
    _check_pair(weight, grad)
    if patterns.dim() != 3 or patterns.shape[1:] != weight.shape[2:]:
        raise ValueError(
            f"patterns must be [P, {weight.shape[2]}, {weight.shape[3]}], "
            f"got {tuple(patterns.shape)}"
        )
    imp = weight_importance(weight, grad)
    p2 = patterns.to(device=imp.device, dtype=imp.dtype).square()
    return torch.einsum("fcrs,prs->fcp", imp, p2)


def kernel_scores(weight: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Importance of every kernel, Eq. (2): ``sum_{r,s} (g*w)^2``, shape ``[F, C]``, in the
    squared units of ``g*w`` (weight times its gradient); Sec. 4.1 of ClickTrain."""
    return weight_importance(weight, grad).sum(dim=(2, 3))


# -- the 126 patterns and the candidate rules of Sec. 4.2 --------------------------------------


def all_patterns(device: torch.device | str | None = None) -> torch.Tensor:
    """All ``C(9, 4) = 126`` 3x3 patterns that keep 4 positions: ``[126, 3, 3]`` bool.

    Pattern ``i`` keeps the positions ``itertools.combinations(range(9), 4)[i]`` (row-major).
    """
    out = torch.zeros(N_PATTERNS, N_POSITIONS, dtype=torch.bool)
    for i, combo in enumerate(itertools.combinations(range(N_POSITIONS), KEEP)):
        out[i, list(combo)] = True
    return out.view(N_PATTERNS, KERNEL_SIZE, KERNEL_SIZE).to(device)


def _neighbours(diagonal: bool) -> torch.Tensor:
    """``[9, 9]`` bool: ``n[a, b]`` when position ``b`` is adjacent to position ``a``."""
    n = torch.zeros(N_POSITIONS, N_POSITIONS, dtype=torch.bool)
    for a, b in itertools.product(range(N_POSITIONS), repeat=2):
        dr, ds = abs(a // 3 - b // 3), abs(a % 3 - b % 3)
        if a != b and dr <= 1 and ds <= 1 and (diagonal or dr + ds == 1):
            n[a, b] = True
    return n


NEIGHBOURS_8 = _neighbours(diagonal=True)
"""Horizontal, vertical and diagonal neighbours (step 2 of Sec. 4.2)."""
NEIGHBOURS_4 = _neighbours(diagonal=False)
"""Horizontal and vertical neighbours only (step 3: diagonals excluded on purpose)."""


def candidate_positions(first: int, second: int) -> list[int]:
    """Step 3 of Sec. 4.2: positions 4-adjacent to ``first`` or ``second``, minus those two."""
    cand = (NEIGHBOURS_4[first] | NEIGHBOURS_4[second]).clone()
    cand[[first, second]] = False
    return cand.nonzero().flatten().tolist()


def candidate_table() -> torch.Tensor:
    """``[81, 126]`` bool: which patterns are candidates for a (first, second) position pair.

    Row ``9*first + second`` marks the patterns made of ``first``, ``second`` and two of
    their :func:`candidate_positions` (step 4 of Sec. 4.2). Rows of pairs that are not
    8-adjacent are all False (step 2 never produces them).
    """
    ids = {combo: i for i, combo in enumerate(itertools.combinations(range(N_POSITIONS), KEEP))}
    table = torch.zeros(N_POSITIONS * N_POSITIONS, N_PATTERNS, dtype=torch.bool)
    for first, second in itertools.product(range(N_POSITIONS), repeat=2):
        if not NEIGHBOURS_8[first, second]:
            continue
        for extra in itertools.combinations(candidate_positions(first, second), KEEP - 2):
            table[N_POSITIONS * first + second, ids[tuple(sorted((first, second, *extra)))]] = True
    return table


_CANDIDATES = candidate_table()
_ALL_PATTERNS_FLAT = all_patterns().view(N_PATTERNS, N_POSITIONS)


def _check_3x3(weight: torch.Tensor) -> None:
    if weight.dim() != 4 or tuple(weight.shape[2:]) != (KERNEL_SIZE, KERNEL_SIZE):
        raise ValueError(f"pattern pruning needs 3x3 kernels, got weight {tuple(weight.shape)}")


def best_candidate_patterns(
    weight: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1 to 4 of Sec. 4.2 for every kernel of one layer, vectorised.

    1. the first position is the one of highest importance ``(g*w)^2``;
    2. the second is the most important of the first's 8 neighbours;
    3. the candidate positions are the 4-neighbours of the first two;
    4. of the patterns made of the first two plus two candidate positions, the one with the
       highest Eq. (1) score is the kernel's candidate pattern.

    Ties go to the lowest position / pattern id (``argmax`` order).

    Returns:
        ``(pattern_ids [F, C] int64, reachable [F, C, 3, 3] bool)``: the candidate pattern of
        each kernel and the positions some candidate pattern of that kernel can keep (the
        first two plus the candidate positions); the others can be penalised at once.
    """
    _check_3x3(weight)
    imp = weight_importance(weight, grad).flatten(2)  # [F, C, 9]
    device = imp.device
    first = imp.argmax(dim=-1)  # step 1
    nb8 = NEIGHBOURS_8.to(device)[first]  # [F, C, 9]
    second = imp.masked_fill(~nb8, float("-inf")).argmax(dim=-1)  # step 2
    allowed = _CANDIDATES.to(device)[N_POSITIONS * first + second]  # [F, C, 126], steps 3-4
    scores = imp @ _ALL_PATTERNS_FLAT.to(device=device, dtype=imp.dtype).t()  # Eq. (1)
    ids = scores.masked_fill(~allowed, float("-inf")).argmax(dim=-1)
    nb4 = NEIGHBOURS_4.to(device)
    reachable = nb4[first] | nb4[second]
    reachable.scatter_(-1, first.unsqueeze(-1), True)
    reachable.scatter_(-1, second.unsqueeze(-1), True)
    return ids, reachable.view(*first.shape, KERNEL_SIZE, KERNEL_SIZE)


class PatternPool:
    """Dynamic pattern pool generation (DPPG, Sec. 4.2, Fig. 6).

    Every call of :meth:`update` runs steps 1 to 4 on one layer's weights and gradients and
    adds 1 to the *competitive score* of each kernel's candidate pattern (a pattern enters
    the candidate pool with score 1 the first time it is chosen, step 4). Calls accumulate
    over the generation epochs (step 5; ClickTrain calls it for every prunable layer on
    every batch). :meth:`finalize` keeps the ``size`` patterns with the highest scores
    (step 6); ties go to the lower pattern id. If fewer than ``size`` distinct patterns were
    ever chosen, the pool holds only those.

    Args:
        size: number of patterns in the final pool, 1 to 126 (the paper uses 4, 8 or 12).
    """

    def __init__(self, size: int = 12) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= N_PATTERNS:
            raise ValueError(f"pool size must be an int in 1..{N_PATTERNS}, got {size!r}")
        self.size = size
        self.scores = torch.zeros(N_PATTERNS, dtype=torch.float64)
        self.pattern_ids: torch.Tensor | None = None

    def update(self, weight: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """Add one layer's candidate patterns to the competitive scores (steps 1-5).

        Returns the ``[F, C, 3, 3]`` reachable positions of each kernel (see
        :func:`best_candidate_patterns`). ``RuntimeError`` once the pool is finalized: its
        patterns are fixed, and a score added then would change nothing.
        """
        if self.pattern_ids is not None:
            raise RuntimeError("the pattern pool is finalized: update() no longer changes it")
        ids, reachable = best_candidate_patterns(weight, grad)
        counts = torch.bincount(ids.flatten(), minlength=N_PATTERNS)
        self.scores += counts.to(device="cpu", dtype=torch.float64)
        return reachable

    @property
    def finalized(self) -> bool:
        """Whether :meth:`finalize` has fixed the pool."""
        return self.pattern_ids is not None

    def finalize(self) -> torch.Tensor:
        """Fix the pool: the ``size`` patterns of highest competitive score (step 6).

        Returns ``[N, 3, 3]`` bool patterns, by decreasing score. Raises ``RuntimeError``
        when no candidate was ever added.
        """
        if not bool((self.scores > 0).any()):
            raise RuntimeError("the candidate pattern pool is empty: update() was never called")
        order = torch.argsort(-self.scores, stable=True)
        n = min(self.size, int((self.scores > 0).sum()))
        self.pattern_ids = order[:n].clone()
        return self.patterns()

    def patterns(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The final pool ``[N, 3, 3]`` bool (after :meth:`finalize`)."""
        if self.pattern_ids is None:
            raise RuntimeError("the pattern pool is not finalized yet")
        return all_patterns()[self.pattern_ids].to(device)

    def state_dict(self) -> dict[str, Any]:
        """Scores and final ids, as plain tensors."""
        return {
            "size": self.size,
            "scores": self.scores.clone(),
            "pattern_ids": None if self.pattern_ids is None else self.pattern_ids.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.size = int(state["size"])
        self.scores = state["scores"].to(torch.float64).cpu().clone()
        ids = state["pattern_ids"]
        self.pattern_ids = None if ids is None else ids.to(torch.int64).cpu().clone()


# -- adaptive finalization (Sec. 4.3) ----------------------------------------------------------


def removal_count(n: int, fraction: float) -> int:
    """How many of ``n`` kernels a connectivity ``fraction`` removes: ``round(fraction * n)``.

    Capped at ``n - 1`` so that at least one kernel is kept (per filter when balanced).
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"connectivity fraction must be in [0, 1), got {fraction}")
    return min(int(round(fraction * n)), max(n - 1, 0))


def rank_for_removal(
    primary: torch.Tensor, secondary: torch.Tensor | None, fraction: float, balanced: bool
) -> torch.Tensor:
    """Kernels to remove: ``[F, C]`` bool, the ``fraction`` that rank lowest.

    Kernels are ordered by ``primary`` ascending, ties broken by ``secondary`` ascending
    (then by index). ``balanced`` ranks within each filter (row), so every filter loses the
    same number of kernels and the sparse filter matrix has equal row lengths (the load
    balance of Sec. 5.2); otherwise the ranking is layer-wide.
    """
    if primary.dim() != 2:
        raise ValueError(f"scores must be [F, C], got {tuple(primary.shape)}")
    flat = primary if balanced else primary.reshape(1, -1)
    sec = None if secondary is None else (secondary if balanced else secondary.reshape(1, -1))
    k = removal_count(flat.shape[1], fraction)
    removed = torch.zeros_like(flat, dtype=torch.bool)
    if k > 0:
        order = torch.arange(flat.shape[1], device=flat.device).expand_as(flat)
        if sec is not None:
            order = torch.argsort(sec, dim=1, stable=True)
        key = torch.gather(flat, 1, order)
        order = torch.gather(order, 1, torch.argsort(key, dim=1, stable=True))
        removed.scatter_(1, order[:, :k], True)
    return removed.reshape(primary.shape)


class LayerFinalizer:
    """Adaptive pattern and kernel finalization of one layer (Sec. 4.3).

    On every counted batch each kernel's best pool pattern by Eq. (1) gets one occurrence,
    and each kernel that ranks in the layer's lowest ``fraction`` by Eq. (2) gets one
    removal vote (per filter when ``balanced``). Eq. (1) and Eq. (2) scores are also summed
    over every batch, counted or not, to break ties.

    Args:
        shape: ``(F, C)`` kernels of the layer.
        pool_size: number of patterns in the pool.
        fraction: connectivity sparsity, the fraction of kernels to remove.
        balanced: rank kernels per filter (equal row lengths) instead of layer-wide.
    """

    def __init__(
        self,
        shape: tuple[int, int],
        pool_size: int,
        fraction: float,
        balanced: bool = True,
        device: torch.device | str | None = None,
    ) -> None:
        removal_count(shape[1] if balanced else shape[0] * shape[1], fraction)  # validates
        self.fraction = fraction
        self.balanced = balanced
        self.pattern_counts = torch.zeros(*shape, pool_size, dtype=torch.int64, device=device)
        self.pattern_score_sum = torch.zeros(*shape, pool_size, dtype=torch.float64, device=device)
        self.kernel_votes = torch.zeros(*shape, dtype=torch.int64, device=device)
        self.kernel_score_sum = torch.zeros(*shape, dtype=torch.float64, device=device)
        self.batches = 0
        self.counted = 0

    def update(
        self, weight: torch.Tensor, grad: torch.Tensor, pool: torch.Tensor, count: bool
    ) -> None:
        """Score one batch; ``count`` is False on batches the loss margin skips."""
        p_scores = pattern_scores(weight, grad, pool).to(torch.float64)  # [F, C, N]
        k_scores = kernel_scores(weight, grad).to(torch.float64)  # [F, C]
        self.pattern_score_sum += p_scores
        self.kernel_score_sum += k_scores
        self.batches += 1
        if not count:
            return
        self.counted += 1
        best = p_scores.argmax(dim=-1, keepdim=True)
        self.pattern_counts.scatter_add_(-1, best, torch.ones_like(best))
        self.kernel_votes += rank_for_removal(k_scores, None, self.fraction, self.balanced)

    def final_patterns(self) -> torch.Tensor:
        """Each kernel's most frequent best pattern, ``[F, C]`` indices into the pool.

        Ties between equally frequent patterns go to the higher summed Eq. (1) score.
        """
        top = self.pattern_counts == self.pattern_counts.max(dim=-1, keepdim=True).values
        return self.pattern_score_sum.masked_fill(~top, float("-inf")).argmax(dim=-1)

    def removed_kernels(self) -> torch.Tensor:
        """Kernels marked for removal, ``[F, C]`` bool.

        The ``fraction`` of kernels with the most removal votes; ties go to the lower summed
        Eq. (2) score.
        """
        return rank_for_removal(
            -self.kernel_votes.to(torch.float64),
            self.kernel_score_sum,
            self.fraction,
            self.balanced,
        )

    def state_dict(self) -> dict[str, Any]:
        """Counters as tensors."""
        return {
            "fraction": self.fraction,
            "balanced": self.balanced,
            "pattern_counts": self.pattern_counts.cpu().clone(),
            "pattern_score_sum": self.pattern_score_sum.cpu().clone(),
            "kernel_votes": self.kernel_votes.cpu().clone(),
            "kernel_score_sum": self.kernel_score_sum.cpu().clone(),
            "batches": self.batches,
            "counted": self.counted,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (onto the current device)."""
        device = self.pattern_counts.device
        self.fraction = float(state["fraction"])
        self.balanced = bool(state["balanced"])
        for key in ("pattern_counts", "pattern_score_sum", "kernel_votes", "kernel_score_sum"):
            setattr(self, key, state[key].to(device).clone())
        self.batches = int(state["batches"])
        self.counted = int(state["counted"])


def loss_rose(prev_loss: float | None, loss: float, delta: float) -> bool:
    """Whether a batch is skipped by the loss margin ``delta`` (Sec. 4.3).

    The paper's text ("the loss in the previous batch divided by the value in the current
    batch is smaller than 0.0018") cannot be meant literally (it would need a 500-fold
    rise); read as a relative rise: skip when ``loss > prev_loss * (1 + delta)``. The first
    batch (no previous loss) is counted.
    """
    if prev_loss is None or not math.isfinite(prev_loss):
        return False
    return loss > prev_loss * (1.0 + delta)


def kernel_keep_mask(
    pool: torch.Tensor, chosen: torch.Tensor, removed: torch.Tensor
) -> torch.Tensor:
    """Final keep-mask ``[F, C, R, S]`` bool: each kernel's pool pattern, all-zero if removed."""
    device = removed.device
    mask = pool.to(device)[chosen.to(device)]  # [F, C, 3, 3]
    return mask & ~removed.unsqueeze(-1).unsqueeze(-1)


# -- modified group lasso (Sec. 4.4) -----------------------------------------------------------


def modified_group_lasso(
    weight: torch.Tensor, keep: torch.Tensor | None = None, removed: torch.Tensor | None = None
) -> torch.Tensor:
    """Modified group lasso of one layer (Sec. 4.4), without the coefficient.

    ``sum_kernels sqrt(sum of w^2 outside the kernel's kept positions + eps) +
    sum_removed_kernels sqrt(sum of w^2 + eps)``, the form of the authors' code
    (their public code), with ``eps = 1e-8``. Only the groups are penalised: weights inside a kept
    pattern of a kept kernel get no gradient.

    Args:
        weight: ``[F, C, R, S]``.
        keep: ``[F, C, R, S]`` bool, the positions not penalised (None: no pattern term).
        removed: ``[F, C]`` bool, the kernels penalised whole (None: no kernel term).
    """
    total = weight.new_zeros(())
    sq = weight.square()
    if keep is not None:
        outside = sq.masked_fill(keep, 0.0).sum(dim=(2, 3))
        total = total + (outside + GROUP_LASSO_EPS).sqrt().sum()
    if removed is not None and bool(removed.any()):
        whole = sq.sum(dim=(2, 3))[removed]
        total = total + (whole + GROUP_LASSO_EPS).sqrt().sum()
    return total
