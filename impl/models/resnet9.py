"""ResNet-9 of ffcv's CIFAR-10 example, the model SDGP trains on CIFAR-10 (Sec. IV: "We use
the FFCV dataloader and training regime"; its Table I: dense 95.3%).

It descends from Page's DAWNBench ResNet-9 ("How to train your ResNet", 2018) but is not the
same network: the first down-sampling is a 5x5 stride-2 convolution instead of a max-pool,
the residual blocks sit at 128 and 256 channels (not 128 and 512), the last convolution
narrows to 128 channels without padding, and the logits are scaled by 0.2 (DAWNBench: 0.125).
2,274,880 parameters at 10 classes (DAWNBench's: 6,573,120).

Layout (``conv_bn`` is a convolution without bias, BatchNorm, ReLU; 3x3, stride 1, padding 1
unless stated)::

    prep    conv_bn(in, 64)
    layer1  conv_bn(64, 128, 5x5, stride 2, padding 2), residual(conv_bn(128, 128) x 2)
    layer2  conv_bn(128, 256), max-pool 2, residual(conv_bn(256, 256) x 2)
    layer3  conv_bn(256, 128, padding 0)
    pool    adaptive max-pool to 1x1, flatten
    fc      Linear(128, num_classes, bias=False), output multiplied by ``scale`` = 0.2

Only the CIFAR stem exists. Module names: ``prep``, ``layer1``..``layer3`` (``nn.Sequential``),
``ConvBN`` children ``conv bn relu``, ``Residual`` children ``conv_bn1 conv_bn2``, ``pool``, ``fc``.
"""

from __future__ import annotations

import torch
from torch import nn

from .resnet import init_weights


class ConvBN(nn.Module):
    """Convolution (no bias; 3x3, stride 1, padding 1 by default), BatchNorm2d, ReLU; children
    ``conv bn relu``."""

    def __init__(
        self, c_in: int, c_out: int, kernel_size: int = 3, stride: int = 1, padding: int = 1
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel_size, stride, padding, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class Residual(nn.Module):
    """``x + conv_bn2(conv_bn1(x))`` at constant width."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv_bn1 = ConvBN(channels, channels)
        self.conv_bn2 = ConvBN(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv_bn2(self.conv_bn1(x))


class ResNet9(nn.Module):
    """ResNet-9 (see the module docstring). Only the CIFAR stem exists.

    Args:
        num_classes: classifier outputs.
        in_channels: input image channels.
        scale: multiplier of the logits (0.2 in ffcv's model).
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 3, scale: float = 0.2) -> None:
        super().__init__()
        self.prep = ConvBN(in_channels, 64)
        self.layer1 = nn.Sequential(ConvBN(64, 128, 5, stride=2, padding=2), Residual(128))
        self.layer2 = nn.Sequential(ConvBN(128, 256), nn.MaxPool2d(2), Residual(256))
        self.layer3 = nn.Sequential(ConvBN(256, 128, padding=0))
        self.pool = nn.AdaptiveMaxPool2d((1, 1))
        self.fc = nn.Linear(128, num_classes, bias=False)
        self.scale = scale
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer3(self.layer2(self.layer1(self.prep(x))))
        x = torch.flatten(self.pool(x), 1)
        return self.fc(x) * self.scale
