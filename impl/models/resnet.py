"""Residual networks with torchvision's module naming.

One :class:`ResNet` class builds both families used by the papers:

* the CIFAR ResNets of He et al. (2016, Sec. 4.2): ResNet-20/32/56, three stages of 16/32/64
  channels with ``n = (depth - 2) / 6`` basic blocks each. Where a block changes shape, its
  shortcut is a 1x1 projection (convolution + BatchNorm, "option B") rather than the paper's
  zero-padding identity ("option A"), so that every path holds plain ``nn.Conv2d`` layers that
  channel pruning can slice;
* the ImageNet ResNets (He et al. 2016, Table 1): ResNet-18/34 (basic blocks) and
  ResNet-50/101 (bottleneck blocks, stride on the 3x3 convolution as in torchvision's "v1.5";
  ``resnet50_v1`` puts it on the first 1x1, as He et al. and Campfire's Tables 4-5),
  with either the ImageNet stem (7x7 stride-2 convolution + 3x3 stride-2 max-pool) or a CIFAR
  stem (3x3 stride-1 convolution, no max-pool);
* PruneTrain's CIFAR "ResNet-50" (:func:`prunetrain_resnet50`): three stages of 8 bottleneck
  blocks at 16/32/64 base channels (64/128/256 out) on the CIFAR stem, the layout of the
  authors' CIFAR model, whose 230 MFLOPs per inference the paper quotes (Sec. 5.2).

Module names follow torchvision exactly (``conv1 bn1 relu maxpool layer1.. avgpool fc``; blocks
``conv1 bn1 conv2 bn2 [conv3 bn3] downsample``), so that a state_dict of an ImageNet-stem model
has the same keys and shapes as torchvision's. Differences that do not change parameters:
ReLUs are not in-place (hooks that keep activations stay valid), and the CIFAR stem's
``maxpool`` is an ``nn.Identity``.
"""

from __future__ import annotations

import torch
from torch import nn

STEMS = ("cifar", "imagenet")


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    """3x3 convolution with padding 1 and no bias (a BatchNorm follows)."""
    return nn.Conv2d(in_planes, out_planes, 3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    """1x1 convolution without bias (a BatchNorm follows)."""
    return nn.Conv2d(in_planes, out_planes, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a shortcut (He et al. 2016, Fig. 2 left).

    Children: ``conv1 bn1 relu conv2 bn2 downsample``; ``downsample`` is
    ``nn.Sequential(conv1x1, BatchNorm2d)`` where the block changes shape, else ``None``.
    """

    expansion = 1

    def __init__(
        self,
        inplanes: int,
        planes: int,
        stride: int = 1,
        downsample: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 - 3x3 - 1x1 bottleneck block (He et al. 2016, Fig. 5 right).

    The stride is on the 3x3 convolution ("v1.5", torchvision's), or on the first 1x1 when
    ``stride_in_1x1`` (the original "v1" of He et al., which Campfire's Tables 4-5 train).
    Children: ``conv1 bn1 conv2 bn2 conv3 bn3 relu downsample``; output channels are
    ``planes * 4``.
    """

    expansion = 4

    def __init__(
        self,
        inplanes: int,
        planes: int,
        stride: int = 1,
        downsample: nn.Module | None = None,
        stride_in_1x1: bool = False,
    ) -> None:
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes, stride if stride_in_1x1 else 1)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, 1 if stride_in_1x1 else stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU()
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """A residual network: stem, ``len(layers)`` stages, global average pool, linear classifier.

    Args:
        block: ``BasicBlock`` or ``Bottleneck``.
        layers: number of blocks per stage.
        widths: base channels per stage (the first stage has stride 1, the others stride 2).
        num_classes: classifier outputs.
        in_channels: input image channels.
        stem: ``"cifar"`` (3x3 stride-1 convolution to ``widths[0]`` channels, no max-pool) or
            ``"imagenet"`` (7x7 stride-2 convolution, 3x3 stride-2 max-pool).
        stride_in_1x1: bottleneck blocks put their stride on the first 1x1 convolution
            (ResNet v1) instead of the 3x3 (v1.5); ignored by basic blocks.
    """

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        layers: list[int],
        widths: list[int],
        num_classes: int = 10,
        in_channels: int = 3,
        stem: str = "cifar",
        stride_in_1x1: bool = False,
    ) -> None:
        super().__init__()
        self.stride_in_1x1 = stride_in_1x1 and block is Bottleneck
        if stem not in STEMS:
            raise ValueError(f"unknown stem {stem!r}; valid stems: {', '.join(STEMS)}")
        if len(layers) != len(widths):
            raise ValueError(f"layers {layers} and widths {widths} differ in length")
        self.inplanes = widths[0]
        if stem == "imagenet":
            self.conv1 = nn.Conv2d(in_channels, widths[0], 7, stride=2, padding=3, bias=False)
        else:
            self.conv1 = conv3x3(in_channels, widths[0])
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU()
        if stem == "imagenet":
            self.maxpool: nn.Module = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        else:
            self.maxpool = nn.Identity()
        self.num_stages = len(layers)
        for i, (blocks, width) in enumerate(zip(layers, widths, strict=True)):
            stage = self._make_layer(block, width, blocks, stride=1 if i == 0 else 2)
            self.add_module(f"layer{i + 1}", stage)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[-1] * block.expansion, num_classes)
        init_weights(self)

    def _make_layer(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        planes: int,
        blocks: int,
        stride: int,
    ) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        v1 = {"stride_in_1x1": True} if self.stride_in_1x1 else {}
        stage = [block(self.inplanes, planes, stride, downsample, **v1)]
        self.inplanes = planes * block.expansion
        stage += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*stage)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for i in range(self.num_stages):
            x = getattr(self, f"layer{i + 1}")(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def init_weights(model: nn.Module) -> None:
    """Kaiming-normal (fan_out, ReLU) convolutions, BatchNorm weight 1 and bias 0.

    He et al. (2015), "Delving deep into rectifiers", Eq. (10); linear layers keep torch's
    default initialisation (as torchvision's ResNet does). A model on the meta device holds
    no values and is left as it is (a meta ``normal_`` loads torch's decompositions: 1.6 s).
    """
    for m in model.modules():
        if any(p.is_meta for p in m.parameters(recurse=False)):
            continue
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d | nn.GroupNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def cifar_resnet(depth: int, num_classes: int = 10, in_channels: int = 3) -> ResNet:
    """CIFAR ResNet of He et al. (2016, Sec. 4.2): depth 6n+2, stages of 16/32/64 channels.

    Only the CIFAR stem exists for this family. Shortcuts that change shape are 1x1
    projections (convolution + BatchNorm).
    """
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(f"CIFAR ResNet depth must be 6n+2 with n >= 1, got {depth}")
    n = (depth - 2) // 6
    return ResNet(BasicBlock, [n, n, n], [16, 32, 64], num_classes, in_channels, "cifar")


IMAGENET_RESNETS: dict[str, tuple[type[BasicBlock] | type[Bottleneck], list[int]]] = {
    "resnet18": (BasicBlock, [2, 2, 2, 2]),
    "resnet34": (BasicBlock, [3, 4, 6, 3]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]),
    "resnet101": (Bottleneck, [3, 4, 23, 3]),
    "resnet50_v1": (Bottleneck, [3, 4, 6, 3]),
}


def imagenet_resnet(
    name: str, num_classes: int = 10, in_channels: int = 3, stem: str = "cifar"
) -> ResNet:
    """ResNet-18/34/50/101 (He et al. 2016, Table 1), stages of 64/128/256/512 base channels.

    ``stem="imagenet"`` reproduces torchvision's architecture (same parameter names and shapes);
    ``stem="cifar"`` replaces the 7x7 stride-2 convolution and max-pool by one 3x3 stride-1
    convolution, for 32x32 inputs. ``resnet50_v1`` is ResNet-50 with the original
    placement of a stage's stride, on the first 1x1 convolution of its first block (the
    others, like torchvision, put it on the 3x3: "v1.5"); same parameters, fewer FLOPs.
    """
    if name not in IMAGENET_RESNETS:
        raise ValueError(f"unknown ResNet {name!r}; valid: {', '.join(IMAGENET_RESNETS)}")
    block, layers = IMAGENET_RESNETS[name]
    return ResNet(
        block,
        layers,
        [64, 128, 256, 512],
        num_classes,
        in_channels,
        stem,
        stride_in_1x1=name.endswith("_v1"),
    )


# PruneTrain's CIFAR ResNet-50: blocks per stage and base channels (the authors' CIFAR model).
PRUNETRAIN_RESNET50_LAYERS = [8, 8, 8]
PRUNETRAIN_RESNET50_WIDTHS = [16, 32, 64]


def prunetrain_resnet50(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    """PruneTrain's CIFAR "ResNet-50": 3 stages of 8 bottleneck blocks, 16/32/64 base channels.

    Not the ImageNet ResNet-50 on a CIFAR stem (23.5M parameters, 2.6 GFLOPs per 32x32 image):
    the paper's dense CIFAR ResNet-50 costs "230 MFLOPs/inference" (Sec. 5.2, Fig. 8), which
    this layout, the authors' CIFAR model, gives (236 MFLOPs, forward, 2 FLOPs a multiply-add,
    BatchNorm included; 0.78M parameters). The first block of each stage has a 1x1 projection
    shortcut (stride 2 from the second stage on, on the 3x3 convolution as in "v1.5").
    """
    return ResNet(
        Bottleneck,
        PRUNETRAIN_RESNET50_LAYERS,
        PRUNETRAIN_RESNET50_WIDTHS,
        num_classes,
        in_channels,
        "cifar",
    )
