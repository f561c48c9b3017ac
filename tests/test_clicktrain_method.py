"""ClickTrain as a method: stages driven through its hooks by a small loop (as the Trainer does)."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from impl.methods.base import TrainContext
from impl.methods.clicktrain import ClickTrain, ClickTrainConfig, prunable_layers
from impl.methods.masking import conv_weight_counts
from impl.ops import PatternConv2d


class TinyNet(nn.Module):
    """Stem conv (never pruned), two prunable 3x3 convs, a 1x1 conv, a classifier."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.block_a = nn.Conv2d(channels, 12, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(12)
        self.block_b = nn.Conv2d(12, 12, 3, stride=2, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(12)
        self.shortcut = nn.Conv2d(channels, 12, 1, stride=2, bias=False)
        self.fc = nn.Linear(12, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.block_a(x)))
        y = self.bn3(self.block_b(y)) + self.shortcut(x)
        return self.fc(F.relu(y).mean(dim=(2, 3)))


class OneByOneNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.conv2 = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x)).mean(dim=(2, 3))


def _data(n_batches: int = 3, batch: int = 16, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    xs = torch.randn(n_batches, batch, 1, 9, 9, generator=gen)
    ys = torch.randint(0, 4, (n_batches, batch), generator=gen)
    xs[:, :, :, :3, :3] += ys.view(n_batches, batch, 1, 1, 1).float()  # learnable signal
    return list(zip(xs, ys, strict=True))


def _context(model: nn.Module, epochs: int) -> TrainContext:
    return TrainContext(
        model=model,
        optimizer=None,
        config=SimpleNamespace(epochs=epochs, model=None),
        device=torch.device("cpu"),
        input_shape=(1, 9, 9),
    )


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-3
    )


def _run_epochs(method: ClickTrain, ctx: TrainContext, epochs: range, data, on_step=None):
    for epoch in epochs:
        ctx.epoch = epoch
        method.on_epoch_start(ctx)
        ctx.model.train()
        for x, y in data:
            out = ctx.model(x)
            loss = F.cross_entropy(out, y)
            total = method.loss(ctx, loss, out, y)
            ctx.optimizer.zero_grad(set_to_none=True)
            total.backward()
            method.after_backward(ctx)
            ctx.optimizer.step()
            method.after_step(ctx)
            ctx.step += 1
            if on_step is not None:
                on_step(method, ctx)
        method.on_epoch_end(ctx)
        method.epoch_metrics(ctx)


def _train(options: dict, epochs: int = 5, seed: int = 0, on_step=None, n_batches: int = 3):
    torch.manual_seed(seed)
    method = ClickTrain(ClickTrainConfig(**options))
    ctx = _context(TinyNet(), epochs)
    method.setup(ctx)
    ctx.optimizer = _optimizer(ctx.model)
    _run_epochs(method, ctx, range(epochs), _data(n_batches), on_step)
    return method, ctx


FAST = {"dense_epochs": 1, "pool_epochs": 1, "finalize_epochs": 1, "hard_prune_epoch": 3}


@pytest.mark.parametrize("padding", [{"padding_mode": "reflect"}, {"padding": "same"}])
def test_a_conv_the_pattern_conv_cannot_run_is_pruned_as_a_masked_dense_conv(padding, caplog):
    # hard pruning used to stop the run half way with PatternConv2d's error, naming no layer
    torch.manual_seed(0)
    model = TinyNet()
    model.block_a = nn.Conv2d(8, 12, 3, bias=False, **{"padding": 1, **padding})
    method = ClickTrain(ClickTrainConfig(**FAST, connectivity=0.5))
    ctx = _context(model, 5)
    method.setup(ctx)
    ctx.optimizer = _optimizer(ctx.model)
    with caplog.at_level("WARNING", logger="impl.methods.clicktrain"):
        _run_epochs(method, ctx, range(5), _data())
    assert type(ctx.model.block_a) is nn.Conv2d
    assert isinstance(ctx.model.block_b, PatternConv2d)
    info = method.sparse_layers["block_a"]
    assert info["pattern_conv"] is False and "PatternConv2d needs" in info["dense_because"]
    assert "block_a stays a masked dense conv" in caplog.text
    keep = method.masks["block_a.weight"]
    assert not ctx.model.block_a.weight[~keep].any()  # pruned all the same


def test_prunable_layers_skip_stem_and_1x1():
    assert prunable_layers(TinyNet()) == ["block_a", "block_b"]


def test_prunable_layers_skip_grouped_convs():
    """Grouped and depthwise 3x3 convs (groups > 1) stay dense: only groups=1 is pruned."""
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3),
        nn.Conv2d(8, 8, 3, groups=8),
        nn.Conv2d(8, 8, 3, groups=2),
        nn.Conv2d(8, 8, 3),
    )
    assert prunable_layers(model) == ["3"]
    assert prunable_layers(model, pointwise=True) == ["3"]


def test_setup_rejects_a_model_without_3x3_convs():
    method = ClickTrain()
    with pytest.raises(ValueError, match="3x3"):
        method.setup(_context(OneByOneNet(), 30))


def test_stages_run_in_order_and_final_kernels_match_one_pool_pattern():
    method, ctx = _train({**FAST, "connectivity": 0.5}, epochs=5)
    assert method.stage_start == {
        "dense": 0,
        "pool": 1,
        "finalize": 2,
        "regularize": 3,
        "sparse": 3,
    }
    # the summary says so (ClickTrain Table 1's hard-pruning epoch is read from it), with
    # each epoch's mean training loss
    summary = method.summary(ctx)["clicktrain"]
    assert summary["stage_start_epoch"] == method.stage_start
    assert summary["final_stage"] == "sparse"
    assert len(summary["epoch_train_loss"]) == 5
    assert summary["epoch_train_loss"] == method.epoch_losses
    pool = method.pool.patterns()
    assert bool((pool.flatten(1).sum(1) == 4).all())
    assert len({tuple(p.flatten().tolist()) for p in pool}) == pool.shape[0]
    for name in method.layers:
        keep = method.masks[f"{name}.weight"]
        w = ctx.model.get_submodule(name).weight.detach()
        assert torch.count_nonzero(w[~keep]) == 0
        for f in range(keep.shape[0]):
            for c in range(keep.shape[1]):
                matches = sum(torch.equal(keep[f, c], p) for p in pool)
                assert (not keep[f, c].any()) or matches == 1


@pytest.mark.parametrize(
    "sparse_impl", ["none", "auto", "ref"], ids=["masked_dense", "pattern_conv", "pattern_ref"]
)
def test_pruned_weights_stay_exactly_zero_for_50_steps(sparse_impl):
    checked = []

    def check(method: ClickTrain, ctx: TrainContext) -> None:
        if method.stage != "sparse":
            return
        for name in method.layers:
            p = ctx.model.get_submodule(name).weight
            pruned = ~method.masks[f"{name}.weight"]
            assert torch.count_nonzero(p.detach()[pruned]) == 0
            buf = ctx.optimizer.state[p]["momentum_buffer"]
            assert torch.count_nonzero(buf[pruned]) == 0
        checked.append(ctx.step)

    # hard pruning at the start of epoch 3; epochs 3 to 12 x 5 batches = 50 steps after it
    options = {**FAST, "connectivity": 0.6, "sparse_impl": sparse_impl}
    method, ctx = _train(options, epochs=13, on_step=check, n_batches=5)
    assert len(checked) == 50
    is_pattern = [isinstance(ctx.model.get_submodule(n), PatternConv2d) for n in method.layers]
    assert all(is_pattern) == (sparse_impl != "none")
    assert sparse_impl == "none" or all(
        ctx.model.get_submodule(n).impl == sparse_impl for n in method.layers
    )
    for name in method.layers:  # the optimizer kept updating the kept weights
        p = ctx.model.get_submodule(name).weight
        keep = method.masks[f"{name}.weight"]
        assert bool((~keep).any()) and bool((p.detach()[keep] != 0).all())
        assert torch.count_nonzero(ctx.optimizer.state[p]["momentum_buffer"][keep]) > 0


def test_sparse_conv_only_above_threshold_and_decision_recorded():
    method, ctx = _train({**FAST, "connectivity": 0.0}, epochs=4)
    for name in method.layers:  # 5/9 = 0.556 sparsity: below 0.65, stays dense
        assert not isinstance(ctx.model.get_submodule(name), PatternConv2d)
        assert method.sparse_layers[name]["sparsity"] == pytest.approx(5 / 9)
        assert method.sparse_layers[name]["pattern_conv"] is False
    method, ctx = _train({**FAST, "connectivity": 0.5}, epochs=4)
    for name in method.layers:
        assert isinstance(ctx.model.get_submodule(name), PatternConv2d)
        assert method.sparse_layers[name]["pattern_conv"] is True


def test_balanced_connectivity_gives_equal_row_lengths():
    method, ctx = _train({**FAST, "connectivity": 0.6}, epochs=4)
    for name in method.layers:
        module = ctx.model.get_submodule(name)
        assert isinstance(module, PatternConv2d)
        lengths = module.row_ptr.diff()
        assert bool((lengths == lengths[0]).all())
        c = module.weight.shape[1]
        assert int(lengths[0]) == 4 * (c - round(0.6 * c))


def test_layer_wide_ranking_removes_the_layer_fraction():
    method, _ = _train({**FAST, "connectivity": 0.6, "kernel_ranking": "layer"}, epochs=4)
    for name in method.layers:
        removed = method.removed[name]
        assert int(removed.sum()) == round(0.6 * removed.numel())


def _feed_epoch_losses(method: ClickTrain, ctx: TrainContext, losses):
    for epoch, value in enumerate(losses):
        ctx.epoch = epoch
        method.on_epoch_start(ctx)
        method.loss(ctx, torch.tensor(value), None, None)
        method.on_epoch_end(ctx)


def test_a_loss_derivative_at_the_threshold_does_not_end_stage_one():
    """The rule is strictly below: derivatives of exactly 0.25 against 0.25 go on."""
    method = ClickTrain(ClickTrainConfig(loss_derivative_threshold=0.25))
    ctx = _context(TinyNet(), 30)
    method.setup(ctx)
    _feed_epoch_losses(method, ctx, [2.0, 1.75, 1.5])  # 0.25 and 0.25 are exact in binary
    assert "pool" not in method.stage_start


def test_stage_one_ends_when_loss_derivative_falls_below_threshold():
    method = ClickTrain(ClickTrainConfig())
    ctx = _context(TinyNet(), 30)
    method.setup(ctx)
    _feed_epoch_losses(method, ctx, [2.0, 1.5, 1.4])  # derivatives 0.5, then 0.1 < 0.27
    assert method.stage_start["pool"] == 3
    assert method.epoch_metrics(ctx)["clicktrain_loss_derivative"] == pytest.approx(0.1)


def test_stage_one_reads_each_epochs_mean_loss_from_its_first_derivative_on():
    method = ClickTrain(ClickTrainConfig())
    ctx = _context(TinyNet(), 30)
    method.setup(ctx)
    for epoch, batches in enumerate([(2.0, 3.0), (2.4, 2.4)]):  # means 2.5, 2.4: 0.1 < 0.27
        ctx.epoch = epoch
        method.on_epoch_start(ctx)
        for value in batches:
            method.loss(ctx, torch.tensor(value), None, None)
        method.on_epoch_end(ctx)
    assert method.epoch_losses == pytest.approx([2.5, 2.4])
    assert method.stage_start["pool"] == 2  # the first derivative already ends stage one


def test_stage_one_does_not_end_on_a_rising_loss():
    method = ClickTrain(ClickTrainConfig())
    ctx = _context(TinyNet(), 30)
    method.setup(ctx)
    _feed_epoch_losses(method, ctx, [2.0, 0.3, 0.8, 0.5, 0.4])  # -0.5 and 0.3 do not count
    assert method.stage_start["pool"] == 5
    assert method.epoch_metrics(ctx)["clicktrain_loss_derivative"] == pytest.approx(0.1)


def test_the_loss_derivative_is_reported_in_stage_one_epochs_only():
    """The derivative that ends stage 1 is that stage's metric: a later epoch's row has none."""
    method = ClickTrain(ClickTrainConfig())
    ctx = _context(TinyNet(), 30)
    method.setup(ctx)
    _feed_epoch_losses(method, ctx, [2.0, 1.9])  # 0.1 < 0.27: stage 2 from epoch 2
    assert method.epoch_metrics(ctx)["clicktrain_loss_derivative"] == pytest.approx(0.1)
    ctx.epoch = 2
    method.on_epoch_start(ctx)
    method.loss(ctx, torch.tensor(1.0), None, None)
    method.on_epoch_end(ctx)
    row = method.epoch_metrics(ctx)
    assert row["clicktrain_stage"] == "pool" and "clicktrain_loss_derivative" not in row


def test_two_epoch_run_skips_stage_one_and_prunes_at_the_end():
    method, ctx = _train({}, epochs=2)
    assert method.stage_start == {
        "dense": 0,
        "pool": 0,
        "finalize": 1,
        "regularize": 2,
        "sparse": 2,
    }
    assert method.stage == "sparse" and method.masks.mask_sparsity()


def test_stage_one_is_capped_by_max_dense_epochs():
    method = ClickTrain(ClickTrainConfig(max_dense_epochs=3))
    ctx = _context(TinyNet(), 30)
    method.setup(ctx)
    _feed_epoch_losses(method, ctx, [3.0, 2.0, 1.0])  # derivatives stay at 1.0
    assert method.stage == "pool" and method.stage_start["pool"] == 3


def test_loss_margin_skips_batches_where_loss_rose():
    method = ClickTrain(ClickTrainConfig(**FAST))
    ctx = _context(TinyNet(), 5)
    method.setup(ctx)
    method._enter("finalize", 0)
    method.pool.scores[[0, 5]] = 1.0
    method.pool.finalize()
    method._finish_pool(ctx)
    model = ctx.model
    x, y = _data(1)[0]
    for value in (1.0, 2.0, 1.5, 1.5):  # counted (first), skipped (rose), counted, counted
        out = model(x)
        loss = F.cross_entropy(out, y)
        method.loss(ctx, torch.tensor(value), out, y)
        model.zero_grad()
        loss.backward()
        method.after_backward(ctx)
    fin = method.finalizers["block_a"]
    assert (fin.batches, fin.counted) == (4, 3)
    # the margin compares consecutive batches across an epoch's boundary too (Sec. 4.3)
    method.on_epoch_start(ctx)
    out = model(x)
    method.loss(ctx, torch.tensor(2.0), out, y)  # rose from the last epoch's 1.5: skipped
    model.zero_grad()
    F.cross_entropy(out, y).backward()
    method.after_backward(ctx)
    assert (fin.batches, fin.counted) == (5, 3)


@pytest.mark.parametrize("early", [True, False], ids=["early", "no-early"])
def test_early_regularization_is_the_pool_stages_penalty_and_can_be_turned_off(early):
    """Sec. 4.2's early regularization: during the pool stage the loss adds the modified group
    lasso of the positions no candidate pattern keeps; ``early_regularization=False`` trains
    that stage on the cross-entropy alone."""
    torch.manual_seed(0)
    method = ClickTrain(ClickTrainConfig(**FAST, penalty=0.01, early_regularization=early))
    ctx = _context(TinyNet(), 5)
    method.setup(ctx)
    ctx.optimizer = _optimizer(ctx.model)
    _run_epochs(method, ctx, range(1), _data())  # the dense stage
    method.on_epoch_start(ctx)
    x, y = _data(1)[0]
    out = ctx.model(x)
    ce = F.cross_entropy(out, y)
    method.loss(ctx, ce, out, y)
    ce.backward()
    method.after_backward(ctx)  # the pool stage's first batch: candidates known from here
    assert method.stage == "pool" and method.reachable
    ce = F.cross_entropy(ctx.model(x), y)
    total = method.loss(ctx, ce, None, y)
    if early:
        assert float(total.detach()) > float(ce.detach())
    else:
        assert total is ce


@pytest.mark.parametrize("stop", [2, 4], ids=["in_finalize", "after_hard_prune"])
def test_resume_gives_the_same_result(stop):
    epochs = 6
    options = {**FAST, "connectivity": 0.5}
    reference, ref_ctx = _train(options, epochs=epochs)

    torch.manual_seed(0)
    method = ClickTrain(ClickTrainConfig(**options))
    ctx = _context(TinyNet(), epochs)
    method.setup(ctx)
    ctx.optimizer = _optimizer(ctx.model)
    data = _data()
    _run_epochs(method, ctx, range(stop), data)
    buffer = io.BytesIO()
    torch.save(
        {
            "method": method.state_dict(),
            "model": ctx.model.state_dict(),
            "opt": ctx.optimizer.state_dict(),
        },
        buffer,
    )
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)

    torch.manual_seed(123)  # a different init: everything must come from the checkpoint
    resumed = ClickTrain(ClickTrainConfig(**options))
    ctx2 = _context(TinyNet(), epochs)
    resumed.setup(ctx2)
    resumed.load_state_dict(state["method"], ctx2)
    ctx2.model.load_state_dict(state["model"])
    ctx2.optimizer = _optimizer(ctx2.model)
    ctx2.optimizer.load_state_dict(state["opt"])
    ctx2.step = ctx.step
    _run_epochs(resumed, ctx2, range(stop, epochs), data)

    assert resumed.stage_start == reference.stage_start
    assert torch.equal(resumed.pool.pattern_ids, reference.pool.pattern_ids)
    for name in reference.layers:
        assert type(ctx2.model.get_submodule(name)) is type(ref_ctx.model.get_submodule(name))
        torch.testing.assert_close(
            ctx2.model.get_submodule(name).weight, ref_ctx.model.get_submodule(name).weight
        )


def _penalty_of(method: ClickTrain, model: nn.Module) -> torch.Tensor:
    """Stage 4's modified group lasso, computed apart from ClickTrain.loss."""
    from impl.methods.clicktrain_patterns import modified_group_lasso

    return sum(
        modified_group_lasso(
            model.get_submodule(n).weight, method.keep[n], method.removed[n]
        ).detach()
        for n in method.layers
    )


def test_loss_adds_the_weighted_penalty_only_in_the_regularization_stage():
    """Sec. 4.3: stage 4 minimises CE + penalty x (modified group lasso); the dense and sparse
    stages train on the cross-entropy alone. The epoch's metric is the mean penalty."""
    torch.manual_seed(0)
    method = ClickTrain(ClickTrainConfig(**{**FAST, "hard_prune_epoch": 4, "penalty": 0.01}))
    ctx = _context(TinyNet(), 5)
    method.setup(ctx)
    ctx.optimizer = _optimizer(ctx.model)
    _run_epochs(method, ctx, range(3), _data())  # dense, pool, finalize
    assert method.stage == "regularize"
    model = ctx.model
    x, y = _data(1)[0]
    ctx.epoch = 3
    method.on_epoch_start(ctx)
    expected = _penalty_of(method, model)
    assert float(expected) > 0
    for _ in range(2):  # the weights do not move: the same penalty twice
        ce = F.cross_entropy(model(x), y)
        total = method.loss(ctx, ce, None, y)
        assert float(total.detach()) == pytest.approx(
            float(ce.detach()) + 0.01 * float(expected), rel=1e-6
        )
    metrics = method.epoch_metrics(ctx)
    assert metrics["clicktrain_penalty"] == pytest.approx(float(expected), rel=1e-6)
    assert metrics["clicktrain_stage"] == "regularize"
    assert "clicktrain_counted_batches" not in metrics  # finalize epochs only
    assert "clicktrain_conv_compression" not in metrics  # once sparse only
    dense = ClickTrain(ClickTrainConfig(penalty=0.01))
    dctx = _context(TinyNet(), 30)
    dense.setup(dctx)
    ce = F.cross_entropy(dctx.model(x), y)
    assert dense.stage == "dense" and dense.loss(dctx, ce, None, y) is ce


@pytest.mark.parametrize("sparse_impl", ["none", "auto"], ids=["masked_dense", "pattern_conv"])
def test_sparse_stage_masks_gradients_and_reports_compression_and_finalize_counts(sparse_impl):
    from impl.methods.clicktrain_patterns import loss_rose

    steps = []  # (stage, batch loss, the finalize epoch's count so far)

    def record(method, ctx):
        metrics = method.epoch_metrics(ctx)
        stage, counted = metrics["clicktrain_stage"], metrics.get("clicktrain_counted_batches")
        steps.append((stage, float(method._batch_loss), counted))

    method, ctx = _train({**FAST, "sparse_impl": sparse_impl}, epochs=4, on_step=record)
    margin = method.cfg.loss_margin
    expected = sum(
        not loss_rose(steps[i - 1][1], steps[i][1], margin)
        for i in range(len(steps))
        if steps[i][0] == "finalize"
    )
    assert [c for stage, _, c in steps if stage == "finalize"][-1] == expected
    assert all(c is None for stage, _, c in steps if stage != "finalize")
    assert method.stage == "sparse"
    model = ctx.model
    x, y = _data(1)[0]
    model.zero_grad()
    loss = F.cross_entropy(model(x), y)
    assert method.loss(ctx, loss, None, y) is loss  # no penalty once sparse
    loss.backward()
    method.after_backward(ctx)
    for name in method.layers:
        keep = method.masks[f"{name}.weight"]
        assert not model.get_submodule(name).weight.grad[~keep].any()
    total, nonzero = conv_weight_counts(model)
    got = method.epoch_metrics(ctx)["clicktrain_conv_compression"]
    assert got == pytest.approx(total / nonzero) and got > 1


def test_summary_and_cost_report_the_pruned_model():
    method, ctx = _train({**FAST, "connectivity": 0.5}, epochs=4)
    summary = method.summary(ctx)["clicktrain"]
    total = sum(m.weight.numel() for m in ctx.model.modules() if isinstance(m, nn.Conv2d))
    nonzero = sum(
        int(torch.count_nonzero(m.weight)) for m in ctx.model.modules() if isinstance(m, nn.Conv2d)
    )
    assert summary["compression_ratio"] == pytest.approx(total / nonzero)
    kernels = sum(summary["layers"][n]["kernels"] for n in method.layers)
    usage = summary["pattern_usage"]
    assert sum(usage["kept_kernels_per_pattern"]) + usage["removed_kernels"] == kernels
    assert len(summary["pool"]) == len(usage["kept_kernels_per_pattern"])
    assert summary["layers"]["block_a"]["pattern_conv"] is True
    from impl.ops import pattern_cpu

    n_pattern = sum(summary["layers"][n]["pattern_conv"] for n in method.layers)
    path = "cpu" if pattern_cpu.is_available() else "ref"
    assert summary["pattern_conv_paths"] == {path: n_pattern}
    flops = summary["flops"]
    assert 0 < flops["inference_flops_saved_nominal"] < 1
    assert flops["train_flops_saved_nominal"] < flops["inference_flops_saved_nominal"]
    cost = method.cost(ctx.model)
    assert set(cost) == set(method.layers)
    kept = 1 - summary["layers"]["block_a"]["sparsity"]
    # forward, data gradient and weight gradient all run on the kept kernels only
    assert cost["block_a"].forward == pytest.approx(kept)
    assert (cost["block_a"].data_grad, cost["block_a"].weight_grad) == pytest.approx((kept, kept))
    mask = method.masks["block_a.weight"]  # exactly the kept count over the weights: nominal
    assert cost["block_a"].forward == int(mask.sum()) / mask.numel()  # = executed FLOPs


def test_summary_flops_over_the_run_and_per_layer_kernel_counts():
    """Sec. 6.2 / Table 1: epochs before hard pruning train at the dense cost, the rest at the
    final model's; "saved" is 1 - run / (epochs x dense)."""
    from impl.flops import training_flops

    method, ctx = _train({**FAST, "connectivity": 0.5}, epochs=5)  # hard pruning at epoch 3
    summary = method.summary(ctx)["clicktrain"]
    flops = summary["flops"]
    final = flops["per_sample_final"]
    dense_train, nominal_train = final["dense"]["train"], final["nominal"]["train"]
    unpruned = training_flops(TinyNet(), (1, 9, 9))  # the same architecture before pruning
    assert (final["dense"]["forward"], dense_train) == pytest.approx(
        (unpruned.forward, unpruned.total)
    )
    assert nominal_train < dense_train
    run = flops["train_flops_run_per_sample"]
    assert run["dense"] == pytest.approx(5 * dense_train)
    assert run["nominal"] == pytest.approx(3 * dense_train + 2 * nominal_train)
    assert run["executed"] == pytest.approx(3 * dense_train + 2 * final["executed"]["train"])
    assert flops["train_flops_saved_nominal"] == pytest.approx(1 - run["nominal"] / run["dense"])
    assert flops["train_flops_saved_executed"] == pytest.approx(1 - run["executed"] / run["dense"])
    assert flops["inference_flops_saved_nominal"] == pytest.approx(
        1 - final["nominal"]["forward"] / final["dense"]["forward"]
    )
    assert flops["inference_flops_saved_executed"] == pytest.approx(
        1 - final["executed"]["forward"] / final["dense"]["forward"]
    )
    for name in method.layers:
        info = summary["layers"][name]
        removed = method.removed[name]
        w = ctx.model.get_submodule(name).weight
        assert info["kernels"] == removed.numel() == w.shape[0] * w.shape[1]
        assert info["kernels_removed"] == int(removed.sum()) > 0
        kept = (~removed).sum(dim=1)
        assert (info["kept_kernels_per_filter_min"], info["kept_kernels_per_filter_max"]) == (
            int(kept.min()), int(kept.max()))  # fmt: skip
        assert info["sparsity"] == pytest.approx(1 - info["nonzero"] / info["weights"])
    pruned = [summary["layers"][n] for n in method.layers]
    assert summary["compression_ratio_pruned_layers"] == pytest.approx(
        sum(i["weights"] for i in pruned) / sum(i["nonzero"] for i in pruned)
    )


@pytest.mark.gpu
def test_stages_run_on_gpu():
    torch.manual_seed(0)
    device = torch.device("cuda")
    method = ClickTrain(ClickTrainConfig(**FAST, connectivity=0.5))
    ctx = _context(TinyNet().to(device), 4)
    ctx.device = device
    method.setup(ctx)
    ctx.optimizer = _optimizer(ctx.model)
    data = [(x.to(device), y.to(device)) for x, y in _data()]
    _run_epochs(method, ctx, range(4), data)
    assert method.stage == "sparse"
    for name in method.layers:
        module = ctx.model.get_submodule(name)
        assert isinstance(module, PatternConv2d)
        assert torch.count_nonzero(module.weight[~method.masks[f"{name}.weight"]]) == 0


def test_the_row_of_the_hard_pruning_epoch_says_it_was_tested_after_pruning():
    """Hard pruning ends the last regularization epoch, before it is evaluated: its row keeps
    the stage it trained in and says the model it describes is the pruned one."""
    method = ClickTrain(ClickTrainConfig(**{**FAST, "hard_prune_epoch": 4}))
    ctx = _context(TinyNet(), 6)
    method.setup(ctx)
    ctx.optimizer = _optimizer(ctx.model)
    data = _data()
    _run_epochs(method, ctx, range(3), data)
    rows = []
    for epoch in (3, 4):
        _run_epochs(method, ctx, range(epoch, epoch + 1), data)
        rows.append(method.epoch_metrics(ctx))
    regularize, sparse = rows
    assert regularize["clicktrain_stage"] == "regularize" and method.stage == "sparse"
    assert regularize["clicktrain_evaluated_after_hard_prune"] is True
    assert regularize["clicktrain_conv_compression"] > 1
    assert sparse["clicktrain_stage"] == "sparse"
    assert "clicktrain_evaluated_after_hard_prune" not in sparse


def test_prune_pointwise_adds_every_1x1_conv_but_the_stem():
    from impl.methods.clicktrain import pointwise_layers
    from impl.models import create

    assert prunable_layers(TinyNet(), pointwise=True) == ["block_a", "block_b", "shortcut"]
    assert pointwise_layers(TinyNet()) == ["shortcut"]
    with torch.device("meta"):
        net = create("prunetrain_resnet50")
    ones = pointwise_layers(net)  # 24 bottlenecks x 2, and 3 projection shortcuts
    assert len(ones) == 51 and len(prunable_layers(net)) == 24
    assert all(net.get_submodule(n).kernel_size == (1, 1) for n in ones)


def test_pointwise_convs_lose_whole_kernels_and_are_penalised_whole():
    """With prune_pointwise the 1x1 shortcut loses the connectivity fraction of its kernels
    (single weights) per filter, chosen by the stage-3 votes, penalised whole in stage 4 and
    zeroed at hard pruning; the 3x3 layers keep their pool patterns, and the pattern usage
    counts 3x3 kernels only."""
    seen = {}

    def penalty_grad(method, ctx):
        if method.stage == "regularize" and "grad" not in seen:
            w = ctx.model.shortcut.weight
            (g,) = torch.autograd.grad(method._penalty(ctx.model), w)
            seen["grad"], seen["removed"] = g, method.removed["shortcut"]

    opts = {**FAST, "hard_prune_epoch": 4, "connectivity": 0.5, "prune_pointwise": True}
    method, ctx = _train(opts, epochs=5, on_step=penalty_grad)
    removed = seen["removed"]  # [12, 8]: 4 of each filter's 8 kernels
    assert removed.shape == (12, 8) and bool((removed.sum(dim=1) == 4).all())
    g = seen["grad"].flatten(1)
    assert bool((g[removed] != 0).all()) and bool((g[~removed] == 0).all())
    keep = method.masks["shortcut.weight"]
    assert keep.shape == (12, 8, 1, 1) and torch.equal(keep.flatten(1), ~removed)
    w = ctx.model.shortcut.weight.detach().flatten(1)
    assert torch.count_nonzero(w[removed]) == 0 and bool((w[~removed] != 0).all())
    pool = method.pool.patterns()
    kept_3x3 = 0
    for name in ("block_a", "block_b"):
        k = method.masks[f"{name}.weight"]
        kept = k.flatten(2).any(dim=2)
        kept_3x3 += int(kept.sum())
        assert all(any(torch.equal(k[f, c], p) for p in pool) for f, c in kept.nonzero())
    usage = method.summary(ctx)["clicktrain"]["pattern_usage"]
    assert sum(usage["kept_kernels_per_pattern"]) == kept_3x3
    assert usage["removed_kernels"] == int(removed.sum()) + sum(
        int(method.removed[n].sum()) for n in ("block_a", "block_b")
    )


def test_prune_pointwise_is_off_by_default_and_resumes():
    method, ctx = _train(FAST, epochs=4)
    assert "shortcut" not in method.layers and ctx.model.shortcut.weight.count_nonzero() == 96
    opts = {**FAST, "prune_pointwise": True}
    method, ctx = _train(opts, epochs=4)
    again = ClickTrain(ClickTrainConfig(**opts))
    again.setup(ctx)
    again.load_state_dict(method.state_dict(), ctx)
    assert again.pointwise == {"shortcut"} and torch.equal(
        again.masks["shortcut.weight"], method.masks["shortcut.weight"]
    )


def test_default_stage_lengths_round_halves_up():
    from impl.methods.clicktrain import resolve_schedule

    # half of 7 and of 9 epochs: 4 and 5 (round() gave 4 for both: halves to even)
    assert resolve_schedule(ClickTrainConfig(), 7).hard_prune_epoch == 4
    assert resolve_schedule(ClickTrainConfig(), 9).hard_prune_epoch == 5
    fifty = resolve_schedule(ClickTrainConfig(), 50)  # 5% of 50 = 2.5, 25% = 12.5
    assert (fifty.pool_epochs, fifty.finalize_epochs, fifty.hard_prune_epoch) == (3, 3, 25)


def test_a_layer_exactly_at_the_sparse_threshold_stays_dense():
    options = {**FAST, "connectivity": 0.5, "sparse_impl": "ref"}
    method, _ = _train(options, epochs=4)
    name, entry = next(iter(method.sparse_layers.items()))
    at, _ = _train({**options, "sparse_threshold": entry["sparsity"]}, epochs=4)
    assert at.sparse_layers[name] == {"sparsity": entry["sparsity"], "pattern_conv": False}


def test_a_resumed_finalisation_keeps_the_previous_batchs_loss():
    method, _ = _train({**FAST, "connectivity": 0.5}, epochs=5)
    again = ClickTrain(ClickTrainConfig(**FAST, connectivity=0.5))
    ctx = _context(TinyNet(), 5)
    again.setup(ctx)
    again.load_state_dict(method.state_dict(), ctx)
    assert method._prev_loss is not None
    assert again._prev_loss == pytest.approx(float(method._prev_loss))


def test_counted_batches_are_the_epochs_own(monkeypatch):
    rows = []
    real = ClickTrain.epoch_metrics

    def recording(self, ctx):
        rows.append(real(self, ctx))
        return rows[-1]

    monkeypatch.setattr(ClickTrain, "epoch_metrics", recording)
    _train({**FAST, "finalize_epochs": 2, "hard_prune_epoch": 4}, epochs=5, n_batches=3)
    counted = [r["clicktrain_counted_batches"] for r in rows if "clicktrain_counted_batches" in r]
    assert len(counted) == 2 and all(c <= 3 for c in counted)  # 3 batches an epoch
    # beside it, of how many: a batch whose loss rose by more than delta is not counted
    seen = [r["clicktrain_finalize_batches"] for r in rows if "clicktrain_counted_batches" in r]
    assert seen == [3, 3]


def test_a_run_that_never_hard_pruned_counts_every_epoch_dense():
    """Before hard pruning every epoch trains at the dense cost (Sec. 6.2): a run summarised
    before the sparse stage saved no training FLOPs and reports the stage it is in."""
    torch.manual_seed(0)
    method = ClickTrain(ClickTrainConfig(**FAST))
    ctx = _context(TinyNet(), 5)
    method.setup(ctx)
    summary = method.summary(ctx)["clicktrain"]
    assert summary["final_stage"] == method.stage != "sparse"
    flops = summary["flops"]
    dense_train = flops["per_sample_final"]["dense"]["train"]
    run = flops["train_flops_run_per_sample"]
    assert run["dense"] == run["nominal"] == run["executed"] == pytest.approx(5 * dense_train)
    assert flops["train_flops_saved_nominal"] == flops["train_flops_saved_executed"] == 0.0
