"""Channel union against channel gating FLOPs (PruneTrain Sec. 4.2, Fig. 6)."""

from __future__ import annotations

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
