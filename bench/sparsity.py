"""Masks for the kernel benchmarks: what a layer's kept positions look like after pruning.

Two generators, both with the same number of kept weights in every filter (row) of the
``F x C*R*S`` filter matrix, since ClickTrain's SpMM kernel works on CSR rows of equal length
(Sec. 5.2) and layer-wise kernel pruning keeps the same number of kernels per filter:

* :func:`pattern_mask` (3x3 kernels, sparsity >= 5/9): ClickTrain after hard pruning
  (Sec. 4): each filter keeps ``round((1 - s) * C * 9 / 4)`` of its ``C`` kernels, and each
  kept kernel keeps 4 of its 9 positions, one of a pool of 12 patterns (the paper's
  number of candidate patterns, Sec. 4.2). Below 5/9 sparsity no 4-entry pattern mask exists.
* :func:`row_uniform_mask` (any shape or sparsity): ``round((1 - s) * K)`` random columns
  per row.

:func:`benchmark_mask` picks the pattern mask where it applies, the row-uniform one
otherwise. Draws come from an explicit seed.
"""

from __future__ import annotations

import math

import torch

PATTERN_SIZE = 4  # ClickTrain's patterns keep 4 of the 9 positions of a 3x3 kernel
POOL_SIZE = 12  # ClickTrain's number of candidate patterns (paper hyper-parameter)
PATTERN_MIN_SPARSITY = 1.0 - PATTERN_SIZE / 9.0


def _check_sparsity(sparsity: float) -> float:
    if not (isinstance(sparsity, int | float) and 0.0 <= sparsity < 1.0):
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity!r}")
    return float(sparsity)


def row_uniform_mask(rows: int, cols: int, sparsity: float, seed: int = 0) -> torch.Tensor:
    """Boolean ``[rows, cols]`` mask keeping ``max(1, round((1 - s) * cols))`` random columns
    in every row."""
    s = _check_sparsity(sparsity)
    if rows < 1 or cols < 1:
        raise ValueError(f"rows and cols must be >= 1, got {rows}, {cols}")
    keep = max(1, round((1.0 - s) * cols))
    gen = torch.Generator().manual_seed(seed)
    order = torch.rand(rows, cols, generator=gen).argsort(dim=1)
    mask = torch.zeros(rows, cols, dtype=torch.bool)
    mask.scatter_(1, order[:, :keep], True)
    return mask


def pattern_pool(size: int = POOL_SIZE, seed: int = 0) -> torch.Tensor:
    """``[size, 3, 3]`` boolean patterns, each keeping 4 of 9 positions, all distinct."""
    if not 1 <= size <= math.comb(9, PATTERN_SIZE):
        raise ValueError(f"pool size must be in [1, {math.comb(9, PATTERN_SIZE)}], got {size}")
    gen = torch.Generator().manual_seed(seed)
    seen: set[tuple[int, ...]] = set()
    pool = []
    while len(pool) < size:
        pos = tuple(sorted(torch.randperm(9, generator=gen)[:PATTERN_SIZE].tolist()))
        if pos in seen:
            continue
        seen.add(pos)
        p = torch.zeros(9, dtype=torch.bool)
        p[list(pos)] = True
        pool.append(p.view(3, 3))
    return torch.stack(pool)


def pattern_mask(shape: tuple[int, int, int, int], sparsity: float, seed: int = 0) -> torch.Tensor:
    """ClickTrain-style mask ``[F, C, 3, 3]``: kernel pruning plus 4-entry patterns.

    Every filter keeps ``k = max(1, round((1 - s) * 9 * C / 4))`` kernels (``k <= C``), each
    with a pattern drawn from :func:`pattern_pool`. The achieved sparsity is ``1 - 4k / (9C)``.
    Raises ValueError for a kernel that is not 3x3 or a sparsity below 5/9.
    """
    s = _check_sparsity(sparsity)
    f, c, r, q = shape
    if (r, q) != (3, 3):
        raise ValueError(f"pattern masks need 3x3 kernels, got {r}x{q}")
    if s < PATTERN_MIN_SPARSITY - 1e-9:
        raise ValueError(
            f"a 4-entry pattern mask has sparsity >= {PATTERN_MIN_SPARSITY:.4f}; got {s}"
        )
    keep = min(c, max(1, round((1.0 - s) * 9 * c / PATTERN_SIZE)))
    gen = torch.Generator().manual_seed(seed)
    pool = pattern_pool(seed=seed)
    kernels = torch.rand(f, c, generator=gen).argsort(dim=1)[:, :keep]
    kept = torch.zeros(f, c, dtype=torch.bool)
    kept.scatter_(1, kernels, True)
    choice = torch.randint(0, pool.shape[0], (f, c), generator=gen)
    return pool[choice] & kept[:, :, None, None]


def benchmark_mask(
    shape: tuple[int, ...], sparsity: float, seed: int = 0
) -> tuple[torch.Tensor, str]:
    """``(mask, kind)`` for a weight of ``shape`` at ``sparsity``: the pattern mask where it
    applies (4-D, 3x3, sparsity >= 5/9), else the row-uniform mask reshaped to ``shape``."""
    s = _check_sparsity(sparsity)
    if len(shape) == 4 and tuple(shape[2:]) == (3, 3) and s >= PATTERN_MIN_SPARSITY - 1e-9:
        return pattern_mask(tuple(shape), s, seed), "pattern"  # type: ignore[arg-type]
    rows, cols = shape[0], math.prod(shape[1:])
    return row_uniform_mask(rows, cols, s, seed).reshape(shape), "row-uniform"
