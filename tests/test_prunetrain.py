"""PruneTrain's functions: group lasso, coefficient, reconfiguration, channel union, layer
removal, and the equivalence of zeroing-then-reconfiguring (Lym et al., SC 2019)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import impl.models as M
from impl.methods import create_method
from impl.methods.channel_graph import ShortcutOnly, build_graph, path_forward, zero_channels
from impl.methods.prunetrain import (
    PruneTrainConfig,
    group_lasso,
    lasso_coefficient,
    reconfigure,
)
from impl.methods.prunetrain_reconfig import (
    ReconfigReport,
    apply_architecture,
    architecture,
    check_optimizer_state,
    shrink_to_channels,
)
from impl.models.resnet import BasicBlock, Bottleneck
from impl.models.resnet9 import Residual


# -- helpers ---------------------------------------------------------------------------------
def tiny_model() -> nn.Sequential:
    """Odd sizes: 3 -> 5 -> 7 channels, 3 classes."""
    return nn.Sequential(
        nn.Conv2d(3, 5, 3, padding=1, bias=False),
        nn.BatchNorm2d(5),
        nn.ReLU(),
        nn.Conv2d(5, 7, 3, padding=1, bias=False),
        nn.BatchNorm2d(7),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(7, 3),
    )


def randomize_bn(model: nn.Module, gen: torch.Generator) -> None:
    """Non-trivial BatchNorm statistics and affine parameters (eval mode uses them)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.rand(n, generator=gen) - 0.5)
                m.running_var.copy_(torch.rand(n, generator=gen) * 1.5 + 0.5)
                m.weight.copy_(torch.rand(n, generator=gen) + 0.5)
                m.bias.copy_(torch.rand(n, generator=gen) * 0.6 - 0.3)


def zero_random(
    model: nn.Module,
    gen: torch.Generator,
    fraction: float = 0.4,
    dead_paths: int = 1,
    zero_norms: bool = True,
) -> tuple[set[str], dict[str, int]]:
    """Zero a random ``fraction`` of every space and all channels of ``dead_paths`` paths
    (spread over the network). Returns the dead blocks and the zeroed count per space."""
    graph = build_graph(model)
    blocks = [p.block for p in graph.paths]
    dead: set[str] = set()
    if dead_paths and blocks:
        stride = max(len(blocks) // dead_paths, 1)
        dead = set(blocks[stride // 2 :: stride][:dead_paths])
    zeroed = {}
    for name, space in graph.spaces.items():
        if space.path in dead:
            idx = torch.arange(space.size)
        else:
            idx = torch.randperm(space.size, generator=gen)[: int(space.size * fraction)]
        zero_channels(model, graph, name, idx, zero_norms=zero_norms)
        zeroed[name] = int(idx.numel())
    return dead, zeroed


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


# -- group lasso -----------------------------------------------------------------------------
def loop_group_lasso(model: nn.Module) -> float:
    """Plain-loop reference of Eq. (2) in float64."""
    total = 0.0
    first = True
    last = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            w = m.weight.detach().double()
            for k in range(w.shape[0]):
                total += math.sqrt(float((w[k] ** 2).sum()) + 1e-8)
            if not first:
                for c in range(w.shape[1]):
                    total += math.sqrt(float((w[:, c] ** 2).sum()) + 1e-8)
            first = False
        elif isinstance(m, nn.Linear):
            w = m.weight.detach().double()
            for i in range(w.shape[1]):
                total += math.sqrt(float((w[:, i] ** 2).sum()) + 1e-8)
            if m is not last:  # output neurons of all but the last FC layer (Sec. 4.1)
                for j in range(w.shape[0]):
                    total += math.sqrt(float((w[j] ** 2).sum()) + 1e-8)
    return total


def two_fc_head_model() -> nn.Sequential:
    """tiny_model with a hidden linear layer: 7 -> 6 -> 3."""
    return nn.Sequential(*tiny_model()[:-1], nn.Linear(7, 6), nn.ReLU(), nn.Linear(6, 3))


@pytest.mark.parametrize("name", ["tiny", "two-fc", "resnet20", "vgg11"])
def test_group_lasso_matches_plain_loop(name: str) -> None:
    models = {"tiny": tiny_model, "two-fc": two_fc_head_model}
    model = models[name]() if name in models else M.create(name)
    got = float(group_lasso(model).detach())
    assert got == pytest.approx(loop_group_lasso(model), rel=1e-5)


def test_group_lasso_skips_first_conv_inputs_and_zero_groups_cost_eps() -> None:
    model = tiny_model()
    with torch.no_grad():
        model[0].weight[:, 1] = 5.0  # input channel of the first conv: not a group
    base = loop_group_lasso(model)
    assert float(group_lasso(model).detach()) == pytest.approx(base, rel=1e-6)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    # 5 + 7 output groups, 5 input groups of conv 2, 7 linear input groups, each sqrt(1e-8)
    assert float(group_lasso(model).detach()) == pytest.approx(24 * 1e-4, rel=1e-5)


def test_group_lasso_gradient_is_w_over_group_norm() -> None:
    model = nn.Sequential(nn.Conv2d(2, 3, 1, bias=False), nn.Flatten(), nn.Linear(12, 2))
    w = model[0].weight
    group_lasso(model).backward()
    expected = w.detach() / (w.detach().pow(2).sum(dim=(1, 2, 3), keepdim=True) + 1e-8).sqrt()
    torch.testing.assert_close(w.grad, expected)


# -- coefficient -----------------------------------------------------------------------------
@pytest.mark.parametrize("ratio", [0.05, 0.2, 0.25, 0.4, 0.97], ids=lambda r: f"r{r}")
def test_lasso_coefficient_solves_eq3(ratio: float) -> None:
    ce, gl = 2.302585, 1517.0
    lam = lasso_coefficient(ce, gl, ratio)
    assert lam == pytest.approx(ratio * ce / ((1 - ratio) * gl))
    assert lam * gl / (ce + lam * gl) == pytest.approx(ratio)  # Eq. (3) recovered


def test_lasso_coefficient_edges() -> None:
    """A cross-entropy of 0 is allowed (lambda 0); an infinite group lasso (overflowed
    weights) is refused, not turned into lambda 0 with the penalty silently off."""
    assert lasso_coefficient(0.0, 10.0, 0.2) == 0.0
    with pytest.raises(ValueError):
        lasso_coefficient(2.3, math.inf, 0.2)


def test_lasso_coefficient_plausible_against_authors_resnet32() -> None:
    # Authors' stored values for CIFAR ResNet-32 (public code): r=0.2 -> 3.79e-4. They depend on
    # the initialisation, so this only checks the order of magnitude with ours.
    model = M.create("resnet32")
    lam = lasso_coefficient(math.log(10), group_lasso(model).detach(), 0.2)
    assert 3.79e-4 / 10 < lam < 3.79e-4 * 10


@pytest.mark.parametrize(
    "ratio", [0.0, 1.0, -0.1, 1.5, float("nan")], ids=["0", "1", "neg", "1.5", "nan"]
)
def test_bad_ratio_is_an_error(ratio: float) -> None:
    with pytest.raises(ValueError, match="ratio"):
        lasso_coefficient(2.3, 100.0, ratio)
    with pytest.raises(ValueError, match="penalty_ratio"):
        PruneTrainConfig(penalty_ratio=ratio)
    with pytest.raises(ValueError, match="penalty_ratio"):
        create_method("prunetrain", {"penalty_ratio": ratio})


def test_bad_lasso_loss_and_interval_are_errors() -> None:
    with pytest.raises(ValueError, match="group lasso"):
        lasso_coefficient(2.3, 0.0, 0.2)
    with pytest.raises(ValueError, match="reconfig_interval"):
        PruneTrainConfig(reconfig_interval=0)
    with pytest.raises(ValueError, match="threshold"):
        PruneTrainConfig(threshold=-1e-4)
    with pytest.raises(ValueError, match="threshold"):
        PruneTrainConfig(threshold=float("nan"))
    for name in ("batch_step", "max_batch"):
        with pytest.raises(ValueError, match=f"^{name} must be >= 1, got 0"):
            PruneTrainConfig(**{name: 0})
    with pytest.raises(ValueError, match="cross-entropy"):
        lasso_coefficient(-1e-3, 100.0, 0.2)
    with pytest.raises(ValueError, match="cross-entropy"):
        lasso_coefficient(float("inf"), 100.0, 0.2)


def test_edge_settings_are_accepted() -> None:
    """Zero threshold, steps and batches of one, and a cross-entropy of exactly 0 (lambda 0)."""
    cfg = PruneTrainConfig(threshold=0.0, batch_step=1, max_batch=1, reconfig_interval=1)
    assert (cfg.threshold, cfg.batch_step, cfg.max_batch) == (0.0, 1, 1)
    assert lasso_coefficient(0.0, 100.0, 0.2) == 0.0
    assert lasso_coefficient(1.0, 0.5, 0.5) == pytest.approx(2.0)  # any positive lasso loss


# -- supported models ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.Flatten(), nn.Linear(4, 2)),
        nn.Sequential(nn.Conv2d(3, 4, 3, groups=1), nn.Conv2d(4, 4, 3, groups=2)),
        nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.GELU()),
    ],
    ids=["groupnorm", "grouped-conv", "gelu"],
)
def test_unsupported_layers_are_named(bad: nn.Module) -> None:
    with pytest.raises(ValueError, match="unsupported|grouped"):
        build_graph(bad)


def test_unsupported_model_class_is_an_error() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

    with pytest.raises(ValueError, match="unsupported model class"):
        build_graph(Net())


def _head(channels: int) -> list[nn.Module]:
    return [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 2)]


@pytest.mark.parametrize(
    "bad,message",
    [
        (nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Conv2d(4, 5, 3), *_head(5)),
         "reads 4 channels"),
        # global pooling leaves one feature per channel: a linear of 2 per channel is wrong
        (nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                       nn.Linear(8, 2)), "not a multiple"),
        (nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(7, 2)), "not a multiple"),
        (nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d((None, 1)), nn.Flatten(),
                       nn.Linear(4, 2)), "free dimension"),
        (nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)), "does not end in a linear"),
        (nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(5), *_head(4)), "does not match"),
        (nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4),
                       BasicBlock(4, 8, downsample=nn.Sequential(
                           nn.Conv2d(4, 8, 1), nn.BatchNorm2d(8), nn.ReLU())),
                       *_head(8)), "unsupported shortcut"),
        (nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4),
                       ShortcutOnly(None, torch.zeros(3), True), *_head(4)), "path_bias"),
        (nn.Sequential(Residual(3), nn.Conv2d(3, 4, 3), *_head(4)), "network input"),
        (nn.Sequential(BasicBlock(3, 3), nn.Conv2d(3, 4, 3), *_head(4)), "network input"),
        # no projection: the path's 4 channels would be added to the block's 8 input channels
        (nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), BasicBlock(8, 4),
                       *_head(4)), "'2.conv2' writes 4 channels into space '0' of 8"),
        (nn.Sequential(nn.Flatten(), nn.Linear(12, 2)), "no convolution"),
    ],
    ids=["conv-width", "linear-after-pool", "linear-width", "free-pool", "no-classifier",
         "norm-width", "shortcut-with-relu", "path-bias-width", "residual-first", "block-first",
         "path-width", "no-conv"],
)  # fmt: skip
def test_build_graph_refuses_sizes_or_structures_it_cannot_prune(bad: nn.Module, message) -> None:
    with pytest.raises(ValueError, match=message):
        build_graph(bad)


def test_a_linear_after_a_conv_reads_the_positions_that_conv_leaves_per_channel() -> None:
    # the pooling before the last conv says nothing about the linear: 5 channels of 2x2
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(3), nn.Conv2d(4, 5, 2),
        nn.Flatten(), nn.Linear(20, 2),
    )  # fmt: skip
    assert model(torch.randn(1, 3, 8, 8)).shape == (1, 2)
    assert build_graph(model).spaces["2"].readers == [("4", 4)]


def pooled_model() -> nn.Sequential:
    """4 channels read by a linear at 2x2 positions each (fan 4)."""
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16, 3),
    )  # fmt: skip


def test_zero_channels_zeroes_each_channels_run_of_linear_features() -> None:
    torch.manual_seed(0)
    model = pooled_model()
    before = model[5].weight.detach().clone()
    zero_channels(model, build_graph(model), "0", [1, 3])
    for col in range(16):  # flatten keeps channel-major order: feature = channel * 4 + position
        if col // 4 in (1, 3):
            assert not model[5].weight[:, col].any(), col
        else:
            assert torch.equal(model[5].weight[:, col], before[:, col]), col


# -- reconfiguration -------------------------------------------------------------------------
def test_threshold_uses_absolute_value_and_removes_small_weights() -> None:
    model = tiny_model()
    with torch.no_grad():
        # channel 0 of space 1: strongly negative writer, zero readers -> kept (the authors'
        # signed comparison would have removed it)
        model[0].weight[0] = -1.0
        model[3].weight[:, 0] = 0.0
        # channel 2: every weight in (-1e-4, 1e-4) but nonzero -> removed
        model[0].weight[2] = 5e-5
        model[3].weight[:, 2] = -5e-5
    rep = reconfigure(model, None, threshold=1e-4)
    assert rep.kept["0"] == [0, 1, 3, 4]
    assert model[0].weight.shape == (4, 3, 3, 3) and model[3].weight.shape == (7, 4, 3, 3)
    assert model[1].running_mean.shape == (4,) and model[1].num_features == 4
    assert rep.layers["3"].in_before == 5 and rep.layers["3"].in_after == 4


def test_a_channel_exactly_at_the_threshold_is_kept_and_threshold_zero_is_valid() -> None:
    # "below the threshold counts as zero": a channel whose largest |w| equals it stays.
    model = tiny_model()
    with torch.no_grad():
        model[0].weight.fill_(1.0)  # channels 0, 3 and 4 well above the threshold
        model[0].weight[1] = 0.25
        model[3].weight[:, 1] = -0.25
        model[0].weight[2] = 0.0
        model[3].weight[:, 2] = 0.0
    rep = reconfigure(model, None, threshold=0.25)
    assert rep.kept["0"] == [0, 1, 3, 4]
    # nor is a group at the threshold zeroed: kept channel 1 is now index 1
    assert bool((model[0].weight[1] == 0.25).all() and (model[3].weight[:, 1] == -0.25).all())
    assert rep.layers["0"].kept_out == [0, 1, 3, 4] and rep.layers["3"].kept_in == [0, 1, 3, 4]
    assert rep.layers["0"].kept_in is None  # the image's channels are never pruned
    # |w| < 0 holds for no weight: at threshold 0 nothing is removed, not even exact zeros
    zeroed = tiny_model()
    with torch.no_grad():
        zeroed[0].weight[2] = 0.0
        zeroed[3].weight[:, 2] = 0.0
    assert reconfigure(zeroed, None, threshold=0.0).kept["0"] == [0, 1, 2, 3, 4]


def test_nothing_removed_on_a_dense_model() -> None:
    model = M.create("resnet20")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rep = reconfigure(model, None)
    assert not rep.changed and rep.params_after == rep.params_before
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k])


@pytest.mark.parametrize("zero_norms", [True, False], ids=["bn-zeroed", "bn-kept"])
def test_zero_channels_zeroes_every_layer_touching_them_and_nothing_else(zero_norms) -> None:
    model = tiny_model()
    model[3] = nn.Conv2d(5, 7, 3, padding=1, bias=True)  # a writer with a bias
    randomize_bn(model, torch.Generator().manual_seed(0))
    graph = build_graph(model)
    (space,) = [k for k, s in graph.spaces.items() if s.writers == ["3"]]
    before = copy.deepcopy(model.state_dict())
    idx = torch.tensor([1, 4])
    zero_channels(model, graph, space, idx, zero_norms=zero_norms)
    rest = torch.tensor([0, 2, 3, 5, 6])
    conv, bn, fc = model[3], model[4], model[8]
    assert not conv.weight[idx].any() and not conv.bias[idx].any()  # the writer's rows
    assert not fc.weight[:, idx].any()  # the reader's columns
    assert bool(not bn.weight[idx].any() and not bn.bias[idx].any()) is zero_norms
    assert torch.equal(conv.weight[rest], before["3.weight"][rest])
    assert torch.equal(conv.bias[rest], before["3.bias"][rest])
    assert torch.equal(bn.bias[rest], before["4.bias"][rest])
    assert torch.equal(fc.weight[:, rest], before["8.weight"][:, rest])
    assert torch.equal(model[0].weight, before["0.weight"])  # another space: untouched


def test_vgg_space_keeps_one_channel_when_all_are_zero() -> None:
    model = M.create("vgg11")
    graph = build_graph(model)
    zero_channels(model, graph, "features.4", torch.arange(128))
    reconfigure(model, None)
    assert model.features[4].out_channels == 1 and model.features[8].in_channels == 1
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_a_path_whose_last_conv_is_all_below_the_threshold_is_removed_as_if_zeroed() -> None:
    """Its last conv's weights are small but not zero: the path is removed, and the model
    computes what it computed with that conv zeroed (not with another conv zeroed); a path
    whose last conv holds one weight exactly at the threshold is kept, as a channel is."""
    gen = torch.Generator().manual_seed(5)
    model = M.create("resnet20")
    randomize_bn(model, gen)
    graph = build_graph(model)
    path = graph.paths[1]
    last = model.get_submodule(path.convs[-1])
    with torch.no_grad():
        last.weight.uniform_(-5e-3, 5e-3, generator=gen)  # all below a threshold of 0.01
    kept = copy.deepcopy(model)
    with torch.no_grad():
        kept.get_submodule(path.convs[-1]).weight.view(-1)[7] = 0.01
    zeroed = copy.deepcopy(model)
    with torch.no_grad():
        zeroed.get_submodule(path.convs[-1]).weight.zero_()
    x = torch.randn(2, 3, 32, 32, generator=gen)
    for m in (model, kept, zeroed):
        m.eval()
    with torch.no_grad():
        want = zeroed(x)
        rep = reconfigure(model, None, threshold=0.01)
        assert rep.removed_paths == [path.block]
        assert rel_err(model(x), want) < 1e-5
        assert reconfigure(kept, None, threshold=0.01).removed_paths == []


def _union_models() -> list:
    names = [("resnet20", "cifar"), ("resnet32", "cifar"), ("resnet56", "cifar")]
    for n in ("resnet18", "resnet34", "resnet50", "resnet101"):
        names += [(n, "cifar"), (n, "imagenet")]
    names += [(n, "cifar") for n in ("vgg11", "vgg13", "vgg16")] + [("resnet9", "cifar")]
    names += [("vgg11", "imagenet")]
    slow = {("resnet101", "cifar"), ("resnet101", "imagenet"), ("vgg11", "imagenet")}
    return [
        pytest.param(n, s, marks=[pytest.mark.slow] if (n, s) in slow else [], id=f"{n}-{s}")
        for n, s in names
    ]


@pytest.mark.parametrize("name,stem", _union_models())
def test_channel_union_keeps_shapes_consistent(name: str, stem: str) -> None:
    gen = torch.Generator().manual_seed(1)
    model = M.create(name, num_classes=7, in_channels=1, stem=stem)
    dead, zeroed = zero_random(model, gen, fraction=0.3, dead_paths=2)
    graph = build_graph(model)
    rep = reconfigure(model, None)
    # every space lost exactly its zeroed channels; dead paths are gone
    for sname, space in graph.spaces.items():
        if space.path in dead:
            assert rep.spaces[sname] == (space.size, 0)
        else:
            assert rep.spaces[sname] == (space.size, space.size - zeroed[sname]), sname
    assert sorted(rep.removed_paths) == sorted(dead)
    build_graph(model)  # sizes cross-checked again
    x = torch.randn(2, 1, 32, 32)
    out = model(x)
    assert out.shape == (2, 7)
    out.sum().backward()


@pytest.mark.parametrize(
    "name", ["resnet20", "resnet56", "resnet50", "prunetrain_resnet50", "vgg11"], ids=str
)
@pytest.mark.parametrize("zero_norms", [True, False], ids=["bn-zeroed", "bn-kept"])
def test_zero_then_reconfigure_is_equivalent(name: str, zero_norms: bool) -> None:
    """Required: outputs unchanged (eval mode, 1e-5 relative), dead paths included."""
    gen = torch.Generator().manual_seed(7)
    model = M.create(name)
    randomize_bn(model, gen)
    dead, _ = zero_random(model, gen, fraction=0.5, dead_paths=2, zero_norms=zero_norms)
    assert len(dead) == (0 if name == "vgg11" else 2)
    model.eval()
    x = torch.randn(3, 3, 32, 32, generator=gen)
    before, rep, after = outputs_around_reconfigure(model, x)
    assert rep.params_after < 0.5 * rep.params_before
    assert sorted(rep.removed_paths) == sorted(dead)
    assert rel_err(after, before) < 1e-5


@pytest.mark.parametrize(
    "name,kind", [("resnet20", "basic"), ("resnet50", "bottleneck-mid"), ("resnet9", "residual")],
    ids=["basic", "bottleneck-mid", "resnet9"],
)  # fmt: skip
def test_layer_removal(name: str, kind: str) -> None:
    gen = torch.Generator().manual_seed(3)
    model = M.create(name)
    randomize_bn(model, gen)
    graph = build_graph(model)
    path = graph.paths[1]
    # bottleneck: empty the second internal space only (conv2 -> conv3)
    target = path.internal[-1] if kind == "bottleneck-mid" else path.internal[0]
    zero_channels(model, graph, target, torch.arange(graph.spaces[target].size))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.eval()
    x = torch.randn(2, 3, 32, 32, generator=gen)
    with torch.no_grad():
        before = model(x)
        rep = reconfigure(model, opt)
        after = model(x)
    assert rep.removed_paths == [path.block]
    block = model.get_submodule(path.block)
    assert isinstance(block, ShortcutOnly) and block.post_relu == (kind != "residual")
    assert not block.training  # the replacement follows the model's evaluation mode
    assert rep.removed_layers == path.convs
    assert rel_err(after, before) < 1e-5
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert in_opt == {id(p) for p in model.parameters()}
    assert f"{path.block}.path_bias" in model.state_dict()
    assert not any(k.startswith(f"{path.block}.conv") for k in model.state_dict())


@torch.no_grad()
def outputs_around_reconfigure(
    model: nn.Module, x: torch.Tensor
) -> tuple[torch.Tensor, ReconfigReport, torch.Tensor]:
    """``(model(x), reconfigure(model, None), model(x))``: the outputs before and after."""
    before = model(x)
    report = reconfigure(model, None)
    return before, report, model(x)


def bottleneck_net(gen: torch.Generator) -> nn.Sequential:
    """A stem, one Bottleneck (16 -> 4 -> 16) and a classifier, BatchNorms randomised."""
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        Bottleneck(16, 4), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 3),
    )  # fmt: skip
    randomize_bn(model, gen)
    return model


def test_a_bottleneck_path_emptied_at_its_first_space_leaves_what_its_later_layers_give():
    """The second 3x3 conv reads nothing, so the path outputs conv3 and bn3 applied to the
    rectified constant of bn2; with that constant negative in some channels, the removed
    block must keep the ReLU between them to leave the eval output unchanged."""
    gen = torch.Generator().manual_seed(8)
    model = bottleneck_net(gen)
    block = model[3]
    with torch.no_grad():
        block.bn2.bias.copy_(torch.tensor([-1.0, 0.8, -0.6, 0.5]))
        block.bn2.running_mean.zero_()
    graph = build_graph(model)
    (path,) = graph.paths
    zero_channels(model, graph, path.internal[0], torch.arange(4))
    model.eval()
    x = torch.randn(2, 3, 8, 8, generator=gen)
    want, rep, got = outputs_around_reconfigure(model, x)
    assert rep.removed_paths == ["3"] and isinstance(model[3], ShortcutOnly)
    assert rel_err(got, want) < 1e-5


def test_a_bottleneck_path_whose_first_space_is_below_the_threshold_is_removed_as_if_zeroed():
    """conv1's rows and conv2's columns (all of conv2) are small but not zero: the path is
    removed, and the model computes what it computed with both convs zeroed."""
    gen = torch.Generator().manual_seed(9)
    model = bottleneck_net(gen)
    block = model[3]
    with torch.no_grad():
        block.conv1.weight.uniform_(-5e-3, 5e-3, generator=gen)
        block.conv2.weight.uniform_(-5e-3, 5e-3, generator=gen)
    zeroed = copy.deepcopy(model).eval()
    with torch.no_grad():
        zeroed[3].conv1.weight.zero_()
        zeroed[3].conv2.weight.zero_()
    model.eval()
    x = torch.randn(2, 3, 8, 8, generator=gen)
    with torch.no_grad():
        want = zeroed(x)
        rep = reconfigure(model, None, threshold=0.01)
        got = model(x)
    assert rep.removed_paths == ["3"]
    assert rel_err(got, want) < 1e-5


@pytest.mark.parametrize("name", ["resnet20", "resnet50"])
def test_a_removed_path_keeps_its_projection_shortcut_training(name: str) -> None:
    """Removing a residual path whose block has a projection shortcut (Sec. 4.1): the
    shortcut's parameters stay in the optimizer, momentum included, and keep training (its
    BatchNorm in training mode); the removed convs leave the optimizer's state too, and the
    report names them, not the shortcut's conv."""
    model = M.create(name)
    graph = build_graph(model)
    path = next(p for p in graph.paths if getattr(model.get_submodule(p.block), "downsample", None))
    zero_channels(model, graph, path.internal[0], torch.arange(graph.spaces[path.internal[0]].size))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()  # momentum buffers exist
    short = list(model.get_submodule(path.block).downsample.parameters())
    rep = reconfigure(model, opt)
    assert path.block in rep.removed_paths
    assert rep.removed_layers == path.convs
    block = model.get_submodule(path.block)
    assert isinstance(block, ShortcutOnly)
    assert block.training and all(m.training for m in block.downsample.modules())
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert {id(p) for p in block.parameters()} == {id(p) for p in short}
    assert all(id(p) in in_opt and "momentum_buffer" in opt.state[p] for p in short)
    assert in_opt == {id(p) for p in model.parameters()}
    assert {id(p) for p in opt.state} <= in_opt
    fresh = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    fresh.load_state_dict(opt.state_dict())  # the state packs against the param groups


def test_path_with_all_zero_last_conv_is_removed() -> None:
    model = M.create("resnet20")
    with torch.no_grad():
        model.layer3[2].conv2.weight.zero_()
    rep = reconfigure(model, None)
    assert rep.removed_paths == ["layer3.2"]


def test_step_after_reconfigure_equals_unpruned_step_on_kept_channels() -> None:
    gen = torch.Generator().manual_seed(5)
    model = M.create("resnet20", num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(8, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (8,), generator=gen)

    def step(m: nn.Module, o: torch.optim.Optimizer) -> None:
        o.zero_grad()
        (F.cross_entropy(m(x), y) + 1e-3 * group_lasso(m)).backward()
        o.step()

    for _ in range(2):  # momentum buffers hold history
        step(model, opt)
    graph = build_graph(model)
    zero_random(model, gen, fraction=0.3, dead_paths=0)
    ref_model, ref_opt = copy.deepcopy((model, opt))
    rep = reconfigure(model, opt)
    assert rep.params_after < rep.params_before
    step(ref_model, ref_opt)
    step(model, opt)
    ref = dict(ref_model.named_parameters())
    checked = 0
    for space_name, space in graph.spaces.items():
        idx = torch.tensor(rep.kept[space_name])
        for w in space.writers:
            torch.testing.assert_close(
                dict(model.named_parameters())[f"{w}.weight"],
                ref[f"{w}.weight"][idx][:, _in_idx(rep, w)],
            )
            checked += 1
        for bn in space.norms:
            for attr in ("weight", "bias"):
                got = dict(model.named_parameters())[f"{bn}.{attr}"]
                torch.testing.assert_close(got, ref[f"{bn}.{attr}"][idx])
                buf = opt.state[got]["momentum_buffer"]
                torch.testing.assert_close(
                    buf, ref_opt.state[ref[f"{bn}.{attr}"]]["momentum_buffer"][idx]
                )
    torch.testing.assert_close(model.fc.weight, ref["fc.weight"][:, _in_idx(rep, "fc")])
    assert checked == sum(1 for m in model.modules() if isinstance(m, nn.Conv2d))


def _in_idx(rep, name: str) -> torch.Tensor | slice:
    kept = rep.layers[name].kept_in
    return slice(None) if kept is None else torch.tensor(kept)


# -- architecture record ---------------------------------------------------------------------
def test_architecture_replays_on_a_fresh_model() -> None:
    gen = torch.Generator().manual_seed(11)
    model = M.create("resnet56")
    randomize_bn(model, gen)
    zero_random(model, gen, fraction=0.4, dead_paths=3)
    reconfigure(model, None)
    fresh = M.create("resnet56")
    apply_architecture(fresh, architecture(model))
    fresh.load_state_dict(model.state_dict())  # strict: same keys and shapes
    model.eval()
    fresh.eval()
    x = torch.randn(2, 3, 32, 32, generator=gen)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), model(x))
    assert sum(isinstance(m, ShortcutOnly) for m in fresh.modules()) == 3
    # the replayed layers describe their new sizes, so the next reconfiguration can walk them
    sizes = {n: (m.in_channels, m.out_channels) for n, m in model.named_modules()
             if isinstance(m, nn.Conv2d)}  # fmt: skip
    assert sizes == {n: (m.in_channels, m.out_channels) for n, m in fresh.named_modules()
                     if isinstance(m, nn.Conv2d)}  # fmt: skip
    assert fresh.fc.in_features == model.fc.in_features
    build_graph(fresh)


def test_architecture_naming_a_missing_block_is_an_error() -> None:
    arch = {"removed": {"layer9.0": {"post_relu": True}}, "shapes": {}}
    with pytest.raises(ValueError, match="layer9.0"):
        apply_architecture(M.create("resnet20"), arch)


def test_shrink_to_channels_rebuilds_a_logged_stage() -> None:
    from impl.methods.prunetrain import channels_per_layer
    from impl.methods.prunetrain_reconfig import shrink_to_channels

    gen = torch.Generator().manual_seed(13)
    model = M.create("resnet32")
    zero_random(model, gen, fraction=0.45, dead_paths=0)
    reconfigure(model, None)
    logged = channels_per_layer(model)
    fresh = M.create("resnet32")
    shrink_to_channels(fresh, logged)
    assert channels_per_layer(fresh) == logged
    assert sum(p.numel() for p in fresh.parameters()) == sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError, match="requested"):
        shrink_to_channels(M.create("resnet20"), {"conv1": 17})
    with pytest.raises(ValueError, match="0 channels requested"):
        shrink_to_channels(M.create("resnet20"), {"conv1": 0})
    one = M.create("resnet20")
    shrink_to_channels(one, {"conv1": 1})  # one channel is a valid size
    assert channels_per_layer(one)["conv1"] == 1


def test_groups_below_the_threshold_that_union_keeps_are_zeroed():
    """Sec. 4.1 "zero out these weights": a sub-threshold output row of a conv whose channel
    the next conv still reads, and a sub-threshold input column of a channel the writer still
    fills, are kept by channel union but set to zero, with their momentum; a group just above
    the threshold is untouched."""
    torch.manual_seed(0)
    model = M.create("resnet20")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    conv1, conv2 = model.layer1[0].conv1, model.layer1[0].conv2
    fc = model.fc
    with torch.no_grad():
        conv1.weight[3].uniform_(-5e-5, 5e-5)  # row 3 small; conv2 still reads channel 3
        conv2.weight[:, 5].uniform_(-5e-5, 5e-5)  # column 5 small; conv1 still writes 5
        conv1.weight[7].uniform_(-2e-4, 2e-4)
        conv1.weight[7, 0, 0, 0] = 2e-4  # just above: kept as it is
        fc.weight[:, 9].uniform_(-5e-5, 5e-5)  # a classifier input read by no one else
    above = conv1.weight[7].clone()
    rep = reconfigure(model, opt, threshold=1e-4)
    assert rep.spaces["layer1.0.conv1"] == (16, 16)  # nothing removed: union keeps both
    assert rep.zeroed_groups >= 3
    assert not conv1.weight[3].any() and not opt.state[conv1.weight]["momentum_buffer"][3].any()
    assert not conv2.weight[:, 5].any()
    assert not opt.state[conv2.weight]["momentum_buffer"][:, 5].any()
    assert not fc.weight[:, 9].any()
    assert torch.equal(conv1.weight[7], above)
    assert rep.to_dict()["zeroed_groups"] == rep.zeroed_groups


def test_the_channel_kept_to_stay_connected_is_not_zeroed():
    """A VGG layer whose every channel is below the threshold keeps its strongest one so the
    network stays connected; zeroing that channel's groups would make the output constant."""
    torch.manual_seed(0)
    model = M.create("vgg11")
    conv, reader = model.features[4], model.features[8]
    with torch.no_grad():
        conv.weight.uniform_(-5e-5, 5e-5)  # every group touching features.4's channels small
        reader.weight[:, :].uniform_(-5e-5, 5e-5)
        conv.weight[7].mul_(1.5)  # the strongest channel, still below the threshold
    rep = reconfigure(model, None, threshold=1e-4)
    assert rep.spaces["features.4"] == (128, 1)
    assert conv.weight.abs().max() > 0 and reader.weight.abs().max() > 0
    with torch.no_grad():  # train mode: BatchNorm's batch statistics carry a tiny signal
        a, b = model(torch.randn(2, 3, 32, 32)), model(torch.randn(2, 3, 32, 32))
    assert not torch.allclose(a, b)


def test_reconfiguring_under_a_linear_reading_several_positions_per_channel_keeps_the_output():
    # VGG with the ImageNet head reads each last channel at several positions (fan > 1): the
    # kept columns must be each kept channel's whole run of positions.
    torch.manual_seed(0)
    model = M.create("vgg11", num_classes=7, in_channels=1, stem="imagenet").eval()
    graph = build_graph(model)
    name = next(n for n, sp in graph.spaces.items() if any(f > 1 for _, f in sp.readers))
    space = graph.spaces[name]
    modules = dict(model.named_modules())
    drop = torch.arange(0, space.size, 3)
    with torch.no_grad():
        for writer in space.writers:
            modules[writer].weight[drop] = 0
            if modules[writer].bias is not None:
                modules[writer].bias[drop] = 0
        for reader, fan in space.readers:
            w = modules[reader].weight
            w.view(w.shape[0], -1, fan)[:, drop] = 0
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        want = model(x)
        reconfigure(model, None)
        got = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_layer_left_without_channels_keeps_its_strongest():
    torch.manual_seed(0)
    model = M.create("vgg11")
    conv, reader = model.features[4], model.features[8]
    with torch.no_grad():  # every group below the threshold; channel 7 the strongest
        conv.weight.uniform_(-5e-5, 5e-5)
        reader.weight.uniform_(-5e-5, 5e-5)
        conv.weight[7].mul_(1.5)
    report = reconfigure(model, None, threshold=1e-4)
    assert report.kept["features.4"] == [7]


def test_a_removed_path_without_a_relu_after_it_keeps_none_through_its_architecture():
    model = M.create("resnet9")
    graph = build_graph(model)
    path = next(p for p in graph.paths if p.kind == "residual")
    modules = dict(model.named_modules())
    with torch.no_grad():
        for conv in path.convs:
            modules[conv].weight.zero_()
    reconfigure(model, None, threshold=1e-4)
    fresh = M.create("resnet9")
    apply_architecture(fresh, architecture(model))
    block = fresh.get_submodule(path.block)
    assert isinstance(block, ShortcutOnly) and block.post_relu is False


def test_a_kept_channel_whose_linear_features_are_below_the_threshold_has_them_zeroed() -> None:
    """Channel union keeps channel 2 (its conv row is large); its four linear input features,
    all below the threshold, are set to zero, and no other feature is touched."""
    torch.manual_seed(0)
    model = pooled_model()
    fc = model[5]
    with torch.no_grad():
        model[0].weight.fill_(1.0)
        fc.weight.uniform_(0.5, 1.0)
        fc.weight[:, 8:12] = 5e-5
    before = fc.weight.detach().clone()
    rep = reconfigure(model, None, threshold=1e-4)
    assert rep.spaces["0"] == (4, 4) and rep.zeroed_groups == 1
    assert not fc.weight[:, 8:12].any()
    torch.testing.assert_close(fc.weight[:, :8], before[:, :8], rtol=0, atol=0)
    torch.testing.assert_close(fc.weight[:, 12:], before[:, 12:], rtol=0, atol=0)


@pytest.mark.parametrize("threshold", [-1e-4, float("nan")], ids=["negative", "nan"])
def test_reconfigure_refuses_a_threshold_that_is_not_a_magnitude(threshold: float) -> None:
    with pytest.raises(ValueError, match="threshold"):
        reconfigure(tiny_model(), None, threshold=threshold)


def test_reconfigure_slices_the_gradients_that_a_step_will_read() -> None:
    """Gradients computed before a reconfiguration follow their parameters: a step taken
    right after it (no new backward) uses each kept channel's own gradient."""
    torch.manual_seed(0)
    model = tiny_model()
    model(torch.randn(4, 3, 6, 6)).sum().backward()
    with torch.no_grad():
        model[0].weight[2] = 0
        model[3].weight[:, 2] = 0
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    rep = reconfigure(model, None)
    assert rep.kept["0"] == [0, 1, 3, 4]
    kept = torch.tensor(rep.kept["0"])
    got = dict(model.named_parameters())
    torch.testing.assert_close(got["0.weight"].grad, grads["0.weight"][kept])
    torch.testing.assert_close(got["1.bias"].grad, grads["1.bias"][kept])
    torch.testing.assert_close(got["3.weight"].grad, grads["3.weight"][:, kept])
    torch.testing.assert_close(got["8.weight"].grad, grads["8.weight"])


def test_a_conv_bias_is_sliced_with_its_output_channels() -> None:
    gen = torch.Generator().manual_seed(2)
    model = tiny_model()
    model[3] = nn.Conv2d(5, 7, 3, padding=1, bias=True)
    randomize_bn(model, gen)
    zero_channels(model, build_graph(model), "3", [1, 4], zero_norms=False)
    model.eval()
    x = torch.randn(2, 3, 6, 6, generator=gen)
    want, rep, got = outputs_around_reconfigure(model, x)
    assert rep.kept["3"] == [0, 2, 3, 5, 6] and model[3].bias.shape == (5,)
    torch.testing.assert_close(got, want)


def test_the_report_names_kept_indices_only_for_the_side_of_a_layer_that_changed() -> None:
    model = tiny_model()
    with torch.no_grad():
        model[0].weight[2] = 0
        model[3].weight[:, 2] = 0
    rep = reconfigure(model, None)
    assert (rep.layers["0"].kept_in, rep.layers["0"].kept_out) == (None, [0, 1, 3, 4])
    assert (rep.layers["3"].kept_in, rep.layers["3"].kept_out) == ([0, 1, 3, 4], None)
    assert (rep.layers["8"].kept_in, rep.layers["8"].kept_out) == (None, None)
    plain = rep.to_dict()
    assert "kept" not in plain and "kept_in" not in plain["layers"]["3"]
    full = rep.to_dict(indices=True)
    assert full["kept"]["0"] == [0, 1, 3, 4] and full["layers"]["3"]["kept_in"] == [0, 1, 3, 4]
    assert (plain["channels_before"], plain["channels_after"]) == (12, 11)


def test_a_second_reconfiguration_slices_the_constant_a_removed_path_left() -> None:
    """After layer removal, the stage's shared node loses channels at the next
    reconfiguration: the removed path's per-channel constant loses them too, the report
    names the removal, and the eval output is unchanged."""
    gen = torch.Generator().manual_seed(4)
    model = M.create("resnet20")
    randomize_bn(model, gen)
    graph = build_graph(model)
    path = graph.paths[1]
    zero_channels(model, graph, path.internal[0], torch.arange(16))
    model.eval()
    x = torch.randn(2, 3, 32, 32, generator=gen)
    with torch.no_grad():
        first = reconfigure(model, None)
    assert first.to_dict()["removed_paths"] == [path.block]
    bias = model.get_submodule(path.block).path_bias.clone()
    graph = build_graph(model)
    zero_channels(model, graph, path.output, [0, 5, 9])
    want, second, got = outputs_around_reconfigure(model, x)
    keep = [c for c in range(16) if c not in (0, 5, 9)]
    assert second.kept[path.output] == keep
    torch.testing.assert_close(model.get_submodule(path.block).path_bias, bias[keep])
    assert rel_err(got, want) < 1e-5


def test_shrink_to_channels_keeps_the_first_channels_of_each_space() -> None:
    torch.manual_seed(0)
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rep = shrink_to_channels(model, {"0": 3})
    assert rep.kept["0"] == [0, 1, 2] and rep.kept["3"] == list(range(7))
    assert torch.equal(model[0].weight, before["0.weight"][:3])
    assert torch.equal(model[3].weight, before["3.weight"][:, :3])


def test_replaying_a_models_own_architecture_changes_nothing() -> None:
    """The architecture of a reconfigured model, applied to that model again, keeps its
    removed paths' constants and every tensor."""
    gen = torch.Generator().manual_seed(6)
    model = M.create("resnet20")
    randomize_bn(model, gen)
    zero_random(model, gen, fraction=0.3, dead_paths=2)
    reconfigure(model, None)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert any(k.endswith("path_bias") and v.any() for k, v in before.items())
    apply_architecture(model, architecture(model))
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in after.items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0, msg=k)


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def test_reconfigure_slices_a_factored_optimizer_state_along_the_dims_it_spans() -> None:
    # Adafactor keeps, per conv weight [out, in, kh, kw], a row statistic [out, in, kh, 1] and
    # a column one [out, in, 1, kw]: both follow the kept channels, and training goes on
    # exactly as an optimizer over the smaller model holding the sliced state would
    gen = torch.Generator().manual_seed(3)
    model = tiny_model()
    x = torch.randn(4, 3, 6, 6, generator=gen)
    opt = torch.optim.Adafactor(model.parameters(), lr=1e-2)
    _step(model, opt, x)
    with torch.no_grad():
        model[0].weight[2] = 0.0
        model[3].weight[:, 2] = 0.0
    w3 = model[3].weight
    before = {k: v.clone() for k, v in opt.state[w3].items() if torch.is_tensor(v)}
    assert before["row_var"].shape == (7, 5, 3, 1) and before["col_var"].shape == (7, 5, 1, 3)
    rep = reconfigure(model, opt)
    assert rep.kept["0"] == [0, 1, 3, 4]
    kept = torch.tensor([0, 1, 3, 4])
    after = opt.state[w3]
    assert torch.equal(after["row_var"], before["row_var"][:, kept])
    assert torch.equal(after["col_var"], before["col_var"][:, kept])
    assert torch.equal(after["step"], before["step"])
    twin = copy.deepcopy(model)
    twin_opt = torch.optim.Adafactor(twin.parameters(), lr=1e-2)
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # a state of its own
    _step(model, opt, x)
    _step(twin, twin_opt, x)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


class _FlatStateSGD(torch.optim.SGD):
    """SGD that also keeps a flattened copy of each weight: a state no slicing can follow."""

    def step(self, closure=None):  # type: ignore[override]
        loss = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["flat"] = p.detach().flatten().clone()
        return loss


def test_reconfigure_refuses_an_optimizer_state_it_cannot_slice_before_changing_anything():
    model = tiny_model()
    opt = _FlatStateSGD(model.parameters(), lr=0.1)
    _step(model, opt, torch.randn(2, 3, 6, 6))
    with torch.no_grad():
        model[0].weight[2] = 0.0
        model[3].weight[:, 2] = 0.0
    shapes = [tuple(p.shape) for p in model.parameters()]
    with pytest.raises(ValueError, match=r"_FlatStateSGD state 'flat' of shape \(135,\)"):
        reconfigure(model, opt)
    assert [tuple(p.shape) for p in model.parameters()] == shapes


def test_an_optimizer_state_of_a_parameter_outside_the_model_is_left_to_it():
    # only the model's parameters are sliced, so only their state has to follow them: an
    # optimizer that also steps a parameter of its own with a flattened state still works
    model = tiny_model()
    other = nn.Parameter(torch.randn(2, 3))
    opt = _FlatStateSGD([*model.parameters(), other], lr=0.1)
    _step(model, opt, torch.randn(2, 3, 6, 6))
    for p in model.parameters():
        del opt.state[p]["flat"]
    with torch.no_grad():
        model[0].weight[2] = 0.0
        model[3].weight[:, 2] = 0.0
    assert reconfigure(model, opt).kept["0"] == [0, 1, 3, 4]
    assert opt.state[other]["flat"].shape == (6,)
    with pytest.raises(ValueError, match=r"state 'flat' of shape \(6,\)"):
        check_optimizer_state(opt)  # over every parameter the optimizer holds


def test_a_shortcut_only_block_adds_its_own_copy_of_the_path_bias() -> None:
    """The block copies the constant it is given (a later change to that tensor changes
    nothing) and, without a ReLU after the addition, passes negative values through."""
    bias = torch.tensor([0.5, -1.0, 2.0])
    block = ShortcutOnly(None, bias, post_relu=False)
    bias.zero_()
    x = torch.zeros(1, 3, 2, 2)
    x[0, 0] = 1.0
    expected = torch.tensor([1.5, -1.0, 2.0]).view(1, 3, 1, 1).expand(1, 3, 2, 2)
    assert torch.equal(block(x), expected)


@pytest.mark.parametrize("kind", ["basic", "bottleneck"])
def test_path_forward_is_the_block_without_its_shortcut(kind: str) -> None:
    """A block without projection computes ``relu(path(x) + x)``: the path alone, with the
    ReLUs between its convolutions, gives the block's output once the input is added back."""
    torch.manual_seed(0)
    block = BasicBlock(16, 16) if kind == "basic" else Bottleneck(16, 4)
    randomize_bn(block, torch.Generator().manual_seed(1))
    block.eval()
    x = torch.randn(2, 16, 5, 5)
    with torch.no_grad():
        torch.testing.assert_close(F.relu(path_forward(block, kind, x) + x), block(x))
