"""Tests of the SDGP convolution, ``sdgp_convert`` and the ``SDGP`` method's hooks."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from test_sdgp import loop_prune  # the loop reference (tests/ is on sys.path)
from torch import nn

import impl.models
from impl.methods import create_method
from impl.methods.base import TrainContext
from impl.methods.sdgp import (
    SDGP,
    SDGPConfig,
    SDGPConv2d,
    conv_grad,
    nm_prune,
    rank_prune_seed,
    sdgp_conv_forward,
    sdgp_convert,
    sdgp_modules,
    sdgp_plan,
    sdgp_restore,
)


def explicit_grad_input(g: torch.Tensor, conv: nn.Conv2d, in_shape: torch.Size) -> torch.Tensor:
    """dL/dD = conv_transpose2d(dL/dO, W), written out with the output padding made explicit."""
    pad = conv.padding
    out_pad = []
    for i in range(2):
        size = (g.shape[2 + i] - 1) * conv.stride[i] - 2 * pad[i]
        size += conv.dilation[i] * (conv.kernel_size[i] - 1) + 1
        out_pad.append(in_shape[2 + i] - size)
    return F.conv_transpose2d(
        g,
        conv.weight.detach(),
        None,
        conv.stride,
        pad,
        tuple(out_pad),
        conv.groups,
        conv.dilation,
    )


def _grads(module: nn.Module, x: torch.Tensor, g: torch.Tensor):
    module.zero_grad(set_to_none=True)
    xi = x.clone().requires_grad_(True)
    out = module(xi)
    out.backward(g)
    bias = None if module.bias is None else module.bias.grad.clone()
    return out.detach(), xi.grad, module.weight.grad.clone(), bias


CONV_CASES = [
    (2, 4, 32, 1, (9, 7)),
    (2, 8, 32, 2, (9, 7)),
    (4, 32, 32, 2, (8, 8)),
    (1, 16, 32, 1, (5, 11)),
    (2, 8, 12, 2, (7, 9)),  # 12 channels, m = 8: padded partial group
]
CONV_IDS = ["2of4", "2of8-s2", "4of32-s2", "1of16", "2of8-partial"]


def test_the_stem_rule_keeps_three_input_channels_dense_and_prunes_four():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 3, padding=1),
                          nn.Conv2d(4, 8, 3, padding=1))  # fmt: skip
    plan = sdgp_plan(model, 2, 4)
    assert [p.sparse for p in plan] == [False, True, True]
    assert plan[0].reason == "in_channels=3 <= 3 (stem)"


def test_no_pruning_where_the_input_needs_no_gradient():
    """The stem's dL/dD is never computed in training: nothing to prune there."""
    sd = SDGPConv2d.from_conv(nn.Conv2d(4, 8, 3, padding=1), 2, 4, "magnitude")
    sd(torch.randn(2, 4, 6, 6)).sum().backward()  # the input is a leaf without grad
    assert sd.prune_calls == 0 and sd.weight.grad is not None
    x = torch.randn(2, 4, 6, 6, requires_grad=True)
    sd(x).sum().backward()
    assert sd.prune_calls == 1 and x.grad is not None


def test_eval_mode_gives_the_dense_input_gradient_an_attack_needs():
    """eval-fgsm loads an SDGP run as trained, converted: its attack reads exact gradients."""
    torch.manual_seed(0)
    dense = nn.Conv2d(8, 8, 3, padding=1)
    sd = SDGPConv2d.from_conv(copy.deepcopy(dense), 2, 4, "magnitude").eval()
    x = torch.randn(2, 8, 6, 6, requires_grad=True)
    xd = x.detach().clone().requires_grad_()
    sd(x).square().sum().backward()
    dense(xd).square().sum().backward()
    assert sd.prune_calls == 0 and torch.equal(x.grad, xd.grad)
    sd.train()  # training prunes again
    x.grad = None
    sd(x).square().sum().backward()
    assert sd.prune_calls == 1 and not torch.allclose(x.grad, xd.grad)


def test_create_graph_gives_the_pruned_first_order_gradient_and_no_second():
    # nm_prune refused the gradient autograd handed it under create_graph, blaming the caller
    sd = SDGPConv2d.from_conv(nn.Conv2d(8, 8, 3, padding=1), 2, 4, "magnitude")
    x = torch.randn(2, 8, 6, 6, requires_grad=True)
    (once,) = torch.autograd.grad(sd(x).square().sum(), x, create_graph=True)
    (plain,) = torch.autograd.grad(sd(x).square().sum(), x)
    assert sd.prune_calls == 2 and torch.equal(once, plain)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        once.sum().backward()


def test_extra_repr_names_the_rescale_rule_only_for_rescaled_pruning():
    conv = nn.Conv2d(4, 8, 3)
    assert "rescale=plane" in repr(SDGPConv2d.from_conv(conv, 2, 4, "rescaled"))
    text = repr(SDGPConv2d.from_conv(conv, 2, 4, "magnitude"))
    assert "sdgp=2:4 magnitude" in text and "rescale" not in text


@pytest.mark.parametrize(
    ("padding", "kernel", "dilation"),
    [("same", 3, 1), ("same", 5, 2), ("same", (3, 5), 1), ("same", (5, 3), (1, 2)),
     ("valid", 3, 1), ("valid", 1, 1), ((1, 2), (3, 5), 1), ((0, 1), 3, 1)],
    ids=["same-3", "same-5-dil2", "same-3x5", "same-5x3-dil1x2", "valid-3", "valid-1",
         "int-1x2", "int-0x1"],
)  # fmt: skip
def test_every_padding_gives_the_dense_gradients_when_nothing_is_pruned(padding, kernel, dilation):
    """padding="same" / "valid" are turned into the integer padding of dL/dD's transposed conv
    (per dimension: dilation x (kernel - 1) / 2), and integer paddings are kept per dimension;
    with n = m nothing is pruned, so every gradient must be the dense conv's."""
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 8, kernel, padding=padding, dilation=dilation, bias=True).double()
    x = torch.randn(2, 4, 11, 13, dtype=torch.float64)
    with torch.no_grad():
        g = torch.randn_like(conv(x))
    dense = _grads(conv, x, g)
    sparse = _grads(SDGPConv2d.from_conv(conv, 4, 4, "magnitude"), x, g)
    for got, want in zip(sparse, dense, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


GRAD_CASES = [  # (in, out, kernel, stride, padding, dilation, groups, input size)
    (8, 16, 3, 1, 1, 1, 1, (9, 9)),
    (8, 16, 3, 2, 1, 1, 1, (9, 8)),
    (16, 8, 1, 2, 0, 1, 1, (8, 8)),
    (6, 12, (3, 5), 1, (1, 2), (2, 1), 1, (11, 13)),
    (8, 8, 3, 1, 1, 1, 4, (7, 7)),
]
GRAD_IDS = ["3x3", "3x3-s2", "1x1-s2", "3x5-dil", "groups4"]


@pytest.mark.parametrize("case", GRAD_CASES, ids=GRAD_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_conv_input_and_weight_grads_are_torch_nn_grads_bit_for_bit(case, dtype):
    """The convolution backward on the real input and weight, one gradient at a time, gives
    exactly what ``torch.nn.grad`` gives from their shapes (and so what the reference SDGP
    computed before it called the former); float32 too, not only within a tolerance."""
    cin, cout, k, stride, padding, dilation, groups, hw = case
    conv = nn.Conv2d(cin, cout, k, stride, padding, dilation, groups, bias=False, dtype=dtype)
    x = torch.randn(4, cin, *hw, dtype=dtype)
    with torch.no_grad():
        g = torch.randn_like(conv(x))
    w = conv.weight.detach()
    args = (conv.stride, conv.padding, conv.dilation, groups)
    gx = conv_grad("input", g, x, w, args)
    gw = conv_grad("weight", g, x, w, args)
    assert gx.shape == x.shape and gw.shape == w.shape
    assert torch.equal(gx, torch.nn.grad.conv2d_input(x.shape, w, g, *args))
    assert torch.equal(gw, torch.nn.grad.conv2d_weight(x, w.shape, g, *args))
    # and they are the gradients autograd gives the dense conv
    _, gx_dense, gw_dense, _ = _grads(conv, x, g)
    torch.testing.assert_close(gx, gx_dense, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gw, gw_dense, rtol=1e-5, atol=1e-5)


def test_sdgp_backward_uses_the_saved_input_not_a_stand_in(monkeypatch):
    """dL/dD comes from the convolution backward on the saved input (the path dense training
    takes), not from ``torch.nn.grad.conv2d_input``'s stride-0 stand-in for it."""

    def refuse(*args, **kwargs):
        raise AssertionError("torch.nn.grad.conv2d_input called")

    monkeypatch.setattr(torch.nn.grad, "conv2d_input", refuse)
    conv = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False)
    x = torch.randn(2, 8, 9, 9)
    with torch.no_grad():
        g = torch.randn_like(conv(x))
    sd = SDGPConv2d.from_conv(conv, 2, 4, "magnitude")
    _, gx, _, _ = _grads(sd, x, g)
    pruned = nm_prune(g, 2, 4, "magnitude", dim=1)
    args = (conv.stride, conv.padding, conv.dilation, 1)
    assert torch.equal(gx, conv_grad("input", pruned, x, conv.weight.detach(), args))


def test_conv_grad_refuses_a_gradient_it_does_not_compute():
    conv = nn.Conv2d(4, 8, 3, padding=1)
    x = torch.randn(2, 4, 5, 5)
    g = torch.randn(2, 8, 5, 5)
    args = (conv.stride, conv.padding, conv.dilation, 1)
    with pytest.raises(ValueError, match="which must be"):
        conv_grad("bias", g, x, conv.weight.detach(), args)


@pytest.mark.parametrize(("kernel", "dilation"), [(4, 1), ((3, 2), 1)], ids=["4x4", "3x2"])
def test_same_padding_that_pads_asymmetrically_is_refused(kernel, dilation):
    conv = nn.Conv2d(4, 8, kernel, padding="same", dilation=dilation)
    with pytest.raises(ValueError, match="pads asymmetrically"):
        SDGPConv2d.from_conv(conv, 2, 4)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_sdgp_conv_forward_is_the_dense_conv_and_saves_what_backward_reads(bias):
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, dilation=1, bias=bias).double()
    x = torch.randn(2, 4, 9, 7, dtype=torch.float64)
    saved = []
    ctx = SimpleNamespace(save_for_backward=lambda *t: saved.extend(t))
    w, b = conv.weight.detach(), None if conv.bias is None else conv.bias.detach()
    out = sdgp_conv_forward(ctx, x, w, b, (2, 2), (1, 1), (1, 1), 1, (1, 1))
    assert torch.equal(out, conv(x).detach())
    assert saved[0] is x and saved[1] is w and len(saved) == 2
    assert ctx.conv_args == ((2, 2), (1, 1), (1, 1), 1)
    assert ctx.bias_shape == ([6] if bias else None)
    assert ctx.bias_dtype == (torch.float64 if bias else None)


@pytest.mark.parametrize(("n", "m", "cout", "stride", "hw"), CONV_CASES, ids=CONV_IDS)
@pytest.mark.parametrize("method", ["magnitude", "rescaled"], ids=["magnitude", "rescaled"])
def test_sdgp_conv_gradients(n, m, cout, stride, hw, method):
    conv = nn.Conv2d(5, cout, 3, stride=stride, padding=1, bias=True).double()
    x = torch.randn(3, 5, *hw, dtype=torch.float64)
    with torch.no_grad():
        g = torch.randn_like(conv(x))
    out_dense, gx_dense, gw_dense, gb_dense = _grads(conv, x, g)

    sd = SDGPConv2d.from_conv(conv, n, m, method)
    assert sd.weight is conv.weight and sd.bias is conv.bias  # same Parameter objects
    out, gx, gw, gb = _grads(sd, x, g)

    assert torch.equal(out, out_dense)  # forward bit-identical
    torch.testing.assert_close(gw, gw_dense, rtol=1e-13, atol=1e-13)  # dense dL/dO for dL/dW
    torch.testing.assert_close(gb, gb_dense, rtol=1e-13, atol=1e-13)
    pruned = loop_prune(g, n, m, method, "plane")  # the loop reference
    torch.testing.assert_close(
        gx, explicit_grad_input(pruned, conv, x.shape), rtol=1e-10, atol=1e-12
    )
    # and it really differs from the dense input gradient
    assert not torch.allclose(gx, gx_dense, rtol=1e-3, atol=1e-6)


def test_sdgp_conv_random_uses_generator():
    conv = nn.Conv2d(6, 16, 3, padding=1, bias=False)
    x = torch.randn(2, 6, 7, 7)
    g = torch.randn(2, 16, 7, 7)
    sd = SDGPConv2d.from_conv(conv, 2, 4, "random", generator=torch.Generator().manual_seed(9))
    _, gx, _, _ = _grads(sd, x, g)
    pruned = nm_prune(g, 2, 4, "random", generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(gx, explicit_grad_input(pruned, conv, x.shape), rtol=1e-5, atol=1e-6)
    assert 0.0 < sd.l1_ratio() < 1.0


@pytest.mark.parametrize(
    ("method", "layout"),
    [
        ("rescaled", "nchw"),
        ("magnitude", "nchw"),
        ("random", "nchw"),
        ("rescaled", "channels_last"),
        ("rescaled", "float64"),
    ],
    ids=["rescaled", "magnitude", "random", "rescaled-channels-last", "rescaled-f64"],
)
def test_prune_grad_equals_nm_prune_and_its_l1_sums(method, layout):
    # prune_grad takes the reference's fast path with its L1 sums where it can: the pruned
    # gradient must be nm_prune's, and the statistics the float64 sums of |dL/dO| and
    # |pruned| bit for bit, summed over calls.
    conv = nn.Conv2d(6, 20, 3, padding=1, bias=False)
    sd = SDGPConv2d.from_conv(conv, 2, 4, method, generator=torch.Generator().manual_seed(4))
    gen = torch.Generator().manual_seed(4)
    dense = pruned_sum = torch.zeros((), dtype=torch.float64)
    for step in range(3):
        g = torch.randn(3, 20, 5, 7, generator=torch.Generator().manual_seed(step))
        if layout == "channels_last":
            g = g.contiguous(memory_format=torch.channels_last)
        elif layout == "float64":
            g = g.double()
        got = sd.prune_grad(g)
        want = nm_prune(g, 2, 4, method, generator=gen)
        assert torch.equal(got, want) and got.stride() == want.stride()
        dense = dense + g.abs().sum(dtype=torch.float64)
        pruned_sum = pruned_sum + want.abs().sum(dtype=torch.float64)
    assert sd.prune_calls == 3
    assert torch.equal(sd._l1_dense, dense) and torch.equal(sd._l1_pruned, pruned_sum)


def test_sdgp_conv_float32_weight_grad_exact_and_channels_last():
    conv = nn.Conv2d(8, 16, 3, padding=1, bias=True)
    x = torch.randn(4, 8, 9, 9)
    g = torch.randn(4, 16, 9, 9)
    _, _, gw_dense, gb_dense = _grads(conv, x, g)
    sd = SDGPConv2d.from_conv(conv, 2, 4)
    out, gx, gw, gb = _grads(sd, x, g)
    torch.testing.assert_close(gw, gw_dense, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gb, gb_dense, rtol=1e-6, atol=1e-6)
    # channels-last activations and gradients: the same input gradient
    xl = x.contiguous(memory_format=torch.channels_last)
    gl = g.contiguous(memory_format=torch.channels_last)
    outl, gxl, gwl, _ = _grads(sd, xl, gl)
    torch.testing.assert_close(outl, out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gxl, gx, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gwl, gw, rtol=1e-4, atol=1e-5)


def test_sdgp_conv_reflect_padding_and_no_grad_forward():
    conv = nn.Conv2d(4, 8, 3, padding=1, padding_mode="reflect", bias=False).double()
    x = torch.randn(2, 4, 6, 5, dtype=torch.float64)
    g = torch.randn(2, 8, 6, 5, dtype=torch.float64)
    sd = SDGPConv2d.from_conv(conv, 2, 4, "magnitude")
    out, gx, _, _ = _grads(sd, x, g)
    assert torch.equal(out, conv(x))
    with torch.no_grad():
        assert torch.equal(sd(x), conv(x))
    # reference: autograd through the pad of (conv with the pruned gradient)
    xi = x.clone().requires_grad_(True)
    xp = F.pad(xi, (1, 1, 1, 1), mode="reflect")
    gi = F.conv_transpose2d(loop_prune(g, 2, 4, "magnitude"), conv.weight.detach(), None, 1, 0)
    xp.backward(gi)
    torch.testing.assert_close(gx, xi.grad, rtol=1e-10, atol=1e-12)


def test_sdgp_conv_bf16_autocast_backward_runs():
    conv = nn.Conv2d(8, 16, 3, padding=1)
    sd = SDGPConv2d.from_conv(conv, 2, 4)
    x = torch.randn(2, 8, 5, 5, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sd(x)
        with torch.no_grad():
            ref = conv(x)
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref)
    out.float().square().sum().backward()
    assert x.grad.dtype == torch.float32 and conv.weight.grad.dtype == torch.float32
    assert torch.isfinite(x.grad).all()


# ---------------------------------------------------------------------------------------------
# conversion of a whole model
# ---------------------------------------------------------------------------------------------
def test_convert_resnet20_keeps_parameters_and_forward():
    torch.manual_seed(0)
    model = impl.models.create("resnet20", num_classes=10, in_channels=3)
    params_before = {name: p for name, p in model.named_parameters()}
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 3, 32, 32)
    model.train()
    out_before = model(x)
    for k, v in state_before.items():  # restore BN statistics the forward changed
        model.state_dict()[k].copy_(v)
    sdgp_convert(model, 2, 4, "rescaled")
    assert torch.equal(model(x), out_before)
    params_after = dict(model.named_parameters())
    assert params_after.keys() == params_before.keys()
    assert all(params_after[k] is params_before[k] for k in params_before)
    assert model.state_dict().keys() == state_before.keys()
    convs = {k: v for k, v in model.named_modules() if isinstance(v, nn.Conv2d)}
    sparse = sdgp_modules(model)
    assert set(convs) - set(sparse) == {"conv1"}  # only the 3-channel stem stays dense
    assert all(v.in_channels > 3 for v in sparse.values())
    plan = {p.name: p for p in sdgp_plan(model, 2, 4)}
    assert not plan["conv1"].sparse and "<= 3" in plan["conv1"].reason
    # a second conversion reconfigures, it does not wrap twice
    sdgp_convert(model, 1, 8, "magnitude")
    assert all(
        v.n == 1 and v.m == 8 and type(v) is SDGPConv2d for v in sdgp_modules(model).values()
    )


def _tiny(cout: int = 10) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, cout, 3, padding=1, stride=2, bias=False),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(cout, 4),
    )


@pytest.mark.parametrize("rule", ["pad", "dense"], ids=["pad", "dense"])
def test_nondivisible_rule(rule):
    model = _tiny(cout=10)  # 10 output channels, m = 4
    sdgp_convert(model, 2, 4, nondivisible=rule)
    plan = {p.name: p for p in sdgp_plan(model, 2, 4, rule)}
    assert plan["3"].sparse and plan["3"].data_grad_density == 0.5
    if rule == "pad":
        assert isinstance(model[6], SDGPConv2d)
        assert plan["6"].sparse and plan["6"].data_grad_density == pytest.approx(0.6)
    else:
        assert type(model[6]) is nn.Conv2d
        assert not plan["6"].sparse and "not a multiple of m=4" in plan["6"].reason
    with pytest.raises(ValueError, match="valid: pad, dense"):
        sdgp_plan(model, 2, 4, "crop")


def test_restore_and_reconvert_to_dense_give_plain_convs_sharing_the_parameters():
    # sdgp_restore undoes sdgp_convert; converting again with a plan that marks a converted
    # layer dense makes it a plain conv again (it went on pruning at the old n:m).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 16, 3), nn.Conv2d(16, 12, 1))
    weights = [m.weight for m in model]
    x = torch.randn(2, 3, 9, 9)
    want = model(x)
    sdgp_convert(model, 2, 4)
    assert list(sdgp_modules(model)) == ["1", "2"]
    sdgp_convert(model, 2, 16, nondivisible="dense")  # 8 and 12 channels: not multiples of 16
    assert list(sdgp_modules(model)) == ["1"] and sdgp_modules(model)["1"].m == 16
    assert type(model[2]) is nn.Conv2d and model[2].weight is weights[2]
    sdgp_restore(model)
    assert not sdgp_modules(model) and all(type(m) is nn.Conv2d for m in model)
    assert [m.weight for m in model] == weights
    assert torch.equal(model(x), want)


def test_convert_rejects_bad_arguments():
    with pytest.raises(ValueError, match="1 <= n <= m <= 32"):
        sdgp_convert(_tiny(), 3, 2)
    with pytest.raises(ValueError, match="valid: random, magnitude, rescaled"):
        sdgp_convert(_tiny(), 2, 4, "largest")
    with pytest.raises(ValueError, match="valid: plane, channel"):
        sdgp_convert(_tiny(), 2, 4, "rescaled", "sample")


# ---------------------------------------------------------------------------------------------
# the method's hooks
# ---------------------------------------------------------------------------------------------
def _ctx(model: nn.Module, seed: int = 5) -> TrainContext:
    return TrainContext(
        model=model,
        optimizer=None,
        config=SimpleNamespace(seed=seed),
        device=torch.device("cpu"),
        batch_size=4,
        input_shape=(1, 12, 12),
    )


def _step(model: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 1, 12, 12, generator=gen)
    y = torch.randint(0, 4, (4,), generator=gen)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


def test_l1_metrics_sum_every_ranks_share_before_the_ratio(monkeypatch):
    """Under data parallelism each rank prunes its share of the batch: the epoch's L1 ratio
    is of the sums over the ranks, computed alike on every rank (another rank simulated by
    the all-reduce adding its sums), not rank 0's share alone."""
    import torch.distributed as dist

    import impl.distributed as D

    method = create_method("sdgp", {"n": 2, "m": 4, "prune_method": "random"})
    model = _tiny(cout=12)
    ctx = _ctx(model)
    method.setup(ctx)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    method.on_epoch_start(ctx)
    _step(model, opt, 0)
    ours = [m.l1_sums() for m in sdgp_modules(model).values()]
    assert all(c == 1 for _, _, c in ours)
    other = [(1.0, 4.0, 1), (3.0, 3.0, 1)]  # the other rank: ratios 0.25 and 1.0

    def add_other_rank(t):
        t += torch.tensor(other, dtype=t.dtype).flatten()  # the layers' sums, one after another

    monkeypatch.setattr(D, "current", lambda: D.DistInfo(0, 2, 0, "gloo", 60.0))
    monkeypatch.setattr(dist, "all_reduce", add_other_rank)
    metrics = method.epoch_metrics(ctx)
    expected = [(p + q) / (d + e) for (p, d, _), (q, e, _) in zip(ours, other, strict=True)]
    assert metrics["sdgp_l1_ratio_min"] == pytest.approx(min(expected))
    assert metrics["sdgp_l1_ratio_mean"] == pytest.approx(sum(expected) / 2)
    alone = [p / d for p, d, _ in ours]
    assert metrics["sdgp_l1_ratio_mean"] != pytest.approx(sum(alone) / 2)


def _magnitude_grad() -> torch.Tensor:
    """dL/dO of 8 channels |1, 2, 3, 4| twice: 2:4 magnitude keeps 3 and 4 of each group,
    sum|pruned| / sum|dense| = 14 / 20 = 0.7."""
    return torch.tensor([1.0, -2.0, 3.0, -4.0, 1.0, 2.0, -3.0, 4.0]).reshape(1, 8, 1, 1)


def test_l1_metrics_average_only_the_layers_that_pruned_this_epoch():
    """A layer that pruned nothing this epoch has no ratio: the mean is over the others."""
    method = SDGP(SDGPConfig(prune_method="magnitude", profile=False))
    model = _tiny(cout=12)
    ctx = _ctx(model)
    method.setup(ctx)
    method.on_epoch_start(ctx)
    layers = sdgp_modules(model)
    assert list(layers) == ["3", "6"]
    layers["3"].prune_grad(_magnitude_grad())
    metrics = method.epoch_metrics(ctx)
    assert metrics["sdgp_l1_ratio_mean"] == pytest.approx(0.7)
    assert metrics["sdgp_l1_ratio_min"] == pytest.approx(0.7)


def test_l1_ratio_leaves_out_the_calls_whose_gradients_overflowed():
    """An fp16 step whose dL/dO overflowed is skipped: its sums do not count, and a layer
    that saw only such calls has no ratio (NaN), not 0."""
    conv = SDGPConv2d.from_conv(nn.Conv2d(8, 8, 1), 2, 4, "magnitude")
    conv.prune_grad(torch.full((1, 8, 1, 1), float("inf")))
    assert conv.prune_calls == 1 and math.isnan(conv.l1_ratio())
    conv.prune_grad(_magnitude_grad())
    assert conv.l1_sums() == (pytest.approx(14.0), pytest.approx(20.0), 1)
    assert conv.l1_ratio() == pytest.approx(0.7)


def test_method_registry_setup_train_and_summary(capsys):
    method = create_method("sdgp", {"n": 2, "m": 4, "prune_method": "random", "profile_repeats": 1})
    assert isinstance(method, SDGP) and method.name == "sdgp"
    model = _tiny(cout=12)
    ctx = _ctx(model)
    method.setup(ctx)
    assert len(sdgp_modules(model)) == 2
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    method.on_epoch_start(ctx)
    for i in range(2):
        _step(model, opt, i)
    metrics = method.epoch_metrics(ctx)
    assert 0.0 < metrics["sdgp_l1_ratio_mean"] < 1.0
    ratios = [m.l1_ratio() for m in sdgp_modules(model).values()]
    assert metrics["sdgp_l1_ratio_min"] == min(ratios) < max(ratios)  # the worst layer's
    assert metrics["sdgp_l1_ratio_mean"] == pytest.approx(sum(ratios) / len(ratios))
    # each epoch's own: a new epoch starts from nothing
    method.on_epoch_start(ctx)
    assert all(math.isnan(m.l1_ratio()) for m in sdgp_modules(model).values())  # no call yet
    assert method.epoch_metrics(ctx) == {}
    _step(model, opt, 7)
    fresh = [m.l1_ratio() for m in sdgp_modules(model).values()]
    assert fresh != ratios and method.epoch_metrics(ctx)["sdgp_l1_ratio_min"] == min(fresh)
    summary = method.summary(ctx)
    assert summary["sdgp_prune_method"] == "random" and summary["sdgp_rescale"] is None
    assert summary["sdgp_sparse_layers"] == ["3", "6"]
    assert list(summary["sdgp_dense_layers"]) == ["0"]
    t = summary["sdgp_time"]
    assert len(t["layers"]) == 3 and t["iteration_ms_measured"] > 0
    assert t["iteration_ms_trainer"] is None  # no Trainer medians in this context
    ctx.extra.update(epoch_fwd_ms=3.0, epoch_bwd_ms=4.5)
    assert method.summary(ctx)["sdgp_time"]["iteration_ms_trainer"] == 7.5  # fwd + bwd
    assert "sdgp: timing every conv" not in capsys.readouterr().err  # no progress: quiet
    ctx.progress = True  # a run that shows what it does says what takes the time
    method.summary(ctx)
    assert "sdgp: timing every conv's forward and gradients" in capsys.readouterr().err
    assert t["est_saved_ms"] == pytest.approx(
        sum(r["dgrad_ms"] * 0.5 for r in t["layers"] if r["sparse"])
    )
    # Fig. 10 rescales dense epoch times: the saving's share is of a dense iteration (it was
    # of one with SDGP on, its pruning included, which understated the share)
    assert t["iteration_ms_dense"] > 0
    assert t["est_saved_fraction_of_iteration"] == pytest.approx(
        t["est_saved_ms"] / t["iteration_ms_dense"]
    )
    assert sdgp_modules(model)  # timing the dense iteration left the model converted


def test_random_pruning_draws_differ_between_ranks(monkeypatch):
    # Every rank seeded the generator with the run's seed: sample i of every rank's share
    # kept the same random positions, and a resume gave every rank rank 0's generator.
    import impl.distributed as distributed

    def states(rank: int | None, epoch: int) -> torch.Tensor:
        world = distributed.DistInfo() if rank is None else distributed.DistInfo(rank, 2)
        monkeypatch.setattr(distributed, "current", lambda: world)
        method = SDGP(SDGPConfig(prune_method="random", profile=False))
        ctx = _ctx(_tiny())
        method.setup(ctx)
        ctx.epoch = epoch
        method.on_epoch_start(ctx)
        return method.generator.get_state()

    one = states(None, 1)
    assert torch.equal(one, torch.Generator().manual_seed(5).get_state())  # as set up
    rank0, rank1 = states(0, 1), states(1, 1)
    assert not torch.equal(rank0, rank1) and not torch.equal(rank0, one)
    assert torch.equal(rank0, states(0, 1))  # what a run resumed at epoch 1 draws
    assert not torch.equal(rank0, states(0, 2))
    assert torch.equal(rank1, torch.Generator().manual_seed(rank_prune_seed(5, 1, 1)).get_state())


def test_method_summary_names_the_rescale_rule():
    method = SDGP(SDGPConfig(rescale="channel", profile=False))
    model = _tiny()
    ctx = _ctx(model)
    method.setup(ctx)
    s = method.summary(ctx)
    assert s["sdgp_rescale"] == "channel" and "paper" in s["sdgp_rescale_rule"]
    assert "sdgp_time" not in s
    assert s["sdgp_nondivisible"] == "pad" and "6" in s["sdgp_sparse_layers"]


def test_method_resume_restores_generator():
    cfg = SDGPConfig(prune_method="random", profile=False)
    a = SDGP(cfg)
    model_a = _tiny(cout=12)
    a.setup(_ctx(model_a, seed=21))
    opt = torch.optim.SGD(model_a.parameters(), lr=0.1)
    _step(model_a, opt, 0)
    state = a.state_dict()
    weights = {k: v.clone() for k, v in model_a.state_dict().items()}
    _step(model_a, opt, 1)
    grads_a = [p.grad.clone() for p in model_a.parameters()]

    b = SDGP(cfg)
    model_b = _tiny(cout=12)
    ctx_b = _ctx(model_b, seed=21)
    b.setup(ctx_b)
    b.load_state_dict(state, ctx_b)
    model_b.load_state_dict(weights)
    _step(model_b, torch.optim.SGD(model_b.parameters(), lr=0.1), 1)
    for ga, p in zip(grads_a, model_b.parameters(), strict=True):
        assert torch.equal(ga, p.grad)
    # a fresh generator (no resume) would have drawn differently
    c = SDGP(cfg)
    model_c = _tiny(cout=12)
    c.setup(_ctx(model_c, seed=21))
    model_c.load_state_dict(weights)
    _step(model_c, torch.optim.SGD(model_c.parameters(), lr=0.1), 1)
    assert not torch.equal(grads_a[3], list(model_c.parameters())[3].grad)


def test_method_load_state_converts_an_unconverted_model():
    method = SDGP(SDGPConfig(profile=False))
    model = _tiny()
    method.load_state_dict({}, _ctx(model))
    assert len(sdgp_modules(model)) == 2


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"n": 3, "m": 2}, "1 <= n <= m <= 32"),
        ({"m": 64}, "1 <= n <= m <= 32"),
        ({"prune_method": "l2"}, "valid: random, magnitude, rescaled"),
        ({"rescale": "batch"}, "valid: plane, channel"),
        ({"nondivisible": "skip"}, "valid: pad, dense"),
        ({"profile_repeats": 0}, "profile_repeats must be >= 1"),
        ({"rescale_eps": -1e-12}, "rescale_eps"),
        ({"rescale_eps": float("nan")}, "rescale_eps"),
    ],
    ids=["n>m", "m>32", "method", "rescale", "nondivisible", "repeats", "eps-neg", "eps-nan"],
)
def test_method_validate(options, match):
    method = create_method("sdgp", options)
    with pytest.raises(ValueError, match=match):
        method.validate(SimpleNamespace(seed=0))


def test_channel_rescale_is_refused_with_several_processes(monkeypatch):
    # a rank's backward holds its share of the batch only; the per-sample plane rule and
    # one process are fine
    channel = create_method("sdgp", {"rescale": "channel"})
    channel.validate(SimpleNamespace(seed=0))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match="with 2 processes each one's backward sees its share"):
        channel.validate(SimpleNamespace(seed=0))
    create_method("sdgp", {"rescale": "plane"}).validate(SimpleNamespace(seed=0))
    create_method("sdgp", {"rescale": "channel", "prune_method": "magnitude"}).validate(
        SimpleNamespace(seed=0)
    )


def test_method_validate_accepts_a_zero_rescale_eps():
    create_method("sdgp", {"rescale_eps": 0.0}).validate(SimpleNamespace(seed=0))


def test_method_cost_densities():
    from impl.flops import LayerDensity

    method = SDGP(SDGPConfig(n=1, m=8, profile=False))
    cost = method.cost(_tiny(cout=12))
    assert set(cost) == {"3", "6"}
    assert cost["3"] == LayerDensity(forward=1.0, data_grad=1 / 8, weight_grad=1.0)
    assert cost["6"].data_grad == pytest.approx(2 / 12)  # 12 channels: 8 + a padded 4


def test_method_defaults_are_the_papers_2_of_4_rescaled_magnitude():
    """SDGP Sec. III-B and Table I: 2:4 along the channels, rescaled magnitude pruning; the
    authors' per-plane rescale; the partial-group rule; Fig. 9's accounting on, 3 repeats."""
    c = SDGPConfig()
    assert (c.n, c.m, c.prune_method, c.rescale) == (2, 4, "rescaled", "plane")
    assert (c.nondivisible, c.backend, c.prune_seed) == ("pad", "reference", None)
    assert (c.profile, c.profile_repeats) == (True, 3)
    summary = SDGP(SDGPConfig(profile=False)).summary(_ctx(_tiny()))
    assert (summary["sdgp_n"], summary["sdgp_m"]) == (2, 4)


def test_method_default_eps_is_the_authors_constant_unscaled():
    # The authors' 1e-4 acted on GradScaler-scaled gradients (initial scale 2**16); the
    # method's default is that constant in unscaled units, and the layers receive it.
    from impl.methods.sdgp import METHOD_RESCALE_EPS, RESCALE_EPS

    assert METHOD_RESCALE_EPS == pytest.approx(1e-4 / 65536) and RESCALE_EPS == 1e-4
    method = SDGP()
    model = _tiny()
    ctx = _ctx(model)
    method.setup(ctx)
    assert all(v.eps == METHOD_RESCALE_EPS for v in sdgp_modules(model).values())
    assert SDGP(SDGPConfig(profile=False)).summary(ctx)["sdgp_rescale_eps"] == METHOD_RESCALE_EPS
    # with gradients of the size a trained net sees (~1e-7 per element), the literal 1e-4
    # shrinks the L1 norm of a 5x5 plane by far more than the default does
    g = torch.randn(2, 8, 5, 5) * 1e-7
    literal = nm_prune(g, 2, 4, eps=RESCALE_EPS).abs().sum() / g.abs().sum()
    default = nm_prune(g, 2, 4, eps=METHOD_RESCALE_EPS).abs().sum() / g.abs().sum()
    assert literal < 0.1 and default > 0.99


def test_random_generator_is_shared_seeded_and_only_for_random_pruning():
    from impl.methods.sdgp import random_generator

    model = torch.nn.Conv2d(4, 8, 3)
    given = torch.Generator()
    assert random_generator(model, "random", given, 0) is given
    assert random_generator(model, "rescaled", None, 0) is None
    a, b = random_generator(model, "random", None, 7), random_generator(model, "random", None, 7)
    assert torch.equal(torch.rand(5, generator=a), torch.rand(5, generator=b))
    assert random_generator(torch.nn.Identity(), "random", None, 1).device.type == "cpu"


@pytest.mark.slow
def test_a_resumed_run_reports_the_whole_runs_pruning_paths(tmp_path):
    # the counts lived only in the layers: a run resumed after its last checkpoint reported
    # {} (or the calls since the resume), not the whole run's
    from impl.config import resolve
    from impl.rundir import SUMMARY_FILE
    from impl.train import resume, train

    def cfg(out):
        c = resolve("smoke", method="sdgp", epochs=2, max_steps_per_epoch=2, threads=1)
        c.out = str(out)
        return c

    whole = train(cfg(tmp_path / "whole"), progress=False)["sdgp_prune_paths"]
    assert whole and sum(whole.values()) > 0
    train(cfg(tmp_path / "cut"), progress=False)
    (tmp_path / "cut" / SUMMARY_FILE).unlink()  # killed after its last checkpoint
    assert resume(tmp_path / "cut", progress=False)["sdgp_prune_paths"] == whole


def test_a_trainable_bias_of_a_frozen_weight_gets_its_dense_gradient():
    """dL/db is the dense dL/dO summed over batch and space even when the weight is frozen
    (only the bias trains): it is asked for on its own, not only beside dL/dW."""
    conv = nn.Conv2d(8, 8, 3, padding=1, bias=True).double()
    conv.weight.requires_grad_(False)
    sd = SDGPConv2d.from_conv(conv, 2, 4, "magnitude")
    x = torch.randn(2, 8, 5, 5, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 8, 5, 5, dtype=torch.float64)
    sd(x).backward(g)
    assert conv.weight.grad is None
    torch.testing.assert_close(conv.bias.grad, g.sum(dim=(0, 2, 3)), rtol=1e-12, atol=1e-12)


def test_a_conv_converted_in_eval_mode_stays_in_eval_mode_and_prunes_nothing():
    """from_conv keeps the conv's training flag: a model converted after ``.eval()`` (e.g.
    loaded for an attack) gives the dense input gradient until it is put in train mode."""
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 8, 3, padding=1, bias=False).eval()
    sd = SDGPConv2d.from_conv(conv, 2, 4, "magnitude")
    assert not sd.training
    x = torch.randn(2, 8, 5, 5)
    g = torch.randn(2, 8, 5, 5)
    _, gx, _, _ = _grads(sd, x, g)
    assert sd.prune_calls == 0
    torch.testing.assert_close(gx, explicit_grad_input(g, conv, x.shape), rtol=1e-5, atol=1e-5)


def test_from_conv_prunes_rescaled_by_the_plane_rule_by_default():
    """Without a method, an SDGP conv prunes by rescaled magnitude, per-plane rule, with the
    authors' eps (the paper's default pruning function, Sec. III-B)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(6, 8, 3, padding=1, bias=False).double()
    sd = SDGPConv2d.from_conv(conv, 2, 4)
    assert (sd.prune_method, sd.rescale, sd.eps) == ("rescaled", "plane", 1e-4)
    x = torch.randn(2, 6, 5, 5, dtype=torch.float64)
    g = torch.randn(2, 8, 5, 5, dtype=torch.float64)
    _, gx, _, _ = _grads(sd, x, g)
    want = explicit_grad_input(loop_prune(g, 2, 4, "rescaled", "plane"), conv, x.shape)
    torch.testing.assert_close(gx, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"n": 3, "m": 2}, "1 <= n <= m <= 32"), ({"eps": -1.0}, "eps")],
    ids=["n>m", "eps-neg"],
)
def test_from_conv_and_configure_refuse_bad_pruning_arguments(kwargs, match):
    """A layer built or reconfigured directly (not through sdgp_convert) checks n, m and eps
    itself, before any gradient is pruned."""
    args = {"n": 2, "m": 4, "eps": 1e-4} | kwargs
    with pytest.raises(ValueError, match=match):
        SDGPConv2d.from_conv(nn.Conv2d(4, 8, 3), args["n"], args["m"], eps=args["eps"])
    sd = SDGPConv2d.from_conv(nn.Conv2d(4, 8, 3), 2, 4)
    with pytest.raises(ValueError, match=match):
        sd.configure(args["n"], args["m"], eps=args["eps"])


def test_reset_stats_forgets_the_calls_and_both_l1_sums():
    """After ``reset_stats`` the layer has counted no call, and its sums are those of the
    calls made since: each of sum|pruned| and sum|dense| starts again from zero."""
    sd = SDGPConv2d.from_conv(nn.Conv2d(4, 8, 3), 2, 4, "magnitude")
    sd.prune_grad(torch.randn(2, 8, 3, 3))
    sd.reset_stats()
    assert sd.prune_calls == 0 and sd.l1_sums() == (0.0, 0.0, 0)
    g = torch.randn(2, 8, 3, 3, dtype=torch.float64)
    pruned = sd.prune_grad(g)
    assert sd.prune_calls == 1
    sums = (float(pruned.abs().sum()), float(g.abs().sum()), 1)
    assert sd.l1_sums() == pytest.approx(sums, rel=1e-12)


def test_convert_seeds_the_random_pruning_generator_with_seed():
    """Without a generator, ``sdgp_convert(..., seed=s)`` draws random pruning from a generator
    seeded with ``s``: the same positions as ``nm_prune`` with ``manual_seed(s)``."""
    conv = nn.Conv2d(6, 16, 3, padding=1, bias=False)
    model = nn.Sequential(copy.deepcopy(conv))
    sdgp_convert(model, 2, 4, "random", seed=3)
    g = torch.randn(2, 16, 5, 5)
    got = model[0].prune_grad(g)
    want = nm_prune(g, 2, 4, "random", generator=torch.Generator().manual_seed(3))
    assert torch.equal(got, want)


def test_reconverting_applies_the_new_eps_to_converted_layers():
    model = _tiny(cout=12)
    sdgp_convert(model, 2, 4, eps=1e-4)
    sdgp_convert(model, 2, 4, eps=0.0)
    assert [v.eps for v in sdgp_modules(model).values()] == [0.0, 0.0]


def test_a_bare_conv_model_is_refused_by_convert_and_restore():
    """A model that is itself a conv cannot be replaced in place: both directions say so
    instead of leaving it silently unchanged."""
    with pytest.raises(ValueError, match="the model itself is a Conv2d"):
        sdgp_convert(nn.Conv2d(8, 8, 3), 2, 4)
    with pytest.raises(ValueError, match="the model itself is an SDGP conv"):
        sdgp_restore(SDGPConv2d.from_conv(nn.Conv2d(8, 8, 3), 2, 4))


def test_prune_path_counts_add_every_layers_calls():
    from impl.methods.sdgp import prune_path_counts

    model = _tiny(cout=12)
    sdgp_convert(model, 2, 4, "magnitude")
    layers = list(sdgp_modules(model).values())
    layers[0].prune_paths = {"reference": 2, "cpu kernel": 5}
    layers[1].prune_paths = {"reference": 3}
    assert prune_path_counts(model) == {"cpu kernel": 5, "reference": 5}


def test_l1_ratio_of_an_all_zero_gradient_is_zero_not_an_error():
    """A layer whose counted output gradients were all zero (a dead ReLU branch) reports a
    ratio of 0.0; NaN only where no call was counted."""
    from impl.methods.sdgp import l1_ratio_of

    assert l1_ratio_of(0.0, 0.0, 3) == 0.0
    assert math.isnan(l1_ratio_of(0.0, 0.0, 0))
    assert l1_ratio_of(1.5, 6.0, 2) == 0.25


def test_prune_seed_seeds_the_generator_and_is_validated():
    method = SDGP(SDGPConfig(prune_method="random", prune_seed=11, profile=False))
    method.setup(_ctx(_tiny(), seed=5))
    assert torch.equal(method.generator.get_state(), torch.Generator().manual_seed(11).get_state())
    # a prune_seed of 0 is a seed like any other, not "unset": the run's seed 5 is not used
    zero = SDGP(SDGPConfig(prune_method="random", prune_seed=0, profile=False))
    zero.setup(_ctx(_tiny(), seed=5))
    assert torch.equal(zero.generator.get_state(), torch.Generator().manual_seed(0).get_state())
    with pytest.raises(ValueError, match="prune_seed must be an integer"):
        SDGP(SDGPConfig(prune_seed=-1)).validate(SimpleNamespace(seed=0))


def test_load_state_dict_restores_each_layers_pruning_path_counts():
    paths = {"3": {"reference": 4}, "6": {"cpu kernel": 2, "reference": 1}}
    fresh = SDGP(SDGPConfig(profile=False))
    other = _tiny(cout=12)
    fresh.load_state_dict({"prune_paths": paths}, _ctx(other))
    assert {k: v.prune_paths for k, v in sdgp_modules(other).items()} == paths
    assert fresh.state_dict()["prune_paths"] == paths


def test_summary_times_the_configured_pruning_rule_and_repeats(monkeypatch):
    """The end-of-run profile (Fig. 9) times what the run trained with: its pruning method,
    its nondivisible rule (a layer left dense is timed as dense) and ``profile_repeats``."""
    import impl.methods.sdgp_timing as timing

    methods = []
    real = timing.nm_prune

    def spy(g, n, m, method, *args, **kwargs):
        methods.append(method)
        return real(g, n, m, method, *args, **kwargs)

    monkeypatch.setattr(timing, "nm_prune", spy)
    cfg = SDGPConfig(prune_method="magnitude", nondivisible="dense", profile_repeats=2)
    method = SDGP(cfg)
    model = _tiny(cout=10)  # 10 output channels: not a multiple of m = 4
    ctx = _ctx(model)
    method.setup(ctx)
    t = method.summary(ctx)["sdgp_time"]
    assert t["repeats"] == 2
    assert [(r["name"], r["sparse"]) for r in t["layers"]] == [
        ("0", False),
        ("3", True),
        ("6", False),
    ]
    assert methods and set(methods) == {"magnitude"}


def test_a_conv_with_asymmetric_same_padding_stays_dense_with_density_one():
    """sdgp_plan marks a conv whose ``padding="same"`` pads asymmetrically dense (its full
    dL/dO used, density 1.0) and sdgp_convert leaves it a plain conv instead of failing."""
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 8, 4, padding="same"))
    plan = sdgp_plan(model, 2, 4)
    assert [p.sparse for p in plan] == [True, False]
    assert "asymmetric" in plan[1].reason
    assert [p.data_grad_density for p in plan] == [0.5, 1.0]
    sdgp_convert(model, 2, 4)
    assert isinstance(model[0], SDGPConv2d) and type(model[1]) is nn.Conv2d


def test_load_state_dict_converts_an_unconverted_model_of_a_set_up_method():
    """A method already set up on one model converts the unconverted model it is resumed
    into, rather than restoring counts into layers that do not exist."""
    method = SDGP(SDGPConfig(profile=False))
    method.setup(_ctx(_tiny(cout=12)))
    other = _tiny(cout=12)
    method.load_state_dict({"prune_paths": {"3": {"reference": 1}}}, _ctx(other))
    assert list(sdgp_modules(other)) == ["3", "6"]
    assert sdgp_modules(other)["3"].prune_paths == {"reference": 1}
