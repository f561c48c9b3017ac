"""Campfire as a method: schedule, validation, the per-step masking loop, fixed masks, resume."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from impl.config import TrainConfig, resolve
from impl.flops import LayerDensity
from impl.methods import TrainContext, create_method
from impl.methods.campfire import (
    Campfire,
    CampfireConfig,
    pruned_layers,
    resolve_era,
    sparsity_at,
)

ROOT = Path(__file__).resolve().parents[1]


# -- schedule ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("start", "era", "final"),
    [(30, 20, 0.7), (0, 10, 0.6), (5, 3, 0.9), (2.5, 1.5, 0.4), (7, 1, 0.0)],
    ids=["paper-30-50", "from-0", "cpu-5-8", "fractional", "zero-final"],
)
def test_schedule_ends_and_monotone(start, era, final) -> None:
    assert sparsity_at(0.0, start, era, final) == 0.0
    assert sparsity_at(start, start, era, final) == 0.0
    assert sparsity_at(start + era, start, era, final) == pytest.approx(final)
    assert sparsity_at(start + era + 10, start, era, final) == pytest.approx(final)
    grid = [start - 1 + i * (era + 2) / 997 for i in range(998)]
    values = [sparsity_at(max(e, 0.0), start, era, final) for e in grid]
    assert all(b >= a for a, b in zip(values, values[1:], strict=False))
    assert all(0.0 <= v <= final for v in values)


def test_schedule_is_the_cubic_ramp() -> None:
    # s_f + (0 - s_f)(1 - t)^3 at t = 1/2: 0.7 * (1 - 1/8)
    assert sparsity_at(40, 30, 20, 0.7) == pytest.approx(0.7 * 7 / 8)
    assert sparsity_at(40, 30, 20, 0.7, r=1) == pytest.approx(0.35)
    # the paper's printed form s_f - (s_i + s_f)(1 - t)^r agrees for s_i = 0
    t = 0.3
    assert sparsity_at(30 + t * 20, 30, 20, 0.7) == pytest.approx(0.7 - 0.7 * (1 - t) ** 3)


def test_schedule_era_zero_prunes_at_once() -> None:
    assert sparsity_at(4.999, 5, 0, 0.5) == 0.0
    assert sparsity_at(5, 5, 0, 0.5) == 0.5


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(final=1.0),
        dict(final=-0.1),
        dict(era=-1),
        dict(start=-2),
        dict(r=0),
        dict(epoch=float("nan")),
        dict(epoch=float("inf")),
    ],
    ids=["final-1", "final-neg", "era-neg", "start-neg", "r-0", "epoch-nan", "epoch-inf"],
)
def test_schedule_rejects_bad_arguments(kwargs) -> None:
    args = dict(epoch=1.0, start=0, era=2, final=0.5, r=3)
    args.update(kwargs)
    with pytest.raises(ValueError):
        sparsity_at(**args)


# -- config and validation ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("epochs", "per_epoch", "per_step"),
    [(90, (30, 20), (30, 20)), (15, (5, 3), (5, 3)), (2, (1, 0), (1, 1)), (1, (0, 0), (0, 1)),
     (7, (2, 2), (2, 2)), (3, (1, 1), (1, 1))],
    ids=["e90", "e15", "e2", "e1", "e7", "e3"],
)  # fmt: skip
def test_default_era(epochs, per_epoch, per_step) -> None:
    # per epoch, the final sparsity is set in epoch start + era, which must be in the run
    start, era = resolve_era(CampfireConfig(), epochs)
    assert (start, era) == per_epoch
    assert start + era <= epochs - 1
    start, era = resolve_era(CampfireConfig(schedule_every="step"), epochs)
    assert (start, era) == per_step
    assert start + era <= epochs


@pytest.mark.parametrize(
    ("every", "start", "expected"),
    [("step", 9, (9, 1)), ("step", 10, (10, 0)), ("epoch", 8, (8, 1)), ("epoch", 9, (9, 0))],
    ids=["step-one-left", "step-none-left", "epoch-one-left", "epoch-none-left"],
)
def test_default_era_is_cut_to_the_epochs_left_after_a_given_start(every, start, expected):
    config = CampfireConfig(start_epoch=start, schedule_every=every)
    assert resolve_era(config, 10) == expected


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (dict(final_sparsity=1.0), "final_sparsity"),
        (dict(final_sparsity=-0.01), "final_sparsity"),
        (dict(start_epoch=8, era_epochs=5), "ends after training"),
        (dict(start_epoch=13), "nothing would be pruned"),
        (dict(start_epoch=7, era_epochs=5), "must be an epoch of the run"),
        (dict(start_epoch=13, schedule_every="step"), "ends after training"),
        (dict(schedule_every="batch"), "unknown schedule_every"),
        (dict(mask="filter"), "unknown mask"),
        (dict(fc_block=5), "fc_block"),
        (dict(window_fraction=1.5), "window_fraction"),
        (dict(window_rounding="global"), "window_rounding"),
        (dict(ck_scope="filter"), "ck_scope"),
        (dict(era_epochs=-1), "era_epochs"),
        (dict(r=0.0), "r must"),
        (dict(r=float("nan")), "r must"),
        (dict(window_max_nonzero=0), "window_max_nonzero"),
        (dict(fc_block=0), "fc_block"),
        (dict(start_epoch=-1), "start_epoch"),
        (dict(start_epoch=12), "nothing would be pruned"),
        (dict(ck_scope="input_channel", mask="window"), "the masks with a CK phase"),
    ],
    ids=[
        "final-1",
        "final-neg",
        "era-past-end",
        "start-past-end",
        "era-ends-with-the-run-per-epoch",
        "start-past-end-per-step",
        "schedule-every",
        "mask",
        "fc-block",
        "window-fraction",
        "rounding",
        "scope",
        "era-neg",
        "r",
        "r-nan",
        "window-cap-0",
        "fc-block-0",
        "start-neg",
        "era-after-the-last-epoch",
        "scope-with-window",
    ],
)
def test_validate_rejects_bad_config(options, match) -> None:
    method = create_method("campfire", options)
    with pytest.raises(ValueError, match=match):
        method.validate(TrainConfig(method="campfire", epochs=12))


@pytest.mark.parametrize("mask", ["combined", "window", "ck"], ids=["combined", "window", "ck"])
def test_validate_accepts_good_config(mask) -> None:
    # per epoch: the final sparsity set in the last epoch (11); per step: reached on its last step
    method = create_method("campfire", dict(mask=mask, start_epoch=7, era_epochs=4))
    method.validate(TrainConfig(method="campfire", epochs=12))
    assert isinstance(method, Campfire) and method.name == "campfire"
    options = dict(mask=mask, start_epoch=7, era_epochs=5, schedule_every="step")
    create_method("campfire", options).validate(TrainConfig(method="campfire", epochs=12))


def test_validate_accepts_the_edges_of_every_range() -> None:
    edges = dict(window_max_nonzero=1, fc_block=4, era_epochs=0, start_epoch=12,
                 final_sparsity=0.0, window_fraction=1.0, fc_block_fraction=0.0, r=0.5)  # fmt: skip
    create_method("campfire", edges).validate(TrainConfig(method="campfire", epochs=12))
    create_method("campfire", dict(fc_block=1, window_fraction=0.0)).validate(
        TrainConfig(method="campfire", epochs=12)
    )


def test_unknown_option_is_rejected_by_registry() -> None:
    with pytest.raises(ValueError, match="unknown option"):
        create_method("campfire", {"sparsity": 0.5})


# -- which layers are pruned -------------------------------------------------------------------
class Tiny(nn.Module):
    """stem conv, a 3x3 conv, a 1x1 conv, global pool, linear: every kind Campfire handles."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 6, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(6)
        self.conv = nn.Conv2d(6, 10, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(10)
        self.point = nn.Conv2d(10, 12, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(12)
        self.fc = nn.Linear(12, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn0(self.stem(x)))
        x = F.relu(self.bn1(self.conv(x)))
        x = F.relu(self.bn2(self.point(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def test_a_mask_update_never_regrows_a_pruned_weight() -> None:
    # The update ANDs with the masks in force; without it a weight pruned by the mask but
    # left nonzero (here: the largest) came back at the next step.
    torch.manual_seed(0)
    model = Tiny()
    method = Campfire(CampfireConfig(final_sparsity=0.6, mask="window", start_epoch=0,
                                     era_epochs=1))  # fmt: skip
    method.setup(TrainContext(model, None, TrainConfig(method="campfire", epochs=3), "cpu"))
    magnitude = model.conv.weight.detach().abs()
    in_force = magnitude < magnitude.flatten().median()  # prunes the largest half
    method.masks.set("conv.weight", in_force)
    method.update_masks(model, 0.3)
    assert not bool((method.masks["conv.weight"] & ~in_force).any())


def test_pruned_layers_kinds_and_stem() -> None:
    layers = pruned_layers(Tiny(), prune_fc=True, prune_stem=False)
    assert [(x.module, x.kind) for x in layers] == [
        ("conv", "conv"),
        ("point", "pointwise"),
        ("fc", "fc"),
    ]
    layers = pruned_layers(Tiny(), prune_fc=False, prune_stem=True)
    assert [x.param for x in layers] == ["stem.weight", "conv.weight", "point.weight"]


def test_pruned_layers_of_resnet20() -> None:
    from impl.models import create

    layers = pruned_layers(create("resnet20", in_channels=1), prune_fc=True, prune_stem=False)
    kinds = {x.module: x.kind for x in layers}
    assert "conv1" not in kinds
    assert kinds["layer2.0.downsample.0"] == "pointwise"
    assert kinds["fc"] == "fc"
    assert sum(k == "conv" for k in kinds.values()) == 18


def test_a_conv_with_a_one_by_n_kernel_is_a_conv_not_a_pointwise_layer() -> None:
    """Only single-weight kernels are "pointwise": a 1x3 kernel holds three weights."""
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.Conv2d(4, 4, (1, 3)), nn.Conv2d(4, 4, (3, 1)), nn.Conv2d(4, 4, 1)
    )
    layers = pruned_layers(model, prune_fc=True, prune_stem=False)
    assert [(x.module, x.kind) for x in layers] == [
        ("1", "conv"),
        ("2", "conv"),
        ("3", "pointwise"),
    ]


def test_a_bare_layer_model_names_its_own_weight() -> None:
    """A model that is itself a Linear or Conv2d prunes the parameter named "weight"."""
    for model, kind in ((nn.Linear(6, 4), "fc"), (nn.Conv2d(3, 4, 3), "conv")):
        layers = pruned_layers(model, prune_fc=True, prune_stem=True)
        assert [(x.module, x.param, x.kind) for x in layers] == [("", "weight", kind)]
        assert model.get_parameter(layers[0].param) is model.weight


# -- the training loop through the hooks -------------------------------------------------------
START, ERA, EPOCHS, STEPS = 1, 2, 9, 10  # 60 steps after the era


def _loop(
    method: Campfire,
    model: nn.Module,
    epochs: int,
    steps: int,
    *,
    first: int = 0,
    last: int | None = None,
    state: dict | None = None,
):
    """Call the hooks as the Trainer does (epochs ``first`` to ``last``, resuming from ``state``
    when given); yield (epoch, step index, ctx) after every step. Batches depend on (epoch, i)."""
    ctx = TrainContext(model, None, TrainConfig(method="campfire", epochs=epochs), "cpu")
    method.validate(ctx.config)
    method.setup(ctx)
    if state is not None:
        method.load_state_dict(state["method"], ctx)
        model.load_state_dict(state["model"])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        ctx.step = state["step"]
    ctx.optimizer = opt
    for epoch in range(first, epochs if last is None else last):
        ctx.epoch = epoch
        ctx.steps_per_epoch = steps
        method.on_epoch_start(ctx)
        for i in range(steps):
            g = torch.Generator().manual_seed(1000 * epoch + i)
            x = torch.randn(8, 1, 6, 6, generator=g)
            y = torch.randint(0, 5, (8,), generator=g)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            method.after_backward(ctx)
            opt.step()
            method.after_step(ctx)
            ctx.step += 1
            yield epoch, i, ctx


def _run(method: Campfire, model: nn.Module, epochs: int, steps: int, **kw) -> TrainContext:
    """Run the whole loop; return the context."""
    *_, (_, _, ctx) = _loop(method, model, epochs, steps, **kw)
    return ctx


def _zeros(model: nn.Module, method: Campfire) -> dict[str, torch.Tensor]:
    return {x.param: model.get_parameter(x.param).detach() == 0 for x in method.layers}


@pytest.mark.parametrize("mask", ["window", "ck", "combined"], ids=["window", "ck", "combined"])
def test_loop_schedule_monotone_zeros_and_fixed_masks(mask) -> None:
    model = Tiny()
    method = Campfire(CampfireConfig(final_sparsity=0.7, mask=mask, start_epoch=START,
                                     era_epochs=ERA, schedule_every="step"))  # fmt: skip
    prev = None
    fixed_zeros = None
    steps_after = 0
    for epoch, i, ctx in _loop(method, model, EPOCHS, STEPS):
        e = epoch + (i + 1) / STEPS
        zeros = _zeros(model, method)
        if e <= START + ERA:
            expected = sparsity_at(e, START, ERA, 0.7)
            assert method.target == pytest.approx(expected)
            assert method.fixed == (e >= START + ERA)
        if prev is not None:  # once zero, zero for the rest of training
            for name in zeros:
                assert bool((zeros[name] >= prev[name]).all()), (name, epoch, i)
        prev = zeros
        if method.fixed:
            if fixed_zeros is None:
                fixed_zeros = zeros
                report = method.sparsity_report(model)
                for layer in method.layers:
                    w = model.get_parameter(layer.param)
                    unit = 9 if layer.kind == "conv" else 4 if layer.kind == "fc" else 1
                    got = report["layer_sparsity"][layer.module]
                    assert got * w.numel() >= math.floor(0.7 * w.numel() + 0.5) - 1e-6
                    assert got * w.numel() <= 0.7 * w.numel() + unit, layer.module
            else:
                steps_after += 1
                for name in zeros:  # no drift: exactly the same zeros, step after step
                    assert torch.equal(zeros[name], fixed_zeros[name]), name
                for name, m in method.masks.items():
                    p = model.get_parameter(name)
                    assert bool((p[~m] == 0).all())
                    buf = ctx.optimizer.state[p]["momentum_buffer"]
                    assert bool((buf[~m] == 0).all())
    assert steps_after >= 50
    assert bool((model.stem.weight != 0).all())  # the stem stays dense
    fc_rows = (model.fc.weight != 0).sum(dim=1)
    assert bool((fc_rows >= 1).all())


@pytest.mark.parametrize("cap", [None, 2], ids=["uncapped", "cap-2"])
@pytest.mark.parametrize("mask", ["window", "ck", "combined"], ids=["window", "ck", "combined"])
def test_a_conv_layer_gets_the_configured_mask_type(mask, cap) -> None:
    # ... with the configured options (window_max_nonzero reaches the combined mask's window
    # phase too: it was dropped there)
    from impl.methods.campfire_masks import ck_mask, combined_mask, window_mask

    torch.manual_seed(0)
    model = Tiny()
    c = CampfireConfig(mask=mask, window_max_nonzero=cap)
    method = Campfire(c)
    method.setup(TrainContext(model, None, TrainConfig(method="campfire", epochs=9), "cpu"))
    conv = next(x for x in method.layers if x.module == "conv")
    w = model.get_parameter(conv.param).detach()
    by_type = {
        "window": window_mask(w, 0.6, rounding=c.window_rounding,
                              max_nonzero=c.window_max_nonzero),
        "ck": ck_mask(w, 0.6, scope=c.ck_scope),
        "combined": combined_mask(w, 0.6, c.window_fraction, rounding=c.window_rounding,
                                  max_nonzero=c.window_max_nonzero),
    }  # fmt: skip
    got = method.layer_mask(model, conv, 0.6)
    assert torch.equal(got, by_type[mask])
    if cap is None:  # (capped at 2 of 9, window and combined coincide: 78% > 60% pruned)
        assert all(not torch.equal(got, m) for k, m in by_type.items() if k != mask)
    else:
        assert int((got.flatten(2) != 0).sum(-1).max()) <= (9 if mask == "ck" else cap)


@pytest.mark.parametrize("mask", ["ck", "combined"])
def test_a_conv_layer_is_ranked_in_the_configured_ck_scope(mask) -> None:
    """ck_scope="input_channel" reaches the 3x3 convs' CK phase, of ck and of combined."""
    from impl.methods.campfire_masks import ck_mask, combined_mask

    torch.manual_seed(0)
    model = Tiny()
    c = CampfireConfig(mask=mask, ck_scope="input_channel")
    method = Campfire(c)
    method.setup(TrainContext(model, None, TrainConfig(method="campfire", epochs=9), "cpu"))
    conv = next(x for x in method.layers if x.module == "conv")
    w = model.get_parameter(conv.param).detach()

    def expected(scope: str) -> torch.Tensor:
        if mask == "ck":
            return ck_mask(w, 0.6, scope=scope)
        return combined_mask(w, 0.6, c.window_fraction, rounding=c.window_rounding, scope=scope)

    got = method.layer_mask(model, conv, 0.6)
    assert torch.equal(got, expected("input_channel"))
    assert not torch.equal(got, expected("layer"))  # the two scopes differ here


@pytest.mark.parametrize(
    ("mask", "scope", "expected"),
    [("ck", "input_channel", "input_channel"), ("ck", "layer", "layer"),
     ("combined", "layer", "layer"), ("combined", "input_channel", "input_channel"),
     ("window", "layer", "layer")],
)  # fmt: skip
def test_a_pointwise_conv_is_ck_pruned_in_the_ck_masks_scope(mask, scope, expected) -> None:
    """A 1x1 conv is CK-pruned with single-weight kernels: per input channel where the CK
    phase ranks so (Algorithm 1's loops), layer-wide otherwise (a window has nothing to keep)."""
    from impl.methods.campfire_masks import ck_mask

    torch.manual_seed(0)
    model = Tiny()
    method = Campfire(CampfireConfig(mask=mask, ck_scope=scope))
    method.setup(TrainContext(model, None, TrainConfig(method="campfire", epochs=9), "cpu"))
    point = next(x for x in method.layers if x.kind == "pointwise")
    w = model.get_parameter(point.param).detach()
    got = method.layer_mask(model, point, 0.5)
    assert torch.equal(got, ck_mask(w, 0.5, scope=expected))
    other = "layer" if expected == "input_channel" else "input_channel"
    assert not torch.equal(got, ck_mask(w, 0.5, scope=other))  # the two scopes differ here


def test_fc_block_fraction_default_is_the_documented_half() -> None:
    """The paper leaves the split between block and fine FC pruning open (Sec. 2.1.2); ours
    is half and half (docs/methods.md), 2 x 2 blocks."""
    c = CampfireConfig()
    assert (c.fc_block, c.fc_block_fraction) == (2, 0.5)
    assert "`fc_block_fraction` (0.5)" in (ROOT / "docs" / "methods.md").read_text()


def test_one_step_epochs_advance_the_schedule_a_whole_epoch_per_step() -> None:
    method = Campfire(
        CampfireConfig(final_sparsity=0.5, start_epoch=0, era_epochs=1, schedule_every="step")
    )
    next(_loop(method, Tiny(), 3, 1))  # one step: the end of epoch 0
    assert method.fixed and method.target == pytest.approx(0.5)


def test_window_loop_respects_per_kernel_cap() -> None:
    model = Tiny()
    method = Campfire(CampfireConfig(final_sparsity=0.7, mask="window", start_epoch=0,
                                     era_epochs=1))  # fmt: skip
    _run(method, model, 2, 5)
    nz = (model.conv.weight != 0).reshape(60, 9).sum(dim=1)
    assert int(nz.max()) <= math.ceil(0.3 * 9)
    assert method.sparsity_report(model)["max_kernel_nonzeros"] == int(nz.max())


def test_no_pruning_before_the_era() -> None:
    model = Tiny()
    method = Campfire(CampfireConfig(start_epoch=2, era_epochs=1, schedule_every="step"))
    for epoch, i, _ in _loop(method, model, 3, 4):
        if epoch == 2:  # the first step of the era prunes
            assert i == 0 and len(method.masks) == 3
            assert method.target == pytest.approx(sparsity_at(2.25, 2, 1, 0.7))
            break
        assert len(method.masks) == 0
        assert method.sparsity_report(model)["true_sparsity"] == 0.0


@pytest.mark.parametrize("mask", ["window", "ck", "combined"], ids=["window", "ck", "combined"])
def test_per_epoch_schedule_is_the_papers_eq_1_at_each_epoch(mask) -> None:
    """The default, as Eq. (1) reads: the target is set from the epoch's number, 0 in the era's
    first epoch ("Before or during the first epoch of pruning ... zero"), constant inside an
    epoch, the final sparsity from epoch start + era on, then fixed masks."""
    method = Campfire(CampfireConfig(final_sparsity=0.7, mask=mask, start_epoch=START,
                                     era_epochs=ERA))  # fmt: skip
    model = Tiny()
    seen: dict[int, set[float]] = {}
    fixed_at = None
    for epoch, i, _ in _loop(method, model, EPOCHS, STEPS):
        seen.setdefault(epoch, set()).add(round(method.target, 12))
        if epoch < START + 1:
            assert len(method.masks) == 0 and method.sparsity_report(model)["true_sparsity"] == 0
        if method.fixed and fixed_at is None:
            fixed_at = (epoch, i)
    expected = {e: round(sparsity_at(e, START, ERA, 0.7), 12) for e in range(EPOCHS)}
    assert seen == {e: {v} for e, v in expected.items()}
    assert expected[START] == 0.0 and expected[START + 1] == pytest.approx(0.7 * 7 / 8)
    assert expected[START + ERA] == pytest.approx(0.7)
    assert fixed_at == (START + ERA, 0)
    layer = method.sparsity_report(model)["layer_sparsity"]["conv"]
    assert layer == pytest.approx(0.7, abs=9 / model.conv.weight.numel())


def test_per_epoch_schedule_prunes_one_epoch_after_the_per_step_ramp() -> None:
    """Per step, the target at the end of epoch e is what the per-epoch schedule sets in e + 1."""
    targets = {}
    for every in ("epoch", "step"):
        method = Campfire(CampfireConfig(start_epoch=START, era_epochs=ERA, schedule_every=every))
        for epoch, i, _ in _loop(method, Tiny(), START + ERA + 1, STEPS):
            if i == STEPS - 1:
                targets[every, epoch] = method.target
    for e in range(START, START + ERA):
        assert targets["step", e] == pytest.approx(targets["epoch", e + 1])
    assert targets["epoch", START] == 0.0 < targets["step", START]


def test_summary_names_the_epochs_the_masks_grew_in() -> None:
    """The era is the schedule's under both granularities; the epochs pruned in are measured."""
    for every, grew in (("epoch", [START + 1, START + ERA]), ("step", [START, START + ERA - 1])):
        method = Campfire(CampfireConfig(start_epoch=START, era_epochs=ERA, schedule_every=every))
        ctx = _run(method, Tiny(), START + ERA + 1, STEPS)
        summary = method.summary(ctx)
        assert summary["pruning_era"] == [START, START + ERA]
        assert summary["pruned_in_epochs"] == grew and summary["schedule_every"] == every
        other = Campfire(CampfireConfig(start_epoch=START, era_epochs=ERA, schedule_every=every))
        other.setup(ctx)
        other.load_state_dict(method.state_dict(), ctx)
        assert other.pruned_epochs == grew  # a resumed run reports the epochs before it too
        older = {k: v for k, v in method.state_dict().items() if k != "pruned_epochs"}
        other.load_state_dict(older, ctx)  # a checkpoint from before the record, masks grown
        assert other.pruned_epochs is None and other.summary(ctx)["pruned_in_epochs"] is None
    unpruned = Campfire(CampfireConfig(final_sparsity=0.0, start_epoch=0, era_epochs=1))
    assert unpruned.summary(_run(unpruned, Tiny(), 2, STEPS))["pruned_in_epochs"] == []


def test_metrics_summary_and_cost() -> None:
    model = Tiny()
    method = Campfire(CampfireConfig(final_sparsity=0.5, mask="ck", start_epoch=0, era_epochs=1,
                                     schedule_every="step"))  # fmt: skip
    ctx = _run(method, model, 1, 4)
    ctx.input_shape = (1, 6, 6)
    row = method.epoch_metrics(ctx)
    json.dumps(row)
    assert row["masks_fixed"] is True and row["target_sparsity"] == pytest.approx(0.5)
    assert row["true_sparsity"] == pytest.approx(0.5, abs=9 / 372)
    assert set(row["layer_sparsity"]) == {"conv", "point", "fc"}
    assert 0 < row["true_conv_sparsity"] < row["true_sparsity"]  # the dense stem dilutes it
    # the epoch's training FLOPs are the Trainer's (its start/end mean), not overwritten with
    # the cost at the epoch's end, the sparsest point of an era epoch
    assert "train_flops_nominal" not in row and "train_flops_executed" not in row
    assert row["inference_flops"] > 0
    cost = method.cost(model)
    for name, density in cost.items():
        assert isinstance(density, LayerDensity)
        w = model.get_submodule(name).weight
        kept = float((w != 0).float().mean())
        # pruned weights take no part in the product nor in either gradient
        assert (density.forward, density.data_grad, density.weight_grad) == pytest.approx(
            (kept, kept, kept)
        )
    summary = method.summary(ctx)
    json.dumps(summary)
    assert summary["pruning_era"] == [0, 1] and summary["mask"] == "ck"


def test_cost_is_the_kept_fraction_of_each_pruned_layer() -> None:
    """Every density of a layer's cost is its fraction of nonzero weights (0.3 at 70%)."""
    torch.manual_seed(0)
    model = Tiny()
    method = Campfire(CampfireConfig(final_sparsity=0.7, mask="ck", fc_block=1))
    method.setup(TrainContext(model, None, TrainConfig(method="campfire", epochs=9), "cpu"))
    method.update_masks(model, 0.7)
    cost = method.cost(model)
    assert set(cost) == {"conv", "point", "fc"}
    for name, density in cost.items():
        w = model.get_submodule(name).weight
        kept = int(torch.count_nonzero(w)) / w.numel()
        assert kept == pytest.approx(0.3, abs=0.05), name
        assert (density.forward, density.data_grad, density.weight_grad) == pytest.approx(
            (kept, kept, kept)
        )


def test_pruned_gradients_are_zeroed_after_backward() -> None:
    """Sec. 2: once a weight is pruned its gradient is set to zero (the kept ones untouched)."""
    torch.manual_seed(0)
    model = Tiny()
    method = Campfire(CampfireConfig(final_sparsity=0.5, mask="ck", start_epoch=0, era_epochs=0))
    ctx = TrainContext(model, None, TrainConfig(method="campfire", epochs=2), "cpu")
    method.setup(ctx)
    method.update_masks(model, 0.5)
    F.cross_entropy(model(torch.randn(4, 1, 6, 6)), torch.tensor([0, 1, 2, 3])).backward()
    before = {x.param: model.get_parameter(x.param).grad.clone() for x in method.layers}
    method.after_backward(ctx)
    for name, keep in method.masks.items():
        grad = model.get_parameter(name).grad
        assert bool((grad[~keep] == 0).all()) and bool((before[name][~keep] != 0).any()), name
        assert torch.equal(grad[keep], before[name][keep]), name


def test_state_dict_round_trip_restores_masks() -> None:
    model = Tiny()
    method = Campfire(CampfireConfig(mask="combined", start_epoch=0, era_epochs=1))
    ctx = _run(method, model, 2, 3)
    buf = io.BytesIO()
    torch.save(method.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    other = Campfire(CampfireConfig(mask="combined", start_epoch=0, era_epochs=1))
    other.setup(ctx)
    other.load_state_dict(state, ctx)
    assert other.fixed and other.target == pytest.approx(method.target)
    for name, m in method.masks.items():
        assert torch.equal(other.masks[name], m)
    bad = {"masks": {"nope.weight": torch.ones(2, dtype=torch.bool)}}
    with pytest.raises(ValueError, match="does not prune"):
        other.load_state_dict(bad, ctx)
    assert state["schedule_every"] == other.config.schedule_every == "epoch"
    # a checkpoint of the code before the per-epoch schedule resumes with the per-step ramp
    older = {k: v for k, v in state.items() if k != "schedule_every"}
    again = Campfire(CampfireConfig(mask="combined", start_epoch=0, era_epochs=1))
    again.setup(ctx)
    again.load_state_dict(older, ctx)
    assert again.config.schedule_every == "step"


@pytest.mark.parametrize("stop", [2, 3], ids=["mid-era", "after-era"])
def test_resume_equals_uninterrupted(stop) -> None:
    """Stop after epoch ``stop``, save through weights_only, resume: the same weights at the end."""
    cfg = dict(mask="combined", start_epoch=1, era_epochs=2, final_sparsity=0.6)
    whole = Tiny()
    init = {k: v.clone() for k, v in whole.state_dict().items()}
    _run(Campfire(CampfireConfig(**cfg)), whole, 5, 4)

    part = Tiny()
    part.load_state_dict(init)
    method = Campfire(CampfireConfig(**cfg))
    ctx = _run(method, part, 5, 4, last=stop)
    buf = io.BytesIO()
    saved = {
        "method": method.state_dict(),
        "model": part.state_dict(),
        "optimizer": ctx.optimizer.state_dict(),
        "step": ctx.step,
    }
    torch.save(saved, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    resumed = Tiny()
    _run(Campfire(CampfireConfig(**cfg)), resumed, 5, 4, first=stop, state=state)
    for name, value in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name


class Plain(nn.Module):
    """conv -> BN -> ReLU -> pool -> linear, the chain where removed filters silence inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.conv = nn.Conv2d(4, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.fc = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.conv(F.relu(self.stem(x)))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@torch.no_grad()
def test_fc_inputs_of_removed_filters_are_pruned() -> None:
    model = Plain()
    model.conv.weight[:2] = 0.0  # filters 0 and 1 removed (e.g. by CK)
    model.conv.bias[:2] = 0.0
    model.bn.bias[:2] = -0.1
    method = Campfire(CampfireConfig(final_sparsity=0.2, mask="ck", fc_block=1))
    ctx = TrainContext(model, None, TrainConfig(method="campfire", epochs=3), "cpu")
    method.setup(ctx)
    assert [f.linear for f in method.feeds] == ["fc"]
    method.update_masks(model, 0.2)
    assert bool((model.fc.weight[:, :2] == 0).all())  # pruned unscored: more than 20%
    assert bool((model.fc.weight[:, 2:] != 0).all())


class FcFirst(Plain):
    """:class:`Plain` with its linear layer registered before the convolutions."""

    def __init__(self) -> None:
        super().__init__()
        fc = self._modules.pop("fc")
        self._modules = {"fc": fc, **self._modules}


@torch.no_grad()
@pytest.mark.parametrize("net", [Plain, FcFirst], ids=["fc-last", "fc-registered-first"])
def test_fc_inputs_of_filters_removed_in_the_same_update_are_pruned(net) -> None:
    """The convolutions are masked (and zeroed) before the FC layers in one update, whatever
    the order the model registers them in, so an FC layer already sees the filters that
    update removes as dead inputs."""
    torch.manual_seed(0)
    model = net()
    model.conv.weight.copy_(torch.rand_like(model.conv.weight) + 0.5)
    model.conv.weight[:2] *= 1e-3  # filters 0 and 1: the 8 lowest of the 24 kernels
    model.conv.bias[:2] = 0.0
    model.bn.bias[:2] = -0.1
    model.fc.weight.copy_(torch.rand_like(model.fc.weight) + 0.5)
    model.fc.weight[:, :2] += 1.0  # the largest FC weights: kept unless their inputs are dead
    method = Campfire(CampfireConfig(final_sparsity=0.5, mask="ck", fc_block=1))
    method.setup(TrainContext(model, None, TrainConfig(method="campfire", epochs=3), "cpu"))
    method.update_masks(model, 8 / 24)
    assert bool((model.conv.weight[:2] == 0).all()) and bool((model.conv.weight[2:] != 0).all())
    assert bool((model.fc.weight[:, :2] == 0).all())
    assert not bool(method.masks["fc.weight"][:, :2].any())


class StemOnly(nn.Module):
    """stem conv -> BN -> ReLU -> pool -> linear: the classifier is fed by the stem alone."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def test_the_dead_input_rule_applies_only_to_a_classifier_fed_by_a_pruned_conv() -> None:
    """A dense stem removes no filter, so the classifier it feeds gets no dead-input rule;
    with ``prune_stem`` it does. The summary names the linear layers the rule applies to."""
    config = TrainConfig(method="campfire", epochs=3)
    dense_stem = Campfire(CampfireConfig(mask="ck"))
    dense_stem.setup(TrainContext(StemOnly(), None, config, "cpu"))
    assert dense_stem.feeds == []
    pruned_stem = Campfire(CampfireConfig(mask="ck", prune_stem=True))
    pruned_stem.setup(TrainContext(StemOnly(), None, config, "cpu"))
    assert [(f.conv, f.linear) for f in pruned_stem.feeds] == [("stem", "fc")]
    method = Campfire(CampfireConfig(mask="ck"))
    ctx = TrainContext(Plain(), None, config, "cpu")
    method.setup(ctx)
    assert method.summary(ctx)["dead_input_rule_layers"] == ["fc"]


@torch.no_grad()
def test_max_kernel_nonzeros_counts_the_kernels_of_more_than_one_weight_only() -> None:
    """A 1x1 kernel's single weight is no kernel of R*S > 1: a model pruning only a 1x1
    conv reports 0, and one 3x3 kernel with 5 nonzeros among empty ones reports 5."""
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Conv2d(4, 4, 1), nn.Conv2d(4, 2, 3))
    method = Campfire(CampfireConfig(mask="ck", prune_fc=False))
    method.setup(TrainContext(model, None, TrainConfig(method="campfire", epochs=3), "cpu"))
    assert [x.kind for x in method.layers] == ["pointwise", "conv"]
    model[2].weight.zero_()
    model[2].weight[1, 3].view(-1)[:5] = 1.0
    assert method.sparsity_report(model)["max_kernel_nonzeros"] == 5
    model[2].weight.zero_()
    assert method.sparsity_report(model)["max_kernel_nonzeros"] == 0


# -- through the Trainer -----------------------------------------------------------------------
@pytest.mark.slow
def test_smoke_run_through_trainer(tmp_path) -> None:
    from impl.train import load_trained_model, train

    cfg = resolve(
        "smoke",
        method="campfire",
        method_options={"mask": "combined", "final_sparsity": 0.6},
        model="resnet20",
        data="digits",
        out=str(tmp_path / "run"),
        threads=1,
    )
    summary = train(cfg, progress=False)
    assert summary["status"] == "complete"
    assert summary["pruning_era"] == [1, 1]  # 2 epochs: no room for a ramp, pruned at once
    assert summary["pruned_in_epochs"] == [1, 1]
    assert summary["true_sparsity"] == pytest.approx(0.6, abs=0.01)
    assert summary["train_flops_nominal"] < summary["train_flops_executed"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert rows[0]["target_sparsity"] == 0.0 and rows[-1]["masks_fixed"] is True
    model, _ = load_trained_model(tmp_path / "run")
    w = model.get_parameter("layer1.0.conv1.weight")
    assert float((w == 0).float().mean()) == pytest.approx(0.6, abs=9 / w.numel() + 1e-6)


def test_comm_masks_only_once_masks_are_fixed() -> None:
    model = Tiny()
    method = Campfire(CampfireConfig(final_sparsity=0.7, mask="combined", start_epoch=START,
                                     era_epochs=ERA))  # fmt: skip
    seen_before_fixed = False
    for _, _, ctx in _loop(method, model, START + ERA + 1, 3):
        masks = method.comm_masks(ctx)
        if not method.fixed:
            assert masks is None
            seen_before_fixed = True
        else:
            assert masks is not None and set(masks) == {x.param for x in method.layers}
            for name, keep in masks.items():
                weight = model.get_parameter(name).detach()
                assert keep.dtype == torch.bool and keep.shape == weight.shape
                assert torch.all(weight[~keep] == 0)
    assert seen_before_fixed and method.fixed


@pytest.mark.slow
def test_an_epoch_pruned_on_its_first_step_counts_its_steps_at_the_new_cost(tmp_path) -> None:
    """Under the per-epoch target the masks change on the era epoch's first step: that epoch's
    training FLOPs are one step at the old cost and the rest at the new one, not their mean."""
    from impl.train import epoch_step_cost, train

    # era epochs 1-2: epoch 1 at target 0, epoch 2 pruned to the final sparsity on its first step
    cfg = resolve("smoke", method="campfire", epochs=4, model="resnet20", data="digits",
                  method_options={"start_epoch": 1, "era_epochs": 1, "final_sparsity": 0.6},
                  out=str(tmp_path / "run"), threads=1)  # fmt: skip
    train(cfg, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    _, dense, pruned_epoch, after = (r["train_flops_nominal"] for r in rows)
    steps = rows[2]["iterations"]
    assert steps == 3 and after < dense
    assert pruned_epoch == pytest.approx((dense + (steps - 1) * after) / steps, rel=1e-9)
    # steps 1-3 along the line through (1, 4) and (3, 2); a quadratic exactly; none: start
    assert epoch_step_cost(10.0, [(1, 4.0), (3, 2.0)], 4) == pytest.approx((10 + 4 + 3 + 2) / 4)
    sq = [(k, float(k * k)) for k in (1, 5, 9)]
    assert epoch_step_cost(0.0, sq, 10) == pytest.approx(sum(k * k for k in range(1, 10)) / 10)
    assert epoch_step_cost(10.0, [(1, 4.0)], 4) == pytest.approx((10 + 3 * 4) / 4)
    assert epoch_step_cost(10.0, [], 4) == 10.0 and epoch_step_cost(10.0, [(1, 4.0)], 1) == 10.0
    # a cost that does not change after the first step: its value, not a sum of Lagrange terms
    same = [(1, 123456789.0), (6, 123456789.0), (11, 123456789.0)]
    assert epoch_step_cost(123456789.0, same, 12) == 123456789.0


def test_epoch_step_cost_averages_the_first_step_and_the_curve_through_the_read_costs() -> None:
    """The first step counts at the epoch's starting cost, steps 1 to n-1 along the
    polynomial through the sampled costs, each step once."""
    from impl.train import epoch_step_cost

    # unchanged after a first-step drop to 4: (10 + 3 * 4) / 4
    assert epoch_step_cost(10.0, [(1, 4.0), (2, 4.0), (3, 4.0)], 4) == pytest.approx(5.5)
    # a line through two costs, 10 - 2k at steps 1..4: (10 + 8 + 6 + 4 + 2) / 5
    assert epoch_step_cost(10.0, [(1, 8.0), (3, 4.0)], 5) == pytest.approx(6.0)
    # a parabola k^2 through three costs: (0 + 1 + 4 + 9 + 16) / 5
    assert epoch_step_cost(0.0, [(1, 1.0), (2, 4.0), (4, 16.0)], 5) == pytest.approx(6.0)
    # a cubic k^3 through four costs at an odd count of steps 1..4: (0 + 1 + 8 + 27 + 64) / 5
    cubic = [(1, 1.0), (2, 8.0), (3, 27.0), (4, 64.0)]
    assert epoch_step_cost(0.0, cubic, 5) == pytest.approx(20.0, rel=1e-12)
    # one step, or none: the starting cost whatever was read
    assert epoch_step_cost(7.0, [(1, 1.0), (2, 4.0)], 1) == 7.0
    assert epoch_step_cost(7.0, [(1, 1.0)], 0) == 7.0


@pytest.mark.slow
def test_a_per_step_ramp_epoch_counts_its_flops_along_its_costs(tmp_path, monkeypatch) -> None:
    """Under the per-step target the cost falls along a cubic within an era epoch: the epoch's
    training FLOPs (the cubic through the costs at steps 1, the two middle ones of an odd
    count and the last, averaged over the steps) stay within 2e-4 of the mean of every step's
    cost (the cubic target is rounded to whole kernels: 1.2e-4 and 5.5e-5 for the two era
    epochs; three points, without the second middle one, 7.9e-5 and 5.6e-4), where a
    trapezoid over the epoch's two ends is off by several percent."""
    from impl import train as trainer
    from impl.methods.campfire import Campfire

    seen: list[tuple[int, float]] = []  # (step, nominal cost the next step runs at)
    after_step = Campfire.after_step

    def recording(self, ctx):
        after_step(self, ctx)
        seen.append((ctx.step, trainer._step_cost(ctx, self)[0]))

    monkeypatch.setattr(Campfire, "after_step", recording)
    cfg = resolve("cpu", method="campfire", epochs=3, model="resnet20", data="digits",
                  data_options={"image_size": 16}, batch_size=32, max_steps_per_epoch=25,
                  out=str(tmp_path / "run"), threads=1,
                  method_options={"start_epoch": 1, "era_epochs": 2, "final_sparsity": 0.6,
                                  "schedule_every": "step"})  # fmt: skip
    trainer.train(cfg, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    costs = dict(seen)
    for epoch in (1, 2):  # the era's epochs: the target rises every step
        steps = rows[epoch]["iterations"]
        assert steps == 25  # steps 1-24: two middle ones, 12 and 13
        first = epoch * steps  # global step of the epoch's first step
        start = costs[first - 1]  # the cost the epoch's first step runs at
        truth = (start + sum(costs[first + k] for k in range(steps - 1))) / steps
        ends = [(1, costs[first]), (steps, costs[first + steps - 1])]  # after 1st, at the end
        trapezoid = trainer.epoch_step_cost(start, ends, steps)
        reported = rows[epoch]["train_flops_nominal"]
        assert reported == pytest.approx(truth, rel=2e-4)
        assert abs(trapezoid / truth - 1) > 2 * abs(reported / truth - 1)
