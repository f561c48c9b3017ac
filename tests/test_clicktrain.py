"""ClickTrain's functions: Eq. (1) and (2), the pattern pool, finalization, lasso, schedule."""

from __future__ import annotations

import itertools

import pytest
import torch

from impl.config import TrainConfig
from impl.methods.clicktrain import (
    ClickTrain,
    ClickTrainConfig,
    PatternPool,
    kernel_scores,
    pattern_scores,
    resolve_schedule,
)
from impl.methods.clicktrain_patterns import (
    N_PATTERNS,
    LayerFinalizer,
    all_patterns,
    best_candidate_patterns,
    candidate_positions,
    candidate_table,
    kernel_keep_mask,
    loss_rose,
    modified_group_lasso,
    rank_for_removal,
    removal_count,
    weight_importance,
)

F64 = torch.float64
COMBOS = list(itertools.combinations(range(9), 4))
ODD_SHAPES = [(1, 1), (5, 3), (7, 11), (16, 16)]
ODD_IDS = ["1x1", "5x3", "7x11", "16x16"]


def _pair(shape, seed=0, dtype=F64):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(*shape, 3, 3, generator=gen, dtype=dtype)
    g = torch.randn(*shape, 3, 3, generator=gen, dtype=dtype)
    return w, g


# -- Eq. (1) and Eq. (2) ----------------------------------------------------------------------


@pytest.mark.parametrize("shape", ODD_SHAPES, ids=ODD_IDS)
@pytest.mark.parametrize("n_patterns", [1, 5, 126], ids=["P1", "P5", "P126"])
def test_pattern_scores_match_plain_loop(shape, n_patterns):
    w, g = _pair(shape, seed=n_patterns)
    patterns = all_patterns()[torch.randperm(N_PATTERNS)[:n_patterns]]
    scores = pattern_scores(w, g, patterns)
    assert scores.shape == (*shape, n_patterns)
    wl, gl, pl, sl = w.tolist(), g.tolist(), patterns.double().tolist(), scores.tolist()
    for f, c, p in itertools.product(range(shape[0]), range(shape[1]), range(n_patterns)):
        expected = 0.0
        for r, s in itertools.product(range(3), range(3)):
            t = gl[f][c][r][s] * wl[f][c][r][s] * pl[p][r][s]
            expected += t * t
        assert sl[f][c][p] == pytest.approx(expected, rel=1e-12, abs=1e-300)


def test_pattern_scores_real_valued_pattern_enters_squared():
    w, g = _pair((2, 3), seed=3)
    p = torch.rand(4, 3, 3, dtype=F64)
    expected = ((g * w).unsqueeze(2) * p).square().sum(dim=(-2, -1))
    torch.testing.assert_close(pattern_scores(w, g, p), expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("shape", ODD_SHAPES, ids=ODD_IDS)
def test_kernel_scores_match_plain_loop(shape):
    w, g = _pair(shape, seed=11)
    scores = kernel_scores(w, g)
    assert scores.shape == shape
    wl, gl, sl = w.tolist(), g.tolist(), scores.tolist()
    for f, c in itertools.product(range(shape[0]), range(shape[1])):
        expected = sum(
            (gl[f][c][r][s] * wl[f][c][r][s]) ** 2 for r, s in itertools.product(range(3), range(3))
        )
        assert sl[f][c] == pytest.approx(expected, rel=1e-12)


def test_scores_reject_bad_shapes():
    w, g = _pair((2, 3))
    with pytest.raises(ValueError, match="must match"):
        kernel_scores(w, g[:1])
    with pytest.raises(ValueError, match="patterns must be"):
        pattern_scores(w, g, torch.ones(4, 2, 2))
    with pytest.raises(ValueError, match=r"\[F, C, R, S\]"):
        kernel_scores(w[0], g[0])


# -- patterns and candidates (Sec. 4.2) -------------------------------------------------------


def test_all_patterns_are_126_distinct_and_keep_4_of_9():
    p = all_patterns()
    assert p.shape == (126, 3, 3) and p.dtype == torch.bool
    assert bool((p.flatten(1).sum(1) == 4).all())
    assert len({tuple(x.flatten().tolist()) for x in p}) == 126


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [(4, 1, [0, 2, 3, 5, 7]), (0, 1, [2, 3, 4]), (0, 4, [1, 3, 5, 7]), (8, 4, [1, 3, 5, 7])],
    ids=["center_top", "corner_edge", "corner_center", "corner_diag"],
)
def test_candidate_positions_are_4_neighbours_of_the_first_two(first, second, expected):
    assert candidate_positions(first, second) == expected


@pytest.mark.parametrize("pair", [(4, 1), (0, 1), (0, 4), (8, 4), (2, 6)], ids=str)
def test_candidate_table_row_holds_the_pair_and_two_of_its_candidates(pair):
    first, second = pair
    row = candidate_table()[9 * first + second]
    combos = list(itertools.combinations(range(9), 4))
    if abs(first // 3 - second // 3) > 1 or abs(first % 3 - second % 3) > 1:
        assert not bool(row.any())  # (2, 6) are not 8-adjacent: step 2 never yields them
        return
    cands = candidate_positions(first, second)
    expected = {
        combos.index(tuple(sorted((first, second, *extra))))
        for extra in itertools.combinations(cands, 2)
    }
    assert set(row.nonzero().flatten().tolist()) == expected


def test_weight_importance_is_gradient_times_weight_squared():
    w, g = _pair((3, 2))
    assert torch.equal(weight_importance(w, g), (g * w) ** 2)
    with pytest.raises(ValueError, match="must match"):
        weight_importance(w, g[:1])


def _plain_candidates(imp):
    """Steps 1-4 of Sec. 4.2 for one kernel's 9 importances, as a plain loop."""
    first = max(range(9), key=lambda p: (imp[p], -p))
    nb8 = [
        q
        for q in range(9)
        if q != first and abs(q // 3 - first // 3) <= 1 and abs(q % 3 - first % 3) <= 1
    ]
    second = max(nb8, key=lambda p: (imp[p], -p))

    def nb4(a):
        return {q for q in range(9) if abs(q // 3 - a // 3) + abs(q % 3 - a % 3) == 1}

    cands = sorted((nb4(first) | nb4(second)) - {first, second})
    best, best_score = None, -1.0
    combos = list(itertools.combinations(range(9), 4))
    for extra in itertools.combinations(cands, 2):
        combo = tuple(sorted((first, second, *extra)))
        score = sum(imp[p] for p in combo)
        pid = combos.index(combo)
        if score > best_score or (score == best_score and pid < best):
            best, best_score = pid, score
    return best, {first, second, *cands}


@pytest.mark.parametrize("shape", [(3, 5), (7, 2), (1, 13)], ids=["3x5", "7x2", "1x13"])
def test_best_candidate_patterns_match_plain_steps(shape):
    w, g = _pair(shape, seed=5)
    ids, reachable = best_candidate_patterns(w, g)
    imp = (w * g).square().flatten(2)
    for f, c in itertools.product(range(shape[0]), range(shape[1])):
        pid, reach = _plain_candidates(imp[f, c].tolist())
        assert int(ids[f, c]) == pid
        assert set(reachable[f, c].flatten().nonzero().flatten().tolist()) == reach


def test_best_candidate_pattern_on_a_crafted_kernel():
    imp = torch.tensor([0.0, 5.0, 0.0, 1.0, 9.0, 3.0, 0.5, 2.0, 8.0], dtype=F64)
    w = imp.sqrt().view(1, 1, 3, 3)
    g = torch.ones_like(w)
    ids, reachable = best_candidate_patterns(w, g)
    # first 4 (centre), second 8 (diagonal neighbour, 8.0 > 5.0), candidates 1 3 5 7:
    # the best two of them are 1 (5.0) and 5 (3.0)
    assert all_patterns()[ids[0, 0]].flatten().nonzero().flatten().tolist() == [1, 4, 5, 8]
    assert reachable[0, 0].flatten().nonzero().flatten().tolist() == [1, 3, 4, 5, 7, 8]


def _kept(pattern):
    return pattern.flatten().nonzero().flatten().tolist()


def test_second_position_is_an_8_neighbour_even_when_every_neighbour_scores_zero():
    # Only position 8 matters: its 8-neighbours 4, 5 and 7 all score zero, so the second
    # position is the lowest of them (4), never a zero-scoring non-neighbour such as 0.
    w = torch.zeros(2, 1, 3, 3, dtype=F64)
    w[0, 0, 2, 2] = 1.0
    g = torch.ones_like(w)  # kernel (1, 0) is all zero, as with a dead gradient
    ids, reachable = best_candidate_patterns(w, g)
    patterns = all_patterns()
    # first 8, second 4, candidates 1 3 5 7 (all tied at zero): the lowest pattern id
    assert _kept(patterns[ids[0, 0]]) == [1, 3, 4, 8]
    assert _kept(reachable[0, 0]) == [1, 3, 4, 5, 7, 8]
    # all zero: first 0, second 1 (its lowest 8-neighbour), candidates 2 3 4
    assert _kept(patterns[ids[1, 0]]) == [0, 1, 2, 3]
    assert _kept(reachable[1, 0]) == [0, 1, 2, 3, 4]


def test_best_candidate_patterns_reject_kernels_other_than_3x3():
    w = torch.ones(2, 3, 5, 5)
    with pytest.raises(ValueError, match="3x3"):
        best_candidate_patterns(w, w)
    with pytest.raises(ValueError, match="3x3"):
        PatternPool(4).update(w, w)


@pytest.mark.parametrize("size", [0, 127, -1, True, 4.0], ids=["zero", "127", "negative",
                                                                 "bool", "float"])  # fmt: skip
def test_pattern_pool_rejects_sizes_outside_1_to_126(size):
    with pytest.raises(ValueError, match="1..126"):
        PatternPool(size)


@pytest.mark.parametrize("size", [1, 4, 8, 12, 126], ids=["N1", "N4", "N8", "N12", "N126"])
def test_pattern_pool_keeps_top_n_distinct_4_of_9(size):
    pool = PatternPool(size)
    for seed in range(4):
        w, g = _pair((16, 16), seed=seed)
        pool.update(w, g)
    assert float(pool.scores.sum()) == 4 * 16 * 16  # one vote per kernel per update
    patterns = pool.finalize()
    n_distinct = int((pool.scores > 0).sum())
    assert patterns.shape[0] == min(size, n_distinct)
    assert bool((patterns.flatten(1).sum(1) == 4).all())
    assert len({tuple(p.flatten().tolist()) for p in patterns}) == patterns.shape[0]
    kept = pool.scores[pool.pattern_ids]
    dropped = pool.scores[[i for i in range(126) if i not in set(pool.pattern_ids.tolist())]]
    assert float(kept.min()) >= float(dropped.max())
    assert bool((kept[:-1] >= kept[1:]).all())  # by decreasing competitive score


def test_pattern_pool_with_fewer_candidates_than_size_and_resume():
    imp = torch.tensor([0.0, 5.0, 0.0, 1.0, 9.0, 3.0, 0.5, 2.0, 8.0], dtype=F64)
    w = imp.sqrt().view(1, 1, 3, 3).expand(3, 2, 3, 3).contiguous()
    pool = PatternPool(12)
    with pytest.raises(RuntimeError, match="empty"):
        pool.finalize()
    pool.update(w, torch.ones_like(w))
    assert pool.finalize().shape[0] == 1  # every kernel chose the same pattern
    with pytest.raises(RuntimeError, match="finalized"):  # it would change nothing
        pool.update(w, torch.ones_like(w))
    restored = PatternPool(4)
    restored.load_state_dict(pool.state_dict())
    assert restored.size == 12 and torch.equal(restored.patterns(), pool.patterns())
    single = PatternPool(4)  # one kernel's vote (a score of exactly 1) is a pool of one
    single.update(w[:1, :1].contiguous(), torch.ones(1, 1, 3, 3, dtype=F64))
    assert single.finalize().shape[0] == 1


def _kernel_choosing(first, second, extra):
    """A 3x3 kernel whose steps 1-4 pick ``first``, ``second`` and the two ``extra``."""
    imp = torch.zeros(9, dtype=F64)
    imp[first], imp[second], imp[extra[0]], imp[extra[1]] = 8.0, 4.0, 2.0, 1.0
    return imp.sqrt().view(3, 3)


def test_pattern_pool_breaks_competitive_score_ties_by_the_lower_pattern_id():
    a = (4, 1, (3, 5))  # keeps 1 3 4 5, chosen by three kernels
    once = [(8, 7, (5, 6)), (6, 3, (0, 7)), (0, 1, (2, 3)), (2, 5, (1, 8)), (4, 8, (5, 7))]
    kernels = [a, a, a, *once]
    w = torch.stack([_kernel_choosing(*k) for k in kernels]).unsqueeze(0)  # [1, 8, 3, 3]
    pool = PatternPool(3)
    pool.update(w, torch.ones_like(w))
    ids = [COMBOS.index(tuple(sorted((f, s, *e)))) for f, s, e in kernels]
    counts = {i: ids.count(i) for i in set(ids)}
    assert best_candidate_patterns(w, torch.ones_like(w))[0].flatten().tolist() == ids
    expected = sorted(counts, key=lambda i: (-counts[i], i))[:3]
    # (1,3,4,5) three times, then the lowest ids of the five tied at one: (0,1,2,3), (0,3,6,7)
    assert [COMBOS[i] for i in expected] == [(1, 3, 4, 5), (0, 1, 2, 3), (0, 3, 6, 7)]
    pool.finalize()
    assert pool.pattern_ids.tolist() == expected


def test_pattern_pool_state_dict_is_a_snapshot_later_updates_leave_alone():
    w = torch.stack([_kernel_choosing(4, 1, (3, 5))]).unsqueeze(0)
    pool = PatternPool(4)
    pool.update(w, torch.ones_like(w))
    state = pool.state_dict()
    before = state["scores"].clone()
    pool.update(w, torch.ones_like(w))
    assert torch.equal(state["scores"], before)
    assert float(pool.scores.sum()) == 2.0


# -- finalization (Sec. 4.3) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "fraction", "expected"),
    [(16, 0.75, 12), (13, 0.72, 9), (4, 0.99, 3), (7, 0.0, 0), (1, 0.5, 0), (1, 0.75, 0)],
    ids=["16_075", "13_072", "cap_keep_one", "none", "single", "single-kernel-always-kept"],
)
def test_removal_count(n, fraction, expected):
    assert removal_count(n, fraction) == expected


def test_removal_count_rejects_fraction_one():
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        removal_count(8, 1.0)


def test_removal_count_rejects_a_negative_fraction():
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        removal_count(8, -0.25)


@pytest.mark.parametrize("shape", [(7, 13), (16, 16), (3, 64)], ids=["7x13", "16x16", "3x64"])
def test_balanced_ranking_gives_equal_row_lengths(shape):
    scores = torch.rand(shape, dtype=F64)
    removed = rank_for_removal(scores, None, 0.72, balanced=True)
    kept = (~removed).sum(dim=1)
    assert bool((kept == shape[1] - removal_count(shape[1], 0.72)).all())
    # the removed ones are the lowest of their row
    for f in range(shape[0]):
        assert float(scores[f][removed[f]].max()) <= float(scores[f][~removed[f]].min())


def test_layer_wide_ranking_removes_the_lowest_of_the_layer():
    scores = torch.rand(7, 13, dtype=F64)
    removed = rank_for_removal(scores, None, 0.5, balanced=False)
    assert int(removed.sum()) == removal_count(7 * 13, 0.5)
    assert float(scores[removed].max()) <= float(scores[~removed].min())


def test_ranking_ties_go_to_the_secondary_key():
    primary = torch.zeros(1, 4, dtype=F64)
    secondary = torch.tensor([[3.0, 1.0, 2.0, 0.5]], dtype=F64)
    removed = rank_for_removal(primary, secondary, 0.5, balanced=True)
    assert removed.tolist() == [[False, True, False, True]]
    # Layer-wide: the secondary key breaks the ties across filters too (not row by row).
    primary = torch.zeros(2, 3, dtype=F64)
    secondary = torch.tensor([[5.0, 4.0, 3.0], [0.0, 1.0, 2.0]], dtype=F64)
    removed = rank_for_removal(primary, secondary, 0.5, balanced=False)
    assert removed.tolist() == [[False, False, False], [True, True, True]]


def test_ranking_ties_without_a_secondary_key_go_to_the_lower_index():
    # 40 equal scores: half go, and they are the first 20 (by index), in every filter
    removed = rank_for_removal(torch.zeros(3, 40, dtype=F64), None, 0.5, balanced=True)
    assert removed.tolist() == [[True] * 20 + [False] * 20] * 3
    removed = rank_for_removal(torch.zeros(2, 20, dtype=F64), None, 0.5, balanced=False)
    assert removed.tolist() == [[True] * 20, [False] * 20]


def test_ranking_ties_in_both_keys_go_to_the_lower_index():
    primary = torch.zeros(1, 40, dtype=F64)
    secondary = torch.ones(1, 40, dtype=F64)
    secondary[0, 30:] = 0.0  # the last ten rank lowest on the secondary key
    removed = rank_for_removal(primary, secondary, 0.5, balanced=True)
    # the ten of lower secondary score, then the first ten of the thirty tied ones
    assert removed.tolist() == [[True] * 10 + [False] * 20 + [True] * 10]


def test_loss_rose_margin():
    assert not loss_rose(None, 5.0, 0.0018)
    assert not loss_rose(1.0, 1.0018, 0.0018)
    assert loss_rose(1.0, 1.0019, 0.0018)
    assert not loss_rose(1.0, 0.5, 0.0018)
    # a relative rise at any loss scale, not an absolute one: 2.0 -> 2.003 is 0.15 %
    assert not loss_rose(2.0, 2.003, 0.0018) and loss_rose(0.5, 0.501, 0.0018)


def test_layer_finalizer_breaks_a_frequency_tie_by_the_summed_score():
    fin = LayerFinalizer((1, 2), 3, 0.5, balanced=True)
    fin.pattern_counts[0, 0] = torch.tensor([2, 2, 1])  # patterns 0 and 1 equally frequent
    fin.pattern_score_sum[0, 0] = torch.tensor([1.0, 3.0, 9.0])  # 2: best score, less often
    fin.pattern_counts[0, 1] = torch.tensor([1, 3, 3])
    fin.pattern_score_sum[0, 1] = torch.tensor([9.0, 4.0, 2.0])
    assert fin.final_patterns().tolist() == [[1, 1]]


def test_layer_finalizer_counts_only_counted_batches():
    pool = all_patterns()[:5]
    fin = LayerFinalizer((3, 4), 5, 0.5, balanced=True)
    w, g = _pair((3, 4), seed=1)
    fin.update(w, g, pool, count=True)
    w2, g2 = _pair((3, 4), seed=2)
    fin.update(w2, g2, pool, count=False)
    assert fin.batches == 2 and fin.counted == 1
    assert int(fin.pattern_counts.sum()) == 12
    best = pattern_scores(w, g, pool).argmax(-1)
    assert torch.equal(fin.final_patterns(), best)
    assert bool((fin.kernel_votes.sum(dim=1) == 2).all())  # 2 of 4 kernels per filter voted
    removed = fin.removed_kernels()
    assert bool(((~removed).sum(1) == 2).all())
    expected = rank_for_removal(kernel_scores(w, g), None, 0.5, True)
    assert torch.equal(removed, expected)


def test_layer_finalizer_sums_every_batch_and_breaks_a_vote_tie_by_the_lower_score():
    """Eq. (2) scores are summed over every batch, counted or not (the tie-break), and among
    kernels with equal removal votes the one of the lower summed score goes (Sec. 4.3)."""
    pool = all_patterns()[:5]
    fin = LayerFinalizer((3, 4), 5, 0.5, balanced=True)
    w, g = _pair((3, 4), seed=2)
    fin.update(w, g, pool, count=False)  # skipped by the loss margin: no vote, still summed
    assert fin.counted == 0 and int(fin.kernel_votes.sum()) == 0
    assert torch.allclose(fin.kernel_score_sum, kernel_scores(w, g).double())
    # every kernel tied at 0 votes: the summed score decides, lowest first
    assert torch.equal(
        fin.removed_kernels(), rank_for_removal(kernel_scores(w, g), None, 0.5, True)
    )
    tie = LayerFinalizer((1, 4), 5, 0.5, balanced=True)
    tie.kernel_votes[0] = torch.tensor([3, 3, 3, 1])  # three kernels tied for the two places
    tie.kernel_score_sum[0] = torch.tensor([5.0, 1.0, 2.0, 0.0])
    assert tie.removed_kernels().tolist() == [[False, True, True, False]]


def test_pattern_scores_of_skipped_batches_still_break_frequency_ties():
    pool = torch.zeros(2, 3, 3, dtype=torch.bool)
    pool[0].view(-1)[[0, 1, 2, 3]] = True
    pool[1].view(-1)[[5, 6, 7, 8]] = True
    fin = LayerFinalizer((1, 1), 2, 0.0)
    g = torch.ones(1, 1, 3, 3, dtype=F64)

    def batch(position, importance, count):
        w = torch.zeros(1, 1, 3, 3, dtype=F64)
        w.view(-1)[position] = importance**0.5
        fin.update(w, g, pool, count)

    batch(0, 1.0, True)  # pattern 0 best, scores 1
    batch(8, 4.0, True)  # pattern 1 best, scores 4: one occurrence each
    batch(0, 10.0, False)  # skipped by the loss margin, pattern 0 scores 10
    # summed over every batch: pattern 0 has 11, pattern 1 has 4
    assert fin.pattern_score_sum[0, 0].tolist() == pytest.approx([11.0, 4.0])
    assert fin.final_patterns().tolist() == [[0]]


def test_layer_finalizer_state_dict_is_a_snapshot_later_batches_leave_alone():
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(2, 4, 3, 3, generator=gen, dtype=F64)
    g = torch.randn(2, 4, 3, 3, generator=gen, dtype=F64)
    pool = all_patterns()[:3]
    fin = LayerFinalizer((2, 4), 3, 0.5, balanced=True)
    fin.update(w, g, pool, count=True)
    state = fin.state_dict()
    saved = {k: v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)}
    fin.update(w, g, pool, count=True)
    for key, value in saved.items():
        assert torch.equal(state[key], value), key
    assert int(fin.kernel_votes.sum()) == 2 * int(saved["kernel_votes"].sum())


def test_layer_finalizer_load_state_dict_restores_counters_and_ranking_options():
    pool = all_patterns()[:3]
    w, g = _pair((2, 4), seed=6)
    w[0] *= 0.01  # filter 0's kernels are all less important than filter 1's
    fin = LayerFinalizer((2, 4), 3, 0.5, balanced=False)
    fin.update(w, g, pool, count=True)
    fin.update(w, g, pool, count=False)
    restored = LayerFinalizer((2, 4), 3, 0.25, balanced=True)  # other options, overwritten
    restored.load_state_dict(fin.state_dict())
    assert (restored.batches, restored.counted) == (2, 1)
    assert (restored.fraction, restored.balanced) == (0.5, False)
    # layer-wide, half of the layer: the whole of filter 0
    assert restored.removed_kernels().tolist() == [[True] * 4, [False] * 4]
    assert torch.equal(restored.final_patterns(), fin.final_patterns())
    for finalizer in (fin, restored):
        finalizer.update(w, g, pool, count=True)
    assert restored.kernel_votes.tolist() == fin.kernel_votes.tolist() == [[2] * 4, [0] * 4]


def test_layer_finalizer_rejects_a_fraction_outside_0_to_1():
    for fraction in (1.0, -0.1):
        for balanced in (True, False):
            with pytest.raises(ValueError, match=r"\[0, 1\)"):
                LayerFinalizer((2, 4), 3, fraction, balanced=balanced)


def test_a_layer_wide_finalizer_votes_layer_wide():
    """``balanced=False`` (the authors' ``kernel_ranking="layer"``) ranks each batch's kernels
    over the whole layer: one filter may lose all its kernels, another none."""
    pool = all_patterns()[:5]
    w = torch.ones(2, 4, 3, 3)
    w[0] *= 0.01  # filter 0's kernels are all less important than filter 1's
    g = torch.ones(2, 4, 3, 3)
    fin = LayerFinalizer((2, 4), 5, 0.5, balanced=False)
    fin.update(w, g, pool, count=True)
    assert fin.kernel_votes.tolist() == [[1, 1, 1, 1], [0, 0, 0, 0]]
    assert fin.removed_kernels().tolist() == [[True] * 4, [False] * 4]


def test_final_kernels_are_all_zero_or_exactly_one_pool_pattern():
    pool = all_patterns()[[3, 40, 77, 101]]
    chosen = torch.randint(0, 4, (6, 5))
    removed = rank_for_removal(torch.rand(6, 5), None, 0.6, True)
    keep = kernel_keep_mask(pool, chosen, removed)
    for f, c in itertools.product(range(6), range(5)):
        k = keep[f, c]
        matches = [i for i in range(4) if torch.equal(k, pool[i])]
        assert (not k.any()) if removed[f, c] else matches == [int(chosen[f, c])]


# -- modified group lasso (Sec. 4.4) ----------------------------------------------------------


def test_modified_group_lasso_matches_loop_and_spares_kept_weights():
    w, _ = _pair((3, 4), seed=9)
    w.requires_grad_(True)
    pool = all_patterns()[[0, 50, 100]]
    chosen = torch.randint(0, 3, (3, 4))
    keep = pool[chosen]
    removed = torch.zeros(3, 4, dtype=torch.bool)
    removed[1, 2] = removed[2, 0] = True
    value = modified_group_lasso(w, keep, removed)
    expected = 0.0
    for f, c in itertools.product(range(3), range(4)):
        outside = float((w[f, c] * ~keep[f, c]).square().sum().detach())
        expected += (outside + 1e-8) ** 0.5
        if removed[f, c]:
            expected += (float(w[f, c].square().sum().detach()) + 1e-8) ** 0.5
    assert value.item() == pytest.approx(expected, rel=1e-12)
    value.backward()
    protected = keep & ~removed.unsqueeze(-1).unsqueeze(-1)
    assert torch.count_nonzero(w.grad[protected]) == 0
    assert bool((w.grad[~keep] != 0).all())


# -- schedule and validation ------------------------------------------------------------------


def test_default_schedule_for_30_and_190_epochs():
    s30 = resolve_schedule(ClickTrainConfig(), 30)
    assert (s30.max_dense_epochs, s30.pool_epochs, s30.finalize_epochs) == (8, 2, 2)
    assert s30.hard_prune_epoch == 15
    s190 = resolve_schedule(ClickTrainConfig(), 190)
    assert (s190.pool_epochs, s190.finalize_epochs, s190.hard_prune_epoch) == (10, 10, 95)
    s3 = resolve_schedule(ClickTrainConfig(), 3)  # stage 1 gives way to stage 4's one epoch
    assert (s3.max_dense_epochs, s3.pool_epochs, s3.finalize_epochs, s3.hard_prune_epoch) == (
        0,
        1,
        1,
        3,
    )
    # however long stage 1 runs, stage 4 (the modified group lasso) keeps an epoch: the cpu
    # scale's 8 epochs had none when stage 1 ran to its cap
    for epochs in range(3, 41):
        s = resolve_schedule(ClickTrainConfig(), epochs)
        stages_1_to_3 = s.max_dense_epochs + s.pool_epochs + s.finalize_epochs
        assert s.hard_prune_epoch - stages_1_to_3 >= 1, epochs
    s44 = resolve_schedule(ClickTrainConfig(), 44)  # 5% of 44 = 2.2: half up, not up
    assert (s44.pool_epochs, s44.finalize_epochs) == (2, 2)
    s8 = resolve_schedule(ClickTrainConfig(), 8)
    assert (s8.max_dense_epochs, s8.pool_epochs, s8.finalize_epochs, s8.hard_prune_epoch) == (
        1,
        1,
        1,
        4,
    )
    s2 = resolve_schedule(ClickTrainConfig(), 2)  # the smoke preset: no stage 1
    assert (s2.max_dense_epochs, s2.pool_epochs, s2.finalize_epochs, s2.hard_prune_epoch) == (
        0,
        1,
        1,
        2,
    )


@pytest.mark.parametrize(
    ("options", "epochs", "stage4"),
    [({"dense_epochs": 12}, 30, 1), ({"dense_epochs": 75}, 190, 1),
     ({"max_dense_epochs": 12}, 30, 1), ({"dense_epochs": 3}, 8, 1),
     ({"dense_epochs": 0}, 8, 2), ({"dense_epochs": 2}, 30, 9),
     ({"dense_epochs": 6}, 8, 0)],  # 6 + 1 + 1 fill the run: no room for stage 4
)  # fmt: skip
def test_a_set_stage_1_leaves_stage_4_an_epoch_where_the_run_has_room(options, epochs, stage4):
    """dense_epochs=12 of 30 (or max_dense_epochs=12, when stage 1 ran to it) put hard
    pruning right after finalization: no epoch of the modified group lasso (Sec. 4.4)."""
    s = resolve_schedule(ClickTrainConfig(**options), epochs)
    assert s.hard_prune_epoch - (s.max_dense_epochs + s.pool_epochs + s.finalize_epochs) == stage4
    assert s.hard_prune_epoch <= epochs


@pytest.mark.parametrize(
    ("options", "epochs", "match"),
    [
        ({"hard_prune_epoch": 5, "dense_epochs": 3, "pool_epochs": 2}, 30, "after finalization"),
        ({"hard_prune_epoch": 31}, 30, "after the end of training"),
        ({}, 1, "does not fit in 1 epochs"),
        ({"dense_epochs": 2}, 3, "does not fit in 3 epochs"),
        ({"pool_epochs": 0}, 30, "pool_epochs must be >= 1"),
        ({"dense_epochs": -1}, 30, "dense_epochs must be >= 0"),
    ],
    ids=[
        "prune_before_finalize",
        "prune_after_end",
        "too_short",
        "fixed_dense_too_long",
        "zero_pool",
        "negative_dense",
    ],
)
def test_inconsistent_schedule_raises(options, epochs, match):
    with pytest.raises(ValueError, match=match):
        resolve_schedule(ClickTrainConfig(**options), epochs)


def test_hard_pruning_may_come_right_when_finalization_ends_but_not_before():
    """Stages 1-3 of 2 + 1 + 1 epochs end at epoch 4: hard pruning at 4 fits, at 3 does not."""
    options = {"dense_epochs": 2, "pool_epochs": 1, "finalize_epochs": 1}
    s = resolve_schedule(ClickTrainConfig(**options, hard_prune_epoch=4), 10)
    assert (s.max_dense_epochs, s.pool_epochs, s.finalize_epochs, s.hard_prune_epoch) == (
        2,
        1,
        1,
        4,
    )
    with pytest.raises(ValueError, match="end at epoch 4, after hard_prune_epoch=3"):
        resolve_schedule(ClickTrainConfig(**options, hard_prune_epoch=3), 10)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"pool_size": 0}, "pool_size"),
        ({"pool_size": 127}, "pool_size"),
        ({"connectivity": 1.0}, "connectivity"),
        ({"kernel_ranking": "global"}, "kernel_ranking"),
        ({"sparse_impl": "triton"}, "sparse_impl"),
        ({"loss_margin": -0.1}, "loss_margin"),
        ({"penalty": float("nan")}, "penalty"),
        ({"loss_derivative_threshold": 0.0}, "loss_derivative_threshold"),
        ({"sparse_threshold": 1.5}, "sparse_threshold"),
        ({"hard_prune_epoch": 2, "dense_epochs": 2}, "hard pruning must come after"),
    ],
    ids=[
        "pool0",
        "pool127",
        "conn1",
        "ranking",
        "impl",
        "margin",
        "penalty_nan",
        "threshold",
        "sparse_threshold",
        "schedule",
    ],
)
def test_validate_rejects_bad_options(options, match):
    method = ClickTrain(ClickTrainConfig(**options))
    with pytest.raises(ValueError, match=match):
        method.validate(TrainConfig(model="resnet20", epochs=30))


@pytest.mark.parametrize("model", ["resnet20", "vgg11", "resnet50"], ids=["r20", "vgg11", "r50"])
def test_validate_accepts_real_models_and_pool_bounds(model):
    for size in (1, 126):
        ClickTrain(ClickTrainConfig(pool_size=size)).validate(TrainConfig(model=model, epochs=30))


def test_validate_refuses_cuda_pattern_convs_where_they_cannot_run(monkeypatch):
    """sparse_impl='cuda' is refused before training, not at hard pruning half-way through."""
    method = ClickTrain(ClickTrainConfig(sparse_impl="cuda"))
    with pytest.raises(ValueError, match="sparse_impl='cuda' cannot run here: the run trains on"):
        method.validate(TrainConfig(model="resnet20", epochs=30, device="cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"the run trains on the CPU \(--device auto\)"):
        method.validate(TrainConfig(model="resnet20", epochs=30, device="auto"))


def test_validate_refuses_the_compiled_cpu_conv_where_it_cannot_run(monkeypatch):
    """sparse_impl='cpu' is refused before training when the compiled path is off or does
    not build, and accepted where it runs."""
    from impl.ops import pattern_cpu

    method = ClickTrain(ClickTrainConfig(sparse_impl="cpu"))
    monkeypatch.setattr(pattern_cpu, "unavailable_reason", lambda: "no C compiler")
    with pytest.raises(ValueError, match="sparse_impl='cpu' cannot run here: no C compiler"):
        method.validate(TrainConfig(model="resnet20", epochs=30, device="cpu"))
    monkeypatch.setattr(pattern_cpu, "unavailable_reason", lambda: None)
    method.validate(TrainConfig(model="resnet20", epochs=30, device="cpu"))
    # a run on a GPU: its pattern convs would get CUDA tensors, which the CPU path refuses
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"sparse_impl='cpu' cannot run here: the run trains on "
                       r"the GPU \(--device auto\); use 'auto' \(the compiled path"):  # fmt: skip
        method.validate(TrainConfig(model="resnet20", epochs=30, device="auto"))


def test_validate_accepts_cuda_pattern_convs_where_the_kernels_load(monkeypatch):
    import impl.ops.pattern as pattern

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(pattern, "has_cuda_kernels", lambda device=None: asked.append(device) or 1)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    method = ClickTrain(ClickTrainConfig(sparse_impl="cuda"))
    method.validate(TrainConfig(model="resnet20", epochs=30, device="cuda"))
    method.validate(TrainConfig(model="resnet20", epochs=30, device="cuda:5"))
    # a torchrun worker checks the GPU of its local rank, which it trains on (it checked GPU
    # 0 before selecting it, and every worker compiled and held a context there)
    monkeypatch.setenv("RANK", "11")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_RANK", "3")
    method.validate(TrainConfig(model="resnet20", epochs=30, device="cuda"))
    assert asked == [torch.device("cuda"), torch.device("cuda:5"), torch.device("cuda:3")]


def test_config_defaults_are_the_papers_hyper_parameters():
    """The paper's ClickTrain hyper-parameters (Sec. 4.2-4.3, 5.2): loss margin
    delta 0.0018, penalty 2.5e-4, stage-1 threshold 0.27 on the loss derivative, 12 candidate
    patterns, a pattern-sparse conv above 65% zeros; balanced kernel ranking and early
    regularization on."""
    from impl.methods.clicktrain import ClickTrainConfig

    c = ClickTrainConfig()
    assert (c.loss_margin, c.penalty, c.loss_derivative_threshold) == (0.0018, 2.5e-4, 0.27)
    assert (c.pool_size, c.sparse_threshold) == (12, 0.65)
    assert c.kernel_ranking == "balanced" and c.early_regularization is True
