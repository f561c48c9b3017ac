"""FLOPs accounting: hand counts, torch's FlopCounterMode, densities, PruneTrain's analytic cost."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from impl.flops import (
    BN_DATA_GRAD_FLOPS,
    BN_FORWARD_FLOPS,
    BN_WEIGHT_GRAD_FLOPS,
    FlopCounts,
    LayerDensity,
    paper_training_cost,
    training_flops,
)
from impl.models import MODELS, STEMS, create


def torch_counted(report) -> float:
    """Our conv + linear multiply-add FLOPs of forward, data and weight gradient, without bias.

    FlopCounterMode counts only matmuls and convolutions (bias additions are not counted), so
    this is the part of our count it can check.
    """
    return sum(
        2 * layer.macs * (1 + (layer.dense.data_grad > 0) + (layer.dense.weight_grad > 0))
        for layer in report.layers
        if layer.kind != "bn"
    )


def tiny_model() -> nn.Sequential:
    # conv 3->5 (3x3, stride 2, pad 1, bias) on 7x7 -> 4x4; BN; flatten 80 -> linear 11.
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(3, 5, 3, stride=2, padding=1, bias=True),
        nn.BatchNorm2d(5),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(80, 11),
    )


def test_hand_count_conv_and_linear() -> None:
    report = training_flops(tiny_model(), (3, 7, 7))
    conv, bn, fc = report.layers
    # conv: output 5x4x4 = 80 elements, each 3*3*3 = 27 multiply-adds -> 2_160 MACs.
    assert (conv.name, conv.kind, conv.macs) == ("0", "conv", 2_160)
    assert conv.out_shape == (5, 4, 4) and conv.in_shape == (3, 7, 7)
    # forward 2*2_160 + 80 bias adds; no data gradient (the network input needs none);
    # weight gradient 2*2_160 + 80 (bias gradient: a sum over the 16 positions per channel).
    assert conv.dense == FlopCounts(4_400, 0, 4_400)
    # BatchNorm: 80 elements at 5 / 6 / 3 FLOPs each.
    assert bn.dense == FlopCounts(80 * 5, 80 * 6, 80 * 3)
    # linear 80 -> 11: 880 MACs; forward 1_760 + 11 bias, data gradient 1_760, weight 1_760 + 11.
    assert (fc.name, fc.macs) == ("4", 880)
    assert fc.dense == FlopCounts(1_771, 1_760, 1_771)
    assert report.dense.total == 4_400 * 2 + 80 * 14 + 1_771 * 2 + 1_760
    # Dense weights (no zero) and dense kernels: the three counts agree.
    assert report.nominal == report.executed == report.dense
    assert report.forward == report.inference_flops == 4_400 + 400 + 1_771
    # the totals by pass, each the sum of that pass over the layers
    assert report.data_grad == report.dense.data_grad == 0 + 80 * 6 + 1_760
    assert report.weight_grad == report.dense.weight_grad == 4_400 + 80 * 3 + 1_771
    assert FlopCounts(1, 2, 3) + FlopCounts(10, 20, 30) == FlopCounts(11, 22, 33)


def test_hand_count_grouped_dilated_conv() -> None:
    # groups 2, dilation 2, padding 2 on 9x9: output 4x9x9, each 3*3*3 MACs (6/2 channels).
    conv = nn.Conv2d(6, 4, 3, groups=2, dilation=2, padding=2, bias=False)
    report = training_flops(nn.Sequential(nn.Identity(), conv), (6, 9, 9))
    (layer,) = report.layers
    assert layer.macs == 4 * 81 * 27 == 8_748
    assert layer.dense == FlopCounts(2 * 8_748, 0, 2 * 8_748)


def test_input_layer_and_frozen_prefix_have_no_data_gradient() -> None:
    model = create("resnet20")
    report = training_flops(model, (3, 32, 32))
    by_name = {layer.name: layer for layer in report.layers}
    assert by_name["conv1"].dense.data_grad == 0 and by_name["conv1"].dense.weight_grad > 0
    assert by_name["bn1"].dense.data_grad > 0
    assert all(layer.dense.data_grad > 0 for layer in report.layers if layer.name != "conv1")

    # Freeze the stem: no weight gradient there, and nothing before layer1 needs a data gradient.
    for p in [*model.conv1.parameters(), *model.bn1.parameters()]:
        p.requires_grad_(False)
    frozen = {layer.name: layer for layer in training_flops(model, (3, 32, 32)).layers}
    assert frozen["conv1"].dense == FlopCounts(by_name["conv1"].dense.forward, 0, 0)
    assert frozen["bn1"].dense.data_grad == 0 and frozen["bn1"].dense.weight_grad == 0
    assert frozen["layer1.0.conv1"].dense.data_grad == 0
    assert frozen["layer1.0.conv2"].dense == by_name["layer1.0.conv2"].dense


def test_weight_and_bias_gradients_are_counted_by_their_own_requires_grad() -> None:
    # Conv2d(3, 4, 3, padding=1) on 8x8: 4*64 outputs of 27 MACs, and 256 bias additions.
    conv = nn.Conv2d(3, 4, 3, padding=1)
    both = training_flops(conv, (3, 8, 8)).layers[0].dense
    assert both.weight_grad == 2 * 4 * 64 * 27 + 4 * 64
    conv.bias.requires_grad_(False)  # a frozen bias: no bias gradient
    assert training_flops(conv, (3, 8, 8)).layers[0].dense.weight_grad == 2 * 4 * 64 * 27
    conv.bias.requires_grad_(True)
    conv.weight.requires_grad_(False)  # a frozen weight: the bias gradient still is
    assert training_flops(conv, (3, 8, 8)).layers[0].dense.weight_grad == 4 * 64


def test_nonzero_default_and_density_override() -> None:
    model = tiny_model()
    dense = training_flops(model, (3, 7, 7))
    with torch.no_grad():
        model[0].weight[:, :, :2] = 0  # zero rows 0-1 of every 3x3 kernel: 1/3 nonzero
        model[4].weight[:, :20] = 0  # 60 of 80 inputs left: 3/4 nonzero
    sparse = training_flops(model, (3, 7, 7))
    # inference costs the trained model's nonzeros, not what a dense kernel executes
    assert sparse.inference_flops == sparse.nominal.forward < sparse.executed.forward
    assert sparse.executed.forward == sparse.dense.forward == dense.inference_flops
    conv, bn, fc = sparse.layers
    assert conv.density == LayerDensity.uniform(1 / 3)
    # Multiply-add terms scaled by 1/3; the 80 bias additions stay.
    assert conv.nominal.forward == pytest.approx(2 * 2_160 / 3 + 80)
    assert conv.nominal.weight_grad == pytest.approx(2 * 2_160 / 3 + 80)
    assert fc.nominal == FlopCounts(1_320 + 11, 1_320, 1_320 + 11)
    assert bn.nominal == bn.dense
    # Dense kernels still execute everything.
    assert sparse.executed == dense.dense
    saved = (2 * 2_160 * 2 / 3) * 2 + (1_760 - 1_320) * 3
    assert dense.total - sparse.total == pytest.approx(saved)

    # An explicit density replaces the nonzero default, per kind of work.
    override = {"4": LayerDensity(forward=0.25, data_grad=0.5, weight_grad=1.0)}
    report = training_flops(model, (3, 7, 7), density=override)
    fc = report.layers[2]
    assert fc.density == override["4"]
    assert fc.nominal == FlopCounts(440 + 11, 880, 1_760 + 11)
    assert report.layers[0].nominal == conv.nominal  # the conv keeps its nonzero default
    assert report.total - sparse.total == pytest.approx((451 - 1_331) + (880 - 1_320) + 440)


class ThirdConv(nn.Conv2d):
    """A convolution that claims to execute a fixed fraction of its work."""

    def executed_density(self) -> LayerDensity:
        return LayerDensity(0.3, 0.4, 0.5)


def test_executed_density_of_a_sparse_module() -> None:
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1, bias=False), ThirdConv(4, 4, 1, bias=False))
    report = training_flops(model, (2, 5, 5))
    second = report.layers[1]
    macs = 4 * 25 * 4
    assert second.macs == macs
    assert second.executed == FlopCounts(0.3 * 2 * macs, 0.4 * 2 * macs, 0.5 * 2 * macs)
    assert second.nominal == second.dense == FlopCounts(2 * macs, 2 * macs, 2 * macs)
    assert report.executed.total == report.dense.total - (0.7 + 0.6 + 0.5) * 2 * macs


class Wrapper(nn.Module):
    """A non-Conv2d sparse conv holding an inner nn.Conv2d (counted once, as the wrapper)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Conv2d(3, 3, 3, padding=1, bias=False)
        self.weight = self.inner.weight

    def executed_density(self) -> LayerDensity:
        return LayerDensity.uniform(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_sparse_wrapper_counted_once_and_shared_module_summed() -> None:
    wrapper = Wrapper()
    shared = nn.Conv2d(3, 3, 1, bias=False)
    model = nn.Sequential(wrapper, shared, shared)
    report = training_flops(model, (3, 4, 4))
    assert [(layer.name, layer.kind, layer.calls) for layer in report.layers] == [
        ("0", "conv", 1),
        ("1", "conv", 2),
    ]
    assert report.layers[0].executed.forward == 0.5 * 2 * 27 * 48
    assert report.layers[1].macs == 2 * 48 * 3


def test_a_shared_conv_counts_data_gradients_only_for_the_calls_that_need_them() -> None:
    # the first call reads the network input (no gradient), the second its own output
    shared = nn.Conv2d(4, 4, 3, padding=1, bias=False)

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = shared

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(self.c(x))

    (layer,) = training_flops(Twice(), (4, 5, 5)).layers
    one_call = 2 * (4 * 25) * (4 * 9)  # FLOPs of one call's product
    assert layer.calls == 2 and layer.dense.forward == 2 * one_call
    assert layer.dense.data_grad == one_call and layer.dense.weight_grad == 2 * one_call


@pytest.mark.parametrize(
    "conv", [nn.Conv1d(3, 4, 3), nn.Conv3d(3, 4, 3), nn.ConvTranspose2d(3, 4, 3)], ids=repr
)
def test_a_convolution_it_does_not_count_is_refused_not_left_out(conv) -> None:
    with pytest.raises(ValueError, match=f"nn.{type(conv).__name__}"):
        training_flops(nn.Sequential(nn.Conv2d(3, 3, 1), conv), (3, 6, 6, 6))


def test_bad_arguments_raise() -> None:
    model = tiny_model()
    with pytest.raises(ValueError, match=r"valid names: 0, 4"):
        training_flops(model, (3, 7, 7), density={"1": LayerDensity()})
    with pytest.raises(ValueError, match="positive ints"):
        training_flops(model, (3, 0, 7))
    # a size of 1 is valid: one input channel, one row (5 x 1 output positions of 2 filters)
    one = training_flops(nn.Sequential(nn.Conv2d(1, 2, (1, 3), bias=False)), (1, 1, 7))
    assert one.forward == 2 * (2 * 5) * 3
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        LayerDensity(forward=1.5)
    with pytest.raises(ValueError, match="density of '0' must be a LayerDensity"):
        training_flops(model, (3, 7, 7), density={"0": 0.5})
    with pytest.raises(ValueError, match="batch"):
        paper_training_cost(model, (3, 7, 7), batch=0)
    # a batch dimension given with the sample, or one int: said so, not torch's conv error
    with pytest.raises(ValueError, match="without the batch dimension"):
        training_flops(model, (1, 3, 7, 7))
    with pytest.raises(ValueError, match="one sample"):
        training_flops(model, 8)

    class Failing(nn.Module):  # an error of the model's own (out of memory, a kernel's)
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 2, 1)

        def forward(self, x):
            raise RuntimeError("CUDA out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):  # not blamed on input_shape
        training_flops(Failing(), (3, 7, 7))


def test_no_side_effects_on_the_model() -> None:
    model = create("resnet20").train()
    model.layer2.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    training_flops(model, (3, 32, 32))
    paper_training_cost(model, (3, 32, 32), batch=8)
    assert model.training and not model.layer2.training and model.layer3.training
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_to_rows_dataframe() -> None:
    report = training_flops(create("resnet9"), (3, 32, 32))
    df = pd.DataFrame(report.to_rows())
    assert len(df) == len(report.layers) == 8 + 8 + 1  # convs, BNs, classifier
    assert df["nominal_total"].sum() == pytest.approx(report.total)
    assert df["executed_forward"].sum() == pytest.approx(report.executed.forward)
    assert set(df["kind"]) == {"conv", "bn", "linear"}
    assert {"density_forward", "executed_density_weight_grad", "in_shape", "macs"} <= set(df)


def test_bn_constants() -> None:
    # The documented per-element rule (module docstring) is what the counts use.
    assert (BN_FORWARD_FLOPS, BN_DATA_GRAD_FLOPS, BN_WEIGHT_GRAD_FLOPS) == (5, 6, 3)


CASES = [(name, "cifar", 32) for name in MODELS]
CASES += [(name, "imagenet", 64) for name in MODELS if "imagenet" in STEMS[name]]


@pytest.mark.parametrize(
    ("name", "stem", "size"), CASES, ids=[f"{n}-{s}-{px}" for n, s, px in CASES]
)
def test_forward_matches_torch_flop_counter(name: str, stem: str, size: int) -> None:
    # FlopCounterMode counts only matmuls and convolutions, without bias additions: compare it
    # with our conv + linear forward FLOPs (within 1%, biases included), and exactly with
    # their multiply-add part. Models are built on the meta device: shapes without weights.
    with torch.device("meta"):
        model = create(name, stem=stem).eval()
    report = training_flops(model, (3, size, size))
    with FlopCounterMode(display=False) as counter:
        model(torch.empty(1, 3, size, size, device="meta"))
    theirs = counter.get_total_flops()
    ours = sum(layer.dense.forward for layer in report.layers if layer.kind != "bn")
    assert ours == pytest.approx(theirs, rel=0.01)
    assert sum(2 * layer.macs for layer in report.layers if layer.kind != "bn") == theirs


@pytest.mark.parametrize(
    "name", ["resnet20", "vgg11", "resnet9"], ids=["resnet20", "vgg11", "resnet9"]
)
def test_training_step_matches_torch_flop_counter(name: str) -> None:
    # Forward + backward of a real model with an input that needs no gradient: torch skips the
    # first convolution's input gradient, as our count does.
    model = create(name).eval()
    report = training_flops(model, (3, 32, 32))
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(1, 3, 32, 32)).sum().backward()
    assert torch_counted(report) == counter.get_total_flops()


def test_resnet20_known_figure() -> None:
    # CIFAR ResNet-20 with projection shortcuts: 40.81M multiply-adds per image (the commonly
    # cited ~41M MACs / 0.04 GMACs); forward conv + linear FLOPs are twice that.
    report = training_flops(create("resnet20"), (3, 32, 32))
    macs = sum(layer.macs for layer in report.layers)
    assert macs == 40_813_184
    # Data gradient: everything but the stem conv (432 * 1024 MACs).
    conv_dg = sum(layer.dense.data_grad for layer in report.layers if layer.kind != "bn")
    assert conv_dg == 2 * (macs - 432 * 32 * 32)


def test_paper_cost_hand_count() -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )
    cost = paper_training_cost(model, (3, 8, 8), batch=16)
    # conv: CRS*K*PQ = 27*8*64 = 13_824; data gradient (8+2)^2 * KRS*C = 100*72*3 = 21_600.
    conv, bn, fc = cost.layers
    assert conv["inference_macs"] == 13_824
    assert conv["train_macs"] == 16 * (2 * 13_824 + 21_600)
    assert bn["bn_accesses"] == 8 * 16 * 8 * 64
    assert (bn["K"], bn["inference_macs"], bn["train_macs"]) == (8, 0, 0)  # channels; no MACs
    assert fc["train_macs"] == 3 * 16 * 8 * 4
    assert cost.train_macs == 16 * 49_248 + 1_536
    assert cost.train_flops == 2 * cost.train_macs
    assert cost.inference_flops == 2 * (13_824 + 32)
    assert cost.bn_accesses == 65_536


def test_paper_cost_agrees_with_training_flops_on_inference() -> None:
    model = create("resnet32")
    cost = paper_training_cost(model, (3, 32, 32), batch=128)
    report = training_flops(model, (3, 32, 32))
    assert cost.inference_macs == sum(layer.macs for layer in report.layers)
    ours = {layer.name: layer for layer in report.layers}
    checked = 0
    for row in cost.layers:
        if row["type"] != "Conv2d" or row["R"] != 3 or row["H"] != row["P"]:
            continue
        # A 3x3 stride-1 conv: the paper's data gradient runs over the padded (H+2)^2 extent,
        # i.e. (H+2)^2 / H^2 times the forward multiply-adds (our count: exactly 1x).
        forward_macs = ours[row["name"]].macs
        data_grad = row["train_macs"] / 128 - 2 * forward_macs
        assert data_grad == forward_macs * (row["H"] + 2) ** 2 / row["H"] ** 2
        checked += 1
    assert checked == 1 + 3 * 2 * 5 - 2  # stem + 2 convs x 5 blocks x 3 stages - 2 strided
    # Overall: forward + weight gradient (2x) + a data gradient inflated by 13% at 32x32 up
    # to 56% at 8x8, and 4x for the strided convs (input extent): 3.44x the forward here.
    assert cost.train_macs / 128 / cost.inference_macs == pytest.approx(3.44, abs=0.01)


@pytest.mark.parametrize(
    "padding, extent", [("same", 5 + 2 * 2), ("valid", 5), (1, 5 + 2)], ids=["same", "valid", "1"]
)
def test_paper_cost_data_gradient_extent_follows_the_padding(padding, extent) -> None:
    # A dilated 3x3 (dilation 2): "same" pads 2 a side, "valid" nothing, 1 pads 1 a side.
    conv = nn.Conv2d(2, 3, 3, padding=padding, dilation=2 if padding != 1 else 1, bias=False)
    (row,) = paper_training_cost(nn.Sequential(conv), (2, 5, 5), batch=1).layers
    assert (row["pad_h"], row["pad_w"]) == (extent - 5, extent - 5)
    forward = 2 * 9 * 3 * row["P"] * row["Q"]
    assert row["train_macs"] == 2 * forward + extent * extent * 3 * 9 * 2  # batch 1 is valid


def test_paper_cost_linear_counts_every_row_it_is_applied_to() -> None:
    # A Linear over a (rows, features) sample runs once per row: 6 rows of 4 -> 5.
    model = nn.Sequential(nn.Unflatten(1, (6, 4)), nn.Linear(4, 5))
    (row,) = paper_training_cost(model, (24,), batch=2).layers
    assert row["inference_macs"] == 6 * 4 * 5 and row["train_macs"] == 3 * 2 * 6 * 4 * 5


class HalfLinear(nn.Module):
    """A sparse fully connected layer that is not an nn.Linear (a 2-D weight)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(5, 4))

    def executed_density(self) -> LayerDensity:
        return LayerDensity.uniform(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t()


def test_a_sparse_module_with_a_matrix_weight_is_counted_as_linear() -> None:
    report = training_flops(nn.Sequential(nn.Flatten(), HalfLinear()), (4,))
    (layer,) = report.layers
    assert (layer.kind, layer.macs) == ("linear", 20)
    assert layer.executed.forward == 0.5 * 2 * 20


def test_paper_cost_data_gradient_extent_of_a_non_square_conv() -> None:
    # padding (1, 2) on a 5 x 7 input: the data gradient runs over (5+2) x (7+4) positions
    conv = nn.Conv2d(2, 3, 3, padding=(1, 2), bias=False)
    (row,) = paper_training_cost(nn.Sequential(conv), (2, 5, 7), batch=1).layers
    assert (row["H"], row["W"], row["pad_h"], row["pad_w"]) == (5, 7, 2, 4)
    forward = 2 * 9 * 3 * row["P"] * row["Q"]
    assert (row["P"], row["Q"]) == (5, 9)
    assert row["train_macs"] == 2 * forward + (5 + 2) * (7 + 4) * 3 * 9 * 2


def test_a_model_on_the_meta_device_counts_as_dense() -> None:
    # no values to count zeros in: its nominal FLOPs are its dense ones
    with torch.device("meta"):
        model = tiny_model()
    report = training_flops(model, (3, 7, 7))
    assert report.nominal == report.dense == training_flops(tiny_model(), (3, 7, 7)).dense


def test_an_executed_density_that_is_not_a_layer_density_is_refused() -> None:
    class Liar(nn.Conv2d):
        def executed_density(self):
            return 0.5

    with pytest.raises(TypeError, match=r"1\.executed_density\(\) must return a LayerDensity"):
        training_flops(nn.Sequential(nn.Conv2d(2, 2, 1), Liar(2, 2, 1)), (2, 4, 4))


def test_a_fully_pruned_layer_costs_only_its_bias() -> None:
    # Conv2d(2, 3, 1) on 4x4 with every weight zero: density 0 is valid, and of its 48 outputs
    # only the 48 bias additions (and the 48 bias-gradient additions) are left.
    assert LayerDensity(0.0, 0.0, 0.0) == LayerDensity.uniform(0.0)
    conv = nn.Conv2d(2, 3, 1)
    with torch.no_grad():
        conv.weight.zero_()
    (layer,) = training_flops(conv, (2, 4, 4)).layers
    assert layer.density == LayerDensity(0.0, 0.0, 0.0)
    assert layer.nominal == FlopCounts(48, 0, 48)
    assert layer.dense == FlopCounts(2 * 48 * 2 + 48, 0, 2 * 48 * 2 + 48)


def test_a_layer_of_one_nonzero_weight_is_dense() -> None:
    # Linear(1, 1) with its one weight kept: nonzero fraction 1, nominal = dense = 2 + 1 bias.
    fc = nn.Linear(1, 1)
    with torch.no_grad():
        fc.weight.fill_(0.5)
    (layer,) = training_flops(nn.Sequential(nn.Flatten(), fc), (1,)).layers
    assert layer.density == LayerDensity.uniform(1.0)
    assert layer.nominal == layer.dense == FlopCounts(3, 0, 3)


def test_a_sparse_module_that_is_the_model_is_counted_once() -> None:
    # The model itself is the counted layer: its inner nn.Conv2d is not counted again.
    # 3 filters x 16 positions = 48 outputs of 27 multiply-adds each.
    report = training_flops(Wrapper(), (3, 4, 4))
    assert [(layer.name, layer.kind) for layer in report.layers] == [("", "conv")]
    assert report.dense == FlopCounts(2 * 27 * 48, 0, 2 * 27 * 48)
    assert report.executed.forward == 0.5 * 2 * 27 * 48


def test_a_float64_model_is_counted_like_its_float32_twin() -> None:
    # the zero sample takes the model's dtype: a float64 model runs, and counts the same
    assert training_flops(tiny_model().double(), (3, 7, 7)).dense == (
        training_flops(tiny_model(), (3, 7, 7)).dense
    )


def test_a_frozen_bias_still_costs_its_forward_additions_in_the_nominal_count() -> None:
    # Conv2d(3, 4, 3, padding=1) on 8x8: 256 outputs of 27 MACs, the first input channel's
    # weights zero (2/3 nonzero), the bias frozen: the nominal forward keeps the 256 bias
    # additions, the nominal weight gradient has no bias gradient.
    conv = nn.Conv2d(3, 4, 3, padding=1)
    with torch.no_grad():
        conv.weight[:, 0] = 0
    conv.bias.requires_grad_(False)
    (layer,) = training_flops(conv, (3, 8, 8)).layers
    macs = 4 * 64 * 27
    assert layer.nominal.forward == pytest.approx(2 * macs * 2 / 3 + 256)  # bias adds stay
    assert layer.nominal.weight_grad == pytest.approx(2 * macs * 2 / 3)  # no bias gradient


def test_a_layer_defined_but_not_run_is_left_out() -> None:
    class Unused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Conv2d(2, 2, 1, bias=False)
            self.spare = nn.Linear(5, 5)  # never called in forward

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    report = training_flops(Unused(), (2, 3, 3))
    assert [layer.name for layer in report.layers] == ["used"]
    assert report.dense == FlopCounts(2 * 18 * 2, 0, 2 * 18 * 2)
