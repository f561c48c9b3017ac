"""Channel dependency graph of a CNN, for channel pruning that keeps the network consistent.

A *channel space* is a set of feature-map channels that several layers must agree on: the
output channels of the convolutions that write it (dim 0 of their weight, and their bias),
the BatchNorms that normalise it, the input channels of the convolutions that read it (dim 1)
and the input features of a linear classifier that reads it after global pooling. Removing
channel ``c`` of a space removes index ``c`` from every one of those tensors at once.

Inside a residual path, conv_i's output and conv_{i+1}'s input are one space. At a residual
stage's shared node, every block output (last BN of the path), every projection shortcut
(downsample conv + BN), the stem, and every reader (each block's first conv, the next stage's
downsample conv, the classifier) share one space, because the residual additions tie their
channels index by index. This is PruneTrain's *channel union* (Lym et al., SC 2019, Sec. 4.2,
Fig. 5c): a node channel can only be removed when it is sparse in all of them.

How the graph is derived. It is read from the module tree, not traced: the top-level
children of the models of :mod:`impl.models` (ResNet, VGG, ResNet-9, or an ``nn.Sequential``)
run in registration order, and residual blocks are recognised by type (``BasicBlock``,
``Bottleneck``, ResNet-9's ``Residual``, and :class:`ShortcutOnly`, a block whose residual
path was removed). This keeps the model object, its module names and its state_dict keys,
which reconfiguration edits in place; an ``torch.fx`` trace would hand back a different
module (a ``GraphModule``) and could not express layer removal as a module swap. Any other
module type is refused with a ``ValueError`` naming it, so an unsupported model fails before
training starts rather than being mis-pruned. Every size is cross-checked while walking.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from impl.models.resnet import BasicBlock, Bottleneck
from impl.models.resnet9 import ConvBN, Residual

# Modules that do not change the channel dimension and hold nothing to slice.
_PASS = (nn.ReLU, nn.Identity, nn.MaxPool2d, nn.AvgPool2d, nn.Dropout)
_TOP_LEVEL = ("ResNet", "VGG", "ResNet9")


class ShortcutOnly(nn.Module):
    """A residual block whose residual path was removed by PruneTrain (layer removal).

    ``forward(x) = post(shortcut(x) + path_bias)``, where ``shortcut`` is the block's
    projection (``downsample``: conv + BN) or the identity, ``post`` is the ReLU that followed
    the residual addition (``post_relu``; torchvision blocks have one, ResNet-9's ``Residual``
    does not), and ``path_bias`` (a buffer, one value per output channel) is the constant the
    removed path still produced: a path with no channels left outputs the eval-mode value of
    its last BatchNorm (or the layers after the empty space) at zero input, the same at every
    position. Keeping it makes layer removal exact in eval mode for a path whose weights are
    zero (one of weights merely below the threshold still fed its BatchNorm's normalised,
    possibly large, output: :mod:`impl.methods.prunetrain_reconfig`).

    State-dict keys: ``path_bias`` and ``downsample.*`` (the same keys the block had for its
    shortcut), so a checkpoint of a reconfigured model loads into a model on which
    :func:`impl.methods.prunetrain_reconfig.apply_architecture` replayed the swap.
    """

    def __init__(
        self, downsample: nn.Module | None, path_bias: torch.Tensor, post_relu: bool
    ) -> None:
        super().__init__()
        self.downsample = downsample
        self.post_relu = post_relu
        self.register_buffer("path_bias", path_bias.detach().clone().reshape(-1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x if self.downsample is None else self.downsample(x)
        out = out + self.path_bias.view(1, -1, 1, 1).to(out.dtype)
        return F.relu(out) if self.post_relu else out

    def extra_repr(self) -> str:
        return f"channels={self.path_bias.numel()}, post_relu={self.post_relu}"


@dataclass
class Space:
    """One channel space.

    Args:
        name: qualified name of the conv that created it (stable across reconfigurations).
        size: number of channels.
        writers: convs whose output channels (weight dim 0, bias) are this space.
        norms: BatchNorm2d layers over this space.
        readers: ``(name, fan)``: convs (fan 1) reading it as input channels, or linears whose
            input features are ``fan`` consecutive features per channel (flatten after pooling).
        vectors: 1-D buffers indexed by this space (``ShortcutOnly.path_bias``), as
            ``"module.buffer"`` names.
        path: the residual block whose path this space is internal to, or ``None``.
    """

    name: str
    size: int
    writers: list[str] = field(default_factory=list)
    norms: list[str] = field(default_factory=list)
    readers: list[tuple[str, int]] = field(default_factory=list)
    vectors: list[str] = field(default_factory=list)
    path: str | None = None


@dataclass
class ResidualPath:
    """The residual path of one block.

    Args:
        block: qualified name of the block module.
        kind: ``"basic"``, ``"bottleneck"`` or ``"residual"`` (ResNet-9).
        internal: names of the spaces inside the path (between its convs).
        output: name of the space the path adds into (the stage's shared node).
        convs: qualified names of the path's convs, in order.
        post_relu: whether a ReLU follows the residual addition.
    """

    block: str
    kind: str
    internal: list[str]
    output: str
    convs: list[str]
    post_relu: bool


@dataclass
class ChannelGraph:
    """Spaces (by name, in forward order) and residual paths of a model."""

    spaces: dict[str, Space]
    paths: list[ResidualPath]
    first_conv: str


class _Builder:
    def __init__(self, model: nn.Module) -> None:
        self.modules = dict(model.named_modules())
        self.spaces: dict[str, Space] = {}
        self.paths: list[ResidualPath] = []
        self.first_conv: str | None = None
        self.fan: int | None = None  # features per channel after the last global pooling

    # -- primitives ------------------------------------------------------------------------
    def conv(self, name: str, m: nn.Module, cur: str | None, into: str | None = None) -> str:
        if type(m) is not nn.Conv2d:
            raise ValueError(f"unsupported layer type at {name!r}: {type(m).__name__}")
        if m.groups != 1:
            raise ValueError(f"grouped convolution at {name!r} (groups={m.groups}) unsupported")
        if cur is None:
            if self.first_conv is None:
                self.first_conv = name
        else:
            space = self.spaces[cur]
            if m.in_channels != space.size:
                raise ValueError(
                    f"{name!r} reads {m.in_channels} channels but space {cur!r} has {space.size}"
                )
            space.readers.append((name, 1))
        if into is None:
            into = name
            self.spaces[into] = Space(name, m.out_channels)
        elif self.spaces[into].size != m.out_channels:
            raise ValueError(
                f"{name!r} writes {m.out_channels} channels into space {into!r} "
                f"of {self.spaces[into].size}"
            )
        self.spaces[into].writers.append(name)
        self.fan = None
        return into

    def norm(self, name: str, m: nn.Module, cur: str | None) -> str:
        if type(m) is not nn.BatchNorm2d:
            raise ValueError(f"unsupported layer type at {name!r}: {type(m).__name__}")
        if cur is None or m.num_features != self.spaces[cur].size:
            raise ValueError(f"BatchNorm {name!r} does not match the channels before it")
        self.spaces[cur].norms.append(name)
        return cur

    def linear(self, name: str, m: nn.Linear, cur: str | None) -> None:
        if cur is None:  # a hidden layer of a multi-layer classifier: not pruned
            return None
        size = self.spaces[cur].size
        fan = self.fan if self.fan is not None else m.in_features // size
        if fan * size != m.in_features:
            raise ValueError(
                f"{name!r} has {m.in_features} input features, not a multiple of the "
                f"{size} channels of space {cur!r}"
            )
        self.spaces[cur].readers.append((name, fan))
        return None

    # -- walk ------------------------------------------------------------------------------
    def walk(self, name: str, m: nn.Module, cur: str | None) -> str | None:
        if isinstance(m, nn.Conv2d):
            return self.conv(name, m, cur)
        if isinstance(m, nn.BatchNorm2d):
            return self.norm(name, m, cur)
        if isinstance(m, _PASS):
            return cur
        if isinstance(m, nn.AdaptiveAvgPool2d | nn.AdaptiveMaxPool2d):
            size = m.output_size
            size = (size, size) if isinstance(size, int) else tuple(size)
            if any(s is None for s in size):
                raise ValueError(f"{name!r}: adaptive pooling with a free dimension unsupported")
            self.fan = math.prod(size)
            return cur
        if isinstance(m, nn.Flatten):
            return cur
        if type(m) is nn.Linear:
            return self.linear(name, m, cur)
        if type(m) is nn.Sequential or type(m) is ConvBN:
            for child_name, child in m.named_children():
                cur = self.walk(_join(name, child_name), child, cur)
            return cur
        if type(m) in (BasicBlock, Bottleneck):
            return self.block(name, m, cur)
        if type(m) is Residual:
            return self.residual9(name, m, cur)
        if type(m) is ShortcutOnly:
            return self.shortcut_only(name, m, cur)
        raise ValueError(f"unsupported layer type at {name!r}: {type(m).__name__}")

    def shortcut(self, name: str, ds: nn.Module | None, cur: str | None) -> str | None:
        if ds is None:
            return cur
        if not (
            type(ds) is nn.Sequential
            and len(ds) == 2
            and type(ds[0]) is nn.Conv2d
            and type(ds[1]) is nn.BatchNorm2d
        ):
            raise ValueError(f"unsupported shortcut at {name!r}: expected Sequential(Conv2d, BN)")
        out = self.conv(f"{name}.downsample.0", ds[0], cur)
        self.norm(f"{name}.downsample.1", ds[1], out)
        return out

    def block(self, name: str, m: nn.Module, cur: str | None) -> str | None:
        if cur is None:
            raise ValueError(f"block {name!r} reads the network input; unsupported")
        out = self.shortcut(name, m.downsample, cur)
        assert out is not None
        n = len(self.spaces)
        kind = "bottleneck" if isinstance(m, Bottleneck) else "basic"
        convs = ["conv1", "conv2", "conv3"] if kind == "bottleneck" else ["conv1", "conv2"]
        internal = []
        space = cur
        for i, conv in enumerate(convs):
            last = i == len(convs) - 1
            space = self.conv(f"{name}.{conv}", getattr(m, conv), space, out if last else None)
            self.norm(f"{name}.bn{i + 1}", getattr(m, f"bn{i + 1}"), space)
            if not last:
                self.spaces[space].path = name
                internal.append(space)
        assert len(self.spaces) == n + len(internal)
        self.paths.append(
            ResidualPath(name, kind, internal, out, [f"{name}.{c}" for c in convs], True)
        )
        return out

    def residual9(self, name: str, m: Residual, cur: str | None) -> str | None:
        if cur is None:
            raise ValueError(f"block {name!r} reads the network input; unsupported")
        a = self.conv(f"{name}.conv_bn1.conv", m.conv_bn1.conv, cur)
        self.norm(f"{name}.conv_bn1.bn", m.conv_bn1.bn, a)
        self.spaces[a].path = name
        self.conv(f"{name}.conv_bn2.conv", m.conv_bn2.conv, a, into=cur)
        self.norm(f"{name}.conv_bn2.bn", m.conv_bn2.bn, cur)
        convs = [f"{name}.conv_bn1.conv", f"{name}.conv_bn2.conv"]
        self.paths.append(ResidualPath(name, "residual", [a], cur, convs, False))
        return cur

    def shortcut_only(self, name: str, m: ShortcutOnly, cur: str | None) -> str | None:
        out = self.shortcut(name, m.downsample, cur)
        if out is None or m.path_bias.numel() != self.spaces[out].size:
            raise ValueError(f"{name!r}: path_bias does not match its output channels")
        self.spaces[out].vectors.append(f"{name}.path_bias")
        return out


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def build_graph(model: nn.Module) -> ChannelGraph:
    """Derive the channel spaces and residual paths of ``model`` (see the module docstring).

    Supported: the ResNets (BasicBlock and Bottleneck, both stems), VGG-BN (both heads) and
    ResNet-9 of :mod:`impl.models`, also after reconfiguration, and plain ``nn.Sequential``
    models built from the same layers.

    Raises:
        ValueError: a model class or layer type that is not supported (named), or sizes that
            do not agree.
    """
    if type(model).__name__ not in _TOP_LEVEL and type(model) is not nn.Sequential:
        raise ValueError(
            f"unsupported model class {type(model).__name__!r}; supported: "
            f"{', '.join(_TOP_LEVEL)} (impl.models) and nn.Sequential"
        )
    b = _Builder(model)
    cur: str | None = None
    for child_name, child in model.named_children():
        cur = b.walk(child_name, child, cur)
    if cur is not None:
        raise ValueError("the model does not end in a linear classifier")
    if b.first_conv is None:
        raise ValueError("the model has no convolution")
    return ChannelGraph(b.spaces, b.paths, b.first_conv)


@torch.no_grad()
def zero_channels(
    model: nn.Module,
    graph: ChannelGraph,
    space: str,
    index: torch.Tensor | list[int],
    zero_norms: bool = True,
) -> None:
    """Zero channels ``index`` of ``space`` in every layer that touches it, in place.

    What group lasso drives a channel to: the writer convs' output rows (and biases) and the
    reader convs' / linears' input columns become 0, and with ``zero_norms`` the BatchNorms'
    weight and bias of those channels too, so the channel's activation is exactly zero.
    :func:`impl.methods.prunetrain_reconfig.reconfigure` then removes them.
    """
    modules = dict(model.named_modules())
    s = graph.spaces[space]
    idx = torch.as_tensor(index, dtype=torch.long)
    for name in s.writers:
        m = modules[name]
        m.weight[idx.to(m.weight.device)] = 0
        if m.bias is not None:
            m.bias[idx.to(m.bias.device)] = 0
    if zero_norms:
        for name in s.norms:
            m = modules[name]
            m.weight[idx.to(m.weight.device)] = 0
            m.bias[idx.to(m.bias.device)] = 0
    for name, fan in s.readers:
        w = modules[name].weight
        i = idx.to(w.device)
        if w.dim() == 4:
            w[:, i] = 0
        else:
            w.view(w.shape[0], -1, fan)[:, i] = 0


def path_forward(block: nn.Module, kind: str, x: torch.Tensor) -> torch.Tensor:
    """The residual path of ``block`` alone (without shortcut, addition and final ReLU)."""
    if kind == "residual":
        return block.conv_bn2(block.conv_bn1(x))
    out = F.relu(block.bn1(block.conv1(x)))
    if kind == "bottleneck":
        out = F.relu(block.bn2(block.conv2(out)))
        return block.bn3(block.conv3(out))
    return block.bn2(block.conv2(out))


__all__ = [
    "ChannelGraph",
    "ResidualPath",
    "ShortcutOnly",
    "Space",
    "build_graph",
    "path_forward",
    "zero_channels",
]
