"""Mixed precision: bf16 and fp16 autocast in the Trainer (fp16 with dynamic loss scaling),
for every method, on the CPU as on a GPU."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from impl import rundir
from impl.config import TrainConfig, resolve
from impl.train import autocast_dtype, step_overflowed, train

CLICKTRAIN_FAST = {"dense_epochs": 1, "pool_epochs": 1, "finalize_epochs": 1, "hard_prune_epoch": 3}
# Each method's options that reach its structural step within a few smoke epochs.
METHOD_RUNS = {
    "dense": ({}, 2),
    # pattern-sparse convs from epoch 3, the 1x1 shortcuts too (prune_pointwise)
    "clicktrain": ({**CLICKTRAIN_FAST, "prune_pointwise": True}, 4),
    "prunetrain": ({"penalty_ratio": 0.9, "threshold": 0.3, "reconfig_interval": 1}, 2),
    # 4 epochs (8 steps): under fp16 its rescaled gradients (kept values up to m/n times
    # larger) overflow at a loss scale a few halvings below dense's, so the scaler skips up
    # to 4 steps first (on an AVX-512 Xeon: 2**16 to 2**12) before any is taken
    "sdgp": ({}, 4),
    "campfire": ({"start_epoch": 0, "era_epochs": 1, "final_sparsity": 0.6}, 3),
}


def _cfg(out, method="dense", options=None, epochs=2, **kw) -> TrainConfig:
    """A smoke run on 8x8 digits, at batch 8 and 2 steps per epoch: float16 convolutions on
    a CPU without a native fp16 unit run a slow fallback kernel."""
    kw = {"batch_size": 8, "max_steps_per_epoch": 2, "data_options": {"image_size": 8}, **kw}
    return resolve(
        "smoke", method=method, method_options=options or {}, model="resnet20", data="digits",
        out=str(out), threads=1, epochs=epochs, **kw,
    )  # fmt: skip


def test_bf16_and_fp16_exclude_each_other():
    with pytest.raises(ValueError, match="exclude each other"):
        TrainConfig(bf16=True, fp16=True).validate()
    assert autocast_dtype(TrainConfig()) is None
    assert autocast_dtype(TrainConfig(bf16=True)) is torch.bfloat16
    assert autocast_dtype(TrainConfig(fp16=True)) is torch.float16


@pytest.mark.parametrize("bad", [None, math.inf, math.nan], ids=["finite", "inf", "nan"])
def test_step_overflowed_reads_what_the_scalers_step_decides(bad):
    a, b = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([a, b], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    scaler.scale(torch.ones(()))  # as a step scales its loss: the scale comes into being
    a.grad, b.grad = torch.full((3,), 4.0), torch.tensor([4.0, 8.0 if bad is None else bad])
    scaler.unscale_(opt)
    assert step_overflowed(scaler, opt) is (bad is not None)
    scaler.step(opt)
    scaler.update()
    assert torch.equal(a.detach(), torch.ones(3) if bad is not None else torch.full((3,), 0.9))
    assert scaler.get_scale() == (2.0 if bad is not None else 4.0)


@pytest.fixture
def conv_output_dtypes():
    """The dtypes of every convolution's output while the test trains (a global hook)."""
    seen: set[torch.dtype] = set()

    def hook(module, args, output):
        if isinstance(module, nn.Conv2d) and isinstance(output, torch.Tensor):
            seen.add(output.dtype)

    handle = nn.modules.module.register_module_forward_hook(hook)
    yield seen
    handle.remove()


@pytest.mark.parametrize(
    ("method", "amp"),
    [(m, "bf16") for m in METHOD_RUNS] + [(m, "fp16") for m in METHOD_RUNS if m != "dense"],
)  # dense under fp16: the overflow and resume tests below
@pytest.mark.slow
def test_every_method_trains_under_autocast(tmp_path, method, amp, conv_output_dtypes):
    options, epochs = METHOD_RUNS[method]
    summary = train(_cfg(tmp_path / "run", method, options, epochs, **{amp: True}), progress=False)
    assert summary["status"] == "complete"
    rows = rundir.read_metrics(tmp_path / "run")
    assert all(math.isfinite(r["train_loss"]) for r in rows)
    # every conv ran in the autocast dtype (training), float32 only in evaluation
    assert (torch.bfloat16 if amp == "bf16" else torch.float16) in conv_output_dtypes
    assert conv_output_dtypes <= {torch.float32, torch.bfloat16, torch.float16}
    if amp == "fp16":  # the scale falls from 2**16 by half per overflow; some steps were taken
        assert all(r["amp_loss_scale"] <= 2.0**16 for r in rows)
        assert sum(r["amp_skipped_steps"] for r in rows) < sum(r["iterations"] for r in rows)
    else:
        assert "amp_loss_scale" not in rows[0]
    if method == "clicktrain":  # trained through hard pruning on pattern-sparse convs
        assert rows[-1]["clicktrain_stage"] == "sparse"
        layers = summary["clicktrain"]["layers"]
        assert any(layer["pattern_conv"] for layer in layers.values())
        assert any(name.endswith("downsample.0") for name, layer in layers.items()
                   if layer["pattern_conv"])  # fmt: skip
    if method == "prunetrain":
        assert summary["compression_ratio"] > 1.0  # channels were removed under autocast
    if method == "campfire":
        assert summary["compression_ratio"] > 1.5
    if method == "sdgp":  # its end-of-run profile (Fig. 9) timed the arithmetic the run trained in
        assert summary["sdgp_time"]["dtype"] == {"bf16": "bfloat16", "fp16": "float16"}[amp]


@pytest.mark.gpu
@pytest.mark.parametrize(("method", "amp"), [("clicktrain", "fp16"), ("sdgp", "bf16")])
def test_methods_train_under_autocast_on_a_gpu(tmp_path, method, amp, conv_output_dtypes):
    """On CUDA: ClickTrain through hard pruning (its pattern convs on the CUDA kernels, in
    float32) under fp16 with loss scaling, SDGP's pruned backward under bf16."""
    options, epochs = METHOD_RUNS[method]
    cfg = _cfg(tmp_path / "run", method, options, epochs, device="cuda", **{amp: True})
    summary = train(cfg, progress=False)
    rows = rundir.read_metrics(tmp_path / "run")
    assert summary["status"] == "complete" and all(math.isfinite(r["train_loss"]) for r in rows)
    assert (torch.float16 if amp == "fp16" else torch.bfloat16) in conv_output_dtypes
    if method == "clicktrain":
        assert rows[-1]["clicktrain_stage"] == "sparse"
        assert any(layer["pattern_conv"] for layer in summary["clicktrain"]["layers"].values())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_pattern_ops_run_in_float32_under_autocast(dtype):
    """No 16-bit pattern kernels: under autocast ClickTrain's pattern-sparse convs (and the
    SpMM) take float32 copies of 16-bit inputs and run with autocast off, forward and
    backward (even a backward called inside autocast), equal to the float32 op."""
    from impl.ops import PatternConv2d, pattern_index, pattern_spmm

    torch.manual_seed(0)
    conv = nn.Conv2d(8, 16, 3, padding=1, bias=True)
    mask = torch.rand_like(conv.weight) < 0.3
    sparse = PatternConv2d.from_conv(conv, mask, "ref")
    x = torch.randn(2, 8, 6, 6, dtype=dtype)
    with torch.autocast("cpu", dtype=dtype):
        y = sparse(x)
        y.sum().backward()
    assert y.dtype == torch.float32 and sparse.weight.grad.dtype == torch.float32
    ref = nn.functional.conv2d(x.float(), sparse.weight.detach() * mask, sparse.bias, padding=1)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)

    idx = pattern_index(mask.reshape(16, -1))
    values = torch.randn(idx.col_ind.numel(), requires_grad=True)
    b = torch.randn(72, 5, dtype=dtype)
    with torch.autocast("cpu", dtype=dtype):
        out = pattern_spmm(values, idx.row_ptr, idx.col_ind, b, "ref", index=idx)
        out.sum().backward()
    dense = torch.zeros(16, 72).index_put_(
        (torch.repeat_interleave(torch.arange(16), idx.row_ptr.diff()), idx.col_ind),
        values.detach(),
    )
    assert out.dtype == torch.float32 and values.grad.dtype == torch.float32
    torch.testing.assert_close(out, dense @ b.float(), rtol=1e-5, atol=1e-5)


def test_an_fp16_overflow_skips_the_step_and_the_methods_gradient_hook(tmp_path, monkeypatch):
    """A loss scale so large that every gradient overflows: no step is taken (the weights
    stay as initialised), after_backward never runs, after_step does, and each epoch
    counts its skipped steps while the scale halves per step."""
    from impl.methods.dense import Dense

    calls = {"after_backward": 0, "after_step": 0}
    initial = {}
    monkeypatch.setattr(Dense, "setup", lambda self, ctx: initial.update(
        {k: v.clone() for k, v in ctx.model.state_dict().items()}))  # fmt: skip
    monkeypatch.setattr(Dense, "after_backward", lambda self, ctx: _count(calls, "after_backward"))
    monkeypatch.setattr(Dense, "after_step", lambda self, ctx: _count(calls, "after_step"))
    real = torch.amp.GradScaler.__init__

    def huge(self, device="cuda", init_scale=2.0**16, *args, **kw):
        real(self, device, 2.0**120, *args, **kw)  # overflows float32 sums too

    monkeypatch.setattr(torch.amp.GradScaler, "__init__", huge)
    train(_cfg(tmp_path / "run", epochs=2, fp16=True), progress=False)
    rows = rundir.read_metrics(tmp_path / "run")
    assert [r["amp_skipped_steps"] for r in rows] == [2, 2]  # every step of both epochs
    assert rows[-1]["amp_loss_scale"] == 2.0 ** (120 - 4)
    assert calls == {"after_backward": 0, "after_step": 4}
    trained = rundir.load_checkpoint(tmp_path / "run")["model"]
    params = [k for k in initial if k.endswith(("weight", "bias"))]
    assert params and all(torch.equal(trained[k], initial[k]) for k in params)


def _count(calls: dict[str, int], key: str) -> None:
    calls[key] += 1


def test_an_fp16_run_resumes_with_its_loss_scale(tmp_path, monkeypatch):
    """The GradScaler's state travels in the checkpoint: a run that dies after its first
    epoch and is resumed ends where the uninterrupted one does, bit for bit."""
    import impl.train as train_mod

    whole = train(_cfg(tmp_path / "whole", epochs=2, fp16=True), progress=False)
    real_epoch = train_mod.Trainer._train_epoch
    done = []

    def die_after_one(self, *args, **kw):
        if done:
            raise KeyboardInterrupt
        done.append(1)
        return real_epoch(self, *args, **kw)

    monkeypatch.setattr(train_mod.Trainer, "_train_epoch", die_after_one)
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(tmp_path / "cut", epochs=2, fp16=True), progress=False)
    monkeypatch.setattr(train_mod.Trainer, "_train_epoch", real_epoch)
    ck = rundir.load_checkpoint(tmp_path / "cut")
    assert ck["epoch"] == 1 and ck["grad_scaler"]["scale"] > 0
    again = train_mod.resume(tmp_path / "cut", progress=False)
    assert again["top1"] == whole["top1"]
    a = rundir.load_checkpoint(tmp_path / "whole")
    b = rundir.load_checkpoint(tmp_path / "cut")
    assert a["grad_scaler"] == b["grad_scaler"]
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key


def test_the_cli_takes_one_autocast_dtype_and_records_it(tmp_path, capsys):
    from impl import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "--scale", "smoke", "--bf16", "--fp16", "--out", str(tmp_path / "x")])
    assert exc.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    out = tmp_path / "run"
    args = [
        "train",
        "--scale",
        "smoke",
        "--fp16",
        "--batch-size",
        "8",
        "--epochs",
        "1",
        "--max-steps-per-epoch",
        "1",
        "--threads",
        "1",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert cli.main(args) == 0
    assert TrainConfig.from_dict(rundir.read_json(out / rundir.CONFIG_FILE)).fp16 is True


@pytest.mark.parametrize("amp", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_prunetrains_time_probes_run_in_the_autocast_dtype(amp, conv_output_dtypes):
    from impl.methods.prunetrain_memory import probe_iteration_ms

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    fwd, bwd = probe_iteration_ms(model, (3, 8, 8), 2, repeats=1, amp_dtype=amp)
    assert fwd > 0 and bwd > 0
    if amp is None:
        assert conv_output_dtypes == {torch.float32}
    else:  # (one float32 forward counts the model's outputs first)
        assert amp in conv_output_dtypes


def test_sdgps_l1_ratio_leaves_out_an_overflowed_gradient():
    """An fp16 step that overflowed (its dL/dO holds an inf; the Trainer skips it) adds
    nothing to SDGP's L1 statistics: one such call no longer makes the epoch's ratio NaN."""
    from impl.methods.sdgp import SDGPConv2d

    conv = nn.Conv2d(6, 8, 3, padding=1, bias=False)
    sd = SDGPConv2d.from_conv(conv, 2, 4, "magnitude")
    g = torch.randn(2, 8, 5, 5)
    bad = g.clone()
    bad[0, 0, 0, 0] = math.inf
    sd.prune_grad(bad)
    assert math.isnan(sd.l1_ratio())  # no finite call yet
    pruned = sd.prune_grad(g)
    assert sd.prune_calls == 2
    assert sd.l1_ratio() == pytest.approx(float(pruned.abs().sum() / g.abs().sum()))


def test_sdgps_l1_ratio_leaves_out_a_call_whose_rescaled_gradient_overflowed():
    """A finite fp16 dL/dO can overflow once rescaled (sum|x| / sum|y| > 1 lifts a kept 60000
    past fp16's 65504): that call's pruned sum is inf, so it is left out like an overflowed
    dL/dO, not added as an infinite ratio."""
    from impl.methods.sdgp import SDGPConv2d

    sd = SDGPConv2d.from_conv(nn.Conv2d(4, 4, 1), 2, 4, "rescaled")
    g = torch.zeros(1, 4, 1, 2, dtype=torch.float16)
    g[0, :, 0, 0] = torch.tensor([60000.0, 60000.0, 0.0, 0.0])
    g[0, :, 0, 1] = torch.tensor([30000.0, 40000.0, 40000.0, 0.0])
    pruned = sd.prune_grad(g)
    # channel 0's plane: 60000 kept, 30000 pruned -> 60000 * 90000 / 60000 overflows
    assert torch.isinf(pruned[0, 0, 0, 0]) and torch.isfinite(g).all()
    assert math.isnan(sd.l1_ratio())
    assert sd.l1_sums() == (0.0, 0.0, 0)


def test_an_optimizer_replaced_in_after_backward_is_refused_under_fp16(tmp_path, monkeypatch):
    """Its gradients were never unscaled (GradScaler.unscale_ ran on the old one): stepping it
    would apply gradients 2**16 times too large or, unscaled twice, too small."""
    from impl.methods.dense import Dense

    def replace(self, ctx):
        ctx.optimizer = torch.optim.SGD(ctx.model.parameters(), lr=0.1)

    monkeypatch.setattr(Dense, "after_backward", replace)
    with pytest.raises(RuntimeError, match="replaced the optimizer"):
        train(_cfg(tmp_path / "run", epochs=1, fp16=True), progress=False)


def test_sdgp_fig9_times_the_papers_16_bit_arithmetic_on_a_gpu(monkeypatch):
    """Fig. 9's per-layer times: float16 at the gpu and paper scales (the paper trains in
    16-bit, Sec. III-C), float32 on a CPU; the result names the dtype it timed."""
    from reproductions.sdgp import measure

    timed: set[torch.dtype] = set()
    conv2d = nn.functional.conv2d

    def spy(x, *args, **kw):
        timed.add(x.dtype)
        return conv2d(x, *args, **kw)

    monkeypatch.setattr(nn.functional, "conv2d", spy)
    assert measure.DTYPES["gpu"] is measure.DTYPES["paper"] is torch.float16
    assert measure.DTYPES["cpu"] is measure.DTYPES["smoke"] is None
    assert measure.conv_times(scale="smoke", context={}, repeats=1)["dtype"] == "float32"
    assert timed == {torch.float32}
    monkeypatch.setitem(measure.DTYPES, "smoke", torch.bfloat16)  # a 16-bit type a CPU runs
    timed.clear()
    assert measure.conv_times(scale="smoke", context={}, repeats=1)["dtype"] == "bfloat16"
    assert torch.bfloat16 in timed
