"""Channel union against channel gating FLOPs (PruneTrain Sec. 4.2, Fig. 6)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from impl.methods.prunetrain_gating import conv_flops_union_vs_gating


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1, bias=False),  # 5x7 -> 5x7
        nn.ReLU(),
        nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False),  # 5x7 -> 3x4
    )
    with torch.no_grad():
        net[0].weight[1].zero_()  # filter 1 of conv 0 is dead
        net[2].weight[:, 3].fill_(5e-5)  # input channel 3 of conv 2: below the threshold
        net[2].weight[0].zero_()  # filter 0 of conv 2 is dead
    return net


def test_gating_counts_each_conv_on_its_own_dense_channels():
    res = conv_flops_union_vs_gating(_net(), (3, 5, 7), threshold=1e-4)
    l0, l2 = res["layers"]
    assert l0["name"] == "0" and l2["name"] == "2"
    assert l0["union_channels"] == (3, 4) and l0["gating_channels"] == (3, 3)
    # Conv 2's input channel 1 (conv 0's dead filter) still has weights in conv 2: dense.
    assert l2["union_channels"] == (4, 6) and l2["gating_channels"] == (3, 5)
    assert l0["union_flops"] == 2 * 9 * 5 * 7 * 4 * 3 and l0["gating_flops"] == 2 * 9 * 35 * 3 * 3
    assert l2["union_flops"] == 2 * 9 * 3 * 4 * 6 * 4 and l2["gating_flops"] == 2 * 9 * 12 * 5 * 3
    assert res["union"] == l0["union_flops"] + l2["union_flops"]
    assert res["gating"] == l0["gating_flops"] + l2["gating_flops"] < res["union"]


def test_a_zero_threshold_counts_tiny_weights_as_dense():
    res = conv_flops_union_vs_gating(_net(), (3, 5, 7), threshold=0.0)
    assert res["layers"][1]["gating_channels"] == (4, 5)


def test_a_dense_model_is_the_same_under_both():
    net = nn.Sequential(nn.Conv2d(2, 5, 3), nn.Conv2d(5, 4, 1))
    res = conv_flops_union_vs_gating(net, (2, 9, 11))
    assert res["union"] == res["gating"] == 2 * 9 * 7 * 9 * 5 * 2 + 2 * 1 * 7 * 9 * 4 * 5


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="input_shape"):
        conv_flops_union_vs_gating(_net(), (5, 7))
    with pytest.raises(ValueError, match="threshold"):
        conv_flops_union_vs_gating(_net(), (3, 5, 7), threshold=-1.0)


@pytest.mark.slow
def test_union_vs_gating_on_a_trained_prunetrain_run(tmp_path):
    from impl.config import resolve
    from impl.train import train
    from reproductions.prunetrain.measure import union_vs_gating

    runs = {}
    for method, opts in (("dense", {}), ("prunetrain", {"threshold": 0.05, "penalty_ratio": 0.5,
                                                        "reconfig_interval": 1})):  # fmt: skip
        cfg = resolve("smoke", method=method, method_options=opts, out=str(tmp_path / method),
                      threads=1, data_options={"image_size": 16})  # fmt: skip
        train(cfg, progress=False)
        runs[method] = [cfg.out]
    res = union_vs_gating(scale="smoke", context={"runs": runs}, rows=["prunetrain"],
                          dense_row="dense")  # fmt: skip
    row = res["per_row"]["prunetrain"]
    assert 0 < row["gating"] <= row["union"] <= 100.0 + 1e-9
    assert res["difference_min"] == res["difference_max"] == row["union"] - row["gating"]
    with pytest.raises(ValueError, match="no finished run"):
        union_vs_gating(scale="smoke", context={"runs": runs}, rows=["x"], dense_row="dense")
    # Fig. 7: the last conv of every residual block, timed dense / union / gating.
    from reproductions.prunetrain.measure import union_gating_layer_times

    t = union_gating_layer_times(scale="smoke", context={"runs": runs}, row="prunetrain",
                                 dense_row="dense", batch=2, repeats=1)  # fmt: skip
    names = [layer["name"] for layer in t["layers"]]
    assert names and all(n.startswith("layer") and n.endswith(".conv2") for n in names)
    assert all(layer[k] > 0 for layer in t["layers"] for k in ("dense_ms", "union_ms",
                                                                  "gating_ms"))  # fmt: skip
    total = {k: sum(layer[k] for layer in t["layers"]) for k in ("dense_ms", "union_ms")}
    assert t["conv_speedup_vs_dense"] == pytest.approx(total["dense_ms"] / total["union_ms"])
    for layer in t["layers"]:  # gating computes on no more channels than union
        assert all(g <= u for g, u in zip(layer["gating_channels"], layer["union_channels"]))


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_gated_conv_equals_the_conv_when_the_dropped_channels_are_zero(bias):
    from impl.methods.prunetrain_gating import GatedConv

    torch.manual_seed(1)
    conv = nn.Conv2d(5, 7, 3, stride=2, padding=1, bias=bias)
    with torch.no_grad():
        conv.weight[:, [0, 3]] = 0  # input channels 0 and 3 unused
        conv.weight[[2, 6]] = 0  # filters 2 and 6 dead
        if bias:
            conv.bias[[2, 6]] = 0
    gated = GatedConv(conv)
    assert gated.idx_in.tolist() == [1, 2, 4] and gated.idx_out.tolist() == [0, 1, 3, 4, 5]
    x = torch.randn(2, 5, 9, 11)
    torch.testing.assert_close(gated(x), conv(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="groups=1"):
        GatedConv(nn.Conv2d(4, 4, 3, groups=2))


@pytest.mark.parametrize("model, last", [("resnet20", "conv2"), ("resnet50", "conv3")],
                         ids=["basic-block", "bottleneck"])  # fmt: skip
def test_the_timed_layers_are_the_last_conv_of_each_residual_block(model, last):
    from impl.models import create
    from reproductions.prunetrain.measure import _last_convs

    names = _last_convs(create(model, num_classes=10, in_channels=3, stem="cifar"))
    assert len(names) == (9 if model == "resnet20" else 16)
    assert all(n.endswith(f".{last}") for n in names) and names[0] == f"layer1.0.{last}"


def test_dense_channels_are_the_filters_and_inputs_with_a_weight_above_the_threshold():
    from impl.methods.prunetrain_gating import dense_channels

    w = torch.zeros(4, 3, 1, 1)
    w[0, 2] = 1.0
    w[3, 0] = -2e-4  # above 1e-4 in magnitude
    w[1, 1] = 5e-5  # below
    idx_out, idx_in = dense_channels(w, 1e-4)
    assert idx_out.tolist() == [0, 3] and idx_in.tolist() == [0, 2]


def test_fig7_at_gpu_scale_times_the_papers_shapes_untrained():
    # Fig. 7's gpu scale is the paper's ResNet-50 at 224 x 224 (batch 64), built untrained in
    # PruneTrain's reconfigured state: no training row, and the measure runs on any device
    # (here a small model at a small size, with the same code).
    from reproductions.prunetrain import fig7
    from reproductions.prunetrain.measure import union_gating_layer_times_at_shape

    (row,) = fig7.rows("gpu")
    assert row.measure == fig7.MEASURE_AT_SHAPE  # a measurement: it trains nothing
    assert row.params == {"model": "resnet50", "image": 224, "stem": "imagenet",
                          "num_classes": 1000, "batch": 64}  # fmt: skip
    t = union_gating_layer_times_at_shape(scale="smoke", context={}, model="resnet50", batch=2,
                                          image=32, num_classes=10, repeats=1)  # fmt: skip
    names = [layer["name"] for layer in t["layers"]]
    assert len(names) == 16 and all(n.endswith(".conv3") for n in names)  # 3+4+6+3 blocks
    for layer in t["layers"]:  # union: half of each residual path's inner channels left
        dense_in = {"layer1": 64, "layer2": 128, "layer3": 256, "layer4": 512}[layer["name"][:6]]
        assert layer["union_channels"][0] == dense_in // 2
        # gating convolves the half of the shared channels this layer writes; union all
        union_in, union_out = layer["union_channels"]
        assert layer["gating_channels"] == [union_in, union_out - union_out // 2]
        assert all(layer[k] > 0 for k in ("dense_ms", "union_ms", "gating_ms"))
    assert t["batch"] == 2 and "not trained" in t["state"]
    assert "shared channels it writes unused" in t["state"]


def test_gating_keeps_a_channel_at_the_threshold_as_the_reconfiguration_does():
    # Sec. 4.2 removes a channel whose weights are all below the threshold: one whose largest
    # |w| equals it is kept by both the reconfiguration and the gating count (gating used >).
    from impl.methods.prunetrain_gating import dense_channels

    w = torch.zeros(4, 3, 1, 1)
    w[0, 0] = 1.0
    w[1, 1] = 1e-4  # exactly at the threshold
    w[2, 2] = 0.99e-4  # below it
    idx_out, idx_in = dense_channels(w, 1e-4)
    assert idx_out.tolist() == [0, 1] and idx_in.tolist() == [0, 1]


@pytest.mark.parametrize(
    ("out_channels", "groups"), [(4, 4), (6, 2)], ids=["depthwise", "two-groups"]
)
def test_a_grouped_conv_counts_the_same_under_both(out_channels: int, groups: int):
    """Gating skips a (filter, input channel) pair of a dense conv; a grouped or depthwise
    conv has no such pairs to skip (each filter reads its own group): it counts whole, even
    with a zero filter."""
    net = nn.Sequential(nn.Conv2d(4, out_channels, 3, padding=1, groups=groups, bias=False))
    with torch.no_grad():
        net[0].weight[1].zero_()
    (layer,) = conv_flops_union_vs_gating(net, (4, 5, 5))["layers"]
    per_group = 4 // groups  # the input channels each filter reads
    assert layer["gating_channels"] == layer["union_channels"] == (per_group, out_channels)
    assert layer["gating_flops"] == layer["union_flops"] == 2 * 9 * 25 * out_channels * per_group


def test_bad_input_shapes_and_a_nan_threshold_are_refused():
    """A zero-sized dimension or a fourth (batch) dimension is not one sample's shape; a NaN
    threshold is no magnitude (it would compare false with every weight)."""
    for shape in ((3, 0, 7), (1, 3, 5, 7)):  # a zero size; a batch dimension
        with pytest.raises(ValueError, match="input_shape"):
            conv_flops_union_vs_gating(_net(), shape)
    with pytest.raises(ValueError, match="threshold"):
        conv_flops_union_vs_gating(_net(), (3, 5, 7), threshold=float("nan"))


def test_a_non_square_kernel_counts_its_height_times_its_width():
    """A 1x3 kernel (padding 0, 1) on 4x6: 4x6 outputs, 3 multiply-adds per pair."""
    net = nn.Sequential(nn.Conv2d(2, 3, (1, 3), padding=(0, 1), bias=False))
    res = conv_flops_union_vs_gating(net, (2, 4, 6))
    assert res["union"] == res["gating"] == 2 * (1 * 3) * (4 * 6) * 3 * 2


def test_a_conv_the_forward_pass_does_not_reach_is_not_counted():
    """A conv registered on the model but not called by its forward (as a removed path's
    would be) computes nothing: it is left out of the layers and of both totals."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Conv2d(2, 3, 1)
            self.unused = nn.Conv2d(3, 5, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    res = conv_flops_union_vs_gating(Net(), (2, 4, 4))
    assert [layer["name"] for layer in res["layers"]] == ["used"]
    assert res["union"] == res["gating"] == 2 * 16 * 3 * 2


def test_gated_conv_keeps_the_dilation_of_the_conv():
    from impl.methods.prunetrain_gating import GatedConv

    torch.manual_seed(2)
    conv = nn.Conv2d(4, 5, 3, padding=2, dilation=2, bias=False)
    with torch.no_grad():
        conv.weight[:, 1] = 0
        conv.weight[3] = 0
    gated = GatedConv(conv)
    x = torch.randn(1, 4, 9, 9)
    torch.testing.assert_close(gated(x), conv(x), rtol=1e-5, atol=1e-6)


def test_inference_throughput_is_images_per_second_and_speedup_is_pruned_over_dense(monkeypatch):
    import impl.train
    from reproductions.prunetrain import measure

    # dense steps take 20 ms, the pruned model's 10 ms: at batch 10, 500 and 1000 images/s
    ms, current = {"d": 20.0, "p": 10.0}, []

    def load(run_dir, device):
        current.append(run_dir)
        return (lambda x: None), None

    monkeypatch.setattr(impl.train, "load_trained_model", load)
    monkeypatch.setattr(measure, "_sample_shape", lambda run_dir: (1, 2, 2))
    monkeypatch.setattr(measure, "time_ms",
                        lambda step, repeats, warmup: [ms[current[-1]]] * repeats)  # fmt: skip
    runs = {"dense": ["d"], "pt": ["p"]}
    out = measure.inference_throughput(
        scale="cpu", context={"runs": runs}, row="pt", dense_row="dense", batch=10
    )
    assert out["dense"] == pytest.approx(500.0) and out["prunetrain"] == pytest.approx(1000.0)
    assert out["speedup"] == pytest.approx(2.0) and out["batch"] == 10


def test_union_vs_gating_normalises_to_dense_and_spans_the_rows(monkeypatch):
    import impl.methods.prunetrain_gating as gating
    import impl.train
    from reproductions.prunetrain import measure

    cfg = SimpleNamespace(method_options={})
    counts = {"dense": {"union": 200.0, "gating": 200.0}, "a": {"union": 100.0, "gating": 98.0},
              "b": {"union": 60.0, "gating": 48.0}}  # fmt: skip
    monkeypatch.setattr(impl.train, "load_trained_model", lambda run_dir, device: (run_dir, cfg))
    monkeypatch.setattr(measure, "_sample_shape", lambda run_dir: (3, 8, 8))
    monkeypatch.setattr(gating, "conv_flops_union_vs_gating",
                        lambda model, shape, threshold: counts[model])  # fmt: skip
    out = measure.union_vs_gating(
        scale="cpu",
        context={"runs": {"dense": ["dense"], "ra": ["a"], "rb": ["b"]}},
        rows=["ra", "rb"],
        dense_row="dense",
    )
    assert out["per_row"]["ra"] == pytest.approx({"union": 50.0, "gating": 49.0})
    assert out["per_row"]["rb"] == pytest.approx({"union": 30.0, "gating": 24.0})
    assert out["difference_min"] == pytest.approx(1.0)
    assert out["difference_max"] == pytest.approx(6.0)


def test_unuse_shared_outputs_zeroes_a_fraction_of_each_last_convs_filters():
    from reproductions.prunetrain.measure import unuse_shared_outputs

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(4, 6, 3)
            self.conv2 = nn.Conv2d(6, 8, 3)

    model = nn.Module()
    model.layer1 = nn.Sequential(Block(), Block())
    # half of 8 filters of each block's last conv (conv2): 4 + 4; conv1 untouched
    assert unuse_shared_outputs(model, 0.5) == 8
    for block in model.layer1:
        zero = (block.conv2.weight.flatten(1).abs().sum(1) == 0) & (block.conv2.bias == 0)
        assert int(zero.sum()) == 4
        assert bool((block.conv1.weight != 0).any(dim=(1, 2, 3)).all())


def test_a_runs_sample_shape_is_read_from_its_data_spec(tmp_path):

    from reproductions.prunetrain.measure import _sample_shape

    (tmp_path / "summary.json").write_text(
        json.dumps({"data_spec": {"image_size": 16, "in_channels": 1}})
    )
    assert _sample_shape(str(tmp_path)) == (1, 16, 16)
    (tmp_path / "summary.json").write_text(json.dumps({}))
    assert _sample_shape(str(tmp_path)) == (3, 32, 32)  # CIFAR's, where none is saved


def test_layer_times_sum_each_scheme_and_divide_by_union(monkeypatch):
    from reproductions.prunetrain import measure

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
            self.conv2 = nn.Conv2d(4, 4, 3, padding=1)

        def forward(self, x):
            return self.conv2(self.conv1(x))

    def model():
        m = nn.Module()
        m.layer1 = nn.Sequential(Block())
        m.forward = lambda x: m.layer1(x)
        return m

    # each layer is timed dense, union, gating in turn: 4, 2 and 3 ms
    times = iter([4.0, 2.0, 3.0])
    monkeypatch.setattr(measure, "time_ms", lambda step, repeats, warmup: [next(times)])
    out = measure._layer_times(model(), model(), 1e-4, torch.randn(2, 3, 8, 8), repeats=1)
    assert [layer["name"] for layer in out["layers"]] == ["layer1.0.conv2"]
    assert out["conv_speedup_vs_dense"] == pytest.approx(2.0)
    assert out["gating_over_union"] == pytest.approx(1.5)
    assert out["batch"] == 2


def test_the_default_threshold_is_prunetrains_1e_4():
    """Without a threshold, union/gating counting and GatedConv use the paper's 1e-4
    (Sec. 4.1): an input channel whose weights are all 5e-5 is gated away, one at 2e-4 is not."""
    from impl.methods.prunetrain_gating import GatedConv

    conv = nn.Conv2d(3, 2, 1, bias=False)
    with torch.no_grad():
        conv.weight.zero_()
        conv.weight[:, 0] = 1.0
        conv.weight[:, 1] = 2e-4  # above the threshold: dense
        conv.weight[:, 2] = 5e-5  # below it: gated away
    (layer,) = conv_flops_union_vs_gating(nn.Sequential(conv), (3, 2, 2))["layers"]
    assert layer["union_channels"] == (3, 2) and layer["gating_channels"] == (2, 2)
    assert layer["gating_flops"] == 2 * 1 * 4 * 2 * 2
    gated = GatedConv(conv)
    assert gated.idx_in.tolist() == [0, 1] and gated.idx_out.tolist() == [0, 1]
    assert tuple(gated.inner.weight.shape) == (2, 2, 1, 1)
