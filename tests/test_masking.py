"""MaskSet keeps pruned weights exactly zero: weights, gradients, optimizer state, weight decay."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from impl.methods.masking import MaskSet, conv_weight_counts, true_sparsity


def _model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 5, 3, bias=False), nn.Flatten(), nn.Linear(5 * 3 * 3, 7))


def _masks(model: nn.Module, fraction: float = 0.6) -> MaskSet:
    masks = MaskSet()
    for name in ("0.weight", "2.weight"):
        p = model.get_parameter(name)
        masks.set(name, torch.rand(p.shape) > fraction)
    return masks


def test_set_and_lookup() -> None:
    masks = MaskSet({"a": torch.tensor([1.0, 0.0, 2.0])})
    assert "a" in masks and len(masks) == 1 and list(masks) == ["a"]
    assert masks["a"].dtype == torch.bool
    assert masks["a"].tolist() == [True, False, True]
    with pytest.raises(ValueError, match="must be a tensor"):
        masks.set("b", [1, 0])  # type: ignore[arg-type]


def test_shape_mismatch_is_an_error() -> None:
    model = _model()
    masks = MaskSet({"0.weight": torch.ones(5, 3, 3)})
    with pytest.raises(ValueError, match="shape"):
        masks.apply_to_weights(model)


def test_apply_to_weights_zeroes_only_pruned() -> None:
    model = _model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    masks = _masks(model)
    masks.apply_to_weights(model)
    for name, mask in masks.items():
        p = model.get_parameter(name)
        assert bool((p[~mask] == 0).all())
        assert torch.equal(p[mask], before[name][mask])
    assert torch.equal(model.get_parameter("2.bias"), before["2.bias"])


def test_apply_to_grads_and_skip_missing_grad() -> None:
    model = _model()
    masks = _masks(model)
    masks.apply_to_grads(model)  # no grads yet: nothing to do, no error
    model(torch.randn(4, 3, 5, 5)).square().sum().backward()
    grads = {n: model.get_parameter(n).grad.clone() for n in masks}
    masks.apply_to_grads(model)
    for name, mask in masks.items():
        g = model.get_parameter(name).grad
        assert bool((g[~mask] == 0).all())
        assert torch.equal(g[mask], grads[name][mask])


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        lambda ps: torch.optim.Adam(ps, lr=0.01, amsgrad=True),
    ],
    ids=["sgd-momentum", "adam-amsgrad"],
)
def test_apply_to_optimizer_zeroes_state(make) -> None:
    model = _model()
    opt = make(model.parameters())
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 3, 5, 5)).square().sum().backward()
        opt.step()
    masks = _masks(model)
    masks.apply_to_optimizer(opt, model)
    checked = 0
    for name, mask in masks.items():
        state = opt.state[model.get_parameter(name)]
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.shape == mask.shape:
                assert bool((value[~mask] == 0).all()), key
                assert bool((value[mask] != 0).any()), key
                checked += 1
    assert checked >= 2
    masks.apply_to_optimizer(None, model)  # no optimizer: nothing to do


OPTIMIZERS = {
    "sgd-m0.9-wd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=5e-4),
    "sgd-nesterov-wd": lambda ps: torch.optim.SGD(
        ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3
    ),
    "adam-wd": lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=1e-4),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=1e-2),
}


def _train(model, opt, masks, steps, *, grads=True, state=True, weights=False) -> None:
    for _ in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(8, 3, 5, 5)).square().mean()
        loss.backward()
        if grads:
            masks.apply_to_grads(model)
        opt.step()
        if weights:
            masks.apply_to_weights(model)
        if state:
            masks.apply_to_optimizer(opt, model)


@pytest.mark.parametrize("name", list(OPTIMIZERS), ids=list(OPTIMIZERS))
def test_pruned_weights_stay_exactly_zero_without_rezeroing(name: str) -> None:
    """Masking gradients and optimizer state is enough: the step itself keeps zeros at zero."""
    model = _model()
    opt = OPTIMIZERS[name](model.parameters())
    _train(model, opt, MaskSet(), 3, grads=False, state=False)  # warm momentum, then prune
    masks = _masks(model)
    masks.enforce(model, opt)
    _train(model, opt, masks, 50)
    for pname, mask in masks.items():
        p = model.get_parameter(pname)
        assert bool((p[~mask] == 0).all()), pname
        assert bool((p[mask] != 0).all()), pname


def test_control_unmasked_gradient_regrows_weights() -> None:
    """Without the gradient mask the same loop regrows pruned weights (the test above can fail)."""
    model = _model()
    opt = OPTIMIZERS["sgd-m0.9-wd"](model.parameters())
    masks = _masks(model)
    masks.enforce(model, opt)
    _train(model, opt, masks, 3, grads=False)
    p = model.get_parameter("0.weight")
    assert bool((p[~masks["0.weight"]] != 0).any())


def test_control_stale_momentum_regrows_weights() -> None:
    """A momentum buffer left unmasked after pruning moves the pruned weights off zero."""
    model = _model()
    opt = OPTIMIZERS["sgd-m0.9-wd"](model.parameters())
    _train(model, opt, MaskSet(), 3, grads=False, state=False)
    masks = _masks(model)
    masks.apply_to_weights(model)
    _train(model, opt, masks, 1, state=False)
    p = model.get_parameter("0.weight")
    assert bool((p[~masks["0.weight"]] != 0).any())


def test_state_dict_round_trip_weights_only() -> None:
    model = _model()
    masks = _masks(model)
    buf = io.BytesIO()
    torch.save(masks.state_dict(), buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    other = MaskSet({"stale": torch.ones(2)})
    other.load_state_dict(loaded)
    assert list(other) == list(masks)
    for name, mask in masks.items():
        assert torch.equal(other[name], mask)


def test_sparsity_accounting() -> None:
    masks = MaskSet({"a": torch.tensor([True, False, False, True, False])})
    assert masks.mask_sparsity() == {"a": pytest.approx(0.6)}
    assert true_sparsity(torch.tensor([0.0, 1.0, -0.0, 2.0])) == pytest.approx(0.5)
    assert true_sparsity(torch.empty(0)) == 0.0


@pytest.mark.parametrize(
    "dtype",
    [torch.float64, torch.float32, torch.float16, torch.bfloat16],
    ids=["f64", "f32", "f16", "bf16"],
)
def test_zeroing_equals_masked_fill_bit_for_bit_on_special_values(dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(7, 5, 3, 3, generator=gen).to(dtype)
    w.view(-1)[:6] = torch.tensor([float("nan"), float("-inf"), -0.0, float("inf"), -1.5, 0.0])
    keep = torch.rand(w.shape, generator=gen) > 0.5
    keep.view(-1)[:6] = torch.tensor([False, False, False, True, True, False])
    want = w.clone().masked_fill_(~keep, 0.0)
    layer = nn.Conv2d(5, 7, 3, bias=False).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(w)
    MaskSet({"weight": keep}).apply_to_weights(layer)
    got = layer.weight.detach()
    assert torch.equal(got.view(-1).view(torch.uint8), want.view(-1).view(torch.uint8))  # bits
    assert not bool(torch.signbit(got[~keep]).any())  # a pruned -0.0 or -inf became +0.0


def test_zeroing_follows_strides_and_a_changed_mask() -> None:
    layer = nn.Conv2d(4, 6, 3, bias=False).to(memory_format=torch.channels_last)
    assert not layer.weight.is_contiguous()
    first = torch.rand(layer.weight.shape) > 0.5
    masks = MaskSet({"weight": first})
    masks.apply_to_weights(layer)
    assert bool((layer.weight[~first] == 0).all()) and bool((layer.weight[first] != 0).all())
    second = torch.zeros(layer.weight.shape, dtype=torch.bool)
    second[0] = True  # keep only filter 0: the cached integer mask of the first must not serve
    masks.set("weight", second)
    masks.apply_to_weights(layer)
    assert int(torch.count_nonzero(layer.weight)) == int((first & second).sum())
    masks.load_state_dict({"weight": torch.zeros_like(second)})
    masks.apply_to_weights(layer)
    assert int(torch.count_nonzero(layer.weight)) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_zeroing_on_a_gpu_equals_masked_fill_and_keeps_bool_masks(dtype) -> None:
    w = torch.randn(64, 32, 3, 3, device="cuda").to(dtype)
    w.view(-1)[:3] = torch.tensor([float("nan"), float("-inf"), -0.0])
    keep = torch.rand(w.shape, device="cuda") > 0.5
    keep.view(-1)[:3] = False
    want = w.clone().masked_fill_(~keep, 0.0)
    masks = MaskSet({"w": keep})
    layer = nn.Module()
    layer.w = nn.Parameter(w.clone())
    masks.apply_to_weights(layer)
    ints = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert torch.equal(layer.w.detach().view(ints), want.view(ints))  # bit for bit
    cached = [m for per_name in masks._bit_masks.values() for m in per_name.values()]
    assert cached and all(m.dtype == torch.bool for m in cached)  # 1 byte per weight


def test_the_set_keeps_its_own_copy_of_a_mask() -> None:
    layer = nn.Conv2d(2, 3, 3, bias=False)
    keep = torch.ones(layer.weight.shape, dtype=torch.bool)
    masks = MaskSet({"weight": keep})
    masks.apply_to_weights(layer)  # builds the cached integer mask
    keep.zero_()  # the caller reuses its tensor: the set must not change under it
    assert bool(masks["weight"].all())
    masks.apply_to_weights(layer)
    assert int(torch.count_nonzero(layer.weight)) == layer.weight.numel()


def test_zero_pruned_zeroes_any_tensor_shaped_like_the_parameter_and_checks_its_shape() -> None:
    keep = torch.tensor([[True, False, True], [False, True, False]])
    masks = MaskSet({"fc.weight": keep})
    buf = torch.arange(1.0, 7.0).reshape(2, 3)  # say a momentum buffer
    masks.zero_pruned("fc.weight", buf)
    assert buf.tolist() == [[1.0, 0.0, 3.0], [0.0, 5.0, 0.0]]
    with pytest.raises(ValueError, match=r"has shape \(2, 3\), parameter \(3, 2\)"):
        masks.zero_pruned("fc.weight", torch.ones(3, 2))
    with pytest.raises(KeyError):
        masks.zero_pruned("other.weight", buf)


def test_zero_pruned_zeroes_an_integer_tensor_too() -> None:
    """A dtype without a same-width integer view (here int64) is zeroed by a masked fill."""
    keep = torch.tensor([[True, False, True], [False, True, True]])
    masks = MaskSet({"fc.weight": keep})
    t = torch.arange(1, 7, dtype=torch.int64).reshape(2, 3)
    masks.zero_pruned("fc.weight", t)
    assert t.tolist() == [[1, 0, 3], [0, 5, 6]]
    c = torch.full((2, 3), 2.0 + 1.0j)  # complex: no integer view either
    masks.zero_pruned("fc.weight", c)
    assert torch.equal(c, torch.where(keep, 2.0 + 1.0j, 0.0 + 0.0j))


def test_optimizer_state_of_another_shape_is_left_alone() -> None:
    """Only state tensors shaped like the parameter are masked: a per-row statistic (as a
    factored optimizer keeps) is neither zeroed nor checked against the mask's shape."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3, 5, 5)).square().sum().backward()
    opt.step()
    p = model.get_parameter("0.weight")
    row = torch.arange(1.0, 6.0)  # one value per output filter: shape [5], not [5, 3, 3, 3]
    opt.state[p]["row_stat"] = row.clone()
    keep = torch.zeros(p.shape, dtype=torch.bool)
    keep[0] = True
    masks = MaskSet({"0.weight": keep})
    masks.apply_to_optimizer(opt, model)
    assert torch.equal(opt.state[p]["row_stat"], row)
    buf = opt.state[p]["momentum_buffer"]
    assert int(torch.count_nonzero(buf[1:])) == 0 and bool((buf[0] != 0).any())


def test_sparsity_accounting_skips_empty_masks_and_counts_negatives_as_nonzero() -> None:
    """An empty mask has no sparsity to report; true sparsity counts exact zeros only."""
    masks = MaskSet({"a": torch.tensor([True, False]), "empty": torch.zeros(0, dtype=torch.bool)})
    assert masks.mask_sparsity() == {"a": pytest.approx(0.5)}
    assert true_sparsity(torch.tensor([-1.0, 0.0, -2.5, 3.0])) == pytest.approx(0.25)


def test_state_dict_is_a_snapshot_later_changes_leave_alone() -> None:
    """Changing a tensor of a saved state changes neither the set nor a later state."""
    masks = MaskSet({"w": torch.tensor([True, True, False])})
    saved = masks.state_dict()
    saved["w"].zero_()
    assert masks["w"].tolist() == [True, True, False]
    assert masks.state_dict()["w"].tolist() == [True, True, False]


def test_conv_weight_counts_totals_and_nonzeros_over_convs_only() -> None:
    """``(total, nonzero)`` over every Conv2d weight; linear layers and biases do not count."""
    model = _model()  # conv 5x3x3x3 = 135 weights, linear 45x7
    with torch.no_grad():
        model[0].weight.view(-1)[:40] = 0.0
        model[2].weight.zero_()
    assert conv_weight_counts(model) == (135, 135 - 40)


def test_a_masked_bias_has_its_gradient_zeroed_too() -> None:
    """A 1-D parameter (a bias) is masked like a weight: its pruned entries' gradient is 0."""
    model = _model()
    model(torch.randn(2, 3, 5, 5)).sum().backward()  # d(sum)/d(bias) = 2 for every output
    keep = torch.tensor([True, False, True, False, False, True, True])
    MaskSet({"2.bias": keep}).apply_to_grads(model)
    assert model[2].bias.grad.tolist() == [2.0, 0.0, 2.0, 0.0, 0.0, 2.0, 2.0]
    # and its momentum: a pruned bias entry would otherwise grow back through it
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model[2].bias.grad.fill_(2.0)
    opt.step()
    MaskSet({"2.bias": keep}).enforce(model, opt)
    momentum = opt.state[model[2].bias]["momentum_buffer"]
    assert momentum.tolist() == [2.0, 0.0, 2.0, 0.0, 0.0, 2.0, 2.0]
    assert model[2].bias[~keep].eq(0).all()


def test_optimizer_state_with_as_many_dimensions_but_another_shape_is_left_alone() -> None:
    """A per-filter statistic kept with its dimensions ([5, 1, 1, 1] for a [5, 3, 3, 3] conv
    weight) is not shaped like the parameter: neither zeroed nor refused for its shape."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    p = model.get_parameter("0.weight")
    stat = torch.arange(1.0, 6.0).view(5, 1, 1, 1)
    opt.state[p]["filter_stat"] = stat.clone()
    MaskSet({"0.weight": torch.zeros(p.shape, dtype=torch.bool)}).apply_to_optimizer(opt, model)
    assert torch.equal(opt.state[p]["filter_stat"], stat)


def test_true_sparsity_of_a_single_entry_is_one_when_it_is_zero() -> None:
    assert true_sparsity(torch.zeros(1)) == 1.0
    assert true_sparsity(torch.ones(1)) == 0.0
    assert true_sparsity(torch.zeros(0)) == 0.0
    # exactly zero, not small: the least normal and subnormal floats are weights too
    tiny = torch.tensor([0.0, 1e-40, -1e-45, torch.finfo(torch.float32).tiny])
    assert true_sparsity(tiny) == 0.25
