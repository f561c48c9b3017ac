"""PruneTrain's network reconfiguration: remove sparse channels and dead residual paths.

Lym et al., SC 2019, Sec. 4.2 ("Dynamic Network Reconfiguration", "Channel Union") and
Sec. 4.1 ("Layer Removal by Overlapping Regularization Groups").

Rule. In every channel space of :func:`impl.methods.channel_graph.build_graph`, channel ``c``
is removed when *every* weight of every group touching it is below the threshold in absolute
value: the output-channel rows of all writer convs and the input-channel columns of all reader
convs and linears. Equivalently each space keeps the union of the channels any of its layers
still uses ("we only prune the intersection of the sparsified channels", Sec. 4.2). The
authors' code compared signed values (``w < threshold``) and never wrote zeros back; here the
absolute value is compared and what is removed is physically gone.

Because a removed channel is read by no layer (its reader columns are all below the
threshold), removing it changes the function only by those sub-threshold weights: exactly
nothing when they are zero, whatever the BatchNorm of that channel holds. Not nothing when
they are small but not zero: a BatchNorm after them divides by its running standard
deviation, which is as small as their outputs, so a layer of weights just under the
threshold can still carry a signal of unit scale (at threshold 1e-2, the one the short
runs use, a ResNet-20 path of such weights did; the paper's 1e-4 with the authors'
thresholding by value has the same property).

Zeroing. A group below the threshold whose channel another layer still uses (channel union
keeps it) is not removed but set to zero, weights and momentum ("we use a small threshold of
10^-4 to zero out these weights", Sec. 4.1; Fig. 4's channels below it are "zeroed out"), so
every group the regulariser has driven under the threshold is exactly zero afterwards.

Layer removal. A residual path is removed whole when one of its internal spaces has no
channel left, or its last conv has no weight above the threshold: it then outputs one
constant per channel (its BatchNorm's eval-mode value at zero input), which
:class:`~impl.methods.channel_graph.ShortcutOnly` keeps as ``path_bias``. The block is
replaced by a ``ShortcutOnly`` at the same name, keeping its shortcut module. Evaluation is
unchanged by the removal where the path's weights were zero (otherwise it changes by what
the paragraph above says); a training-mode forward is not exactly: there the zero path gave
its BatchNorm's bias ``beta`` (batch statistics of a zero input), while ``path_bias`` is
``beta - gamma * running_mean / sqrt(running_var + eps)``. The step is small when the path's
running statistics are near zero, as for a path whose weights all fell below the threshold;
the paper (Sec. 4.1) does not say what a removed path leaves behind.

Everything happens in place: the model keeps its module objects (except replaced blocks), a
kept parameter keeps its ``nn.Parameter`` object (its ``.data`` is swapped for the smaller
tensor), and the optimizer keeps its param_groups (the parameters of removed paths are taken
out of them) with every per-parameter state tensor (momentum buffers) sliced like its
parameter, so a Trainer's optimizer and scheduler stay valid.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from impl.methods.channel_graph import (
    ChannelGraph,
    ShortcutOnly,
    Space,
    build_graph,
    path_forward,
    zero_channels,
)


@dataclass
class LayerChange:
    """One conv or linear layer: channels before and after, and the kept indices.

    Args:
        in_before: input channels (features, for a linear) before.
        in_after: after.
        out_before: output channels before.
        out_after: after.
        kept_in: kept input indices (into the layer as it was before), ``None`` if all kept.
        kept_out: kept output indices, ``None`` if all kept.
    """

    in_before: int
    in_after: int
    out_before: int
    out_after: int
    kept_in: list[int] | None = None
    kept_out: list[int] | None = None


@dataclass
class ReconfigReport:
    """What one reconfiguration removed.

    Args:
        threshold: the magnitude threshold used.
        layers: per conv / linear that still exists (qualified name): a :class:`LayerChange`.
        spaces: per channel space: ``(channels before, channels after)``.
        removed_paths: qualified names of the blocks whose residual path was removed.
        removed_layers: qualified names of the convs removed with those paths.
        params_before: parameter count before.
        params_after: parameter count after.
        kept: per surviving space: kept channel indices (into the space as it was before).
        zeroed_groups: groups below the threshold kept by channel union and set to zero
            (output rows of writers, input columns of readers).
    """

    threshold: float
    layers: dict[str, LayerChange] = field(default_factory=dict)
    spaces: dict[str, tuple[int, int]] = field(default_factory=dict)
    removed_paths: list[str] = field(default_factory=list)
    removed_layers: list[str] = field(default_factory=list)
    params_before: int = 0
    params_after: int = 0
    kept: dict[str, list[int]] = field(default_factory=dict)
    zeroed_groups: int = 0

    @property
    def channels_before(self) -> int:
        """Channels summed over all spaces before (internal spaces of removed paths included)."""
        return sum(b for b, _ in self.spaces.values())

    @property
    def channels_after(self) -> int:
        """Channels summed over all spaces after."""
        return sum(a for _, a in self.spaces.values())

    @property
    def changed(self) -> bool:
        """Whether anything was removed."""
        return bool(self.removed_paths) or self.channels_after < self.channels_before

    def to_dict(self, indices: bool = False) -> dict[str, Any]:
        """Plain data (JSON); kept indices (per layer and per space) only when ``indices``."""
        layers = {}
        for name, ch in self.layers.items():
            row = asdict(ch)
            if not indices:
                row.pop("kept_in")
                row.pop("kept_out")
            layers[name] = row
        out: dict[str, Any] = {
            "threshold": self.threshold,
            "params_before": self.params_before,
            "params_after": self.params_after,
            "channels_before": self.channels_before,
            "channels_after": self.channels_after,
            "removed_paths": list(self.removed_paths),
            "removed_layers": list(self.removed_layers),
            "zeroed_groups": self.zeroed_groups,
            "spaces": {k: list(v) for k, v in self.spaces.items()},
            "layers": layers,
        }
        if indices:
            out["kept"] = {k: list(v) for k, v in self.kept.items()}
        return out


# -- masks -----------------------------------------------------------------------------------
def _row_max(w: torch.Tensor) -> torch.Tensor:
    return w.detach().abs().flatten(1).amax(1)


def _col_max(w: torch.Tensor, fan: int) -> torch.Tensor:
    a = w.detach().abs()
    if a.dim() == 4:
        return a.amax(dim=(0, 2, 3))
    return a.reshape(a.shape[0], -1, fan).amax(dim=(0, 2))


def _space_strength(space: Space, modules: dict[str, nn.Module]) -> torch.Tensor:
    """Per channel: the largest |w| over every group that touches it."""
    strength = None
    for name in space.writers:
        s = _row_max(modules[name].weight)
        strength = s if strength is None else torch.maximum(strength, s)
    for name, fan in space.readers:
        s = _col_max(modules[name].weight, fan)
        strength = s if strength is None else torch.maximum(strength, s)
    if strength is None:  # a space nobody writes or reads cannot occur in a built graph
        raise ValueError(f"space {space.name!r} has no layer")
    return strength


def _keep_masks(graph: ChannelGraph, model: nn.Module, threshold: float) -> dict[str, torch.Tensor]:
    modules = dict(model.named_modules())
    return {
        name: _space_strength(space, modules) >= threshold for name, space in graph.spaces.items()
    }


def _dead_paths(
    graph: ChannelGraph, model: nn.Module, keep: dict[str, torch.Tensor], threshold: float
) -> list[tuple[str, list[str]]]:
    """Paths to remove, each with the convs to zero before taking its constant output."""
    modules = dict(model.named_modules())
    dead = []
    for path in graph.paths:
        zero: list[str] = []
        for name in path.internal:
            if not bool(keep[name].any()):
                space = graph.spaces[name]
                zero += space.writers + [n for n, _ in space.readers]
        last = modules[path.convs[-1]].weight
        if not bool((last.detach().abs() >= threshold).any()):
            zero.append(path.convs[-1])
        if zero:
            dead.append((path.block, sorted(set(zero))))
    return dead


# -- in-place slicing ------------------------------------------------------------------------
def check_optimizer_state(
    optimizer: torch.optim.Optimizer | None, params: Iterable[torch.Tensor] | None = None
) -> None:
    """Raise ``ValueError`` where a tensor of ``optimizer``'s state (of ``params`` only, when
    given: the parameters :func:`reconfigure` may slice) could not follow its parameter through
    :func:`reconfigure`: each must be a scalar (a step count) or have the parameter's dims,
    each of the parameter's size or 1 (a momentum buffer; a factored second moment such as
    Adafactor's row and column statistics, which span a dim of size 1). Such a tensor is
    sliced along the dims it spans; any other would keep its old size and fail the next
    ``step()``, after the model had changed."""
    if optimizer is None:
        return
    only = None if params is None else {id(p) for p in params}
    for param, state in optimizer.state.items():
        if not torch.is_tensor(param) or (only is not None and id(param) not in only):
            continue
        for key, value in state.items():
            if not torch.is_tensor(value) or value.dim() == 0:
                continue
            fits = value.dim() == param.dim() and all(
                v in (p, 1) for v, p in zip(value.shape, param.shape)
            )
            if not fits:
                raise ValueError(
                    f"{type(optimizer).__name__} state {key!r} of shape {tuple(value.shape)} "
                    f"for a parameter of shape {tuple(param.shape)} cannot be sliced with it; "
                    "reconfigure needs each state tensor to be a scalar or shaped like its "
                    "parameter, with dims of size 1 allowed"
                )


def _slice_tensor_param(
    owner: nn.Module,
    attr: str,
    dim: int,
    idx: torch.Tensor,
    optimizer: torch.optim.Optimizer | None,
) -> None:
    t = getattr(owner, attr)
    if t is None:
        return
    if isinstance(t, nn.Parameter):
        t.data = t.data.index_select(dim, idx.to(t.device)).contiguous()
        if t.grad is not None:
            t.grad = t.grad.index_select(dim, idx.to(t.device)).contiguous()
        if optimizer is not None and t in optimizer.state:
            state = optimizer.state[t]
            for key, value in list(state.items()):
                if torch.is_tensor(value) and value.dim() > 0 and value.shape[dim] > 1:
                    state[key] = value.index_select(dim, idx.to(value.device)).contiguous()
    else:  # a buffer
        setattr(owner, attr, t.index_select(dim, idx.to(t.device)).contiguous())


@torch.no_grad()
def _zero_small_groups(
    graph: ChannelGraph,
    model: nn.Module,
    threshold: float,
    optimizer: torch.optim.Optimizer | None,
    skip: Collection[str] = (),
) -> int:
    """Set to zero, with their momentum, the groups whose largest |w| is below ``threshold``
    (writer rows, reader columns) that reconfiguration kept; return how many. The spaces in
    ``skip`` keep their one channel as it is: it was kept, though below the threshold, so that
    the network stays connected, and zeroing would cut the network (a constant output): no
    weight of a layer that writes or reads such a space is zeroed (a layer reading only
    sub-threshold channels is itself all below the threshold)."""
    modules = dict(model.named_modules())
    count = 0

    def zero(w: torch.Tensor, where: torch.Tensor) -> None:
        w[where] = 0
        state = optimizer.state.get(w) if optimizer is not None else None
        for buf in (state or {}).values():
            if isinstance(buf, torch.Tensor) and buf.shape == w.shape:
                buf[where] = 0

    untouched = {
        name
        for s in skip
        if s in graph.spaces
        for name in [*graph.spaces[s].writers, *(r for r, _ in graph.spaces[s].readers)]
    }
    for space in graph.spaces.values():
        for name in space.writers:
            if name in untouched:
                continue
            w = modules[name].weight
            small = _row_max(w) < threshold
            if bool(small.any()):
                zero(w, small.to(w.device))
                count += int(small.sum())
        for name, fan in space.readers:
            if name in untouched:
                continue
            w = modules[name].weight
            small = _col_max(w, fan) < threshold
            if bool(small.any()):
                cols = small.repeat_interleave(fan) if w.dim() == 2 else small
                zero(w, (slice(None), cols.to(w.device)))
                count += int(small.sum())
    return count


def _expand(idx: torch.Tensor, fan: int) -> torch.Tensor:
    if fan == 1:
        return idx
    return (idx.unsqueeze(1) * fan + torch.arange(fan, device=idx.device)).reshape(-1)


def sync_attributes(module: nn.Module) -> None:
    """Set a conv's / BN's / linear's size attributes from its (possibly resized) tensors."""
    if isinstance(module, nn.Conv2d):
        module.out_channels = module.weight.shape[0]
        module.in_channels = module.weight.shape[1] * module.groups
    elif isinstance(module, nn.BatchNorm2d):
        ref = module.weight if module.weight is not None else module.running_mean
        module.num_features = ref.shape[0]
    elif isinstance(module, nn.Linear):
        module.out_features, module.in_features = module.weight.shape


def _remove_from_optimizer(optimizer: torch.optim.Optimizer | None, params: list) -> None:
    if optimizer is None:
        return
    gone = {id(p) for p in params}
    for group in optimizer.param_groups:
        group["params"][:] = [p for p in group["params"] if id(p) not in gone]
    for p in params:
        optimizer.state.pop(p, None)


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)  # nn.Sequential children are named "0", "1", ...


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def _remove_path(
    model: nn.Module, block_name: str, kind: str, post_relu: bool, zero: list[str], optimizer
) -> list[str]:
    block = model.get_submodule(block_name)
    modules = dict(model.named_modules())
    for name in zero:  # "zero what is removed" before taking the path's constant output
        modules[name].weight.zero_()
    first = modules[f"{block_name}.conv_bn1.conv" if kind == "residual" else f"{block_name}.conv1"]
    was_training = block.training
    block.eval()
    x = torch.zeros(1, first.in_channels, 1, 1, device=first.weight.device)
    x = x.to(first.weight.dtype)
    bias = path_forward(block, kind, x).reshape(-1)
    block.train(was_training)
    downsample = getattr(block, "downsample", None)
    kept = {id(p) for p in downsample.parameters()} if downsample is not None else set()
    removed = [p for p in block.parameters() if id(p) not in kept]
    _remove_from_optimizer(optimizer, removed)
    new = ShortcutOnly(downsample, bias, post_relu)
    new.train(was_training)
    _set_submodule(model, block_name, new)
    return [
        n
        for n, m in block.named_modules()
        if isinstance(m, nn.Conv2d) and not n.startswith("downsample")
    ]


@torch.no_grad()
def reconfigure(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    threshold: float = 1e-4,
) -> ReconfigReport:
    """Remove sparse channels and dead residual paths from ``model``, in place.

    Lym et al., SC 2019, Sec. 4.2: channels whose weights all have ``|w| < threshold`` in
    every layer that touches them are removed (channel union keeps a residual stage's shared
    node consistent), convs, BatchNorms (weight, bias, running mean and variance), linears and
    ``ShortcutOnly.path_bias`` are sliced, and a residual path left with no channel is
    removed whole (see the module docstring). ``optimizer`` (any ``torch.optim`` optimizer,
    or ``None``) is updated in place: removed parameters leave its param_groups and state,
    and every state tensor is sliced with its parameter along the dims it spans (a momentum
    buffer along all; a factored statistic, such as Adafactor's, not along its dims of size
    1). A state tensor of another shape is refused before anything changes
    (:func:`check_optimizer_state`).

    A space that would lose every channel and is not inside a residual path (a VGG layer, a
    stage's shared node) keeps its one strongest channel, so the network stays connected.

    Call it between steps, with no autograd graph of ``model`` alive: parameters are resized
    in place (``.data``), so a graph built before, if kept and backpropagated through (or a
    forward output computed with grad and held), expects the old shapes and fails there.

    Args:
        model: a model :func:`impl.methods.channel_graph.build_graph` supports.
        optimizer: the optimizer over ``model``'s parameters, or ``None``.
        threshold: magnitude below which a weight counts as zero (the paper's 1e-4), >= 0.

    Returns:
        A :class:`ReconfigReport` (channels per layer before and after, kept indices,
        removed paths and layers, parameter counts).
    """
    if not threshold >= 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    check_optimizer_state(optimizer, model.parameters())
    params_before = _count(model)
    graph = build_graph(model)
    keep = _keep_masks(graph, model, threshold)
    report = ReconfigReport(threshold=float(threshold), params_before=params_before)
    before_sizes = {n: s.size for n, s in graph.spaces.items()}
    modules = dict(model.named_modules())
    layer_sizes = {n: _io(m) for n, m in modules.items() if isinstance(m, nn.Conv2d | nn.Linear)}

    # 1. layer removal: paths left with no channels become ShortcutOnly blocks.
    paths = {p.block: p for p in graph.paths}
    for block_name, zero in _dead_paths(graph, model, keep, threshold):
        path = paths[block_name]
        convs = _remove_path(model, block_name, path.kind, path.post_relu, zero, optimizer)
        report.removed_paths.append(block_name)
        report.removed_layers += [f"{block_name}.{c}" for c in convs]
        for name in path.internal:
            report.spaces[name] = (before_sizes[name], 0)

    # 2. channel removal on the graph without the removed paths (their convs no longer read
    # or write the shared node, so the node may lose more channels).
    graph = build_graph(model)
    keep = _keep_masks(graph, model, threshold)
    modules = dict(model.named_modules())
    kept_idx: dict[str, torch.Tensor] = {}
    forced: set[str] = set()  # spaces kept at their one strongest channel, all below threshold
    for name, space in graph.spaces.items():
        mask = keep[name]
        if not bool(mask.any()):
            strength = _space_strength(space, modules)
            mask = torch.zeros_like(mask)
            mask[int(strength.argmax())] = True
            forced.add(name)
        idx = mask.nonzero().reshape(-1)
        kept_idx[name] = idx
        report.kept[name] = idx.tolist()
        report.spaces[name] = (space.size, int(idx.numel()))
        if idx.numel() == space.size:
            continue
        for w in space.writers:
            _slice_tensor_param(modules[w], "weight", 0, idx, optimizer)
            _slice_tensor_param(modules[w], "bias", 0, idx, optimizer)
        for bn in space.norms:
            m = modules[bn]
            for attr in ("weight", "bias"):
                _slice_tensor_param(m, attr, 0, idx, optimizer)
            for attr in ("running_mean", "running_var"):
                _slice_tensor_param(m, attr, 0, idx, None)
        for r, fan in space.readers:
            _slice_tensor_param(modules[r], "weight", 1, _expand(idx, fan), optimizer)
        for v in space.vectors:
            owner, _, attr = v.rpartition(".")
            _slice_tensor_param(modules[owner], attr, 0, idx, None)
    for m in modules.values():
        sync_attributes(m)
    # the graph of step 2 still holds: slicing changed sizes, not who writes or reads what
    report.zeroed_groups = _zero_small_groups(graph, model, threshold, optimizer, skip=forced)

    # 3. report per layer that still exists
    io_space: dict[str, dict[str, tuple[str, int]]] = {}
    for name, space in graph.spaces.items():
        for w in space.writers:
            io_space.setdefault(w, {})["out"] = (name, 1)
        for r, fan in space.readers:
            io_space.setdefault(r, {})["in"] = (name, fan)
    for name, m in modules.items():
        if not isinstance(m, nn.Conv2d | nn.Linear):
            continue
        (in_b, out_b) = layer_sizes[name]
        (in_a, out_a) = _io(m)
        kept_in = kept_out = None
        if "in" in io_space.get(name, {}) and in_a != in_b:
            s, fan = io_space[name]["in"]
            kept_in = _expand(kept_idx[s], fan).tolist()
        if "out" in io_space.get(name, {}) and out_a != out_b:
            kept_out = kept_idx[io_space[name]["out"][0]].tolist()
        report.layers[name] = LayerChange(in_b, in_a, out_b, out_a, kept_in, kept_out)
    report.params_after = _count(model)
    return report


def _io(m: nn.Module) -> tuple[int, int]:
    if isinstance(m, nn.Conv2d):
        return m.in_channels, m.out_channels
    return m.in_features, m.out_features


@torch.no_grad()
def shrink_to_channels(model: nn.Module, channels: dict[str, int]) -> ReconfigReport:
    """Shrink ``model`` in place so every conv has the output channels ``channels`` names.

    Rebuilds the shape of a logged stage (``channels`` as in the ``channels`` field of a
    PruneTrain metrics line) for timing or FLOPs studies: in every channel space, the first
    ``n`` channels are kept, ``n`` being the logged output channels of the space's first
    writer conv. Weights are not those of the run. Removed residual paths are not replayed
    (their convs are simply absent from ``channels`` and keep their size).

    Raises:
        ValueError: a size larger than the model's, or below 1.
    """
    graph = build_graph(model)
    for name, space in graph.spaces.items():
        target = channels.get(space.writers[0])
        if target is None or target == space.size:
            continue
        if not 1 <= target <= space.size:
            raise ValueError(f"space {name!r}: {target} channels requested, has {space.size}")
        drop = torch.arange(target, space.size)
        zero_channels(model, graph, name, drop)
    return reconfigure(model, None, threshold=0.0 + torch.finfo(torch.float32).tiny)


# -- architecture record for resume ----------------------------------------------------------
def architecture(model: nn.Module) -> dict[str, Any]:
    """The structure of a (reconfigured) model as plain data, for resume.

    ``{"removed": {block: {"post_relu": bool}}, "shapes": {tensor name: shape}}`` over every
    parameter and buffer; :func:`apply_architecture` replays it on a freshly built model.
    """
    removed = {
        n: {"post_relu": bool(m.post_relu)}
        for n, m in model.named_modules()
        if isinstance(m, ShortcutOnly)
    }
    shapes = {n: list(t.shape) for n, t in model.state_dict().items()}
    return {"removed": removed, "shapes": shapes}


@torch.no_grad()
def apply_architecture(model: nn.Module, arch: dict[str, Any]) -> None:
    """Shrink a freshly built ``model`` in place to the structure ``arch`` describes.

    Replaces the removed blocks by :class:`ShortcutOnly` (keeping their shortcut modules) and
    resizes every parameter and buffer to its recorded shape (values are zeros, to be
    overwritten by loading the checkpoint's state_dict). Parameters keep their objects.

    Raises:
        ValueError: ``arch`` names a block or tensor the model does not have.
    """
    for block_name, info in arch.get("removed", {}).items():
        try:
            block = model.get_submodule(block_name)
        except AttributeError as err:
            raise ValueError(f"architecture names a block {block_name!r} the model lacks") from err
        if isinstance(block, ShortcutOnly):
            continue
        downsample = getattr(block, "downsample", None)
        width = arch["shapes"].get(f"{block_name}.path_bias")
        if width is None:
            raise ValueError(f"architecture lacks the shape of {block_name}.path_bias")
        device = next(block.parameters()).device
        bias = torch.zeros(width, device=device)
        new = ShortcutOnly(downsample, bias, bool(info["post_relu"]))
        new.train(block.training)
        _set_submodule(model, block_name, new)
    shapes = arch.get("shapes", {})
    named = dict(model.named_parameters())
    named.update(dict(model.named_buffers()))
    unknown = sorted(set(shapes) - set(named))
    if unknown:
        raise ValueError(f"architecture names tensors the model lacks: {unknown[:5]}")
    for name, shape in shapes.items():
        t = named[name]
        if list(t.shape) == list(shape):
            continue
        owner_name, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_name) if owner_name else model
        new = torch.zeros(shape, dtype=t.dtype, device=t.device)
        if isinstance(t, nn.Parameter):
            t.data = new
        else:
            setattr(owner, attr, new)
    for m in model.modules():
        sync_attributes(m)


__all__ = [
    "LayerChange",
    "ReconfigReport",
    "apply_architecture",
    "architecture",
    "check_optimizer_state",
    "reconfigure",
    "shrink_to_channels",
    "sync_attributes",
]
