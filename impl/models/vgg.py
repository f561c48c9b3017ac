"""VGG-11/13/16 with BatchNorm (Simonyan & Zisserman 2015, Table 1, configurations A, B, D).

Module naming follows torchvision's ``vgg*_bn``: ``features`` (an ``nn.Sequential`` of
Conv2d, BatchNorm2d, ReLU and MaxPool2d), ``avgpool`` and ``classifier`` (an ``nn.Sequential``).
The convolutions keep their bias, as torchvision's do, so that an ImageNet-head model has
exactly torchvision's parameters (VGG-16-BN: 138,365,992).

VGG has no stem distinct from its body: the first layer is a 3x3 stride-1 convolution for
every input size. The ``stem`` argument therefore selects the head:

* ``"cifar"``: ``avgpool = AdaptiveAvgPool2d(1)`` and ``classifier = Sequential(Linear(512,
  num_classes))`` (the CIFAR VGG of PruneTrain and most CIFAR pruning work; at 32x32 input
  the features are already 1x1, so the pooling only makes other sizes work);
* ``"imagenet"``: torchvision's head, ``AdaptiveAvgPool2d(7)`` and
  ``Linear(25088, 4096) ReLU Dropout Linear(4096, 4096) ReLU Dropout Linear(4096, num_classes)``.
"""

from __future__ import annotations

import torch
from torch import nn

STEMS = ("cifar", "imagenet")

# Channels per convolution, "M" a 2x2 stride-2 max-pool.
CONFIGS: dict[str, list[int | str]] = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg13": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [
        64,
        64,
        "M",
        128,
        128,
        "M",
        256,
        256,
        256,
        "M",
        512,
        512,
        512,
        "M",
        512,
        512,
        512,
        "M",
    ],  # fmt: skip
}


def make_features(cfg: list[int | str], in_channels: int) -> nn.Sequential:
    """The convolutional body: ``Conv2d(3x3, bias) BatchNorm2d ReLU`` per number, max-pool per M."""
    layers: list[nn.Module] = []
    c = in_channels
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            assert isinstance(v, int)
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU()]
            c = v
    return nn.Sequential(*layers)


class VGG(nn.Module):
    """VGG with BatchNorm: ``features``, ``avgpool``, ``classifier`` (see the module docstring).

    Args:
        cfg: channels per convolution with ``"M"`` for a max-pool (see ``CONFIGS``).
        num_classes: classifier outputs.
        in_channels: input image channels.
        stem: ``"cifar"`` (global average pool + ``Linear(512, num_classes)``) or
            ``"imagenet"`` (torchvision's 3-layer classifier with dropout).
        dropout: dropout probability of the ImageNet head.
    """

    def __init__(
        self,
        cfg: list[int | str],
        num_classes: int = 10,
        in_channels: int = 3,
        stem: str = "cifar",
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        if stem not in STEMS:
            raise ValueError(f"unknown stem (head) {stem!r}; valid: {', '.join(STEMS)}")
        self.features = make_features(cfg, in_channels)
        width = [v for v in cfg if v != "M"][-1]
        assert isinstance(width, int)
        if stem == "imagenet":
            self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
            self.classifier = nn.Sequential(
                nn.Linear(width * 7 * 7, 4096),
                nn.ReLU(),
                nn.Dropout(p=dropout),
                nn.Linear(4096, 4096),
                nn.ReLU(),
                nn.Dropout(p=dropout),
                nn.Linear(4096, num_classes),
            )
        else:
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.classifier = nn.Sequential(nn.Linear(width, num_classes))
        for m in self.modules():
            if any(p.is_meta for p in m.parameters(recurse=False)):
                continue  # no values to set (and a meta normal_ costs 1.6 s of imports)
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(x)


def vgg(name: str, num_classes: int = 10, in_channels: int = 3, stem: str = "cifar") -> VGG:
    """VGG-11/13/16 with BatchNorm; ``stem`` selects the head (see the module docstring)."""
    if name not in CONFIGS:
        raise ValueError(f"unknown VGG {name!r}; valid: {', '.join(CONFIGS)}")
    return VGG(CONFIGS[name], num_classes, in_channels, stem)
