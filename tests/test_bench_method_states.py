"""Tests of bench.method_states: each method's post-pruning model and its Allreduce payload."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bench import method_states as ms
from impl.models import create


def _dense_bytes(model: nn.Module) -> int:
    return sum(p.numel() * 4 for p in model.parameters())


def test_clicktrain_state_uses_pattern_convs_with_fixed_sparsity():
    state = ms.build_state("clicktrain", "resnet20")
    from impl.ops import PatternConv2d

    convs = {n: m for n, m in state.model.named_modules() if isinstance(m, PatternConv2d)}
    assert len(convs) == state.info["pattern_layers"] == 18  # 3x3 convs but the stem
    assert not any("downsample" in n for n in convs)
    for name, conv in convs.items():
        assert conv.nnz() == int(state.masks[f"{name}.weight"].sum())
        assert conv.density() == pytest.approx(1 - ms.CLICKTRAIN_SPARSITY, abs=0.02)
    payload = ms.allreduce_payload(state)
    dense = _dense_bytes(create("resnet20"))
    assert payload["dense_bytes"] == dense
    expected = dense - 4 * sum(c.weight.numel() - c.nnz() for c in convs.values())
    assert payload["payload_bytes"] == expected


def test_prunetrain_state_is_physically_smaller():
    state = ms.build_state("prunetrain", "resnet20")
    before, after = state.info["params_before"], state.info["params_after"]
    assert after == sum(p.numel() for p in state.model.parameters()) < before
    assert state.model.layer1[0].conv1.out_channels == 8  # half of 16 removed
    reg = state.regularizer(state.model)
    assert reg.requires_grad and float(reg.detach()) > 0
    from impl.methods.prunetrain import group_lasso

    want = ms.PRUNETRAIN_LASSO_COEFF * group_lasso(state.model)
    assert float(reg.detach()) == pytest.approx(float(want.detach()))
    out = state.model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    assert ms.allreduce_payload(state)["payload_bytes"] == 4 * after
    assert state.info["channel_prune_source"].startswith("chosen")  # not the paper's


def test_sdgp_state_converts_convs_and_sends_dense_gradients():
    state = ms.build_state("sdgp", "resnet20")
    assert state.info["sdgp_layers"] > 0 and state.info["nm"] == "2:4"
    assert all(d.data_grad == 0.5 and d.forward == 1.0 for d in state.cost.values())
    from impl.methods.sdgp import SDGPConv2d

    sdgp = {n for n, m in state.model.named_modules() if isinstance(m, SDGPConv2d)}
    assert set(state.cost) == sdgp and len(sdgp) == state.info["sdgp_layers"]
    # the rows say the data gradient runs dense after the pruning (no sparse hardware path)
    assert state.info["backend"].startswith("reference: N:M pruning, then a dense")
    assert all(type(m) is SDGPConv2d for n, m in state.model.named_modules() if n in sdgp)
    payload = ms.allreduce_payload(state)
    assert payload["payload_bytes"] == payload["dense_bytes"] == _dense_bytes(create("resnet20"))


def test_campfire_state_masks_gradients_and_weights():
    state = ms.build_state("campfire", "resnet20")
    assert state.info["conv_sparsity"] == pytest.approx(ms.CAMPFIRE_SPARSITY, abs=0.02)
    model = state.model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    state.after_backward(opt)
    conv = model.layer1[0].conv1
    pruned = conv.weight.detach() == 0
    assert pruned.any() and (conv.weight.grad[pruned] == 0).all()
    opt.step()
    state.after_step(opt)
    assert (conv.weight.detach()[pruned] == 0).all()
    assert ms.allreduce_payload(state)["payload_fraction"] < 0.5


def test_prunable_spaces_of_vgg_skip_the_last_conv():
    spaces = ms.prunable_spaces(create("vgg11"))
    assert len(spaces) == 7  # 8 convs: a space between each consecutive pair


def test_unknown_method_raises():
    with pytest.raises(ValueError, match="valid: dense, clicktrain"):
        ms.build_state("lottery", "resnet20")


def test_method_settings_are_the_papers_and_authors_values():
    # ClickTrain: 65% of kernels pruned, 4 of 9 positions kept; PruneTrain's stored lasso
    # coefficient; SDGP 2:4 rescaled; Campfire 70%
    assert ms.CLICKTRAIN_KERNEL_PRUNE == 0.65
    assert ms.CLICKTRAIN_SPARSITY == pytest.approx(1 - 0.35 * 4 / 9)
    assert ms.PRUNETRAIN_LASSO_COEFF == 3.79e-4 and ms.PRUNETRAIN_CHANNEL_PRUNE == 0.5
    assert (ms.SDGP_N, ms.SDGP_M, ms.SDGP_METHOD) == (2, 4, "rescaled")
    assert ms.CAMPFIRE_SPARSITY == 0.7
    assert ms.build_state("sdgp", "resnet20").info["prune"] == "rescaled"


def test_bottleneck_and_vgg_layers_each_method_prunes():
    bottleneck = create("prunetrain_resnet50")
    layers = ms.clicktrain_layers(bottleneck)
    assert len(layers) == 24 and all(name.endswith(".conv2") for name in layers)
    assert len(ms.prunable_spaces(bottleneck)) == 48  # conv1->conv2 and conv2->conv3
    assert all(isinstance(norm, nn.BatchNorm2d) for _, norm, _ in ms.prunable_spaces(
        create("vgg11")))  # fmt: skip
    state = ms.build_state("prunetrain", "prunetrain_resnet50")
    assert state.model.layer1[0].conv2.out_channels == 8
    assert ms.build_state("prunetrain", "vgg11").model.features[0].out_channels == 32
    before, after = state.info["channels_before"], state.info["channels_after"]
    assert before > after
    with pytest.raises(ms.Unavailable):
        ms.build_state("prunetrain", "resnet9")


def test_clicktrain_masks_differ_between_layers():
    masks = ms.build_state("clicktrain", "resnet20").masks
    assert not torch.equal(masks["layer1.0.conv1.weight"], masks["layer1.0.conv2.weight"])


def test_allreduce_payload_fraction_against_a_dense_model_and_frozen_weights():
    state = ms.build_state("prunetrain", "resnet20")
    dense = create("resnet20")
    payload = ms.allreduce_payload(state, dense_model=dense)
    assert payload["dense_bytes"] == _dense_bytes(dense)
    assert payload["payload_fraction"] == payload["payload_bytes"] / payload["dense_bytes"]
    total = sum(p.numel() for p in state.model.parameters())
    state.model.conv1.weight.requires_grad_(False)  # a frozen weight sends nothing
    assert ms.allreduce_payload(state)["params_sent"] == total - state.model.conv1.weight.numel()


def test_build_state_follows_its_seed_stem_classes_and_trains():
    a = ms.build_state("dense", "resnet18", seed=5, stem="imagenet", num_classes=100)
    b = ms.build_state("dense", "resnet18", seed=5, stem="imagenet", num_classes=100)
    assert torch.equal(a.model.conv1.weight, b.model.conv1.weight)
    assert a.model.conv1.kernel_size == (7, 7) and a.model.fc.out_features == 100
    assert a.model.training
