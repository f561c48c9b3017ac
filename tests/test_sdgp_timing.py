"""Tests of SDGP's time accounting (per-conv forward / data-gradient / weight-gradient times)."""

from __future__ import annotations

import time
from types import SimpleNamespace

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


def test_a_conv_behind_frozen_layers_only_needs_no_data_gradient():
    # training computes no dL/dD for conv "3" when everything before it is frozen, so its
    # estimate saves nothing there (as the SDGP layer skips pruning, and the FLOP count)
    model = _model()
    for p in model[:3].parameters():
        p.requires_grad_(False)
    shapes = capture_conv_shapes(model, (3, 11, 13), 2)
    assert [shapes[k]["data_grad_needed"] for k in ("0", "3", "6")] == [False, False, True]
    assert all(p.grad is None for p in model.parameters())  # the capture leaves no gradients
    rows = profile_conv_layers(sdgp_convert(model, 2, 4), (3, 11, 13), 2, 2, 4, repeats=1)
    assert [r["est_saved_ms"] > 0 for r in rows] == [False, False, True]


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


def test_time_ms_is_the_median_of_the_repeats_in_milliseconds(monkeypatch):
    """Calls of 3, 1 and 2 s on a CPU clock (the warm-up's read never): 2000 ms."""
    import impl.methods.sdgp_timing as timing

    ticks = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])  # the three timed calls' start and end
    clock = SimpleNamespace(perf_counter=lambda: next(ticks))  # this module's clock alone
    monkeypatch.setattr(timing, "time", clock)
    assert time_ms(lambda: None, torch.device("cpu"), repeats=3, warmup=1) == 2000.0


@pytest.fixture
def fake_cuda_events(monkeypatch) -> SimpleNamespace:
    """torch.cuda's events, streams and synchronisation on any machine, every elapsed time
    2.5 ms. Returns the streams events were recorded on (``recorded``), the devices
    synchronised (``synced``) and, in order, each event's ``"sync"`` and each elapsed-time
    ``"read"`` (``"read-too-early"`` before its end event synchronised) as ``reads``."""
    log = SimpleNamespace(recorded=[], synced=[], reads=[])

    class FakeEvent:
        def __init__(self, enable_timing: bool = False) -> None:
            self.done = False

        def record(self, stream=None) -> None:
            log.recorded.append(stream)

        def synchronize(self) -> None:
            self.done = True
            log.reads.append("sync")

        def elapsed_time(self, end: FakeEvent) -> float:
            log.reads.append("read" if end.done else "read-too-early")
            return 2.5

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.synced.append(device))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"stream of {device}")
    return log


def test_time_ms_times_on_the_gpu_it_is_given(fake_cuda_events):
    # Its events went on the current GPU's stream: for work on another GPU they timed how
    # long the host took to queue it (fake events on any machine).
    log = fake_cuda_events
    assert time_ms(lambda: None, torch.device("cuda:3"), repeats=2, warmup=0) == 2.5
    assert log.recorded == ["stream of cuda:3"] * 4 and log.synced == [torch.device("cuda:3")]


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


def test_time_ms_reads_each_gpu_time_after_its_end_event_completes(fake_cuda_events):
    """The elapsed time of a call is read only once its end event has completed (reading it
    before raises on a real GPU): one end-event sync per call, before each read."""
    assert time_ms(lambda: None, "cuda:0", repeats=2, warmup=0) == 2.5
    assert fake_cuda_events.reads == ["sync", "read", "sync", "read"]


def test_capture_conv_shapes_leaves_an_eval_model_in_eval_and_removes_its_hooks():
    model = _model().eval()
    capture_conv_shapes(model, (3, 11, 13), 2)
    assert not model.training and not any(mod.training for mod in model.modules())
    convs = [mod for mod in model.modules() if isinstance(mod, nn.Conv2d)]
    assert all(not conv._forward_hooks for conv in convs)


def test_profile_skips_a_conv_the_forward_never_runs():
    """A conv registered but unused by forward (no captured shape) has no row, and does not
    stop the others from being timed."""

    class WithUnused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = _model()
            self.unused = nn.Conv2d(16, 16, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

    model = sdgp_convert(WithUnused(), 2, 4)
    rows = profile_conv_layers(model, (3, 11, 13), 2, 2, 4, repeats=1)
    assert [r["name"] for r in rows] == ["body.0", "body.3", "body.6"]


@pytest.fixture
def conv_grad_calls(monkeypatch) -> list[tuple]:
    """Every call of the profile's ``conv_grad``, as ``(which, g, x, w, args, result)``."""
    import impl.methods.sdgp_timing as timing

    calls = []
    real = timing.conv_grad

    def spy(which, g, x, w, args):
        out = real(which, g, x, w, args)
        calls.append((which, g, x, w, args, out))
        return out

    monkeypatch.setattr(timing, "conv_grad", spy)
    return calls


def test_profile_times_a_reflect_padded_conv_on_its_real_shapes(conv_grad_calls):
    """A non-zero padding mode is applied to the input up front and the convolution then pads
    nothing, as the layer runs it: the timed data gradient has the padded input's shape."""
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1, padding_mode="reflect"), nn.Flatten())
    rows = profile_conv_layers(sdgp_convert(model, 2, 4), (4, 6, 5), 2, 2, 4, repeats=1)
    assert [r["output_shape"] for r in rows] == [[2, 8, 6, 5]]
    shapes = [(which, list(out.shape), args[1]) for which, _, _, _, args, out in conv_grad_calls]
    assert ("input", [2, 4, 8, 7], (0, 0)) in shapes  # the reflect-padded 6x5 input


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
def test_profile_leaves_out_a_conv_with_asymmetric_same_padding():
    """Only its forward could be timed as written (no integer padding for the backward): it
    has no row, the others do."""
    model = nn.Sequential(
        nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 8, 4, padding="same"), nn.Flatten()
    )
    rows = profile_conv_layers(sdgp_convert(model, 2, 4), (4, 6, 6), 2, 2, 4, repeats=1)
    assert [r["name"] for r in rows] == ["0"]


def test_profile_prunes_along_the_channel_dim(monkeypatch):
    """The pruning timed is that of dL/dO's channels (dim 1), as SDGP prunes in training."""
    import impl.methods.sdgp_timing as timing

    dims = []
    real = timing.nm_prune

    def spy(g, n, m, method, dim, *args, **kwargs):
        dims.append(dim)
        return real(g, n, m, method, dim, *args, **kwargs)

    monkeypatch.setattr(timing, "nm_prune", spy)
    profile_conv_layers(sdgp_convert(_model(), 2, 4), (3, 11, 13), 2, 2, 4, repeats=1)
    assert dims and set(dims) == {1}


def test_a_pruned_conv_fed_the_network_input_saves_nothing():
    """A first conv with more than 3 input channels is SDGP-sparse, but training never computes
    the data gradient of the network's input: no saving is estimated for it, and neither its
    data-gradient nor its pruning time counts in the totals."""
    model = nn.Sequential(
        nn.Conv2d(4, 8, 3, padding=1),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    )
    sdgp_convert(model, 2, 4)
    acc = time_accounting(model, (4, 6, 6), 2, 2, 4, repeats=1)
    first, second = acc["layers"]
    assert first["sparse"] and not first["data_grad_needed"] and first["prune_ms"] > 0
    assert first["est_saved_ms"] == 0.0
    assert acc["est_saved_ms"] == pytest.approx(second["dgrad_ms"] / 2)
    assert acc["prune_ms"] == pytest.approx(second["prune_ms"])
    assert acc["dgrad_ms"] == pytest.approx(second["dgrad_ms"])


def test_time_accounting_divides_by_a_dense_iteration_and_names_the_amp_dtype(monkeypatch):
    """``iteration_ms_dense`` is timed with the SDGP convs restored, ``iteration_ms_measured``
    with them pruning; under bf16 every time, and the ``dtype`` reported, is bfloat16."""
    import impl.methods.sdgp_timing as timing

    calls = []

    def fake_iteration(model, input_shape, batch_size, repeats=3, *, dense=False, amp_dtype=None):
        calls.append((dense, amp_dtype))
        return 10.0 if dense else 20.0

    monkeypatch.setattr(timing, "time_iteration", fake_iteration)
    model = sdgp_convert(_model(), 2, 4)
    acc = time_accounting(model, (3, 11, 13), 2, 2, 4, repeats=1, amp_dtype=torch.bfloat16)
    assert sorted(calls, key=str) == [(False, torch.bfloat16), (True, torch.bfloat16)]
    assert acc["iteration_ms_dense"] == 10.0 and acc["iteration_ms_measured"] == 20.0
    assert acc["est_saved_fraction_of_iteration"] == pytest.approx(acc["est_saved_ms"] / 10.0)
    assert acc["dtype"] == "bfloat16" and acc["batch_size"] == 2


def test_profile_times_every_pass_in_the_amp_dtype(conv_grad_calls):
    """Under ``amp_dtype=bfloat16`` the input, the output gradient, the weight and the bias are
    all bfloat16, as the convolutions of a bf16 run compute (the bias-carrying 1x1 conv too)."""
    model = sdgp_convert(_model(), 2, 4)
    rows = profile_conv_layers(model, (3, 11, 13), 2, 2, 4, repeats=1, amp_dtype=torch.bfloat16)
    assert [r["name"] for r in rows] == ["0", "3", "6"]
    dtypes = {t.dtype for _, g, x, w, _, _ in conv_grad_calls for t in (g, x, w)}
    assert dtypes == {torch.bfloat16}
    assert model[0].weight.dtype == torch.float32  # the model itself is left as it was


def test_profile_times_the_forward_with_the_layers_bias(monkeypatch):
    """The forward timed is the layer's own: with its bias where it has one, without where
    it has none."""
    import torch.nn.functional as F

    import impl.methods.sdgp_timing as timing

    biases = []

    def conv2d(x, w, b=None, *args):
        biases.append(b)
        return F.conv2d(x, w, b, *args)

    monkeypatch.setattr(timing, "F", SimpleNamespace(conv2d=conv2d, pad=F.pad))
    model = nn.Sequential(
        nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.Flatten()
    )
    sdgp_convert(model, 2, 4)
    profile_conv_layers(model, (4, 6, 6), 2, 2, 4, repeats=1)
    with_bias = [b for b in biases if b is not None]
    assert with_bias and all(torch.equal(b, model[0].bias) for b in with_bias)
    assert None in biases


def test_time_ms_is_the_median_of_the_timed_calls_by_the_clock(monkeypatch):
    """The warm-up call is not timed; the three timed calls last 5, 1 and 2 ms on a fake
    clock: their median is 2 ms (not the minimum 1, nor the mean 8/3). A device other than
    CUDA (here ``meta``) is timed by the same host clock."""
    for device in ("cpu", "meta"):
        # warm-up (not read), then (start, end) pairs in seconds: 5 ms, 1 ms, 2 ms
        ticks = iter([1.0, 1.005, 2.0, 2.001, 3.0, 3.002])
        monkeypatch.setattr(time, "perf_counter", lambda t=ticks: next(t))
        assert time_ms(lambda: None, device, repeats=3, warmup=1) == pytest.approx(2.0)


def test_every_pass_and_the_iteration_are_timed_with_the_repeats_and_warmup_asked(monkeypatch):
    """Each conv's forward, data and weight gradients and pruning are medians over the
    ``repeats`` asked after the ``warmup`` asked, and each iteration over the same repeats
    (after one warm-up): no pass is timed with fewer calls than the others."""
    import impl.methods.sdgp_timing as timing

    asked = []

    def clock(fn, device, repeats=3, warmup=1):
        asked.append((repeats, warmup))
        return 1.0

    monkeypatch.setattr(timing, "time_ms", clock)
    model = sdgp_convert(_model(), 2, 4)
    profile_conv_layers(model, (3, 11, 13), 2, 2, 4, repeats=5, warmup=2)
    # 3 convs x (fwd, dgrad, wgrad) + pruning of the 2 sparse ones
    assert asked == [(5, 2)] * 11
    asked.clear()
    time_accounting(model, (3, 11, 13), 2, 2, 4, repeats=4)
    assert asked == [(4, 1)] * 13  # 11 conv passes, then the SDGP and the dense iteration


def test_profile_rows_name_each_convs_kernel_and_stride():
    """The row of a conv reports its own kernel size and stride: the 3x3 stride-2 middle conv
    of the model and the 1x1 stride-1 last one."""
    rows = profile_conv_layers(sdgp_convert(_model(), 2, 4), (3, 11, 13), 2, 2, 4, repeats=1)
    assert [(r["kernel_size"], r["stride"]) for r in rows] == [
        ([3, 3], [1, 1]),
        ([3, 3], [2, 2]),
        ([1, 1], [1, 1]),
    ]
    assert [(r["in_channels"], r["out_channels"]) for r in rows] == [(3, 8), (8, 16), (16, 12)]


def test_the_pruning_timed_uses_the_runs_rescale_rule(monkeypatch):
    """A run pruning with ``rescale="channel"`` has that rule timed: :func:`time_accounting`
    hands it on to the pruning :func:`profile_conv_layers` times."""
    import impl.methods.sdgp_timing as timing

    rules = []
    real = timing.nm_prune

    def spy(g, n, m, method, dim, rescale, *args, **kwargs):
        rules.append(rescale)
        return real(g, n, m, method, dim, rescale, *args, **kwargs)

    monkeypatch.setattr(timing, "nm_prune", spy)
    monkeypatch.setattr(timing, "time_iteration", lambda *args, **kwargs: 1.0)
    model = sdgp_convert(_model(), 2, 4)
    time_accounting(model, (3, 11, 13), 2, 2, 4, rescale="channel", repeats=1)
    assert rules and set(rules) == {"channel"}


def _fake_layers() -> list[dict]:
    """Two profiled convs: a stem (never computes its data gradient) and a 2:4 layer."""
    return [
        {"name": "stem", "data_grad_needed": False, "fwd_ms": 1.0, "dgrad_ms": 5.0,
         "wgrad_ms": 2.0, "prune_ms": 0.5, "est_saved_ms": 0.0},
        {"name": "mid", "data_grad_needed": True, "fwd_ms": 2.0, "dgrad_ms": 4.0,
         "wgrad_ms": 3.0, "prune_ms": 0.25, "est_saved_ms": 2.0},
    ]  # fmt: skip


def test_time_accounting_totals_worked_out_by_hand(monkeypatch):
    """Totals of two layers: forward 1 + 2 = 3 ms, data gradient only the second's 4 ms (the
    stem never computes one), weight gradient 2 + 3 = 5 ms (the stem's is computed), pruning
    only the second's 0.25 ms; the conv total 3 + 4 + 5 = 12 ms; the saving 2 ms is 2/12 of it
    and 2/8 of the 8 ms dense iteration (1.75/8 net of the pruning)."""
    import impl.methods.sdgp_timing as timing

    monkeypatch.setattr(timing, "profile_conv_layers", lambda *args, **kwargs: _fake_layers())
    its = {True: 8.0, False: 9.0}
    monkeypatch.setattr(timing, "time_iteration", lambda *args, dense=False, **kwargs: its[dense])
    acc = time_accounting(_model(), (3, 11, 13), 2, 2, 4, repeats=1)
    assert (acc["fwd_ms"], acc["dgrad_ms"], acc["wgrad_ms"]) == (3.0, 4.0, 5.0)
    assert acc["prune_ms"] == 0.25 and acc["conv_total_ms"] == 12.0
    assert acc["est_saved_ms"] == 2.0 and acc["est_saved_net_ms"] == 1.75
    assert acc["dgrad_fraction_of_conv"] == pytest.approx(4 / 12)
    assert acc["est_saved_fraction_of_conv"] == pytest.approx(2 / 12)
    assert acc["est_saved_fraction_of_iteration"] == pytest.approx(2 / 8)
    assert acc["est_saved_net_fraction_of_iteration"] == pytest.approx(1.75 / 8)
    assert acc["iteration_ms_dense"] == 8.0 and acc["iteration_ms_measured"] == 9.0


def test_a_share_of_a_zero_time_is_unknown_not_zero(monkeypatch):
    """A dense iteration or conv total timed at 0 ms (below the clock's resolution) gives no
    share (None): a saving of 0% would read like a measured result."""
    import impl.methods.sdgp_timing as timing

    zero = [dict(r, fwd_ms=0.0, dgrad_ms=0.0, wgrad_ms=0.0) for r in _fake_layers()]
    monkeypatch.setattr(timing, "profile_conv_layers", lambda *args, **kwargs: zero)
    monkeypatch.setattr(timing, "time_iteration", lambda *args, **kwargs: 0.0)
    acc = time_accounting(_model(), (3, 11, 13), 2, 2, 4, repeats=1)
    assert acc["dgrad_fraction_of_conv"] is None and acc["est_saved_fraction_of_conv"] is None
    assert acc["est_saved_fraction_of_iteration"] is None
    assert acc["est_saved_net_fraction_of_iteration"] is None
