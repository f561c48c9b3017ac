"""Tests of bench.sparsity: the masks of the kernel benchmarks."""

from __future__ import annotations

import pytest
import torch

from bench import sparsity


@pytest.mark.parametrize(
    ("rows", "cols", "s"),
    [(256, 1152, 0.75), (37, 117, 0.5), (7, 13, 0.95), (5, 3, 0.0)],
    ids=["paper", "odd", "prime-sparse", "dense"],
)
def test_row_uniform_mask_keeps_the_same_count_per_row(rows, cols, s):
    mask = sparsity.row_uniform_mask(rows, cols, s, seed=3)
    keep = max(1, round((1 - s) * cols))
    assert mask.dtype == torch.bool and mask.shape == (rows, cols)
    assert (mask.sum(dim=1) == keep).all()
    assert torch.equal(mask, sparsity.row_uniform_mask(rows, cols, s, seed=3))
    assert s == 0.0 or not torch.equal(mask, sparsity.row_uniform_mask(rows, cols, s, seed=4))


def test_pattern_pool_distinct_four_entry_patterns():
    pool = sparsity.pattern_pool()
    assert pool.shape == (12, 3, 3)
    assert (pool.flatten(1).sum(1) == 4).all()
    assert len({tuple(p.flatten().tolist()) for p in pool}) == 12
    with pytest.raises(ValueError):
        sparsity.pattern_pool(127)


@pytest.mark.parametrize(
    ("shape", "s"),
    [((256, 128, 3, 3), 0.8444), ((37, 13, 3, 3), 0.9), ((8, 5, 3, 3), 5 / 9)],
    ids=["paper-clicktrain", "odd", "patterns-only"],
)
def test_pattern_mask_kernels_and_patterns(shape, s):
    mask = sparsity.pattern_mask(shape, s, seed=1)
    f, c = shape[:2]
    per_kernel = mask.flatten(2).sum(2)
    assert set(per_kernel.unique().tolist()) <= {0, 4}
    kept = (per_kernel > 0).sum(1)
    expected = min(c, max(1, round((1 - s) * 9 * c / 4)))
    assert (kept == expected).all()
    assert 1 - mask.float().mean().item() == pytest.approx(1 - 4 * expected / (9 * c))


@pytest.mark.parametrize(
    ("shape", "s", "match"),
    [
        ((4, 4, 3, 3), 0.5, "sparsity >="),
        ((4, 4, 1, 1), 0.9, "3x3"),
        ((4, 4, 3, 3), 1.0, "\\[0, 1\\)"),
    ],
    ids=["too-dense", "not-3x3", "all-pruned"],
)
def test_pattern_mask_rejects(shape, s, match):
    with pytest.raises(ValueError, match=match):
        sparsity.pattern_mask(shape, s)


@pytest.mark.parametrize(
    ("shape", "s", "kind"),
    [
        ((256, 128, 3, 3), 0.75, "pattern"),
        ((256, 128, 3, 3), 0.5, "row-uniform"),
        ((64, 256, 1, 1), 0.9, "row-uniform"),
        ((37, 13, 3, 3), 0.0, "row-uniform"),
    ],
    ids=["pattern", "below-5/9", "pointwise", "dense"],
)
def test_benchmark_mask_kind_and_shape(shape, s, kind):
    mask, got = sparsity.benchmark_mask(shape, s)
    assert got == kind and mask.shape == shape
    achieved = 1 - mask.float().mean().item()
    assert achieved == pytest.approx(s, abs=0.03)
