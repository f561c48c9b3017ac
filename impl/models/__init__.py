"""Model zoo: ``create(name, num_classes, in_channels, stem)`` and the list ``MODELS``.

=========================  ==================  ===========================================
names                      stems accepted      family
=========================  ==================  ===========================================
resnet20 resnet32 resnet56 ``"cifar"``         CIFAR ResNets (16/32/64 channels, 1x1
                                               projection shortcuts), :mod:`.resnet`
resnet18 resnet34          ``"cifar"``,        ResNets with torchvision naming; the
resnet50 resnet101         ``"imagenet"``      ``"imagenet"`` stem is torchvision's model
resnet50_v1                                    (resnet50_v1: stride on the first 1x1)
vgg11 vgg13 vgg16          ``"cifar"``,        VGG with BatchNorm; the stem selects the
                           ``"imagenet"``      head (global pool + Linear, or torchvision's
                                               3-layer classifier), :mod:`.vgg`
resnet9                    ``"cifar"``         ffcv ResNet-9 (SDGP), :mod:`.resnet9`
prunetrain_resnet50        ``"cifar"``         PruneTrain's CIFAR ResNet-50 (3 stages of 8
                                               bottlenecks, 16/32/64), :mod:`.resnet`
=========================  ==================  ===========================================
"""

from __future__ import annotations

from torch import nn

from .resnet import (
    IMAGENET_RESNETS,
    BasicBlock,
    Bottleneck,
    ResNet,
    cifar_resnet,
    imagenet_resnet,
    prunetrain_resnet50,
)
from .resnet9 import ResNet9
from .vgg import CONFIGS as VGG_CONFIGS
from .vgg import VGG, vgg

CIFAR_RESNETS = {"resnet20": 20, "resnet32": 32, "resnet56": 56}

MODELS: tuple[str, ...] = (
    *CIFAR_RESNETS,
    *IMAGENET_RESNETS,
    *VGG_CONFIGS,
    "resnet9",
    "prunetrain_resnet50",
)

STEMS: dict[str, tuple[str, ...]] = {
    **{n: ("cifar",) for n in CIFAR_RESNETS},
    **{n: ("cifar", "imagenet") for n in IMAGENET_RESNETS},
    **{n: ("cifar", "imagenet") for n in VGG_CONFIGS},
    "resnet9": ("cifar",),
    "prunetrain_resnet50": ("cifar",),
}


def create(
    name: str, num_classes: int = 10, in_channels: int = 3, stem: str = "cifar"
) -> nn.Module:
    """Build model ``name`` with freshly initialised weights.

    Args:
        name: one of ``MODELS``.
        num_classes: classifier outputs (>= 1).
        in_channels: input image channels (>= 1).
        stem: ``"cifar"`` (32x32 inputs) or ``"imagenet"``; ``STEMS[name]`` lists what each
            model accepts (VGG: the stem selects the head).

    Raises:
        ValueError: unknown name, a stem the model does not have, or a non-positive size.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid models: {', '.join(MODELS)}")
    if stem not in STEMS[name]:
        raise ValueError(
            f"model {name!r} has no stem {stem!r}; valid stems for it: {', '.join(STEMS[name])}"
        )
    if num_classes < 1 or in_channels < 1:
        raise ValueError(
            f"num_classes and in_channels must be >= 1, got {num_classes} and {in_channels}"
        )
    if name in CIFAR_RESNETS:
        return cifar_resnet(CIFAR_RESNETS[name], num_classes, in_channels)
    if name in IMAGENET_RESNETS:
        return imagenet_resnet(name, num_classes, in_channels, stem)
    if name in VGG_CONFIGS:
        return vgg(name, num_classes, in_channels, stem)
    if name == "prunetrain_resnet50":
        return prunetrain_resnet50(num_classes, in_channels)
    return ResNet9(num_classes, in_channels)


__all__ = [
    "MODELS",
    "STEMS",
    "BasicBlock",
    "Bottleneck",
    "ResNet",
    "ResNet9",
    "VGG",
    "create",
]
