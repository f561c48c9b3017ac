"""Training and inference FLOPs per sample, per layer, nominal and executed.

``training_flops(model, input_shape, density)`` runs one forward pass of a batch of one sample
with hooks, and counts for every layer three kinds of work of one training step:

* forward: the layer's output;
* data gradient: the gradient with respect to the layer's input (back-propagated further);
* weight gradient: the gradient with respect to the layer's parameters.

Counting rules (per sample; one multiply-add = 2 FLOPs):

* ``nn.Conv2d`` (any stride, dilation, padding, groups) with weight ``[K, C/g, R, S]`` and output
  ``[K, P, Q]``: ``MACs = K*P*Q * (C/g)*R*S``. Forward ``2*MACs`` plus ``K*P*Q`` for the bias;
  data gradient ``2*MACs`` (the transposed convolution); weight gradient ``2*MACs`` plus
  ``K*P*Q`` for the bias gradient (a sum over positions).
* ``nn.Linear``: the same with ``MACs = in_features * out_features`` per output row.
* ``nn.BatchNorm2d`` over ``E = K*P*Q`` elements, in training mode: forward ``5*E`` (statistics:
  ``sum x`` and ``sum x*x``, 3 per element; normalise-and-affine folded to ``x*a + b``, 2),
  data gradient ``6*E`` (recompute ``x_hat``, 2; ``a*(dy - mean(dy) - x_hat*mean(dy*x_hat))``, 4;
  the two means are the sums of the weight gradient), weight gradient ``3*E``
  (``sum dy`` and ``sum dy*x_hat``). BatchNorm is never scaled by a density.
* Activations, pooling, residual additions, dropout and the loss are not counted: they are
  elementwise and memory-bound, below 1% of the FLOPs of these models, and the papers do not
  count them either. A residual addition is not a module, so it could not be hooked anyway.
* A layer whose input does not require a gradient has no data gradient: the first layer, which
  reads the network input, and any layer behind frozen layers only. A layer whose parameters
  are frozen has no weight gradient.
* A module with a 4-D ``weight`` that exposes ``executed_density()`` is counted as a
  convolution even when it is not an ``nn.Conv2d`` (a sparse convolution), and nothing inside
  a counted module is counted again.

Two counts of the same work:

* nominal: what the method saves if the hardware exploited all of its sparsity. For a conv or
  linear layer the multiply-add terms of forward, data gradient and weight gradient are scaled
  by ``density[name]`` (a :class:`LayerDensity`) when given, and otherwise all three by the
  fraction of nonzero weights of the layer; bias terms are never scaled.
* executed: what this implementation runs. Dense kernels execute all of it (density 1); a
  module that exposes ``executed_density() -> LayerDensity`` reports its own. A physically
  smaller layer (PruneTrain's reconfigured model) needs nothing: its shapes are smaller.

``paper_training_cost`` implements PruneTrain's analytic per-iteration cost (Lym et al., SC 2019,
as computed by the authors' cost script) for comparisons with that paper.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

# FLOPs per output element of BatchNorm2d in training mode (see the module docstring).
BN_FORWARD_FLOPS = 5
BN_DATA_GRAD_FLOPS = 6
BN_WEIGHT_GRAD_FLOPS = 3


@dataclass(frozen=True)
class LayerDensity:
    """Fractions of one layer's multiply-add work that are kept, each in [0, 1].

    Args:
        forward: fraction of the forward multiply-adds.
        data_grad: fraction of the data-gradient (input-gradient) multiply-adds.
        weight_grad: fraction of the weight-gradient multiply-adds.
    """

    forward: float = 1.0
    data_grad: float = 1.0
    weight_grad: float = 1.0

    def __post_init__(self) -> None:
        for key in ("forward", "data_grad", "weight_grad"):
            value = getattr(self, key)
            if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
                raise ValueError(f"LayerDensity.{key} must be in [0, 1], got {value!r}")

    @classmethod
    def uniform(cls, fraction: float) -> LayerDensity:
        """The same fraction for forward, data gradient and weight gradient."""
        return cls(fraction, fraction, fraction)


@dataclass(frozen=True)
class FlopCounts:
    """FLOPs of one training step (per sample): forward, data gradient, weight gradient."""

    forward: float = 0.0
    data_grad: float = 0.0
    weight_grad: float = 0.0

    @property
    def total(self) -> float:
        """Forward + data gradient + weight gradient FLOPs."""
        return self.forward + self.data_grad + self.weight_grad

    def __add__(self, other: FlopCounts) -> FlopCounts:
        return FlopCounts(
            self.forward + other.forward,
            self.data_grad + other.data_grad,
            self.weight_grad + other.weight_grad,
        )


@dataclass(frozen=True)
class LayerFlops:
    """One counted layer: shapes (per sample), multiply-adds, and its three FLOP counts.

    Args:
        name: qualified module name (``model.named_modules()``).
        type: class name of the module.
        kind: ``"conv"``, ``"linear"`` or ``"bn"``.
        in_shape: input shape of one sample (first call).
        out_shape: output shape of one sample (first call).
        weight_shape: shape of the weight (empty for a BatchNorm without affine parameters).
        calls: how many times the module ran in the forward pass (the counts sum them).
        macs: dense multiply-adds of the forward pass (0 for BatchNorm).
        density: nominal density applied to the multiply-add terms.
        executed_density: executed density applied to the multiply-add terms.
        dense: counts at density 1.
        nominal: counts at ``density``.
        executed: counts at ``executed_density``.
    """

    name: str
    type: str
    kind: str
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    calls: int
    macs: int
    density: LayerDensity
    executed_density: LayerDensity
    dense: FlopCounts
    nominal: FlopCounts
    executed: FlopCounts


@dataclass(frozen=True)
class FlopReport:
    """Per-sample training FLOPs of a model: per layer and in total, nominal and executed.

    ``forward``, ``data_grad``, ``weight_grad`` and ``total`` are the nominal totals;
    ``executed`` and ``dense`` hold the executed totals and the totals at density 1.
    """

    input_shape: tuple[int, ...]
    layers: tuple[LayerFlops, ...]
    nominal: FlopCounts = field(init=False)
    executed: FlopCounts = field(init=False)
    dense: FlopCounts = field(init=False)

    def __post_init__(self) -> None:
        for key in ("nominal", "executed", "dense"):
            total = sum((getattr(row, key) for row in self.layers), FlopCounts())
            object.__setattr__(self, key, total)

    @property
    def forward(self) -> float:
        """Nominal forward FLOPs per sample."""
        return self.nominal.forward

    @property
    def data_grad(self) -> float:
        """Nominal data-gradient FLOPs per sample."""
        return self.nominal.data_grad

    @property
    def weight_grad(self) -> float:
        """Nominal weight-gradient FLOPs per sample."""
        return self.nominal.weight_grad

    @property
    def total(self) -> float:
        """Nominal training FLOPs per sample (forward + data gradient + weight gradient)."""
        return self.nominal.total

    @property
    def inference_flops(self) -> float:
        """Nominal forward FLOPs per sample: the cost of inference with the trained model, as
        its training-mode forward counts it (BatchNorm at 5 FLOPs an element, its batch
        statistics included; an inference with running statistics does 2, or none once
        folded into the conv; BatchNorm is 6-9% of a pruned ResNet-20's count)."""
        return self.nominal.forward

    def to_rows(self) -> list[dict]:
        """One flat dict per layer (for ``pandas.DataFrame``); FLOPs per sample."""
        rows = []
        for layer in self.layers:
            row: dict = {
                "name": layer.name,
                "type": layer.type,
                "kind": layer.kind,
                "in_shape": layer.in_shape,
                "out_shape": layer.out_shape,
                "weight_shape": layer.weight_shape,
                "calls": layer.calls,
                "macs": layer.macs,
            }
            for prefix in ("density", "executed_density"):
                for key, value in asdict(getattr(layer, prefix)).items():
                    row[f"{prefix}_{key}"] = value
            for prefix in ("dense", "nominal", "executed"):
                counts = getattr(layer, prefix)
                for key in ("forward", "data_grad", "weight_grad", "total"):
                    row[f"{prefix}_{key}"] = getattr(counts, key)
            rows.append(row)
        return rows


def _kind(module: nn.Module) -> str | None:
    if isinstance(module, nn.Conv2d):
        return "conv"
    if isinstance(module, nn.Linear):
        return "linear"
    if isinstance(module, nn.BatchNorm2d):
        return "bn"
    weight = getattr(module, "weight", None)
    if callable(getattr(module, "executed_density", None)) and isinstance(weight, torch.Tensor):
        if weight.dim() == 4:
            return "conv"
        if weight.dim() == 2:
            return "linear"
    return None


def _nonzero_fraction(weight: torch.Tensor) -> float:
    if weight.device.type == "meta":  # no values: a model built on the meta device is dense
        return 1.0
    return float(torch.count_nonzero(weight.detach()).item()) / max(weight.numel(), 1)


def _check_input_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    if not isinstance(input_shape, Sequence):
        raise ValueError(
            f"input_shape must be a tuple of positive ints (one sample, e.g. (3, 32, 32)), got "
            f"{input_shape!r}"
        )
    shape = tuple(input_shape)
    if not shape or not all(isinstance(s, int) and s > 0 for s in shape):
        raise ValueError(f"input_shape must be a non-empty tuple of positive ints, got {shape!r}")
    return shape


def _scaled(dense_macs: float, density: LayerDensity, fwd_extra: float, wg_extra: float,
            dg_share: float, has_wg: bool) -> FlopCounts:  # fmt: skip
    """``dg_share``: the fraction of the layer's output elements (over its calls) whose
    call's input needs a gradient."""
    flops = 2.0 * dense_macs
    return FlopCounts(
        forward=flops * density.forward + fwd_extra,
        data_grad=flops * density.data_grad * dg_share,
        weight_grad=(flops * density.weight_grad if has_wg else 0.0) + wg_extra,
    )


def training_flops(
    model: nn.Module,
    input_shape: Sequence[int],
    density: Mapping[str, LayerDensity] | None = None,
) -> FlopReport:
    """Count the FLOPs of one training step of ``model`` per sample (see the module docstring).

    Runs one forward pass of a batch of one zero sample of shape ``(1, *input_shape)`` on the
    model's device, in eval mode (so BatchNorm statistics are not touched; every module's
    training flag is restored afterwards) and with autograd on (to see which inputs need a
    gradient). Multiply-add = 2 FLOPs (the convention of PruneTrain's authors' cost script,
    the papers' text does not state it).

    Args:
        model: the network.
        input_shape: shape of one sample, e.g. ``(3, 32, 32)``.
        density: nominal :class:`LayerDensity` per qualified module name (a method's
            ``cost(model)``); conv and linear layers without an entry use their fraction of
            nonzero weights for all three kinds of work (1 for weights on the meta device).

    Returns:
        A :class:`FlopReport` in FLOPs per sample.

    Raises:
        ValueError: a bad ``input_shape``, a ``density`` key that names no counted layer, or
            a convolution other than ``nn.Conv2d`` (1-D, 3-D, transposed), not counted.
    """
    shape = _check_input_shape(input_shape)
    density = dict(density or {})
    for name, value in density.items():
        if not isinstance(value, LayerDensity):
            raise ValueError(
                f"density of {name!r} must be a LayerDensity (LayerDensity.uniform(f) for one "
                f"fraction f), got {value!r}"
            )
    counted: dict[str, tuple[nn.Module, str]] = {}
    for name, module in model.named_modules():
        kind = _kind(module)
        if kind is None and isinstance(module, nn.modules.conv._ConvNd):
            raise ValueError(
                f"training_flops counts nn.Conv2d, nn.Linear and nn.BatchNorm2d layers; "
                f"{name or 'the model'} is an nn.{type(module).__name__}, whose work it would "
                "leave out"
            )
        if kind is None or any(name.startswith(f"{c}.") for c in counted if c):
            continue
        counted[name] = (module, kind)
        if name == "":  # the model itself is a layer: nothing inside it is counted again
            break
    unknown = sorted(set(density) - {n for n, (_, k) in counted.items() if k != "bn"})
    if unknown:
        valid = [n for n, (_, k) in counted.items() if k != "bn"]
        raise ValueError(
            f"density names no conv/linear layer: {unknown}; valid names: {', '.join(valid)}"
        )

    first_conv = next((m for m, kind in counted.values() if isinstance(m, nn.Conv2d)), None)
    if first_conv is not None and len(shape) == 4 and shape[1] == first_conv.in_channels:
        raise ValueError(
            f"input_shape {shape} looks like a batch (N, C, H, W): it is one sample, without "
            f"the batch dimension, e.g. {shape[1:]}"
        )
    records: dict[str, dict] = {}

    def hook(name: str):
        def record(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            x = args[0]
            rec = records.get(name)
            if rec is None:
                rec = records[name] = {
                    "in_shape": tuple(x.shape[1:]),
                    "out_shape": tuple(output.shape[1:]),
                    "elements": 0,
                    "dg_elements": 0,  # of calls whose input needs a gradient
                    "calls": 0,
                }
            rec["elements"] += output.numel()
            rec["dg_elements"] += output.numel() if x.requires_grad else 0
            rec["calls"] += 1

        return record

    handles = [m.register_forward_hook(hook(n)) for n, (m, _) in counted.items()]
    modes = {m: m.training for m in model.modules()}
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    try:
        model.eval()
        with torch.enable_grad():
            model(torch.zeros((1, *shape), device=device, dtype=dtype))
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes.items():
            m.training = mode

    layers = []
    for name, (module, kind) in counted.items():
        rec = records.get(name)
        if rec is None:  # defined but not used in the forward pass
            continue
        weight = getattr(module, "weight", None)
        bias = getattr(module, "bias", None)
        elements = rec["elements"]
        dg_share = rec["dg_elements"] / elements if elements else 0.0
        weight_shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else ()
        if kind == "bn":
            has_wg = isinstance(weight, torch.Tensor) and weight.requires_grad
            dense = FlopCounts(
                BN_FORWARD_FLOPS * elements,
                BN_DATA_GRAD_FLOPS * rec["dg_elements"],
                BN_WEIGHT_GRAD_FLOPS * elements if has_wg else 0.0,
            )
            one = LayerDensity()
            layers.append(LayerFlops(name, type(module).__name__, kind, rec["in_shape"],
                                     rec["out_shape"], weight_shape, rec["calls"], 0, one, one,
                                     dense, dense, dense))  # fmt: skip
            continue
        assert isinstance(weight, torch.Tensor)
        # Conv: MACs per output element = (C/g)*R*S; linear: in_features.
        macs = elements * math.prod(weight.shape[1:])
        has_wg = weight.requires_grad
        bias_flops = float(elements) if isinstance(bias, torch.Tensor) else 0.0
        bias_grad = bias_flops if isinstance(bias, torch.Tensor) and bias.requires_grad else 0.0
        nominal_d = density.get(name) or LayerDensity.uniform(_nonzero_fraction(weight))
        executed_fn = getattr(module, "executed_density", None)
        executed_d = executed_fn() if callable(executed_fn) else LayerDensity()
        if not isinstance(executed_d, LayerDensity):
            raise TypeError(f"{name}.executed_density() must return a LayerDensity")
        one = LayerDensity()
        layers.append(
            LayerFlops(
                name=name,
                type=type(module).__name__,
                kind=kind,
                in_shape=rec["in_shape"],
                out_shape=rec["out_shape"],
                weight_shape=weight_shape,
                calls=rec["calls"],
                macs=macs,
                density=nominal_d,
                executed_density=executed_d,
                dense=_scaled(macs, one, bias_flops, bias_grad, dg_share, has_wg),
                nominal=_scaled(macs, nominal_d, bias_flops, bias_grad, dg_share, has_wg),
                executed=_scaled(macs, executed_d, bias_flops, bias_grad, dg_share, has_wg),
            )
        )
    return FlopReport(shape, tuple(layers))


@dataclass(frozen=True)
class PaperCost:
    """PruneTrain's analytic cost of one training iteration (see :func:`paper_training_cost`).

    Args:
        batch: mini-batch size N.
        layers: one dict per conv / linear / BatchNorm layer with its shapes and costs.
        train_macs: multiply-adds of one training iteration (forward + data gradient + weight
            gradient of conv and linear layers, N samples).
        inference_macs: multiply-adds of the forward pass of one sample.
        bn_accesses: off-chip memory accesses of the BatchNorm layers in one iteration, in
            elements (the authors report them in bytes of 2-byte words).
    """

    batch: int
    layers: tuple[dict, ...]
    train_macs: float
    inference_macs: float
    bn_accesses: float

    @property
    def train_flops(self) -> float:
        """Training FLOPs of one iteration: 2 per multiply-add."""
        return 2.0 * self.train_macs

    @property
    def inference_flops(self) -> float:
        """Forward FLOPs of one sample: 2 per multiply-add."""
        return 2.0 * self.inference_macs


def paper_training_cost(model: nn.Module, input_shape: Sequence[int], batch: int) -> PaperCost:
    """PruneTrain's analytic training cost of one iteration of ``batch`` samples.

    Source: Lym et al., "PruneTrain", SC 2019 (Tab. 1, Figs. 2 and 8 report it; the text does
    not give the formula), as computed by the authors' cost script (``scripts/calc_cost.py``
    of their public code):

    * convolution with weight ``[K, C, R, S]``, input ``H x W``, output ``P x Q``, total
      padding ``pad``: ``N * (2 * CRS*K*PQ + (H + pad_h)(W + pad_w) * KRS*C)`` multiply-adds,
      i.e. forward ``CRS*K*PQ``, weight gradient ``CRS*K*PQ``, and the data gradient as a
      full convolution over the padded input extent. The first convolution's data gradient
      is included (the authors include it). ``pad`` is the padding of both sides
      (``2 * padding``): for 1x1 (0) and 3x3 (2) layers this equals the authors' constants;
      for the 7x7 ImageNet stem the authors used 3.
    * BatchNorm over ``K x P x Q``: ``8 * N * K*PQ`` memory accesses (3 reads/writes in the
      forward, 5 in the backward per element), counted for every ``nn.BatchNorm2d`` present.
    * fully connected ``K x C``: ``3 * N * K*C`` multiply-adds (forward, data and weight
      gradient).
    * inference: ``CRS*K*PQ`` (conv) and ``K*C`` (FC) multiply-adds per sample.

    Multiply-add = 2 FLOPs (the authors divide multiply-adds by 1e15 / 2 to report PFLOPs).
    Grouped convolutions use ``C`` = input channels per group.

    Args:
        model: the network (any device; one forward pass of one zero sample, in eval mode).
        input_shape: shape of one sample, e.g. ``(3, 32, 32)``.
        batch: the mini-batch size N (>= 1).

    Returns:
        A :class:`PaperCost`.
    """
    shape = _check_input_shape(input_shape)
    if not (isinstance(batch, int) and batch >= 1):
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    modules = {
        n: m
        for n, m in model.named_modules()
        if isinstance(m, nn.Conv2d | nn.Linear | nn.BatchNorm2d)
    }
    seen: list[tuple[str, nn.Module, tuple[int, ...], tuple[int, ...]]] = []

    def hook(name: str):
        def record(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            seen.append((name, module, tuple(args[0].shape[1:]), tuple(output.shape[1:])))

        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in modules.items()]
    modes = {m: m.training for m in model.modules()}
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros((1, *shape), device=device, dtype=dtype))
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes.items():
            m.training = mode

    n = batch
    rows = []
    train = inference = bn = 0.0
    for name, module, in_shape, out_shape in seen:
        row: dict = {"name": name, "type": type(module).__name__}
        if isinstance(module, nn.Conv2d):
            k, c, r, s = module.weight.shape
            _, h, w = in_shape
            _, p, q = out_shape
            pad_h, pad_w = _total_padding(module, h, w)
            inf = c * r * s * k * p * q
            tr = n * (2 * inf + (h + pad_h) * (w + pad_w) * k * r * s * c)
            row.update(K=k, C=c, R=r, S=s, H=h, W=w, P=p, Q=q, pad_h=pad_h, pad_w=pad_w)
            row.update(inference_macs=inf, train_macs=tr, bn_accesses=0)
        elif isinstance(module, nn.Linear):
            k, c = module.out_features, module.in_features
            rows_per_sample = math.prod(out_shape[:-1])
            inf = k * c * rows_per_sample
            tr = 3 * n * inf
            row.update(K=k, C=c, inference_macs=inf, train_macs=tr, bn_accesses=0)
        else:
            acc = 8 * n * math.prod(out_shape)
            row.update(K=out_shape[0], inference_macs=0, train_macs=0, bn_accesses=acc)
        train += row["train_macs"]
        inference += row["inference_macs"]
        bn += row["bn_accesses"]
        rows.append(row)
    return PaperCost(n, tuple(rows), train, inference, bn)


def _total_padding(conv: nn.Conv2d, h: int, w: int) -> tuple[int, int]:
    """Padding of both sides of a convolution, per spatial dimension."""
    if isinstance(conv.padding, str):  # "same" / "valid"
        if conv.padding == "valid":
            return 0, 0
        kh, kw = conv.kernel_size
        dh, dw = conv.dilation
        return dh * (kh - 1), dw * (kw - 1)
    ph, pw = conv.padding
    return 2 * ph, 2 * pw
