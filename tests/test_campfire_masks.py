"""Campfire's masks: window, CK, combined (convolutions), block/fine FC, dead classifier inputs."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import impl.methods.campfire_masks as cm
from impl.methods.campfire_masks import (
    ck_mask,
    classifier_feeds,
    combined_mask,
    count_at,
    dead_inputs,
    fc_mask,
    kernel_scores,
    window_mask,
)

# Conv shapes: real (ResNet-20 stages, 1x1 downsample) mixed with primes and odd sizes.
SHAPES = [(16, 16, 3, 3), (64, 32, 3, 3), (7, 5, 3, 3), (13, 1, 3, 3), (1, 1, 3, 3), (3, 11, 5, 5)]
SHAPE_IDS = ["16x16x3x3", "64x32x3x3", "7x5x3x3", "13x1x3x3", "1x1x3x3", "3x11x5x5"]
SPARSITIES = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99]
SPARSITY_IDS = [f"s{s}" for s in SPARSITIES]


def _w(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g)


def _nonzeros_per_kernel(mask: torch.Tensor) -> torch.Tensor:
    return mask.reshape(mask.shape[0] * mask.shape[1], -1).sum(dim=1)


def test_count_at_rounds_half_up() -> None:
    assert count_at(0.7, 10) == 7  # 7.000000000000001 in binary floating point
    assert count_at(0.25, 2) == 1  # 0.5 rounds up
    assert count_at(0.7, 2304) == 1613  # 1612.8
    assert count_at(0.0, 5) == 0 and count_at(1.0, 5) == 5
    assert count_at(0.58, 25) == 15  # 14.499999999999998 in binary floating point: 14.5


def test_count_at_clips_to_zero_and_the_item_count() -> None:
    # a fraction outside [0, 1] counts no items, or all of them, never more or fewer
    assert count_at(1.5, 4) == 4
    assert count_at(2.0, 7) == 7
    assert count_at(-0.5, 4) == 0
    assert count_at(-3.0, 10) == 0


def test_ck_mask_of_two_weight_kernels_removes_whole_kernels() -> None:
    """A 1x2 kernel is neither a single weight nor a 3x3 one: CK still removes it whole."""
    w = torch.randn(4, 4, 1, 2, generator=torch.Generator().manual_seed(0))
    mask = ck_mask(w, 0.5)
    assert mask.shape == w.shape and int((~mask).sum()) == 16
    assert bool((mask.all(dim=-1) | ~mask.any(dim=-1)).all())


# -- window ------------------------------------------------------------------------------------
@pytest.mark.parametrize("s", SPARSITIES, ids=SPARSITY_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_window_mask_hits_target_and_per_kernel_cap(shape, s) -> None:
    w = _w(shape)
    mask = window_mask(w, s)
    n = w.numel()
    assert int((~mask).sum()) == count_at(s, n)  # exact layer sparsity
    m = math.prod(shape[2:])
    n_keep = n - count_at(s, n)
    cap = math.ceil(n_keep / (shape[0] * shape[1]))
    per_kernel = _nonzeros_per_kernel(mask)
    assert int(per_kernel.max()) <= cap <= m
    assert int(per_kernel.min()) >= n_keep // (shape[0] * shape[1])


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_window_mask_keeps_the_largest_of_each_kernel(shape) -> None:
    w = _w(shape, seed=1)
    mask = window_mask(w, 0.6)
    a = w.abs().reshape(shape[0] * shape[1], -1)
    k = mask.reshape_as(a)
    kept_min = a.masked_fill(~k, float("inf")).amin(dim=1)
    pruned_max = a.masked_fill(k, -1.0).amax(dim=1)
    assert bool((kept_min >= pruned_max).all())


@pytest.mark.parametrize("s", [0.1, 0.5, 0.7, 0.75], ids=["s0.1", "s0.5", "s0.7", "s0.75"])
def test_window_kernel_rounding_gives_every_kernel_the_same_count(s) -> None:
    w = _w((11, 7, 3, 3))
    mask = window_mask(w, s, rounding="kernel")
    k = math.floor((1 - s) * 9 + 0.5)
    assert bool((_nonzeros_per_kernel(mask) == k).all())


def test_window_max_nonzero_caps_each_kernel() -> None:
    w = _w((8, 8, 3, 3))
    mask = window_mask(w, 0.2, max_nonzero=4)  # Fig. 2a: at most 4 of 9 kept
    assert int(_nonzeros_per_kernel(mask).max()) == 4
    assert float((~mask).float().mean()) == pytest.approx(5 / 9)


def test_window_mask_ranks_zeros_last() -> None:
    w = _w((4, 4, 3, 3)).abs() + 0.1
    w[0, 0, 1:] = 0.0  # a kernel with two nonzero weights, at (0, 0) and (0, 2)
    w[0, 0, 0, 1] = 0.0
    w[0, 0, 0, 2] = 0.05
    mask = window_mask(w, 0.5)  # every kernel keeps 4 or 5 slots
    assert bool(mask[0, 0, 0, 0]) and bool(mask[0, 0, 0, 2])
    assert int(mask[0, 0].sum()) in (4, 5)


# -- CK ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("s", SPARSITIES, ids=SPARSITY_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_ck_mask_removes_whole_kernels_by_max(shape, s) -> None:
    w = _w(shape, seed=2)
    mask = ck_mask(w, s)
    per_kernel = _nonzeros_per_kernel(mask)
    m = math.prod(shape[2:])
    assert bool(((per_kernel == 0) | (per_kernel == m)).all())  # whole kernels only
    n_kernels = shape[0] * shape[1]
    assert int((per_kernel == 0).sum()) == count_at(s, n_kernels)
    # within one kernel of the target weight count
    assert abs(int((~mask).sum()) - s * w.numel()) <= m
    score = kernel_scores(w).reshape(-1)
    removed = per_kernel == 0
    if bool(removed.any()) and bool((~removed).any()):
        assert float(score[removed].max()) <= float(score[~removed].min())


def test_kernel_scores_are_max_abs() -> None:
    w = torch.zeros(2, 1, 3, 3)
    w[0, 0, 1, 2] = -3.0
    w[1, 0, 0, 0] = 0.5
    assert kernel_scores(w).flatten().tolist() == [3.0, 0.5]


@pytest.mark.parametrize("s", [0.3, 0.7], ids=["s0.3", "s0.7"])
def test_ck_mask_input_channel_scope(s) -> None:
    w = _w((13, 6, 3, 3), seed=3)
    mask = ck_mask(w, s, scope="input_channel")
    kept = mask[:, :, 0, 0]
    removed_per_channel = (~kept).sum(dim=0)
    assert bool((removed_per_channel == count_at(s, 13)).all())
    score = kernel_scores(w)
    for c in range(6):
        r = ~kept[:, c]
        assert float(score[r, c].max()) <= float(score[~r, c].min())


@pytest.mark.parametrize("s", [0.2, 0.7], ids=["s0.2", "s0.7"])
def test_ck_on_1x1_is_magnitude_pruning(s) -> None:
    w = _w((17, 5, 1, 1), seed=4)
    mask = ck_mask(w, s)
    n = count_at(s, w.numel())
    expected = torch.ones(w.numel(), dtype=torch.bool)
    expected[torch.argsort(w.abs().flatten(), stable=True)[:n]] = False
    assert torch.equal(mask.flatten(), expected)


# -- combined ----------------------------------------------------------------------------------
@pytest.mark.parametrize("s", SPARSITIES, ids=SPARSITY_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_combined_mask_reaches_target_within_one_kernel(shape, s) -> None:
    w = _w(shape, seed=5)
    mask = combined_mask(w, s, 0.8)
    target = count_at(s, w.numel())
    pruned = int((~mask).sum())
    m = math.prod(shape[2:])
    assert target <= pruned < target + m
    # the window phase's per-kernel cap still holds, and CK removed whole kernels on top of it
    window = window_mask(w, 0.8 * s)
    assert bool((mask <= window).all())
    per_kernel = _nonzeros_per_kernel(mask)
    window_kernel = _nonzeros_per_kernel(window)
    assert bool(((per_kernel == 0) | (per_kernel == window_kernel)).all())


@pytest.mark.parametrize("s", [0.3, 0.6, 0.9], ids=str)
@pytest.mark.parametrize("shape", [(8, 5, 3, 3), (6, 4, 1, 1), (16, 3, 3, 3)], ids=str)
def test_combined_mask_per_input_channel_is_algorithm_1s_loop(shape, s) -> None:
    """scope="input_channel": after the window phase, each input channel c loses its kernels
    of smallest max |w| until c's pruned weights reach round(s * K*R*S) (a loop over c here);
    the combined mask could only rank a layer's kernels together."""
    w = _w(shape, seed=11)
    got = combined_mask(w, s, 0.8, scope="input_channel")
    window = window_mask(w, 0.8 * s)
    k, c, m = shape[0], shape[1], math.prod(shape[2:])
    expected = window.clone()
    for ch in range(c):
        kept = window[:, ch].reshape(k, m).sum(dim=1)
        need = count_at(s, k * m) - int((~window[:, ch]).sum())
        for kk in torch.argsort(w[:, ch].abs().reshape(k, m).amax(dim=1), stable=True).tolist():
            if need <= 0:
                break
            expected[kk, ch] = False
            need -= int(kept[kk])
    assert torch.equal(got, expected)
    target = count_at(s, k * m)
    pruned = (~got).transpose(0, 1).reshape(c, -1).sum(dim=1)
    # the window's layer-wide rounding may prune a channel past its target on its own
    by_ck = (got != window).transpose(0, 1).reshape(c, -1).any(dim=1)
    assert bool((pruned >= target).all())
    assert bool((pruned[by_ck] < target + m).all()) and bool(by_ck.any())
    assert not torch.equal(got, combined_mask(w, s, 0.8))  # the layer scope differs here
    with pytest.raises(ValueError, match="unknown scope"):
        combined_mask(w, s, scope="filter")


def test_combined_per_input_channel_removes_no_kernel_once_the_window_met_the_target() -> None:
    """Per input channel, CK removes kernels only while the channel is short of its target:
    at sparsity 0 nothing is pruned, and when the window phase alone prunes exactly each
    channel's target (3 of every 9 weights, window_fraction 1) the mask is the window's."""
    w = _w((6, 4, 3, 3), seed=13)
    for scope in ("input_channel", "layer"):
        assert bool(combined_mask(w, 0.0, 0.8, scope=scope).all()), scope
        got = combined_mask(w, 1 / 3, 1.0, rounding="kernel", scope=scope)
        window = window_mask(w, 1 / 3, rounding="kernel")
        assert int((~window).sum()) == count_at(1 / 3, w.numel())  # 3 of 9 in every kernel
        assert torch.equal(got, window), scope


def test_combined_per_input_channel_window_rounding_comes_first() -> None:
    """A channel of small weights loses several kernels' worth to the window phase's layer
    rounding (its spare kept weights go to the largest next weights), as the docstring says;
    the other channel ends within one kernel of its target. With the window's per-kernel
    rounding every channel loses the same count."""
    w = _w((512, 2, 3, 3), seed=12)
    w[:, 1] *= 0.01
    target = count_at(0.1, 512 * 9)

    def pruned(mask: torch.Tensor) -> list[int]:
        return [int((~mask[:, ch]).sum()) for ch in range(2)]

    layer = pruned(combined_mask(w, 0.1, 0.8, scope="input_channel"))
    assert layer[1] >= target + 2 * 9  # past its target by kernels, in the window phase
    assert target <= layer[0] < target + 9
    kernel = pruned(combined_mask(w, 0.1, 0.8, rounding="kernel", scope="input_channel"))
    assert kernel[0] == kernel[1] >= target


def test_combined_extremes() -> None:
    w = _w((9, 7, 3, 3), seed=6)
    assert torch.equal(combined_mask(w, 0.6, 1.0), window_mask(w, 0.6))
    only_ck = combined_mask(w, 0.6, 0.0)
    per_kernel = _nonzeros_per_kernel(only_ck)
    assert bool(((per_kernel == 0) | (per_kernel == 9)).all())
    assert int((per_kernel == 0).sum()) == math.ceil(count_at(0.6, w.numel()) / 9)


def test_combined_mask_window_phase_honours_the_nonzero_cap() -> None:
    # window_max_nonzero caps every kernel's nonzeros in window pruning, alone or as the first
    # phase of the combined mask (which ignored it); the CK phase only removes whole kernels.
    w = _w((9, 7, 3, 3), seed=4)
    capped = combined_mask(w, 0.3, 0.8, max_nonzero=2)
    assert int(_nonzeros_per_kernel(capped).max()) <= 2
    assert torch.equal(
        combined_mask(w, 0.3, 1.0, max_nonzero=2), window_mask(w, 0.3, max_nonzero=2)
    )
    assert int(_nonzeros_per_kernel(combined_mask(w, 0.3, 0.8)).max()) > 2  # uncapped


@pytest.mark.parametrize(
    "fn", [window_mask, ck_mask, combined_mask], ids=["window", "ck", "combined"]
)
def test_conv_masks_reject_bad_input(fn) -> None:
    w = _w((4, 4, 3, 3))
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="sparsity"):
            fn(w, bad)
    with pytest.raises(ValueError, match="dims"):
        fn(torch.randn(5), 0.5)


def test_mask_options_reject_unknown_names() -> None:
    w = _w((4, 4, 3, 3))
    with pytest.raises(ValueError, match="rounding"):
        window_mask(w, 0.5, rounding="global")
    with pytest.raises(ValueError, match="scope"):
        ck_mask(w, 0.5, scope="filter")
    with pytest.raises(ValueError, match="window_fraction"):
        combined_mask(w, 0.5, 1.2)
    with pytest.raises(ValueError, match="max_nonzero"):
        window_mask(w, 0.5, max_nonzero=-1)


def test_masks_do_not_modify_the_weight() -> None:
    w = _w((5, 3, 3, 3))
    before = w.clone()
    window_mask(w, 0.5)
    ck_mask(w, 0.5)
    combined_mask(w, 0.5)
    assert torch.equal(w, before)


# -- FC ----------------------------------------------------------------------------------------
FC_SHAPES = [(10, 64), (10, 512), (7, 13), (1, 5), (3, 1)]
FC_IDS = ["10x64", "10x512", "7x13", "1x5", "3x1"]


@pytest.mark.parametrize("block", [1, 2, 3, 4], ids=["fine", "block2", "block3", "block4"])
@pytest.mark.parametrize("s", [0.3, 0.7, 0.95, 0.999], ids=["s0.3", "s0.7", "s0.95", "s0.999"])
@pytest.mark.parametrize("shape", FC_SHAPES, ids=FC_IDS)
def test_fc_mask_keeps_one_per_output_and_hits_target(shape, s, block) -> None:
    w = _w(shape, seed=7)
    mask = fc_mask(w, s, block=block, block_fraction=0.5)
    assert bool((mask.sum(dim=1) >= 1).all())
    out_f, n = shape[0], w.numel()
    target = min(count_at(s, n), n - out_f)  # at most all but one per output
    pruned = int((~mask).sum())
    assert target <= pruned <= target + block * block


def test_fc_fine_pruning_is_magnitude_with_row_max_protected() -> None:
    w = _w((6, 20), seed=8)
    mask = fc_mask(w, 0.5, block=1)
    protected = torch.zeros_like(mask)
    protected[torch.arange(6), w.abs().argmax(dim=1)] = True
    a = w.abs().masked_fill(protected, float("inf")).flatten()
    expected = torch.ones(w.numel(), dtype=torch.bool)
    expected[torch.argsort(a, stable=True)[: count_at(0.5, w.numel())]] = False
    assert torch.equal(mask.flatten(), expected)


def test_fc_block_pruning_removes_smallest_blocks() -> None:
    w = torch.ones(4, 8)
    w[0:2, 2:4] = 0.01  # the weakest 2x2 block
    w[2:4, 6:8] = 0.02  # the next weakest
    mask = fc_mask(w, 8 / 32, block=2, block_fraction=1.0)
    expected = torch.ones(4, 8, dtype=torch.bool)
    expected[0:2, 2:4] = False
    expected[2:4, 6:8] = False
    assert torch.equal(mask, expected)


def test_fc_block_keeps_a_protected_weight() -> None:
    w = torch.full((2, 4), 0.01)
    w[0, 0] = 1.0
    w[1, 2:] = 5.0
    mask = fc_mask(w, 0.25, block=2, block_fraction=1.0)  # prunes 2: the weak left block's rest
    assert bool(mask[0, 0])  # row 0's largest weight survives its block's removal
    assert not bool(mask[0, 1]) and not bool(mask[1, 0]) and not bool(mask[1, 1])
    assert bool(mask.sum(dim=1).min() >= 1)


def test_fc_dead_inputs_pruned_first_and_counted() -> None:
    w = _w((5, 12), seed=9)
    dead = torch.zeros(12, dtype=torch.bool)
    dead[[1, 4, 7]] = True
    mask = fc_mask(w, 0.1, block=1, dead_inputs=dead)  # target 6 < 15 dead weights
    assert not bool(mask[:, dead].any())
    assert bool(mask[:, ~dead].all())
    mask = fc_mask(w, 0.6, block=2, dead_inputs=dead)
    assert not bool(mask[:, dead].any())
    assert int((~mask).sum()) >= count_at(0.6, 60)
    assert bool((mask.sum(dim=1) >= 1).all())


def test_fc_mask_rejects_bad_input() -> None:
    w = _w((4, 6))
    with pytest.raises(ValueError, match="block"):
        fc_mask(w, 0.5, block=5)
    with pytest.raises(ValueError, match="block"):
        fc_mask(w, 0.5, block=0)
    with pytest.raises(ValueError, match="2-D"):
        fc_mask(_w((4, 6, 1)), 0.5)
    with pytest.raises(ValueError, match="dead_inputs"):
        fc_mask(w, 0.5, dead_inputs=torch.zeros(5, dtype=torch.bool))
    with pytest.raises(ValueError, match="block_fraction"):
        fc_mask(w, 0.5, block_fraction=-0.5)


# -- dead classifier inputs --------------------------------------------------------------------
class PlainNet(nn.Module):
    """conv -> BN -> ReLU -> pool (2x2 kept) -> flatten -> linear: VGG's classifier path."""

    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 5, 3, padding=1, bias=bias)
        self.bn = nn.BatchNorm2d(5)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(5 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class ResidualNet(PlainNet):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)) + x.mean(1, keepdim=True))
        return self.fc(torch.flatten(self.pool(y), 1))


def test_classifier_feeds_follow_plain_chains_only() -> None:
    feeds = classifier_feeds(PlainNet())
    assert len(feeds) == 1
    assert (feeds[0].linear, feeds[0].conv) == ("fc", "conv")
    assert feeds[0].steps == (("bn", "bn"), ("relu", ""))
    assert classifier_feeds(ResidualNet()) == []  # a residual addition silences nothing


@torch.no_grad()
def test_dead_inputs_need_zero_filter_and_nonpositive_constant() -> None:
    net = PlainNet()
    feed = classifier_feeds(net)[0]
    net.conv.weight[:3] = 0.0
    net.conv.bias.zero_()
    net.bn.bias.copy_(torch.tensor([0.0, -0.2, 0.3, 0.0, -1.0]))
    dead = dead_inputs(net, feed)
    per_channel = dead.reshape(5, 4)
    assert bool((per_channel == per_channel[:, :1]).all())  # 4 inputs per channel, contiguous
    # channel 0: zero filter, beta 0; 1: beta < 0; 2: beta > 0 (alive); 3, 4: filters nonzero
    assert per_channel[:, 0].tolist() == [True, True, False, False, False]
    # a positive bias reaching the eval-mode BN output keeps the channel alive
    net.conv.bias[0] = 1.0
    assert not bool(dead_inputs(net, feed)[0])
    # ... unless the running statistics scale it below -beta: (1 - 0) / sqrt(100) - 0.2 < 0
    net.bn.bias[0] = -0.2
    net.bn.running_var[0] = 100.0
    assert bool(dead_inputs(net, feed)[0])
    net.bn.running_var[0] = 1.0  # 1 / sqrt(1) - 0.2 > 0
    assert not bool(dead_inputs(net, feed)[0])
    # training mode passes beta itself (a constant has no batch variance): beta > 0 keeps a
    # channel alive though its eval-mode constant is <= 0: (0 - 10) / 1 + 0.3 < 0
    net.conv.bias[0] = 0.0
    net.bn.bias[0] = 0.3
    net.bn.running_mean[0] = 10.0
    assert not bool(dead_inputs(net, feed)[0])
    net.bn.bias[0] = 0.0  # both constants <= 0: dead
    assert bool(dead_inputs(net, feed)[0])
    # the same in the real model that has such a classifier
    out = net(torch.randn(2, 2, 6, 6))
    assert out.shape == (2, 3)


class ReluAfterBnNet(PlainNet):
    """conv -> ReLU -> BN -> pool -> flatten -> linear: BN shifts the ReLU's zeros."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn(torch.relu(self.conv(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class ReluMethodNet(PlainNet):
    """PlainNet's chain with the ReLU written as a tensor method."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn(self.conv(x)).relu()
        return self.fc(torch.flatten(self.pool(x), 1))


class NoReluNet(PlainNet):
    """conv -> BN -> pool -> flatten -> linear: a negative constant reaches the classifier."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.bn(self.conv(x))), 1))


class RegroupedNet(nn.Module):
    """A linear layer over 2 features of a 4-channel conv's pooled output, regrouped by a
    reshape: its inputs are not whole channels."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.conv(x)).reshape(-1, 2))


def test_classifier_feeds_need_batchnorm_right_after_the_conv() -> None:
    assert classifier_feeds(ReluAfterBnNet()) == []
    feeds = classifier_feeds(NoReluNet())
    assert [(f.linear, f.conv, f.steps) for f in feeds] == [("fc", "conv", (("bn", "bn"),))]


def test_classifier_feeds_read_a_relu_method_as_a_relu_step() -> None:
    feeds = classifier_feeds(ReluMethodNet())  # x.relu() as torch.relu(x)
    assert [(f.linear, f.conv, f.steps) for f in feeds] == [
        ("fc", "conv", (("bn", "bn"), ("relu", "")))
    ]


def test_classifier_feeds_skip_a_linear_whose_inputs_are_not_whole_channels() -> None:
    net = RegroupedNet()
    assert net(torch.randn(3, 2, 5, 5)).shape == (6, 3)  # the model runs as built
    assert classifier_feeds(net) == []


@torch.no_grad()
def test_dead_inputs_without_relu_need_a_zero_constant() -> None:
    # no ReLU clamps the constant: a negative one reaches the classifier, so only a zero
    # constant (in both BatchNorm modes) silences an input
    net = NoReluNet(bias=False)
    feed = classifier_feeds(net)[0]
    net.conv.weight[:2] = 0.0
    net.bn.bias.copy_(torch.tensor([-0.5, 0.0, 0.0, 0.0, 0.0]))
    per_channel = dead_inputs(net, feed).reshape(5, 4)
    assert per_channel[:, 0].tolist() == [False, True, False, False, False]
    assert bool((per_channel == per_channel[:, :1]).all())
    net.eval()  # the model's output for channel 0 is indeed a nonzero constant
    x = torch.randn(2, 2, 6, 6)
    feats = torch.flatten(net.pool(net.bn(net.conv(x))), 1)
    assert torch.allclose(feats[:, :4], torch.full((2, 4), -0.5))
    assert bool((feats[:, 4:8] == 0).all())


@torch.no_grad()
def test_dead_inputs_of_a_channel_with_zero_running_variance() -> None:
    # a zero filter without bias gives a constant 0 channel, whose running variance decays to
    # exactly 0: eval-mode BN maps it to (0 - 0) / sqrt(0 + eps) * gamma + beta = beta = 0
    net = PlainNet(bias=False)
    feed = classifier_feeds(net)[0]
    net.conv.weight[0] = 0.0
    net.bn.running_mean[0] = 0.0
    net.bn.running_var[0] = 0.0
    net.bn.bias[0] = 0.0
    assert dead_inputs(net, feed).reshape(5, 4)[:, 0].tolist() == [True] + [False] * 4
    net.eval()
    out = torch.relu(net.bn(net.conv(torch.randn(2, 2, 6, 6))))
    assert bool((out[:, 0] == 0).all())


@pytest.mark.gpu
@pytest.mark.parametrize("block", [1, 2, 4], ids=["b1", "b2", "b4"])
def test_gpu_masks_equal_the_cpu_masks(block: int) -> None:
    # Every mask function on CUDA tensors gives the CPU's mask (and runs: a scalar made on the
    # CPU inside one of them once broke the first Campfire step on a GPU).
    g = torch.Generator().manual_seed(3)
    conv = torch.randn(37, 19, 3, 3, generator=g)
    fc = torch.randn(10, 67, generator=g)
    dead = torch.rand(67, generator=g) < 0.2
    cuda = torch.device("cuda")
    for fn in (lambda w: window_mask(w, 0.6), lambda w: ck_mask(w, 0.5),
               lambda w: combined_mask(w, 0.7)):  # fmt: skip
        assert torch.equal(fn(conv.to(cuda)).cpu(), fn(conv))
    kw = {"block": block, "block_fraction": 0.5}
    on_gpu = fc_mask(fc.to(cuda), 0.6, dead_inputs=dead.to(cuda), **kw)
    assert on_gpu.device.type == "cuda"
    assert torch.equal(on_gpu.cpu(), fc_mask(fc, 0.6, dead_inputs=dead, **kw))


# -- bit-for-bit equality with the sort-based implementations ---------------------------------
# The masks select (kthvalue, a sampled band, bisection, pairwise ranks) where they once sorted.
# The _ref_* functions below are those sort-based implementations, kept here as the reference:
# every mask must equal theirs bit for bit, ties (broken by position) included.


def _ref_kernels(weight: torch.Tensor) -> torch.Tensor:
    k, c = weight.shape[:2]
    return weight.detach().abs().reshape(k * c, math.prod(weight.shape[2:]))


def _ref_ranks(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.argsort(a, dim=1, descending=True, stable=True)
    rank = torch.empty_like(order)
    idx = torch.arange(a.shape[1], device=a.device).expand_as(order)
    rank.scatter_(1, order, idx)
    return order, rank


def _ref_window_mask(weight, s, *, rounding="layer", max_nonzero=None):
    a = _ref_kernels(weight)
    nk, m = a.shape
    order, rank = _ref_ranks(a)
    if rounding == "kernel":
        keep = rank < count_at(1.0 - s, m)
    else:
        n_keep = a.numel() - count_at(s, a.numel())
        lo, extra = divmod(n_keep, nk) if nk else (0, 0)
        keep = rank < lo
        if extra:
            nxt = order[:, lo]
            cand = a.gather(1, nxt[:, None]).squeeze(1)
            winners = torch.argsort(cand, descending=True, stable=True)[:extra]
            keep[winners, nxt[winners]] = True
    if max_nonzero is not None:
        keep &= rank < max_nonzero
    return keep.reshape(weight.shape)


def _ref_ck_mask(weight, s, *, scope="layer"):
    score = _ref_kernels(weight).amax(dim=1).reshape(weight.shape[0], weight.shape[1])
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


def _ref_combined_mask(weight, s, window_fraction=0.8, *, rounding="layer"):
    keep = _ref_window_mask(weight, window_fraction * s, rounding=rounding)
    flat = keep.reshape(keep.shape[0] * keep.shape[1], math.prod(keep.shape[2:])).clone()
    need = count_at(s, flat.numel()) - int((~flat).sum())
    if need <= 0:
        return keep
    kept = flat.sum(dim=1)
    score = (_ref_kernels(weight) * flat).amax(dim=1)
    order = torch.argsort(score, stable=True)
    cum = kept[order].cumsum(0)
    n_remove = int(torch.searchsorted(cum, torch.tensor(need, device=cum.device))) + 1
    flat[order[:n_remove]] = False
    return flat.reshape(weight.shape)


def _ref_fc_mask(weight, s, *, block=1, block_fraction=1.0, dead_inputs=None):
    out_f, in_f = weight.shape
    a = weight.detach().abs()
    live = torch.ones_like(a, dtype=torch.bool)
    if dead_inputs is not None:
        live[:, dead_inputs.to(torch.bool)] = False
    keep = live.clone()
    need = count_at(s, a.numel()) - int((~live).sum())
    if need <= 0:
        return keep
    rows = live.any(dim=1).nonzero().squeeze(1)
    best = a.masked_fill(~live, -1.0).argmax(dim=1)
    protected = torch.zeros_like(keep)
    protected[rows, best[rows]] = True
    prunable = live & ~protected
    if block > 1 and block_fraction > 0:
        need_b = count_at(block_fraction, need)
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
            idx = int(torch.searchsorted(cum, torch.tensor(float(need_b), dtype=cum.dtype)))
            removed = torch.zeros(ob * ib, dtype=torch.bool)
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


KINDS = ["randn", "levels", "sparse", "equal", "zero"]


def _tied(shape: tuple[int, ...], kind: str, seed: int = 0) -> torch.Tensor:
    """Weights with many exact ties: a few magnitude levels of both signs, exact zeros (as
    pruned weights are), one magnitude everywhere, or all zero."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g)
    if kind == "levels":
        w = torch.randint(-3, 4, shape, generator=g).float() * 0.25
    elif kind == "sparse":
        w = w * (torch.rand(shape, generator=g) < 0.4)
    elif kind == "equal":
        w = torch.where(torch.rand(shape, generator=g) < 0.5, -0.7, 0.7)
    elif kind == "zero":
        w = torch.zeros(shape)
    return w


# "narrowed": thresholds so low that small tensors take every fast path (sampled band with
# hits and misses, bisection of the weighted prefix, pairwise kernel ranks).
PATHS = ["direct", "narrowed"]


@pytest.fixture(params=PATHS, ids=PATHS)
def path(request, monkeypatch) -> str:
    if request.param == "narrowed":
        monkeypatch.setattr(cm, "_SORT_SMALL", 4)
        monkeypatch.setattr(cm, "_SAMPLE", 24)
        monkeypatch.setattr(cm, "_SAMPLE_STRIDE", 1)
        monkeypatch.setattr(cm, "_SAMPLE_ABOVE", 40)
        monkeypatch.setattr(cm, "_SAMPLE_MARGIN", 1.0)
        monkeypatch.setattr(cm, "_SORT_BELOW", 3)
        monkeypatch.setattr(cm, "_PAIRWISE_MIN_KERNELS", 1)
    return request.param


EQ_SHAPES = [(7, 5, 3, 3), (13, 1, 3, 3), (1, 1, 3, 3), (3, 11, 5, 5), (2, 3, 7, 7), (31, 37, 3, 3)]
EQ_SPARSITIES = [0.0, 1e-3, 0.31, 0.5, 0.9, 1.0]


def _cases(shapes):
    for i, shape in enumerate(shapes):
        for kind in KINDS:
            yield shape, kind, _tied(shape, kind, seed=i)


@pytest.mark.parametrize("n_frac", [0.0, 0.01, 0.3, 0.5, 0.99, 1.0], ids=lambda f: f"n{f}")
@pytest.mark.parametrize(
    "mode", ["default", "kthvalue", "band", "wide_band"], ids=["default", "kth", "band", "wide"]
)
def test_select_is_the_stable_argsort_prefix(mode, n_frac, monkeypatch) -> None:
    if mode != "default":  # kthvalue of all values rather than a sort of the small ones
        monkeypatch.setattr(cm, "_SORT_SMALL", 4)
    if mode in ("band", "wide_band"):  # sample small tensors; a band as wide as it gives up
        monkeypatch.setattr(cm, "_SAMPLE", 24)
        monkeypatch.setattr(cm, "_SAMPLE_STRIDE", 1)
        monkeypatch.setattr(cm, "_SAMPLE_ABOVE", 40)
        monkeypatch.setattr(cm, "_SAMPLE_MARGIN", 1.0 if mode == "band" else 1e3)
    for size in (1, 2, 7, 97, 1000, 4099):
        for kind in KINDS:
            v = _tied((size,), kind, seed=size).abs()
            n = count_at(n_frac, size)
            for values, desc in ((v, False), (-v, True)):  # the n smallest; the n largest of v
                expected = torch.zeros(size, dtype=torch.bool)
                expected[torch.argsort(v, descending=desc, stable=True)[:n]] = True
                assert torch.equal(cm._select(values, n), expected), (size, kind, n, desc)


def test_select_dim0_is_the_stable_argsort_prefix_of_every_column() -> None:
    # CK pruning per input channel (Algorithm 1's loops) selects along dim 0 of [K, C] scores.
    for kind in KINDS:
        v = _tied((9, 5), kind, seed=3).abs()
        for n in range(0, 10):
            expected = torch.zeros(9, 5, dtype=torch.bool)
            expected.scatter_(0, torch.argsort(v, dim=0, stable=True)[:n], True)
            assert torch.equal(cm._select_dim0(v, n), expected), (kind, n)


def test_weighted_prefix_is_the_sorted_cumsum_prefix(path) -> None:
    g = torch.Generator().manual_seed(11)
    for size in (1, 5, 97, 2003):
        for wmax in (1, 2, 9):
            score = torch.randint(0, 6, (size,), generator=g).float()  # many ties
            weight = torch.randint(0, wmax + 1, (size,), generator=g)
            total = int(weight.sum())
            for need in sorted({1, 2, total // 3, total // 2, total - 1, total, total + 5}):
                if need < 1:
                    continue
                order = torch.argsort(score, stable=True)
                order = order[weight[order] > 0]
                cum = weight[order].cumsum(0)
                j = int(torch.searchsorted(cum, torch.tensor(need)))
                expected = torch.zeros(size, dtype=torch.bool)
                expected[order[: j + 1]] = True
                got = cm._weighted_prefix(score, weight, need) & (weight > 0)  # 0 is free
                assert torch.equal(got, expected), (size, wmax, need)


@pytest.mark.parametrize("max_nonzero", [None, 0, 1, 4], ids=["nocap", "cap0", "cap1", "cap4"])
@pytest.mark.parametrize("rounding", ["layer", "kernel"], ids=["layer", "kernel"])
def test_window_mask_equals_sort_reference(path, rounding, max_nonzero) -> None:
    for shape, kind, w in _cases([*EQ_SHAPES, (17, 5, 1, 1)]):
        for s in EQ_SPARSITIES:
            got = window_mask(w, s, rounding=rounding, max_nonzero=max_nonzero)
            ref = _ref_window_mask(w, s, rounding=rounding, max_nonzero=max_nonzero)
            assert torch.equal(got, ref), (shape, kind, s)
            assert got.is_contiguous()  # the training loop applies it every step


@pytest.mark.parametrize("scope", ["layer", "input_channel"], ids=["layer", "input_channel"])
def test_ck_mask_equals_sort_reference(path, scope) -> None:
    for shape, kind, w in _cases([*EQ_SHAPES, (17, 5, 1, 1), (61, 53, 1, 1), (5, 7)]):
        for s in EQ_SPARSITIES:
            assert torch.equal(ck_mask(w, s, scope=scope), _ref_ck_mask(w, s, scope=scope)), (
                shape,
                kind,
                s,
            )


@pytest.mark.parametrize("rounding", ["layer", "kernel"], ids=["layer", "kernel"])
@pytest.mark.parametrize("fraction", [0.0, 0.5, 0.8, 1.0], ids=lambda f: f"wf{f}")
def test_combined_mask_equals_sort_reference(path, fraction, rounding) -> None:
    for shape, kind, w in _cases(EQ_SHAPES):
        for s in EQ_SPARSITIES:
            got = combined_mask(w, s, fraction, rounding=rounding)
            ref = _ref_combined_mask(w, s, fraction, rounding=rounding)
            assert torch.equal(got, ref), (shape, kind, s)
            assert got.is_contiguous()


@pytest.mark.parametrize("dead", ["none", "some", "all"], ids=["alive", "some_dead", "all_dead"])
@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0], ids=lambda f: f"bf{f}")
@pytest.mark.parametrize("block", [1, 2, 3, 4], ids=["fine", "block2", "block3", "block4"])
def test_fc_mask_equals_sort_reference(path, block, fraction, dead) -> None:
    for shape, kind, w in _cases([(10, 64), (7, 13), (1, 5), (3, 1), (29, 97)]):
        mask = None
        if dead != "none":
            mask = torch.ones(shape[1], dtype=torch.bool)
            if dead == "some":
                mask = torch.arange(shape[1]) % 3 == 1
        for s in [*EQ_SPARSITIES, 0.95]:
            kw = {"block": block, "block_fraction": fraction, "dead_inputs": mask}
            assert torch.equal(fc_mask(w, s, **kw), _ref_fc_mask(w, s, **kw)), (shape, kind, s)


def test_masks_leave_the_weight_alone_on_every_path(path) -> None:
    # The fast paths copy |w| (a transposed copy for pairwise ranks, a single row for 1x1
    # kernels); none may write into the weight.
    for shape in [(13, 7, 3, 3), (17, 5, 1, 1), (1, 1, 1, 1), (9, 11)]:
        w = _tied(shape, "randn", seed=6)
        before = w.clone()
        for s in (0.31, 0.9):
            ck_mask(w, s)
            ck_mask(w, s, scope="input_channel")
            if len(shape) == 4:
                window_mask(w, s)
                window_mask(w, s, rounding="kernel", max_nonzero=1)
                combined_mask(w, s)
            else:
                fc_mask(w, s, block=2, block_fraction=0.5)
        assert torch.equal(w, before), shape


def test_masks_equal_sort_reference_at_real_size() -> None:
    # Tensors above the real thresholds: a sampled band (> 65536 values), bisection of the
    # weighted prefix (> 8192 kernels or blocks), pairwise ranks (>= 4096 3x3 kernels); after a
    # first mask, as in the pruning era, the pruned weights are exact zeros.
    g = torch.Generator().manual_seed(5)
    conv = torch.randn(96, 64, 3, 3, generator=g)
    pointwise = torch.randn(512, 160, 1, 1, generator=g)
    fc = torch.randn(64, 2048, generator=g)
    for s in (0.3, 0.31, 0.7):
        for w, fn, ref in (
            (conv, combined_mask, _ref_combined_mask),
            (conv, window_mask, _ref_window_mask),
            (pointwise, ck_mask, _ref_ck_mask),
        ):
            assert torch.equal(fn(w, s), ref(w, s)), (fn.__name__, s)
        got = fc_mask(fc, s, block=2, block_fraction=0.5)
        assert torch.equal(got, _ref_fc_mask(fc, s, block=2, block_fraction=0.5)), s
        conv = conv * combined_mask(conv, s)
        pointwise = pointwise * ck_mask(pointwise, s)
        fc = fc * got


def test_masks_of_strided_weights_equal_the_reference(path) -> None:
    # A transposed FC weight and a channels-last conv weight: the block sums and kernel ranks
    # must not depend on the memory layout.
    for kind in KINDS:
        fc = _tied((67, 29), kind, seed=3).t()
        conv = _tied((11, 13, 3, 3), kind, seed=4).to(memory_format=torch.channels_last)
        for s in (0.31, 0.7):
            for block in (1, 2, 3):
                got = fc_mask(fc, s, block=block, block_fraction=0.5)
                assert torch.equal(got, _ref_fc_mask(fc, s, block=block, block_fraction=0.5))
            assert torch.equal(combined_mask(conv, s), _ref_combined_mask(conv, s))
            assert torch.equal(window_mask(conv, s), _ref_window_mask(conv, s))
            assert torch.equal(ck_mask(conv, s), _ref_ck_mask(conv, s))


@pytest.mark.parametrize("shape", [(0, 3, 3, 3), (4, 0, 3, 3), (0, 5), (5, 0)], ids=str)
def test_masks_of_empty_weights_equal_the_reference(shape) -> None:
    w = torch.zeros(shape)
    for s in (0.0, 0.5, 1.0):
        if len(shape) == 2:
            assert torch.equal(fc_mask(w, s, block=2), _ref_fc_mask(w, s, block=2))
        assert torch.equal(ck_mask(w, s), _ref_ck_mask(w, s))
        if len(shape) == 4:
            assert torch.equal(window_mask(w, s), _ref_window_mask(w, s))
            assert torch.equal(combined_mask(w, s), _ref_combined_mask(w, s))


@pytest.mark.gpu
def test_gpu_masks_with_ties_equal_the_sort_reference() -> None:
    cuda = torch.device("cuda")
    for kind in KINDS:
        conv = _tied((67, 71, 3, 3), kind, seed=1)
        pointwise = _tied((300, 257, 1, 1), kind, seed=2)
        fc = _tied((37, 3001), kind, seed=3)
        for s in (0.31, 0.9):
            assert torch.equal(combined_mask(conv.to(cuda), s).cpu(), _ref_combined_mask(conv, s))
            assert torch.equal(window_mask(conv.to(cuda), s).cpu(), _ref_window_mask(conv, s))
            assert torch.equal(ck_mask(pointwise.to(cuda), s).cpu(), _ref_ck_mask(pointwise, s))
            kw = {"block": 2, "block_fraction": 0.5}
            assert torch.equal(fc_mask(fc.to(cuda), s, **kw).cpu(), _ref_fc_mask(fc, s, **kw))


def test_a_nan_weight_ranks_first_on_every_path_and_the_count_holds(path) -> None:
    # a diverged step can leave NaN weights until the epoch's end finds the divergence; the
    # pairwise ranking gave two weights of its kernel one rank (a wrong count, or an index
    # past the kernel in combined_mask)
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(16, 16, 3, 3, generator=gen)
    w[5, 5, 1, 1] = float("nan")
    w[7, 2, 0, 0] = float("nan")
    w[7, 2, 2, 2] = float("nan")  # two in one kernel: the lower position first
    rank, _ = cm._ranks_t(cm._kernels_t(w))
    by_kernel = rank.t().reshape(16, 16, 9)
    assert by_kernel[5, 5, 4] == 0 and by_kernel[7, 2, 0] == 0 and by_kernel[7, 2, 8] == 1
    assert sorted(by_kernel[7, 2].tolist()) == list(range(9))  # one rank each
    assert int((~window_mask(w, 0.6)).sum()) == count_at(0.6, w.numel())
    combined = combined_mask(w, 0.6)  # no index past the kernel
    assert combined.shape == w.shape
