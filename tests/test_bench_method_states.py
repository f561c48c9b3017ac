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


def test_clicktrain_layers_keep_only_dense_3x3_convs_off_the_shortcut():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3)  # 3 inputs: stays dense
            self.four = nn.Conv2d(4, 8, 3)  # 4 inputs: pruned
            self.grouped = nn.Conv2d(8, 8, 3, groups=2)
            self.point = nn.Conv2d(8, 8, 1)
            self.downsample = nn.Sequential(nn.Conv2d(8, 8, 3))  # a shortcut
            self.downsampler = nn.Conv2d(8, 8, 3)  # only its name looks like one

    assert ms.clicktrain_layers(Net()) == ["four", "downsampler"]


def test_clicktrain_first_layer_mask_follows_the_seed():
    from bench.sparsity import pattern_mask

    for seed in (0, 3):
        state = ms.build_state("clicktrain", "resnet20", seed=seed)
        name = ms.clicktrain_layers(create("resnet20"))[0]
        mask = state.masks[f"{name}.weight"]
        assert torch.equal(mask, pattern_mask((16, 16, 3, 3), ms.CLICKTRAIN_SPARSITY, seed))
    assert state.info["layer_sparsity"] == 0.8444  # 1 - 0.35 * 4 / 9 = 0.84444...


def test_zero_channels_clears_writer_bias_norm_and_reader_inputs():
    torch.manual_seed(0)
    writer, norm, reader = nn.Conv2d(4, 6, 3), nn.BatchNorm2d(6), nn.Conv2d(6, 5, 3)
    with torch.no_grad():  # nonzero everywhere before
        norm.weight.uniform_(1.0, 2.0)
        norm.bias.uniform_(1.0, 2.0)
        writer.bias.uniform_(1.0, 2.0)
    ms._zero_channels(writer, norm, reader, torch.tensor([1, 4]))
    zero, kept = [1, 4], [0, 2, 3, 5]
    for t in (writer.weight, writer.bias, norm.weight, norm.bias):
        assert (t[zero] == 0).all() and (t[kept] != 0).all()
    assert (reader.weight[:, zero] == 0).all() and (reader.weight[:, kept] != 0).all()
    assert int((writer.weight == 0).sum()) == 2 * 4 * 9


def test_prunable_spaces_of_basic_blocks_pair_conv1_bn1_conv2():
    model = create("resnet20")
    spaces = ms.prunable_spaces(model)
    assert len(spaces) == 9  # 3 stages x 3 BasicBlocks
    first = model.layer1[0]
    assert spaces[0] == (first.conv1, first.bn1, first.conv2)


def test_prunetrain_removes_channels_chosen_at_random_per_seed():
    def kept(seed):
        dense = ms.build_state("dense", "resnet20", seed=seed).model.layer1[0].conv1.weight
        pruned = ms.build_state("prunetrain", "resnet20", seed=seed).model.layer1[0].conv1.weight
        rows = [i for i in range(16) if any(torch.equal(dense[i], w) for w in pruned)]
        assert len(rows) == 8
        return rows

    assert kept(0) != kept(1)


def test_campfire_state_masks_momentum_and_counts_its_masks():
    state = ms.build_state("campfire", "resnet20")
    assert state.info["masked_params"] == len(state.masks) > 0
    model = state.model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 32, 32)).sum().backward()  # gradients left unmasked
    opt.step()
    state.after_step(opt)
    weight = model.layer1[0].conv1.weight
    pruned = weight.detach() == 0
    assert pruned.any() and (opt.state[weight]["momentum_buffer"][pruned] == 0).all()


def test_build_state_seeds_the_models_initialisation():
    torch.manual_seed(6)
    want = create("resnet20").conv1.weight
    assert torch.equal(ms.build_state("dense", "resnet20", seed=6).model.conv1.weight, want)
    assert not torch.equal(ms.build_state("dense", "resnet20", seed=7).model.conv1.weight, want)


def test_allreduce_payload_counts_each_parameters_element_size_and_trainable_reference():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1)).double()  # 8 + 3 values
    state = ms.MethodState("dense", model)
    payload = ms.allreduce_payload(state)
    assert payload["payload_bytes"] == payload["dense_bytes"] == 11 * 8
    reference = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))  # float32
    reference[0].weight.requires_grad_(False)  # 6 values not all-reduced
    payload = ms.allreduce_payload(state, dense_model=reference)
    assert payload["dense_bytes"] == 5 * 4 and payload["payload_fraction"] == 88 / 20
    for p in model.parameters():
        p.requires_grad_(False)
    payload = ms.allreduce_payload(state)
    assert payload["payload_bytes"] == payload["dense_bytes"] == 0
    assert payload["payload_fraction"] != payload["payload_fraction"]  # NaN: nothing is sent


def test_a_missing_part_of_the_build_is_unavailable():
    with pytest.raises(ms.Unavailable, match="has no nothing_here"):
        ms._import("math", "sqrt", "nothing_here")
    with pytest.raises(ms.Unavailable, match="not available"):
        ms._import("impl.no_such_module", "x")


def test_conv_sparsity_counts_zero_conv_weights_only():
    model = nn.Sequential(nn.Conv2d(1, 1, 1, bias=False), nn.Linear(4, 4))
    with torch.no_grad():
        model[0].weight.zero_()
        model[1].weight.zero_()
    assert ms._conv_sparsity(model) == 1.0  # the one conv weight, zero
    assert ms._conv_sparsity(nn.Linear(2, 2)) == 0.0
