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
    with pytest.raises(ValueError):
        sparsity.pattern_pool(0)
    every = sparsity.pattern_pool(126)  # C(9, 4): every 4-of-9 pattern once
    assert len({tuple(p.flatten().tolist()) for p in every}) == 126
    assert sparsity.pattern_pool(1).shape == (1, 3, 3)


@pytest.mark.parametrize(("rows", "cols"), [(0, 5), (5, 0)], ids=["no-rows", "no-cols"])
def test_row_uniform_mask_rejects_an_empty_matrix(rows, cols):
    with pytest.raises(ValueError, match=">= 1"):
        sparsity.row_uniform_mask(rows, cols, 0.5)
    assert sparsity.row_uniform_mask(1, 1, 0.5).tolist() == [[True]]  # at least one kept


def test_pattern_mask_draws_from_the_whole_pool():
    mask = sparsity.pattern_mask((256, 128, 3, 3), 0.75, seed=2)
    kept = mask.flatten(2)[mask.flatten(2).any(2)]
    used = {tuple(k.tolist()) for k in kept}
    assert used == {tuple(p.flatten().tolist()) for p in sparsity.pattern_pool(seed=2)}


@pytest.mark.parametrize(
    ("shape", "s"),
    [
        ((256, 128, 3, 3), 0.8444),
        ((37, 13, 3, 3), 0.9),
        ((8, 5, 3, 3), 5 / 9),
        ((6, 4, 3, 3), 0.99),
    ],
    ids=["paper-clicktrain", "odd", "patterns-only", "one-kernel-left"],
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
        ((8, 9, 3, 3), 5 / 9, "pattern"),
    ],
    ids=["pattern", "below-5/9", "pointwise", "dense", "at-5/9"],
)
def test_benchmark_mask_kind_and_shape(shape, s, kind):
    mask, got = sparsity.benchmark_mask(shape, s)
    assert got == kind and mask.shape == shape
    achieved = 1 - mask.float().mean().item()
    assert achieved == pytest.approx(s, abs=0.03)


@pytest.mark.parametrize(("cols", "requested"), [(9, 0.25), (10, 0.33), (7, 0.6)])
def test_row_uniform_mask_achieves_the_nearest_sparsity(cols, requested):
    mask = sparsity.row_uniform_mask(4, cols, requested)
    achieved = 1 - mask.float().mean().item()
    assert abs(achieved - requested) <= 0.5 / cols + 1e-9


def test_masks_draw_their_positions_per_row_not_one_layout_for_all():
    """The rows of a row-uniform mask keep different columns, and the filters of a pattern
    mask different kernels: a random unstructured layout, as a pruned layer's, not a column
    (channel) pruning that would give SpMM a structured access pattern."""
    rows = sparsity.row_uniform_mask(64, 128, 0.9, seed=0)
    assert len({tuple(r.nonzero().flatten().tolist()) for r in rows}) == 64
    covered = rows.any(dim=0).float().mean().item()
    assert covered > 0.9  # 64 rows of 13 random columns cover nearly all 128 (one layout: 10%)
    kept = sparsity.pattern_mask((64, 32, 3, 3), 0.9, seed=0).flatten(2).any(dim=2)  # [F, C]
    assert len({tuple(k.nonzero().flatten().tolist()) for k in kept}) == 64
    assert kept.any(dim=0).all()  # every input channel kept by some filter


def test_a_sparsity_that_is_not_a_number_is_refused():
    for bad in ("0.5", None):
        with pytest.raises(ValueError, match=r"\[0, 1\)"):
            sparsity.row_uniform_mask(4, 4, bad)
        with pytest.raises(ValueError, match=r"\[0, 1\)"):
            sparsity.benchmark_mask((4, 4, 3, 3), bad)


@pytest.mark.parametrize("shape", [(4, 4, 3, 1), (4, 4, 1, 3), (4, 4, 3, 5)])
def test_pattern_mask_needs_both_kernel_sides_3(shape):
    with pytest.raises(ValueError, match="3x3"):
        sparsity.pattern_mask(shape, 0.9)


def test_pattern_mask_refuses_a_sparsity_just_below_five_ninths():
    """5/9 = 0.5556 is the sparsity of a kernel keeping 4 of 9 positions: 0.55 is below it."""
    with pytest.raises(ValueError, match="sparsity >="):
        sparsity.pattern_mask((4, 4, 3, 3), 0.55)
    assert sparsity.pattern_mask((4, 4, 3, 3), 0.5556).sum().item() == 4 * 4 * 4  # all kept


def test_pattern_mask_nonzeros_hand_counted():
    """64 filters of 16 3x3 kernels at 90%: round(0.1 * 9 * 16 / 4) = round(3.6) = 4 kernels
    kept per filter, 4 positions each: 16 nonzeros per filter, 1024 of 9216 in all."""
    mask = sparsity.pattern_mask((64, 16, 3, 3), 0.9, seed=5)
    assert mask.sum().item() == 1024
    assert (mask.flatten(1).sum(1) == 16).all()


def test_pattern_pool_and_masks_follow_their_seed():
    def patterns(pool):
        return {tuple(p.flatten().tolist()) for p in pool}

    assert patterns(sparsity.pattern_pool(seed=0)) == patterns(sparsity.pattern_pool(seed=0))
    assert patterns(sparsity.pattern_pool(seed=0)) != patterns(sparsity.pattern_pool(seed=1))
    # the kept kernels of each filter, not only the patterns, change with the seed
    kept = [sparsity.pattern_mask((16, 32, 3, 3), 0.9, seed=s).flatten(2).any(2) for s in (1, 2)]
    assert not torch.equal(kept[0], kept[1])


def test_pattern_mask_draws_a_pattern_per_kernel_not_per_input_channel():
    """At 5/9 every kernel is kept; the 64 filters' kernels of one input channel draw their
    patterns on their own (64 draws of 12 patterns use far more than one)."""
    mask = sparsity.pattern_mask((64, 8, 3, 3), 5 / 9, seed=0).flatten(2)  # [F, C, 9]
    assert mask.sum().item() == 64 * 8 * 4
    for c in range(8):
        assert len({tuple(k.tolist()) for k in mask[:, c]}) > 6


def test_benchmark_mask_of_a_non_3x3_kernel_is_row_uniform():
    """A 3x1 kernel has no 4-of-9 pattern: each of the 4 filters keeps round(0.25 * 27) = 7
    of its 9 * 3 = 27 weights."""
    mask, kind = sparsity.benchmark_mask((4, 9, 3, 1), 0.75)
    assert kind == "row-uniform" and mask.shape == (4, 9, 3, 1)
    assert mask.flatten(1).sum(1).tolist() == [7, 7, 7, 7]


@pytest.mark.parametrize(("shape", "s"), [((8, 9, 3, 3), 0.75), ((16, 32, 1, 1), 0.5)])
def test_benchmark_mask_follows_its_seed(shape, s):
    one, _ = sparsity.benchmark_mask(shape, s, seed=1)
    assert torch.equal(one, sparsity.benchmark_mask(shape, s, seed=1)[0])
    assert not torch.equal(one, sparsity.benchmark_mask(shape, s, seed=2)[0])
