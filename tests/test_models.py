"""Model zoo: names, stems, parameter counts against torchvision's published figures, shapes."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from impl.models import MODELS, STEMS, create
from impl.models.resnet import BasicBlock, Bottleneck


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def build_meta(name: str, **kw) -> nn.Module:
    # Parameter counts need no memory nor initialisation: build on the meta device.
    with torch.device("meta"):
        return create(name, **kw)


# torchvision's figures for its ImageNet models (1000 classes), from its model documentation
# (resnet18 ... vgg16_bn "num_params").
TORCHVISION_PARAMS = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "vgg11": 132_868_840,
    "vgg13": 133_053_736,
    "vgg16": 138_365_992,
}


@pytest.mark.parametrize("name", list(TORCHVISION_PARAMS), ids=list(TORCHVISION_PARAMS))
def test_imagenet_param_counts_equal_torchvision(name: str) -> None:
    model = build_meta(name, num_classes=1000, stem="imagenet")
    assert n_params(model) == TORCHVISION_PARAMS[name]


def test_resnet20_param_count_by_hand() -> None:
    # CIFAR ResNet-20, 10 classes, 1x1 projection shortcuts (conv weights c_in*c_out*k*k, BN 2*c):
    #   stem   conv 3*16*9 = 432, bn 32                                            ->     464
    #   layer1 3 blocks x (2 * 16*16*9 + 2 * 32) = 3 * 4_672                       ->  14_016
    #   layer2 block0: 16*32*9 + 32*32*9 + 2*64 + proj 16*32 + 64 = 14_528
    #          blocks 1-2: 2 * (2 * 32*32*9 + 2*64) = 37_120                       ->  51_648
    #   layer3 block0: 32*64*9 + 64*64*9 + 2*128 + proj 32*64 + 128 = 57_728
    #          blocks 1-2: 2 * (2 * 64*64*9 + 2*128) = 147_968                     -> 205_696
    #   fc     64*10 + 10                                                          ->     650
    # total 272_474; the paper's 0.27M (He et al. 2016, Table 6) is option A (zero-padding
    # shortcuts), i.e. 272_474 - (512 + 64 + 2_048 + 128) = 269_722.
    model = create("resnet20")
    assert n_params(model) == 272_474
    projections = sum(
        n_params(m.downsample)
        for m in model.modules()
        if isinstance(m, BasicBlock) and m.downsample
    )
    assert n_params(model) - projections == 269_722


@pytest.mark.parametrize(
    ("name", "expected"),
    [("resnet32", 466_906), ("resnet56", 855_770), ("resnet9", 2_274_880)],
    ids=["resnet32", "resnet56", "resnet9"],
)
def test_cifar_param_counts(name: str, expected: int) -> None:
    # resnet32 (n=5) / resnet56 (n=9): the resnet20 count (n=3) plus 2 (resp. 6) identity
    # blocks per stage, each 2 * (c*c*9 + 2c) for c = 16, 32, 64: 4_672 + 18_560 + 73_984
    # = 97_216 per triple of blocks.
    per_triple = sum(2 * (c * c * 9 + 2 * c) for c in (16, 32, 64))
    if name == "resnet32":
        assert expected == 272_474 + 2 * per_triple
    elif name == "resnet56":
        assert expected == 272_474 + 6 * per_triple
    else:
        # ffcv's ResNet-9 (SDGP's CIFAR model): 3x3 convs 3*64, 2*128*128, 128*256,
        # 2*256*256, 256*128, one 5x5 conv 64*128, BNs 2c, classifier 128*10 without bias.
        convs = [(3, 64), (128, 128), (128, 128), (128, 256), (256, 256), (256, 256)]
        convs += [(256, 128)]
        five = 25 * 64 * 128 + 2 * 128
        assert expected == sum(9 * a * b + 2 * b for a, b in convs) + five + 128 * 10
    assert n_params(create(name)) == expected


@pytest.mark.parametrize("name", MODELS, ids=MODELS)
def test_forward_shape_cifar(name: str) -> None:
    model = create(name, num_classes=10).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize(
    ("name", "in_channels", "num_classes", "size"),
    [
        ("resnet20", 1, 7, 33),
        ("resnet9", 1, 100, 32),
        ("vgg11", 2, 3, 47),
        ("resnet18", 5, 13, 17),
        ("prunetrain_resnet50", 1, 7, 32),
    ],
    ids=[
        "resnet20-1ch-7cls-33px",
        "resnet9-1ch-100cls",
        "vgg11-2ch-3cls-47px",
        "resnet18-5ch-17px",
        "prunetrain-resnet50-1ch-7cls",
    ],
)
def test_forward_shape_odd_sizes(name: str, in_channels: int, num_classes: int, size: int) -> None:
    model = create(name, num_classes=num_classes, in_channels=in_channels).eval()
    with torch.no_grad():
        out = model(torch.randn(3, in_channels, size, size))
    assert out.shape == (3, num_classes)
    assert torch.isfinite(out).all()


IMAGENET_FORWARD = [
    ("resnet18", 224),
    ("resnet34", 64),
    ("resnet50", 64),
    ("resnet101", 64),
    ("vgg11", 64),
]


@pytest.mark.parametrize(
    ("name", "size"), IMAGENET_FORWARD, ids=[f"{n}-{s}px" for n, s in IMAGENET_FORWARD]
)
def test_forward_shape_imagenet(name: str, size: int) -> None:
    model = create(name, num_classes=1000, stem="imagenet").eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, size, size)).shape == (1, 1000)


@pytest.mark.parametrize("name", ["vgg13", "vgg16"], ids=["vgg13", "vgg16"])
def test_vgg_imagenet_head_shapes(name: str) -> None:
    # The 138M-parameter head is built on the meta device: shapes propagate without weights.
    model = build_meta(name, num_classes=1000, stem="imagenet")
    out = model(torch.empty(1, 3, 64, 64, device="meta"))
    assert out.shape == (1, 1000)
    assert [type(m) for m in model.classifier] == [
        nn.Linear, nn.ReLU, nn.Dropout, nn.Linear, nn.ReLU, nn.Dropout, nn.Linear,
    ]  # fmt: skip
    assert model.classifier[0].in_features == 512 * 7 * 7


def test_vgg_cifar_head() -> None:
    model = create("vgg16", num_classes=10)
    assert isinstance(model.features, nn.Sequential)
    assert len(model.classifier) == 1
    assert (model.classifier[0].in_features, model.classifier[0].out_features) == (512, 10)
    convs = [m for m in model.features if isinstance(m, nn.Conv2d)]
    assert len(convs) == 13


def test_resnet_naming_and_projection_shortcuts() -> None:
    r20 = create("resnet20")
    names = [n for n, _ in r20.named_children()]
    assert names == [
        "conv1",
        "bn1",
        "relu",
        "maxpool",
        "layer1",
        "layer2",
        "layer3",
        "avgpool",
        "fc",
    ]
    assert isinstance(r20.maxpool, nn.Identity)
    assert r20.conv1.kernel_size == (3, 3) and r20.conv1.stride == (1, 1)
    blocks = [m for m in r20.modules() if isinstance(m, BasicBlock)]
    assert len(blocks) == 9
    with_proj = [n for n, m in r20.named_modules() if isinstance(m, BasicBlock) and m.downsample]
    assert with_proj == ["layer2.0", "layer3.0"]
    assert r20.layer2[0].downsample[0].weight.shape == (32, 16, 1, 1)
    assert r20.layer3[0].downsample[0].stride == (2, 2)
    assert all(not m.bias for m in r20.modules() if isinstance(m, nn.Conv2d))

    r50 = build_meta("resnet50", stem="imagenet")
    assert isinstance(r50.layer1[0], Bottleneck)
    assert r50.layer1[0].downsample[0].weight.shape == (256, 64, 1, 1)
    assert r50.layer2[0].conv2.stride == (2, 2) and r50.layer2[0].conv1.stride == (1, 1)
    assert isinstance(r50.maxpool, nn.MaxPool2d)
    assert r50.conv1.weight.shape == (64, 3, 7, 7) and r50.conv1.stride == (2, 2)
    keys = set(r50.state_dict())
    assert {"layer4.2.bn3.running_var", "layer3.5.conv3.weight", "fc.bias"} <= keys


def test_resnet_cifar_stem_for_imagenet_resnets() -> None:
    model = build_meta("resnet18", stem="cifar", in_channels=1)
    assert model.conv1.weight.shape == (64, 1, 3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, nn.Identity)
    out = model(torch.empty(2, 1, 32, 32, device="meta"))
    assert out.shape == (2, 10)


def test_resnet9_scaled_classifier() -> None:
    model = create("resnet9").eval()
    assert model.fc.bias is None and model.fc.in_features == 128
    seen = {}
    model.fc.register_forward_hook(lambda m, i, o: seen.setdefault("fc", o))
    model.pool.register_forward_hook(lambda m, i, o: seen.update(pool_in=i[0].shape))
    with torch.no_grad():
        out = model(torch.randn(2, 3, 32, 32))
    torch.testing.assert_close(out, 0.2 * seen["fc"])
    # ffcv's layout: a 5x5 stride-2 conv then one max-pool (32 -> 16 -> 8), then the last
    # 3x3 conv without padding (8 -> 6) narrows to 128 channels.
    first = model.layer1[0].conv
    assert (first.kernel_size, first.stride, first.padding) == ((5, 5), (2, 2), (2, 2))
    assert seen["pool_in"] == (2, 128, 6, 6)
    assert isinstance(model.pool, nn.AdaptiveMaxPool2d)


@pytest.mark.parametrize(
    "name", ["resnet20", "vgg11", "resnet9"], ids=["resnet20", "vgg11", "resnet9"]
)
def test_init_kaiming_and_batchnorm(name: str) -> None:
    model = create(name)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.equal(m.weight, torch.ones_like(m.weight))
            assert torch.equal(m.bias, torch.zeros_like(m.bias))
    # Kaiming normal, fan_out, ReLU gain: std = sqrt(2 / (out_channels * k * k)).
    big = max(
        (m for m in model.modules() if isinstance(m, nn.Conv2d)), key=lambda m: m.weight.numel()
    )
    fan_out = big.weight.shape[0] * big.weight.shape[2] * big.weight.shape[3]
    assert big.weight.std().item() == pytest.approx((2 / fan_out) ** 0.5, rel=0.05)


def test_prunetrain_resnet50_is_the_papers_cifar_model() -> None:
    """PruneTrain's CIFAR ResNet-50: 3 stages of 8 bottlenecks at 16/32/64 base channels, whose
    dense cost the paper gives as 230 MFLOPs per inference (Sec. 5.2); the ImageNet layout on a
    CIFAR stem is 11x that."""
    from impl.flops import training_flops

    model = create("prunetrain_resnet50")
    stages = [model.layer1, model.layer2, model.layer3]
    assert not hasattr(model, "layer4")
    assert [len(s) for s in stages] == [8, 8, 8]
    assert all(isinstance(b, Bottleneck) for s in stages for b in s)
    assert [s[0].conv1.out_channels for s in stages] == [16, 32, 64]
    assert model.fc.in_features == 256
    assert [s[0].conv2.stride for s in stages] == [(1, 1), (2, 2), (2, 2)]
    mflops = training_flops(model, (3, 32, 32)).forward / 1e6
    assert mflops == pytest.approx(230, rel=0.03)
    imagenet_layout = training_flops(create("resnet50"), (3, 32, 32)).forward / 1e6
    assert imagenet_layout > 10 * mflops


def test_resnet50_v1_puts_a_stages_stride_on_its_first_1x1() -> None:
    """ResNet-50 v1 (He et al.; Campfire Tables 4-5) against v1.5 (torchvision's): the same
    parameters and output, the stride on conv1 instead of conv2, so fewer FLOPs."""
    from impl.flops import training_flops

    v1, v15 = create("resnet50_v1", stem="imagenet"), create("resnet50", stem="imagenet")
    assert n_params(v1) == n_params(v15)
    for stage in ("layer2", "layer3", "layer4"):
        b1, b15 = getattr(v1, stage)[0], getattr(v15, stage)[0]
        assert (b1.conv1.stride, b1.conv2.stride) == ((2, 2), (1, 1))
        assert (b15.conv1.stride, b15.conv2.stride) == ((1, 1), (2, 2))
        assert all(b.conv1.stride == (1, 1) for b in getattr(v1, stage)[1:])
    with torch.no_grad():
        assert v1.eval()(torch.randn(1, 3, 64, 64)).shape == (1, 10)
    f1 = training_flops(v1, (3, 224, 224)).forward
    f15 = training_flops(v15, (3, 224, 224)).forward
    assert f1 < 0.97 * f15


def test_models_and_stems_listed() -> None:
    assert set(MODELS) == {
        "resnet20", "resnet32", "resnet56", "resnet18", "resnet34", "resnet50", "resnet101",
        "vgg11", "vgg13", "vgg16", "resnet9", "prunetrain_resnet50", "resnet50_v1",
    }  # fmt: skip
    assert STEMS["resnet20"] == ("cifar",) and STEMS["resnet9"] == ("cifar",)
    assert STEMS["resnet50"] == ("cifar", "imagenet") and STEMS["vgg16"] == ("cifar", "imagenet")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "resnet19"}, "valid models: resnet20"),
        ({"name": "resnet20", "stem": "imagenet"}, "valid stems for it: cifar"),
        ({"name": "resnet9", "stem": "imagenet"}, "valid stems for it: cifar"),
        ({"name": "resnet18", "stem": "tiny"}, "cifar, imagenet"),
        ({"name": "vgg11", "num_classes": 0}, ">= 1"),
        ({"name": "resnet20", "in_channels": 0}, ">= 1"),
        ({"name": "prunetrain_resnet50", "stem": "imagenet"}, "valid stems for it: cifar"),
    ],
    ids=[
        "bad-name",
        "cifar-resnet-imagenet-stem",
        "resnet9-imagenet-stem",
        "bad-stem",
        "0-classes",
        "0-channels",
        "prunetrain-resnet50-imagenet-stem",
    ],
)
def test_bad_arguments_raise(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        create(**kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(TORCHVISION_PARAMS), ids=list(TORCHVISION_PARAMS))
def test_state_dict_matches_torchvision(name: str) -> None:
    # torchvision does not import on the CPU-only torch of the development machine; where it
    # does (the GPU machines), the ImageNet-stem models must have its exact keys and shapes.
    tv_models = pytest.importorskip("torchvision.models")
    tv_name = name if name.startswith("resnet") else f"{name}_bn"
    with torch.device("meta"):
        theirs = getattr(tv_models, tv_name)(weights=None, num_classes=1000)
    ours = build_meta(name, num_classes=1000, stem="imagenet")
    assert n_params(ours) == n_params(theirs)
    ours_sd = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    theirs_sd = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert ours_sd == theirs_sd


# torchvision's published GFLOPS of its models (multiply-adds, in billions, at 224x224; the
# "GFLOPS" column of torchvision's model table), which the ImageNet models here must meet.
TORCHVISION_GMACS = {"resnet18": 1.81, "resnet34": 3.66, "resnet50": 4.09, "resnet101": 7.80,
                     "vgg11": 7.61, "vgg13": 11.31, "vgg16": 15.47}  # fmt: skip


@pytest.mark.parametrize("name", list(TORCHVISION_GMACS), ids=list(TORCHVISION_GMACS))
def test_imagenet_multiply_adds_equal_torchvisions(name: str) -> None:
    from impl.flops import training_flops

    with torch.device("meta"):
        model = create(name, num_classes=1000, stem="imagenet")
    report = training_flops(model, (3, 224, 224))
    macs = sum(layer.macs for layer in report.layers if layer.kind != "bn")
    assert round(macs / 1e9, 2) == TORCHVISION_GMACS[name]


def _inputs_of(model: nn.Module, names: list[str], x: torch.Tensor) -> dict[str, torch.Tensor]:
    seen: dict[str, torch.Tensor] = {}
    modules = dict(model.named_modules())
    for name in names:
        modules[name].register_forward_pre_hook(lambda m, i, name=name: seen.update({name: i[0]}))
    with torch.no_grad():
        model.eval()(x)
    return seen


def test_imagenet_stem_halves_twice_before_the_first_stage() -> None:
    model = create("resnet18", num_classes=1000, stem="imagenet")
    seen = _inputs_of(model, ["bn1", "layer1"], torch.randn(1, 3, 224, 224))
    assert seen["bn1"].shape == (1, 64, 112, 112)  # the 7x7 stride-2 conv, padding 3
    assert seen["layer1"].shape == (1, 64, 56, 56)  # then the 3x3 stride-2 max pool
    assert seen["layer1"].min() >= 0  # after the stem's ReLU


def test_every_bottleneck_conv_takes_a_relu_output() -> None:
    torch.manual_seed(0)
    model = create("prunetrain_resnet50")
    names = [n for n, m in model.named_modules() if isinstance(m, Bottleneck)]
    convs = [f"{n}.{c}" for n in names for c in ("conv2", "conv3")]
    seen = _inputs_of(model, convs, torch.randn(2, 3, 32, 32))
    assert len(seen) == 2 * 24 and all(t.min() >= 0 for t in seen.values())


def test_resnet9s_second_residual_runs_after_its_pool() -> None:
    model = create("resnet9")
    seen = _inputs_of(model, ["layer2.2"], torch.randn(1, 3, 32, 32))
    assert seen["layer2.2"].shape == (1, 256, 8, 8)


@pytest.mark.parametrize("name", ["resnet20", "vgg11"])
def test_every_conv_is_kaiming_normal_over_its_fan_out(name: str) -> None:
    torch.manual_seed(0)
    for m in create(name).modules():
        if isinstance(m, nn.Conv2d) and m.weight.numel() >= 1000:
            out, _, kh, kw = m.weight.shape
            assert m.weight.std().item() == pytest.approx((2 / (out * kh * kw)) ** 0.5, rel=0.1)


def test_vgg_layers_heads_and_init() -> None:
    from impl.models.vgg import CONFIGS, VGG

    torch.manual_seed(0)
    model = create("vgg11")
    types_ = [type(m) for m in model.features[:4]]
    assert types_ == [nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d]
    assert sum(isinstance(m, nn.ReLU) for m in model.features) == 8
    assert model.features(torch.randn(1, 3, 32, 32)).shape == (1, 512, 1, 1)
    assert type(model.avgpool) is nn.AdaptiveAvgPool2d
    assert all(torch.equal(m.bias, torch.zeros_like(m.bias)) for m in model.features
               if isinstance(m, nn.Conv2d) and m.bias is not None)  # fmt: skip
    big = create("vgg11", num_classes=1000, stem="imagenet")
    assert type(big.avgpool) is nn.AdaptiveAvgPool2d and big.avgpool.output_size == (7, 7)
    assert [m.p for m in big.classifier if isinstance(m, nn.Dropout)] == [0.5, 0.5]
    assert big.classifier[0].weight.std().item() == pytest.approx(0.01, rel=0.1)
    with pytest.raises(ValueError, match="unknown stem"):
        VGG(CONFIGS["vgg11"], stem="tiny")


def test_a_cifar_resnet_depth_below_8_is_refused() -> None:
    from impl.models.resnet import cifar_resnet

    for depth in (2, 5):
        with pytest.raises(ValueError, match="6n\\+2 with n >= 1"):
            cifar_resnet(depth)


@pytest.mark.parametrize("name", ["resnet20", "resnet50", "vgg11", "resnet9"])
def test_a_model_built_on_the_meta_device_draws_no_initial_values(name, monkeypatch) -> None:
    """Meta tensors hold no values: the initialisation leaves them alone (a meta ``normal_``
    loads torch's decompositions, 1.6 s of every process that checks a model on meta), and a
    model built on the CPU still takes it."""
    drawn: list[torch.device] = []
    for fn in ("kaiming_normal_", "normal_"):
        real = getattr(nn.init, fn)

        def record(t, *a, _real=real, **kw):
            drawn.append(t.device)
            return _real(t, *a, **kw)

        monkeypatch.setattr(nn.init, fn, record)
    with torch.device("meta"):
        create(name)
    assert drawn == []
    create(name)
    assert drawn and all(d.type == "cpu" for d in drawn)


# -- forward computations against the papers' formulas ----------------------------------------


def _randomise_batchnorms(model: nn.Module) -> nn.Module:
    """Eval mode with BatchNorm statistics and affine values away from the identity, so that
    each BatchNorm changes what flows through it."""
    gen = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
            with torch.no_grad():
                m.weight.copy_(torch.rand(c, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(c, generator=gen) * 0.1)
    return model.eval()


def _bn(x: torch.Tensor, bn: nn.BatchNorm2d) -> torch.Tensor:
    return F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)


def _conv_bn(x, conv, bn, stride, padding):
    return _bn(F.conv2d(x, conv.weight, conv.bias, stride, padding), bn)


def _basic_block(b, x, stride):
    # He et al. (2016), Fig. 2 left: relu(BN(conv3x3(relu(BN(conv3x3(x))))) + shortcut)
    out = F.relu(_conv_bn(x, b.conv1, b.bn1, stride, 1))
    out = _conv_bn(out, b.conv2, b.bn2, 1, 1)
    shortcut = x if b.downsample is None else _conv_bn(x, *b.downsample, stride, 0)
    return F.relu(out + shortcut)


def _bottleneck(b, x, stride):
    # Fig. 5 right, stride on the 3x3 ("v1.5"): 1x1 -> 3x3 -> 1x1, ReLU after each but the last,
    # which comes after the sum with the shortcut.
    out = F.relu(_conv_bn(x, b.conv1, b.bn1, 1, 0))
    out = F.relu(_conv_bn(out, b.conv2, b.bn2, stride, 1))
    out = _conv_bn(out, b.conv3, b.bn3, 1, 0)
    shortcut = x if b.downsample is None else _conv_bn(x, *b.downsample, stride, 0)
    return F.relu(out + shortcut)


@pytest.mark.parametrize(
    ("name", "stem", "size"),
    [("resnet20", "cifar", 16), ("prunetrain_resnet50", "cifar", 16), ("resnet18", "imagenet", 40)],
)
def test_resnet_forward_is_the_papers_residual_computation(name, stem, size) -> None:
    torch.manual_seed(0)
    model = _randomise_batchnorms(create(name, num_classes=5, stem=stem))
    x = torch.randn(2, 3, size, size)
    if stem == "imagenet":  # 7x7 stride-2 conv, BN, ReLU, 3x3 stride-2 max-pool
        h = F.relu(_conv_bn(x, model.conv1, model.bn1, 2, 3))
        h = F.max_pool2d(h, 3, 2, 1)
    else:  # 3x3 stride-1 conv, BN, ReLU
        h = F.relu(_conv_bn(x, model.conv1, model.bn1, 1, 1))
    stages = [model.layer1, model.layer2, model.layer3] + (
        [model.layer4] if hasattr(model, "layer4") else []
    )
    for i, stage in enumerate(stages):
        for j, b in enumerate(stage):
            stride = 2 if i > 0 and j == 0 else 1
            h = (
                _basic_block(b, h, stride)
                if isinstance(b, BasicBlock)
                else _bottleneck(b, h, stride)
            )
    expected = F.linear(h.mean((2, 3)), model.fc.weight, model.fc.bias)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)


def test_resnet9_forward_is_ffcvs_computation() -> None:
    torch.manual_seed(0)
    model = _randomise_batchnorms(create("resnet9", num_classes=7))
    x = torch.randn(2, 3, 32, 32)

    def cbr(x, m, stride=1, padding=1):
        return F.relu(_conv_bn(x, m.conv, m.bn, stride, padding))

    def residual(x, r):
        return x + cbr(cbr(x, r.conv_bn1), r.conv_bn2)

    h = cbr(x, model.prep)
    h = residual(cbr(h, model.layer1[0], 2, 2), model.layer1[1])
    h = residual(F.max_pool2d(cbr(h, model.layer2[0]), 2), model.layer2[2])
    h = cbr(h, model.layer3[0], padding=0)
    expected = 0.2 * F.linear(h.amax((2, 3)), model.fc.weight)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["vgg11", "vgg16"])
def test_vgg_forward_is_conv_bn_relu_stacks_with_max_pools(name) -> None:
    from impl.models.vgg import CONFIGS

    torch.manual_seed(0)
    model = _randomise_batchnorms(create(name, num_classes=4))
    x = torch.randn(2, 3, 32, 32)
    h = x
    layers = iter(m for m in model.features if not isinstance(m, nn.ReLU | nn.MaxPool2d))
    for v in CONFIGS[name]:
        if v == "M":
            h = F.max_pool2d(h, 2, 2)
        else:
            conv, bn = next(layers), next(layers)
            assert conv.out_channels == v
            h = F.relu(_conv_bn(h, conv, bn, 1, 1))
    expected = F.linear(h.mean((2, 3)), model.classifier[0].weight, model.classifier[0].bias)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)


def test_vgg_linear_layers_start_at_small_normal_weights_and_zero_bias() -> None:
    torch.manual_seed(0)
    for stem in ("cifar", "imagenet"):
        model = create("vgg11", num_classes=1000, stem=stem)
        linears = [m for m in model.classifier if isinstance(m, nn.Linear)]
        assert len(linears) == (1 if stem == "cifar" else 3)
        for m in linears:
            assert torch.equal(m.bias, torch.zeros_like(m.bias))
            assert m.weight.std().item() == pytest.approx(0.01, rel=0.1)


def test_builders_refuse_unknown_names_stems_and_layouts() -> None:
    from impl.models.resnet import ResNet, imagenet_resnet
    from impl.models.vgg import vgg

    with pytest.raises(ValueError, match="unknown ResNet 'resnet152'; valid: resnet18"):
        imagenet_resnet("resnet152")
    with pytest.raises(ValueError, match="unknown VGG 'vgg19'; valid: vgg11"):
        vgg("vgg19")
    with pytest.raises(ValueError, match="unknown stem 'tiny'"):
        ResNet(BasicBlock, [1, 1], [16, 32], stem="tiny")
    with pytest.raises(ValueError, match="differ in length"):
        ResNet(BasicBlock, [1, 1, 1], [16, 32])


def test_cifar_resnet_depths_are_exactly_6n_plus_2() -> None:
    from impl.models.resnet import cifar_resnet

    for depth in (11, 17, 23, 21, 57):
        with pytest.raises(ValueError, match="6n\\+2"):
            cifar_resnet(depth)
    for depth, n in ((8, 1), (14, 2), (44, 7)):
        model = cifar_resnet(depth)
        assert [len(s) for s in (model.layer1, model.layer2, model.layer3)] == [n, n, n]


def test_basic_blocks_ignore_the_v1_stride_placement() -> None:
    """``stride_in_1x1`` concerns bottlenecks only: a basic-block ResNet built with it is the
    same network (BasicBlock has no 1x1 convolution to carry a stride)."""
    from impl.models.resnet import ResNet

    model = ResNet(BasicBlock, [1, 1], [16, 32], num_classes=10, stride_in_1x1=True)
    assert not model.stride_in_1x1
    # stem 3*16*9 + 32; block 2*16*16*9 + 64; block 16*32*9 + 32*32*9 + 128 + proj 16*32 + 64;
    # fc 32*10 + 10
    assert n_params(model) == (432 + 32) + (4_608 + 64) + (13_824 + 128 + 576) + 330
    assert model.layer2[0].conv1.stride == (2, 2)
    with torch.no_grad():
        assert model.eval()(torch.randn(1, 3, 8, 8)).shape == (1, 10)


def test_imagenet_resnet_builds_the_cifar_stem_by_default() -> None:
    from impl.models.resnet import imagenet_resnet

    with torch.device("meta"):
        model = imagenet_resnet("resnet18")
    assert model.conv1.weight.shape == (64, 3, 3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, nn.Identity) and model.fc.out_features == 10


@pytest.mark.parametrize(
    ("name", "stem"),
    [("resnet20", "cifar"), ("prunetrain_resnet50", "cifar"), ("resnet18", "imagenet"),
     ("vgg11", "cifar"), ("resnet9", "cifar")],
)  # fmt: skip
def test_a_hook_keeps_a_batchnorms_output_as_it_was_computed(name, stem) -> None:
    """The ReLUs are not in-place: an activation a forward hook keeps (a BatchNorm's output,
    with its negative values) is not overwritten by the ReLU that follows it."""
    torch.manual_seed(0)
    model = create(name, stem=stem).eval()
    kept = []
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.register_forward_hook(lambda m, i, o: kept.append((o, o.clone())))
    with torch.no_grad():
        model(torch.randn(2, 3, 40, 40))
    assert kept and all(torch.equal(o, copy) for o, copy in kept)
    assert all(copy.min() < 0 for _, copy in kept)


def test_init_weights_zeroes_conv_biases_and_resets_group_norms() -> None:
    """``init_weights`` on layers the model zoo's ResNets lack but a converted model may hold:
    a convolution's bias starts at 0, a GroupNorm at weight 1 and bias 0 as a BatchNorm does."""
    from impl.models.resnet import init_weights

    model = nn.Sequential(nn.Conv2d(4, 8, 3, bias=True), nn.GroupNorm(2, 8))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.5)
    init_weights(model)
    conv, gn = model
    assert torch.equal(conv.bias, torch.zeros(8))
    assert torch.equal(gn.weight, torch.ones(8)) and torch.equal(gn.bias, torch.zeros(8))
    assert conv.weight.std().item() > 0  # redrawn, no longer the constant 0.5


def test_a_vgg_heads_width_is_its_last_convolutions() -> None:
    """A VGG of another layout (the class takes any ``cfg``) heads its classifier with the
    channels of its last convolution: 32 here, 32 * 7 * 7 = 1568 for the ImageNet head."""
    from impl.models.vgg import VGG

    small = VGG([16, "M", 32, "M"], num_classes=3)
    assert (small.classifier[0].in_features, small.classifier[0].out_features) == (32, 3)
    with torch.no_grad():
        assert small.eval()(torch.randn(1, 3, 8, 8)).shape == (1, 3)
    with torch.device("meta"):
        big = VGG([16, "M", 32, "M"], num_classes=3, stem="imagenet")
    assert big.classifier[0].in_features == 1568
