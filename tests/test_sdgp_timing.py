"""Tests of SDGP's time accounting (per-conv forward / data-gradient / weight-gradient times)."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from impl.methods.sdgp import conv_memory_format, sdgp_convert
from impl.methods.sdgp_timing import (
    capture_conv_shapes,
    layout_of,
    profile_conv_layers,
    time_accounting,
    time_ms,
)


def _model() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1, stride=2, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 12, 1, bias=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(12, 5),
    )


def test_capture_conv_shapes_changes_no_state():
    model = _model().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    shapes = capture_conv_shapes(model, (3, 11, 13), 2)
    assert shapes["0"] == {
        "input_shape": [2, 3, 11, 13],
        "output_shape": [2, 8, 11, 13],
        "data_grad_needed": False,
        "input_layout": "contiguous",
        "output_layout": "contiguous",
    }
    assert shapes["3"]["output_shape"] == [2, 16, 6, 7] and shapes["3"]["data_grad_needed"]
    assert shapes["6"]["input_shape"] == [2, 16, 6, 7]
    assert model.training
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(("n", "m"), [(2, 4), (1, 8)], ids=["2of4", "1of8"])
def test_profile_conv_layers_rows(n, m):
    model = sdgp_convert(_model(), n, m)
    rows = profile_conv_layers(model, (3, 11, 13), 2, n, m, repeats=1)
    assert [r["name"] for r in rows] == ["0", "3", "6"]
    stem, mid, last = rows
    for r in rows:
        assert r["fwd_ms"] > 0 and r["dgrad_ms"] > 0 and r["wgrad_ms"] > 0
    assert not stem["sparse"] and stem["prune_ms"] == 0.0 and stem["est_saved_ms"] == 0.0
    assert mid["sparse"] and mid["prune_ms"] > 0
    assert mid["est_saved_ms"] == pytest.approx(mid["dgrad_ms"] * (1 - n / m))
    # 12 channels: m = 4 divides, m = 8 pads the last group of 4 (keeps min(1, 4) = 1)
    density = {4: n / m, 8: 2 / 12}[m]
    assert last["data_grad_density"] == pytest.approx(density)
    assert last["est_saved_ms"] == pytest.approx(last["dgrad_ms"] * (1 - density))


def test_layout_of_names_what_a_convolution_computes_in():
    x = torch.randn(2, 8, 5, 5)
    assert layout_of(x) == "contiguous"
    assert layout_of(x.contiguous(memory_format=torch.channels_last)) == "channels_last"
    # one channel, or a 1x1 plane, is laid out both ways: NCHW is what it computes in
    assert layout_of(torch.randn(2, 1, 5, 5).contiguous(memory_format=torch.channels_last)) == (
        "contiguous"
    )
    assert layout_of(torch.randn(2, 8, 1, 1)) == "contiguous"
    assert layout_of(torch.randn(2, 8)) == "contiguous"
    # the torch format behind the names, which the 2:4 backend lays its data gradient out in
    assert conv_memory_format(x.contiguous(memory_format=torch.channels_last)) == (
        torch.channels_last
    )
    assert conv_memory_format(torch.randn(2, 8, 1, 1)) == torch.contiguous_format


def test_profile_lays_out_its_tensors_as_a_channels_last_model_trains(monkeypatch):
    """In a model trained channels_last every convolution past the stem gets NHWC inputs and
    NHWC output gradients: the profile times it on tensors laid out so, not on NCHW ones that
    oneDNN / cuDNN would reorder first (a copy training never makes)."""
    import impl.methods.sdgp_timing as timing

    seen = []
    real = timing.conv_grad

    def spy(which, g, x, w, args):
        seen.append((which, layout_of(g), layout_of(x)))
        return real(which, g, x, w, args)

    monkeypatch.setattr(timing, "conv_grad", spy)
    model = sdgp_convert(_model(), 2, 4).to(memory_format=torch.channels_last)
    shapes = capture_conv_shapes(model, (3, 11, 13), 2)
    assert shapes["0"]["input_layout"] == "contiguous"  # the images, as the trainer feeds them
    assert shapes["0"]["output_layout"] == "channels_last"
    assert shapes["3"]["input_layout"] == shapes["6"]["input_layout"] == "channels_last"
    rows = profile_conv_layers(model, (3, 11, 13), 2, 2, 4, repeats=1)
    assert [r["layout"] for r in rows] == ["contiguous", "channels_last", "channels_last"]
    # stem: NCHW input, NHWC gradient; then NHWC both (two calls per layer after a warm-up)
    assert seen[:4] == [
        ("input", "channels_last", "contiguous"),
        ("input", "channels_last", "contiguous"),
        ("weight", "channels_last", "contiguous"),
        ("weight", "channels_last", "contiguous"),
    ]
    assert all(call[1:] == ("channels_last", "channels_last") for call in seen[4:])
    assert len(seen) == 12
    plain = profile_conv_layers(sdgp_convert(_model(), 2, 4), (3, 11, 13), 2, 2, 4, repeats=1)
    assert [r["layout"] for r in plain] == ["contiguous"] * 3


def test_profile_times_the_backward_on_the_real_input_and_weight(monkeypatch):
    """The data and weight gradients are timed as dense training computes them (the
    convolution backward on the layer's input and weight), not through ``torch.nn.grad``'s
    stride-0 stand-ins, which can run a slower path on the CPU than training does)."""

    def refuse(*args, **kwargs):
        raise AssertionError("torch.nn.grad stand-in called")

    monkeypatch.setattr(torch.nn.grad, "conv2d_input", refuse)
    monkeypatch.setattr(torch.nn.grad, "conv2d_weight", refuse)
    rows = profile_conv_layers(sdgp_convert(_model(), 2, 4), (3, 11, 13), 2, 2, 4, repeats=1)
    assert len(rows) == 3 and all(r["dgrad_ms"] > 0 and r["wgrad_ms"] > 0 for r in rows)


def test_time_accounting_totals_and_estimate():
    model = sdgp_convert(_model(), 2, 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    acc = time_accounting(model, (3, 11, 13), 2, 2, 4, repeats=1, iteration_ms=12.5)
    rows = acc["layers"]
    assert acc["fwd_ms"] == pytest.approx(sum(r["fwd_ms"] for r in rows))
    # the stem's data gradient is never computed in training: not counted
    assert acc["dgrad_ms"] == pytest.approx(sum(r["dgrad_ms"] for r in rows[1:]))
    assert acc["conv_total_ms"] == pytest.approx(acc["fwd_ms"] + acc["dgrad_ms"] + acc["wgrad_ms"])
    # Sec. IV-C: 2:4 halves the data-gradient time of every pruned layer
    assert acc["est_saved_ms"] == pytest.approx(acc["dgrad_ms"] / 2)
    assert acc["est_saved_net_ms"] == pytest.approx(acc["est_saved_ms"] - acc["prune_ms"])
    assert acc["iteration_ms_measured"] > 0 and acc["iteration_ms_trainer"] == 12.5
    # the shares are of the iteration dense training runs (Fig. 10 rescales dense epochs)
    assert acc["iteration_ms_dense"] > 0
    assert acc["est_saved_fraction_of_iteration"] == pytest.approx(
        acc["est_saved_ms"] / acc["iteration_ms_dense"]
    )
    assert acc["est_saved_net_fraction_of_iteration"] == pytest.approx(
        (acc["est_saved_ms"] - acc["prune_ms"]) / acc["iteration_ms_dense"]
    )
    assert acc["dgrad_fraction_of_conv"] == pytest.approx(acc["dgrad_ms"] / acc["conv_total_ms"])
    assert acc["est_saved_fraction_of_conv"] == pytest.approx(
        acc["est_saved_ms"] / acc["conv_total_ms"]
    )
    assert acc["prune_ms"] > 0
    assert acc["prune_ms"] == pytest.approx(sum(r["prune_ms"] for r in rows[1:]))
    after = model.state_dict()  # the timed iteration ran on a copy
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_time_accounting_takes_a_model_whose_last_feature_map_is_one_pixel():
    """A 2x2 input leaves the second BatchNorm a 1x1 map (as ResNet-18's last stage on a small
    image): the probe for the number of classes runs one sample in eval mode, where train mode
    refused it ("Expected more than 1 value per channel") after the run had trained."""
    model = sdgp_convert(_model(), 2, 4)
    acc = time_accounting(model, (3, 2, 2), 2, 2, 4, repeats=1, iteration_ms=1.0)
    assert acc["iteration_ms_measured"] > 0 and acc["iteration_ms_dense"] > 0
    assert model.training  # the caller's model is left as it was


def test_time_ms_median_and_errors():
    calls = []
    assert time_ms(lambda: calls.append(1), torch.device("cpu"), repeats=3, warmup=2) >= 0.0
    assert len(calls) == 5
    with pytest.raises(ValueError, match="repeats >= 1"):
        time_ms(lambda: None, torch.device("cpu"), repeats=0)
    with pytest.raises(ValueError, match="warmup >= 0"):
        time_ms(lambda: None, torch.device("cpu"), warmup=-1)
    calls.clear()
    assert time_ms(lambda: calls.append(1), torch.device("cpu"), repeats=1, warmup=0) >= 0.0
    assert len(calls) == 1


def test_time_ms_times_on_the_gpu_it_is_given(monkeypatch):
    # Its events went on the current GPU's stream: for work on another GPU they timed how
    # long the host took to queue it (fake events on any machine).
    recorded, synced = [], []

    class FakeEvent:
        def __init__(self, enable_timing: bool = False) -> None:
            pass

        def record(self, stream=None) -> None:
            recorded.append(stream)

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, end: FakeEvent) -> float:
            return 2.5

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"stream of {device}")
    assert time_ms(lambda: None, torch.device("cuda:3"), repeats=2, warmup=0) == 2.5
    assert recorded == ["stream of cuda:3"] * 4 and synced == [torch.device("cuda:3")]


def test_time_ms_is_in_milliseconds_per_call():
    t = time_ms(lambda: time.sleep(0.003), torch.device("cpu"), repeats=3, warmup=0)
    assert 2.5 <= t < 1000


@pytest.mark.gpu
def test_profile_on_gpu_uses_cuda_events():
    model = sdgp_convert(_model().cuda(), 2, 4)
    rows = profile_conv_layers(model, (3, 32, 32), 8, 2, 4, repeats=2)
    assert all(r["fwd_ms"] > 0 and r["dgrad_ms"] > 0 for r in rows)


def test_time_ms_is_the_median_not_the_mean():
    delays = iter([0.0, 0.0, 0.0, 0.05])  # warm-up, then 0, 0 and one 50 ms outlier
    assert time_ms(lambda: time.sleep(next(delays)), torch.device("cpu"), 3, 1) < 10.0


def test_the_dense_iteration_prunes_no_gradient(monkeypatch):
    from impl.methods.sdgp import SDGPConv2d
    from impl.methods.sdgp_timing import time_iteration

    def refuse(self, grad_out):
        raise AssertionError("the dense iteration pruned a gradient")

    model = sdgp_convert(_model(), 2, 4)
    monkeypatch.setattr(SDGPConv2d, "prune_grad", refuse)
    time_iteration(model, (3, 11, 13), 2, repeats=1, dense=True)  # the convs restored
    with pytest.raises(AssertionError, match="pruned a gradient"):
        time_iteration(model, (3, 11, 13), 2, repeats=1)  # the check itself can fail


def test_time_ms_takes_a_device_by_name():
    calls = []
    assert time_ms(lambda: calls.append(1), "cpu", repeats=3, warmup=1) >= 0.0
    assert len(calls) == 4


def test_each_time_is_of_its_own_computation(monkeypatch):
    """``dgrad_ms`` times the data gradient (the product SDGP prunes, Sec. IV-C), ``wgrad_ms``
    the weight gradient and ``fwd_ms`` the forward: a stand-in clock reads which was run."""
    import impl.methods.sdgp_timing as T

    asked: list[str] = []
    real = T.conv_grad

    def recording(kind, *args, **kwargs):
        asked.append(kind)
        return real(kind, *args, **kwargs)

    def clock(fn, device, repeats=3, warmup=1):
        asked.clear()
        fn()
        return {("input",): 7.0, ("weight",): 3.0}.get(tuple(asked), 1.0)

    monkeypatch.setattr(T, "conv_grad", recording)
    monkeypatch.setattr(T, "time_ms", clock)
    rows = profile_conv_layers(sdgp_convert(_model(), 2, 4), (3, 11, 13), 2, 2, 4, repeats=1)
    assert [(r["fwd_ms"], r["dgrad_ms"], r["wgrad_ms"]) for r in rows] == [(1.0, 7.0, 3.0)] * 3


@pytest.mark.parametrize("amp", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_iteration_is_timed_in_the_runs_arithmetic(monkeypatch, amp):
    """Under --bf16 the dense iteration runs under autocast as training does, so the saved
    fraction divides 16-bit conv times by a 16-bit iteration."""
    from impl.methods.sdgp_timing import time_iteration

    seen = []
    real = torch.autocast

    def recording(device_type, dtype=None, enabled=True, **kwargs):
        seen.append((enabled, dtype))
        return real(device_type, dtype=dtype, enabled=enabled, **kwargs)

    monkeypatch.setattr(torch, "autocast", recording)
    time_iteration(sdgp_convert(_model(), 2, 4), (3, 11, 13), 2, repeats=1, amp_dtype=amp)
    assert seen and all(s == (amp is not None, amp) for s in seen)
