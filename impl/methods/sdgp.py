"""SDGP: structured (N:M) pruning of output data gradients during training.

McDanel, Dinh and Magallanes, "Accelerating DNN Training with Structured Data Gradient
Pruning" (2022). Every convolution with more than 3 input channels computes its input (data)
gradient dL/dD from an N:M-pruned copy of its output gradient dL/dO (Sec. III-A, Algorithm 1,
Fig. 2), while its weight gradient dL/dW is computed from the dense dL/dO (Sec. III-A: "SDGP
creates a copy of dL/dO to store the pruned data gradient tensor").

The pruning itself, its three functions (random, magnitude, rescaled magnitude; Sec. III-B),
the two rescale rules and the rule for a partial last group, is the op
:func:`impl.ops.nm.nm_prune` (re-exported here with its reference and argument checks).

The scale of ``eps``: the authors trained with fp16 autocast and ``GradScaler`` (initial scale
2**16, growing), so their ``1e-4`` was added to loss-scaled gradient sums; on unscaled fp32
gradients it stands for about ``1e-4 / 2**16 ~ 1.5e-9``. Applied literally to unscaled fp32
gradients, ``1e-4`` is no longer negligible (per-plane sums of |dL/dO| are often ~1e-4 late in
training) and shrinks the data gradient instead of preserving its L1 norm (measured on digits
with ResNet-20: sum|pruned| / sum|dense| of 0.68 on average, 0.42 in the worst layer, against
0.999 with eps ~ 0). :func:`nm_prune` keeps the literal ``1e-4`` as its default; the ``SDGP``
method defaults to ``1e-4 / 2**16`` (``METHOD_RESCALE_EPS``), the authors' constant in
unscaled-gradient units, and records the value used and sum|pruned| / sum|dense| per epoch
(``sdgp_l1_ratio_*``). Under ``TrainConfig.fp16`` the Trainer scales the loss as the authors'
``GradScaler`` did, so the gradients SDGP prunes are loss-scaled and the literal ``1e-4`` is
the faithful constant (SDGP Table I's paper-scale rows pass it).

A conv whose output channels are not a multiple of ``m`` keeps ``min(n, r)`` of its last
``r`` channels (the op's partial-group rule); :func:`sdgp_convert` can instead leave such
layers dense (``nondivisible="dense"``) and lists them.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from impl.config import check_seed
from impl.data import derived_seed
from impl.methods.base import Method, MethodConfig, TrainContext
from impl.ops.nm import (
    IMPLS,
    MAX_GROUP,
    PRUNE_METHODS,
    RESCALE_EPS,
    RESCALE_RULES,
    _prune_cpu,
    check_eps,
    check_method,
    check_nm,
    check_options,
    check_prune_args,
    nm_keep_mask,
    nm_prune,
    nm_prune_ref,
)

NONDIVISIBLE_RULES: tuple[str, ...] = ("pad", "dense")
BACKENDS: tuple[str, ...] = ("reference", "semi_structured")
# The authors trained under torch.cuda.amp.GradScaler, whose initial loss scale is 2**16: their
# 1e-4 was added to gradient sums 2**16 times (or more) larger than unscaled fp32 ones.
AUTHORS_LOSS_SCALE = 2**16
METHOD_RESCALE_EPS = RESCALE_EPS / AUTHORS_LOSS_SCALE  # ~1.5e-9: SDGPConfig's default
MIN_INPUT_CHANNELS = 4  # convs with <= 3 input channels (the stem) stay dense (authors' rule)


# --------------------------------------------------------------------------------------------
# the converted convolution
# --------------------------------------------------------------------------------------------
def _explicit_padding(conv: nn.Conv2d) -> tuple[int, int] | None:
    """Integer (symmetric) padding of ``conv``, or ``None`` when it pads asymmetrically."""
    if isinstance(conv.padding, str):
        if conv.padding == "valid":
            return (0, 0)
        totals = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size, strict=True)]
        if any(t % 2 for t in totals):
            return None
        return (totals[0] // 2, totals[1] // 2)
    return (int(conv.padding[0]), int(conv.padding[1]))


def conv_memory_format(t: torch.Tensor) -> torch.memory_format:
    """The layout a convolution given ``t`` computes in: ``torch.channels_last`` for a 4-D
    tensor laid out NHWC and not also NCHW (a tensor with one channel, or a 1x1 plane, is
    both), else ``torch.contiguous_format``."""
    if (
        t.dim() == 4
        and not t.is_contiguous()
        and t.is_contiguous(memory_format=torch.channels_last)
    ):
        return torch.channels_last
    return torch.contiguous_format


def conv_grad(
    which: str,
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_args: tuple[Any, Any, Any, int],
) -> torch.Tensor:
    """One gradient of ``conv2d(x, weight, None, *conv_args)`` for the output gradient
    ``grad_out``: ``which="input"`` gives dL/dD (the product SDGP prunes, Sec. III-A) in
    ``x``'s layout, ``"weight"`` gives dL/dW (the dense product SDGP keeps). ``conv_args``
    is ``(stride, padding, dilation, groups)`` with integer padding. It is the convolution
    backward dense training runs, on the real input and weight, asked for one gradient.

    ``torch.nn.grad.conv2d_input`` / ``conv2d_weight`` compute the same values (bit for bit in
    the tests) but stand a stride-0 tensor in for ``x`` / ``weight``; on the CPU (oneDNN) the
    stand-in can take a slower path than training's own backward: on ResNet-20's stride-2
    layer at batch 32, one thread, 2.4-3.3 ms against 0.9-1.4 ms for dL/dD. So SDGP's
    backward and its time accounting (Fig. 9) call this.
    """
    if which not in ("input", "weight"):
        raise ValueError(f"which must be 'input' or 'weight', got {which!r}")
    stride, padding, dilation, groups = conv_args
    mask = [which == "input", which == "weight", False]
    grads = torch.ops.aten.convolution_backward(
        grad_out, x, weight, None, list(stride), list(padding), list(dilation),
        False, [0, 0], groups, mask,
    )  # fmt: skip
    return grads[0] if which == "input" else grads[1]


def _conv_like(cls: type[nn.Conv2d], conv: nn.Conv2d) -> Any:
    """A ``cls`` (``nn.Conv2d`` or a subclass) with ``conv``'s geometry, mode and training flag,
    holding ``conv``'s very parameters: built on the meta device, so nothing is allocated or
    initialised."""
    new = cls(
        conv.in_channels,
        conv.out_channels,
        conv.kernel_size,  # type: ignore[arg-type]
        stride=conv.stride,  # type: ignore[arg-type]
        padding=conv.padding,  # type: ignore[arg-type]
        dilation=conv.dilation,  # type: ignore[arg-type]
        groups=conv.groups,
        bias=conv.bias is not None,
        padding_mode=conv.padding_mode,
        device="meta",
        dtype=conv.weight.dtype,
    )
    new.weight = conv.weight
    new.bias = conv.bias
    new.train(conv.training)
    return new


class _SDGPConv2dFunction(torch.autograd.Function):
    """conv2d whose input gradient uses the pruned output gradient (SDGP, Fig. 2)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        stride: tuple[int, int],
        padding: Any,
        dilation: tuple[int, int],
        groups: int,
        int_padding: tuple[int, int],
        prune: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        ctx.prune = prune
        return sdgp_conv_forward(
            ctx, x, weight, bias, stride, padding, dilation, groups, int_padding
        )

    @staticmethod
    @once_differentiable  # a pruned gradient has no gradient of its own: create_graph's
    # first-order result is exact, differentiating it again raises torch's error
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        def data_grad(g: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return conv_grad("input", ctx.prune(g), x, weight, ctx.conv_args)

        return sdgp_conv_backward(ctx, grad_out, data_grad)


def sdgp_conv_forward(
    ctx: Any,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: tuple[int, int],
    padding: Any,
    dilation: tuple[int, int],
    groups: int,
    int_padding: tuple[int, int],
) -> torch.Tensor:
    """Forward of an SDGP conv's autograd function: the dense conv, unchanged (SDGP Sec. III-A).

    Makes the very ``F.conv2d`` call ``nn.Conv2d`` makes, so the output is bit-identical, and
    saves on ``ctx`` what :func:`sdgp_conv_backward` reads: ``(x, weight)``, ``conv_args =
    (stride, int_padding, dilation, groups)``, ``bias_shape`` and ``bias_dtype``.
    """
    out = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    ctx.save_for_backward(x, weight)
    ctx.conv_args = (stride, int_padding, dilation, groups)
    ctx.bias_shape = None if bias is None else list(bias.shape)
    ctx.bias_dtype = None if bias is None else bias.dtype
    return out


def sdgp_conv_backward(
    ctx: Any,
    grad_out: torch.Tensor,
    data_grad: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
) -> tuple[Any, ...]:
    """Backward of an SDGP conv's autograd function (SDGP Sec. III-A, Fig. 2).

    ``data_grad(grad_out, x, weight)`` computes dL/dD from the pruned dL/dO; dL/dW and dL/db
    come from the dense dL/dO in one call, as the dense conv's own backward computes them.
    ``ctx`` carries the saved ``(x, weight)``, ``conv_args = (stride, int_padding, dilation,
    groups)``, ``bias_shape`` and ``bias_dtype``. Returns the gradients of the function's
    nine inputs (x, weight, bias, then six non-tensors).
    """
    x, weight = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.conv_args
    in_dtype, w_dtype = x.dtype, weight.dtype
    if grad_out.dtype != x.dtype or grad_out.dtype != weight.dtype:
        # Under autocast the conv ran in grad_out's dtype on cast copies of x and weight:
        # compute the gradients in that dtype and hand them back in the leaves' dtypes.
        x, weight = x.to(grad_out.dtype), weight.to(grad_out.dtype)
    grad_x = grad_w = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_x = data_grad(grad_out, x, weight)
    want_w = ctx.needs_input_grad[1]
    want_b = ctx.bias_shape is not None and ctx.needs_input_grad[2]
    if want_w or want_b:
        _, grad_w, grad_b = torch.ops.aten.convolution_backward(
            grad_out,
            x,
            weight,
            ctx.bias_shape,
            list(stride),
            list(padding),
            list(dilation),
            False,
            [0, 0],
            groups,
            [False, want_w, want_b],
        )
    if grad_x is not None:
        grad_x = grad_x.to(in_dtype)
    if grad_w is not None:
        grad_w = grad_w.to(w_dtype)
    if grad_b is not None:
        grad_b = grad_b.to(ctx.bias_dtype)
    return grad_x, grad_w, grad_b, None, None, None, None, None, None


class SDGPConv2d(nn.Conv2d):
    """An ``nn.Conv2d`` whose backward prunes dL/dO N:M before computing dL/dD (SDGP).

    Forward is the original conv, bit for bit. Only in training mode does its backward prune;
    in eval mode (an attack's input gradient, :func:`impl.robustness.fgsm_attack`) it is the
    plain conv's. The weight and bias are the original module's
    ``Parameter`` objects (never re-initialised; the authors' code re-initialised them).
    Build with :meth:`from_conv`. ``l1_ratio()`` reports sum|pruned| / sum|dense| of the
    output gradients seen since the last ``reset_stats()``.
    """

    n: int
    m: int
    prune_method: str
    rescale: str
    eps: float
    generator: torch.Generator | None
    # nm_prune's impl: "auto" runs the CUDA kernel on CUDA gradients and the compiled CPU
    # kernel (impl.ops.nm_cpu) on CPU ones, each where it loads; "ref" the reference.
    prune_impl: str = "auto"

    @classmethod
    def from_conv(
        cls,
        conv: nn.Conv2d,
        n: int,
        m: int,
        method: str = "rescaled",
        rescale: str = "plane",
        generator: torch.Generator | None = None,
        eps: float = RESCALE_EPS,
    ) -> SDGPConv2d:
        """Wrap ``conv`` (its parameters are shared, not copied)."""
        int_padding = _explicit_padding(conv)
        if int_padding is None:
            raise ValueError(f"padding={conv.padding!r} pads asymmetrically; not supported")
        new = _conv_like(cls, conv)
        new._int_padding = int_padding
        new.configure(n, m, method, rescale, generator, eps)
        return new

    def configure(
        self,
        n: int,
        m: int,
        method: str = "rescaled",
        rescale: str = "plane",
        generator: torch.Generator | None = None,
        eps: float = RESCALE_EPS,
    ) -> None:
        """Set the pruning of this layer's output gradient."""
        check_options(n, m, method, rescale, eps, generator)
        self.n, self.m, self.prune_method, self.rescale = n, m, method, rescale
        self.generator, self.eps = generator, eps
        # Calls of prune_grad (and of the semi-structured layer's prune_rows_grad) per path
        # that pruned ("cpu kernel", "reference", "cuda tensor": nm_prune's dispatch by
        # prune_impl) since the layer was configured: compiled and reference rescaled values
        # differ in their last bits, so a run says which ran.
        self.prune_paths: dict[str, int] = {}
        self.reset_stats()

    def reset_stats(self) -> None:
        """Forget the L1 sums accumulated by :meth:`prune_grad` (not ``prune_paths``)."""
        self._l1_dense: torch.Tensor | float = 0.0
        self._l1_pruned: torch.Tensor | float = 0.0
        self._l1_counted: torch.Tensor | int = 0  # calls whose sums were finite
        self.prune_calls = 0

    def _count_path(self, path: str) -> None:
        self.prune_paths[path] = self.prune_paths.get(path, 0) + 1

    def l1_ratio(self) -> float:
        """sum|pruned dL/dO| / sum|dense dL/dO| since the last reset, over the calls whose
        gradients were finite (an fp16 step that overflowed, and is skipped, is left out);
        NaN before any such call."""
        return l1_ratio_of(*self.l1_sums())

    def l1_sums(self) -> tuple[float, float, int]:
        """``(sum|pruned dL/dO|, sum|dense dL/dO|, calls counted)`` since the last reset, the
        parts of :meth:`l1_ratio` (summed over data-parallel ranks by the method's metrics)."""
        if self.prune_calls == 0:
            return 0.0, 0.0, 0
        return float(self._l1_pruned), float(self._l1_dense), int(self._l1_counted)

    def prune_grad(self, grad_out: torch.Tensor) -> torch.Tensor:
        """The pruned output gradient used for dL/dD (channels = dim 1)."""
        l1_dense = l1_pruned = None
        if grad_out.is_cuda:  # nm_prune's dispatch: the CUDA kernel where it loads
            self._count_path("cuda tensor")
            pruned = nm_prune(
                grad_out,
                self.n,
                self.m,
                self.prune_method,
                dim=1,
                rescale=self.rescale,
                generator=self.generator,
                impl=self.prune_impl,
                eps=self.eps,
            )
        else:  # compiled or reference; each also returns the L1 sums when it has them
            dim = check_prune_args(grad_out, self.n, self.m, self.prune_method, 1, self.rescale,
                                   self.eps, self.generator)  # fmt: skip
            args = (self.n, self.m, self.prune_method, dim, self.rescale, self.generator)
            pruned, l1_dense, l1_pruned, path = _prune_cpu(
                grad_out, *args, self.eps, impl=self.prune_impl, stats=True, option="prune_impl"
            )
            self._count_path(path)
        self._add_l1_sums(grad_out, pruned, l1_dense, l1_pruned)
        return pruned

    @torch.no_grad()
    def _add_l1_sums(
        self,
        grad_out: torch.Tensor,
        pruned: torch.Tensor,
        l1_dense: torch.Tensor | None = None,
        l1_pruned: torch.Tensor | None = None,
    ) -> None:
        """Add one call's sum|dL/dO| and sum|pruned| (given, or summed here) to the layer's,
        on the device (no host sync per step), unless either is inf or NaN (an fp16 step
        that overflowed)."""
        if l1_dense is None or l1_pruned is None:
            l1_dense = grad_out.abs().sum(dtype=torch.float64)
            l1_pruned = pruned.abs().sum(dtype=torch.float64)
        finite = torch.isfinite(l1_dense) & torch.isfinite(l1_pruned)
        self._l1_dense = self._l1_dense + torch.where(finite, l1_dense, 0.0)
        self._l1_pruned = self._l1_pruned + torch.where(finite, l1_pruned, 0.0)
        self._l1_counted = self._l1_counted + finite.to(torch.int64)
        self.prune_calls += 1

    def _padded(self, input: torch.Tensor) -> tuple[torch.Tensor, Any, tuple[int, int]]:
        """``(input, padding, int_padding)`` for the autograd function: a padding mode other
        than zeros is applied here, explicitly, and the convolution then pads nothing."""
        if self.padding_mode != "zeros":
            pad = self._reversed_padding_repeated_twice
            return F.pad(input, pad, mode=self.padding_mode), (0, 0), (0, 0)
        return input, self.padding, self._int_padding

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # SDGP prunes training's gradients only: in eval mode (an attack's input gradient,
        # eval-fgsm) or without autograd the conv is the plain one
        if not torch.is_grad_enabled() or not self.training:
            return super().forward(input)
        input, padding, int_padding = self._padded(input)
        return _SDGPConv2dFunction.apply(
            input,
            self.weight,
            self.bias,
            self.stride,
            padding,
            self.dilation,
            self.groups,
            int_padding,
            self.prune_grad,
        )

    def extra_repr(self) -> str:
        rule = f", rescale={self.rescale}" if self.prune_method == "rescaled" else ""
        return f"{super().extra_repr()}, sdgp={self.n}:{self.m} {self.prune_method}{rule}"


# --------------------------------------------------------------------------------------------
# conversion of a model
# --------------------------------------------------------------------------------------------
@dataclass
class LayerPlan:
    """What :func:`sdgp_convert` does to one ``nn.Conv2d``.

    Args:
        name: qualified module name.
        in_channels, out_channels: the conv's channels (groups run along ``out_channels``,
            the channel dim of dL/dO).
        sparse: whether its data gradient is computed from a pruned dL/dO.
        reason: why a layer stays dense ("" when sparse).
        data_grad_density: fraction of dL/dO kept for dL/dD (n/m; higher for a padded
            partial last group; 1.0 when dense).
    """

    name: str
    in_channels: int
    out_channels: int
    sparse: bool
    reason: str
    data_grad_density: float


def data_grad_density(channels: int, n: int, m: int) -> float:
    """Fraction of ``channels`` kept by N:M with the padded partial-group rule."""
    if channels < 1:
        raise ValueError(f"channels must be >= 1, got {channels}")
    full, r = divmod(channels, m)
    return (full * n + min(n, r)) / channels


def sdgp_plan(
    model: nn.Module, n: int = 2, m: int = 4, nondivisible: str = "pad"
) -> list[LayerPlan]:
    """Which convs of ``model`` SDGP prunes, and why the others stay dense.

    A conv is converted when it has more than 3 input channels (the authors' rule: it skips
    the stem, whose data gradient is not needed) and, with ``nondivisible="dense"``, when its
    output channels are a multiple of ``m``. Convs with asymmetric ``padding="same"`` stay
    dense.
    """
    check_nm(n, m)
    if nondivisible not in NONDIVISIBLE_RULES:
        raise ValueError(
            f"unknown nondivisible rule {nondivisible!r}; valid: {', '.join(NONDIVISIBLE_RULES)}"
        )
    plans = []
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Conv2d):
            continue
        reason = ""
        if mod.in_channels < MIN_INPUT_CHANNELS:
            reason = f"in_channels={mod.in_channels} <= 3 (stem)"
        elif nondivisible == "dense" and mod.out_channels % m:
            reason = f"out_channels={mod.out_channels} not a multiple of m={m}"
        elif _explicit_padding(mod) is None:
            reason = f"padding={mod.padding!r} is asymmetric"
        sparse = not reason
        density = data_grad_density(mod.out_channels, n, m) if sparse else 1.0
        plans.append(LayerPlan(name, mod.in_channels, mod.out_channels, sparse, reason, density))
    return plans


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def random_generator(
    model: nn.Module, method: str, generator: torch.Generator | None, seed: int
) -> torch.Generator | None:
    """The generator every layer of a converted model draws from for ``method="random"``:
    ``generator`` when given, else a new one on the model's device seeded with ``seed``;
    ``None`` for the deterministic methods (SDGP Sec. III-B, random pruning)."""
    if generator is not None or method != "random":
        return generator
    param = next(model.parameters(), None)
    out = torch.Generator(device=param.device if param is not None else torch.device("cpu"))
    out.manual_seed(seed)
    return out


def rank_prune_seed(seed: int, epoch: int, rank: int) -> int:
    """The random-pruning seed of ``rank``'s epoch ``epoch`` in a run of several processes.

    Every rank seeded with the run's seed drew the same random numbers, so sample i of every
    rank's share kept the same positions: draws one process never makes. Seeded per rank and
    epoch, the ranks draw independently, and a run resumed at an epoch's start draws what an
    uninterrupted one does (the checkpoint holds rank 0's generator only). One process keeps
    one generator seeded once (``setup``)."""
    return derived_seed(seed, epoch, rank, 0x5D69)


def sdgp_convert(
    model: nn.Module,
    n: int = 2,
    m: int = 4,
    method: str = "rescaled",
    rescale: str = "plane",
    *,
    generator: torch.Generator | None = None,
    seed: int = 0,
    nondivisible: str = "pad",
    eps: float = RESCALE_EPS,
    backend: str = "reference",
) -> nn.Module:
    """Replace, in place, every conv that :func:`sdgp_plan` marks sparse by an :class:`SDGPConv2d`.

    The new modules share the original ``Parameter`` objects (an optimizer built before or
    after keeps working); forward is bit-identical; backward computes dL/dD from the N:M-pruned
    dL/dO and dL/dW, dL/db from the dense dL/dO (SDGP Sec. III-A). A conv already converted is
    reconfigured, or made a plain conv again (:func:`plain_conv`) where the plan now marks it
    dense. For ``method="random"`` all layers draw from one ``generator``; when none is
    given one is created on the model's device and seeded with ``seed``.

    ``eps`` defaults to the authors' literal 1e-4 (:data:`impl.ops.nm.RESCALE_EPS`), meant for
    fp16 loss-scaled gradients; on unscaled float32 gradients it shrinks the rescaled data
    gradient, and the method itself uses :data:`METHOD_RESCALE_EPS` (docs/methods.md).

    ``backend="semi_structured"`` converts to :class:`impl.methods.sdgp_semi.SDGPSemiConv2d`
    (dL/dD on 2:4 sparse tensor cores where the library runs, this reference elsewhere, with
    the reason logged).

    Returns ``model``; :func:`sdgp_plan` (same arguments) lists the layers left dense.
    """
    check_options(n, m, method, rescale, eps, generator)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == "semi_structured":
        # Imported only when asked for: an optional backend.
        from impl.methods.sdgp_semi import sdgp_semi_convert

        return sdgp_semi_convert(
            model, n, m, method, rescale,
            generator=generator, seed=seed, nondivisible=nondivisible, eps=eps,
        )  # fmt: skip
    plans = sdgp_plan(model, n, m, nondivisible)
    generator = random_generator(model, method, generator, seed)
    for plan in plans:
        mod = model.get_submodule(plan.name)
        if isinstance(mod, SDGPConv2d) and not plan.sparse:  # converted before, dense now
            _set_submodule(model, plan.name, plain_conv(mod))
            continue
        if type(mod) is SDGPConv2d:  # a semi-structured layer is replaced by the reference
            if plan.sparse:
                mod.configure(n, m, method, rescale, generator, eps)
            continue
        if plan.sparse:
            new = SDGPConv2d.from_conv(mod, n, m, method, rescale, generator, eps)
            if plan.name:
                _set_submodule(model, plan.name, new)
            else:
                raise ValueError("the model itself is a Conv2d: wrap it in a module to convert it")
    return model


def plain_conv(conv: nn.Conv2d) -> nn.Conv2d:
    """A plain ``nn.Conv2d`` with ``conv``'s geometry and its parameters (shared, not copied):
    an SDGP conv back to dense training (its forward was the same conv all along)."""
    return _conv_like(nn.Conv2d, conv)


def sdgp_restore(model: nn.Module) -> nn.Module:
    """Replace, in place, every SDGP conv of ``model`` by a :func:`plain_conv` sharing its
    parameters: dense training again, the undoing of :func:`sdgp_convert`. Returns ``model``."""
    for name in list(sdgp_modules(model)):
        if not name:
            raise ValueError("the model itself is an SDGP conv: restore it with plain_conv")
        _set_submodule(model, name, plain_conv(model.get_submodule(name)))  # type: ignore[arg-type]
    return model


def prune_path_counts(model: nn.Module) -> dict[str, int]:
    """Calls of each pruning path over the SDGP convs of ``model`` (their ``prune_paths``),
    e.g. ``{"cpu kernel": 6840}``: which code pruned the gradients of a run."""
    total: dict[str, int] = {}
    for mod in sdgp_modules(model).values():
        for path, calls in mod.prune_paths.items():
            total[path] = total.get(path, 0) + calls
    return dict(sorted(total.items()))


def l1_ratio_of(pruned: float, dense: float, counted: int) -> float:
    """sum|pruned| / sum|dense| of dL/dO from :meth:`SDGPConv2d.l1_sums`; NaN where no call
    was counted."""
    if counted == 0:
        return float("nan")
    return pruned / max(dense, 1e-30)


def _summed_over_ranks(rows: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """Each layer's L1 sums added over the data-parallel ranks (every rank calls this, as it
    calls ``epoch_metrics``); unchanged in one process."""
    from impl.distributed import sum_over_ranks

    flat = sum_over_ranks([v for row in rows for v in row])
    return [(a, b, round(c)) for a, b, c in zip(flat[0::3], flat[1::3], flat[2::3], strict=True)]


def sdgp_modules(model: nn.Module) -> dict[str, SDGPConv2d]:
    """The converted convs of ``model`` by qualified name."""
    return {k: v for k, v in model.named_modules() if isinstance(v, SDGPConv2d)}


# --------------------------------------------------------------------------------------------
# the method
# --------------------------------------------------------------------------------------------
@dataclass
class SDGPConfig(MethodConfig):
    """Options of SDGP.

    Args:
        n: gradient elements kept per group (paper: 2).
        m: group size along channels, ``n <= m <= 32`` (paper: 4; Fig. 8 up to 32).
        prune_method: ``random``, ``magnitude`` or ``rescaled`` (rescaled magnitude).
        rescale: ``plane`` (authors' code, per sample and channel) or ``channel`` (paper
            text, per channel over batch and space); used by ``rescaled`` only.
        nondivisible: for convs whose output channels are not a multiple of ``m``: ``pad``
            (the last group keeps min(n, r) of its r channels) or ``dense`` (layer unpruned).
        rescale_eps: additive constant in the rescale denominator. Default 1e-4 / 2**16:
            the authors' 1e-4 acted on gradients loss-scaled by GradScaler (2**16 at start),
            this Trainer's gradients are unscaled unless it trains under ``fp16`` (the
            docstring of impl.methods.sdgp says more); pass 1e-4 for the literal constant,
            the faithful one under ``fp16``.
        prune_seed: seed of the random-pruning generator; ``None`` uses the run's seed.
        profile: at the end of the run, time every conv's forward, data-gradient and
            weight-gradient passes and the pruning (Fig. 9) and write the paper's estimate.
        profile_repeats: timed repeats per measurement (median; one warm-up before).
        backend: ``reference`` (:func:`conv_grad` of the pruned dL/dO) or ``semi_structured``
            (2:4 sparse tensor cores through torch semi-structured sparsity where they run,
            the reference path elsewhere with the reason in summary.json; see
            impl/methods/sdgp_semi.py and docs/sdgp_semi.md).
    """

    n: int = 2
    m: int = 4
    prune_method: str = "rescaled"
    rescale: str = "plane"
    nondivisible: str = "pad"
    rescale_eps: float = METHOD_RESCALE_EPS
    prune_seed: int | None = None
    profile: bool = True
    profile_repeats: int = 3
    backend: str = "reference"


RESCALE_DESCRIPTIONS = {
    "plane": "per (sample, channel) plane over H,W: y *= sum|x| / (sum|y| + eps) (authors' code)",
    "channel": "per channel over N,H,W: y *= sum|x| / (sum|y| + eps) (paper Sec. III-B text)",
}


class SDGP(Method):
    """Structured data gradient pruning as a plug-in of the Trainer (no weight is pruned)."""

    name = "sdgp"
    Config = SDGPConfig
    config: SDGPConfig

    def __init__(self, config: SDGPConfig | None = None) -> None:
        super().__init__(config)
        self.generator: torch.Generator | None = None
        self.plan: list[LayerPlan] = []
        self._prune_paths: dict[str, dict[str, int]] = {}  # per layer, at the last epoch's end
        self._semi_state: dict[str, dict[str, Any]] = {}  # the same, semi-structured layers

    def validate(self, train_config: Any) -> None:
        """Check n, m, the pruning function, the rescale and nondivisible rules."""
        c = self.config
        check_nm(c.n, c.m)
        check_method(c.prune_method, c.rescale)
        if c.nondivisible not in NONDIVISIBLE_RULES:
            raise ValueError(
                f"unknown nondivisible {c.nondivisible!r}; valid: {', '.join(NONDIVISIBLE_RULES)}"
            )
        check_eps(c.rescale_eps, "rescale_eps")
        if c.prune_seed is not None:
            check_seed(c.prune_seed, "prune_seed")
        if c.profile_repeats < 1:
            raise ValueError(f"profile_repeats must be >= 1; got {c.profile_repeats}")
        if c.backend not in BACKENDS:
            raise ValueError(f"unknown backend {c.backend!r}; valid: {', '.join(BACKENDS)}")
        from impl.distributed import env_world

        world = env_world()
        if c.prune_method == "rescaled" and c.rescale == "channel" and world and world[1] > 1:
            raise ValueError(
                "rescale='channel' scales each channel by sums over the whole batch, and with "
                f"{world[1]} processes each one's backward sees its share only: use "
                "rescale='plane' (per sample, the same with any number of processes) or one "
                "process"
            )

    def _seed(self, ctx: TrainContext) -> int:
        if self.config.prune_seed is not None:
            return int(self.config.prune_seed)
        return int(getattr(ctx.config, "seed", 0) or 0)

    def setup(self, ctx: TrainContext) -> None:
        """Convert ``ctx.model``'s convs; create the generator of random pruning."""
        self.validate(ctx.config)
        c = self.config
        self.generator = torch.Generator(device=ctx.device)
        self.generator.manual_seed(self._seed(ctx))
        self.plan = sdgp_plan(ctx.model, c.n, c.m, c.nondivisible)
        sdgp_convert(
            ctx.model,
            c.n,
            c.m,
            c.prune_method,
            c.rescale,
            generator=self.generator,
            nondivisible=c.nondivisible,
            eps=c.rescale_eps,
            backend=c.backend,
        )

    def on_epoch_start(self, ctx: TrainContext) -> None:
        """Reset the per-layer L1 statistics; with several processes, reseed random pruning
        from (seed, epoch, rank) (:func:`rank_prune_seed`)."""
        for mod in sdgp_modules(ctx.model).values():
            mod.reset_stats()
        from impl.distributed import current

        info = current()
        if info.active and self.generator is not None:
            self.generator.manual_seed(rank_prune_seed(self._seed(ctx), ctx.epoch, info.rank))

    def epoch_metrics(self, ctx: TrainContext) -> dict[str, Any]:
        """Mean and min over layers of sum|pruned dL/dO| / sum|dense dL/dO| this epoch (with
        several processes, of the sums over every rank's share of the batch)."""
        # what the epoch's checkpoint keeps of the layers' pruning-path counts (a resumed run
        # then reports the whole run's calls, not those since the resume)
        modules = sdgp_modules(ctx.model)
        self._prune_paths = {name: dict(mod.prune_paths) for name, mod in modules.items()}
        # and of the semi-structured layers' call counts (the executed FLOPs weigh them)
        self._semi_state = {
            name: mod.semi_state()
            for name, mod in modules.items()
            if callable(getattr(mod, "semi_state", None))
        }
        sums = _summed_over_ranks([v.l1_sums() for v in modules.values()])
        ratios = [r for r in (l1_ratio_of(*t) for t in sums) if not math.isnan(r)]
        if not ratios:
            return {}
        return {
            "sdgp_l1_ratio_mean": sum(ratios) / len(ratios),
            "sdgp_l1_ratio_min": min(ratios),
        }

    def cost(self, model: nn.Module) -> dict[str, Any]:
        """Per-layer densities: forward and weight gradient dense, data gradient n/m."""
        from impl.flops import LayerDensity  # lazy: flops is optional for the method

        return {
            p.name: LayerDensity(forward=1.0, data_grad=p.data_grad_density, weight_grad=1.0)
            for p in sdgp_plan(model, self.config.n, self.config.m, self.config.nondivisible)
            if p.sparse
        }

    def summary(self, ctx: TrainContext) -> dict[str, Any]:
        """The rescale rule, the sparse and dense layers, and the Fig. 9 time accounting."""
        c = self.config
        plan = self.plan or sdgp_plan(ctx.model, c.n, c.m, c.nondivisible)
        out: dict[str, Any] = {
            "sdgp_n": c.n,
            "sdgp_m": c.m,
            "sdgp_prune_method": c.prune_method,
            "sdgp_rescale": c.rescale if c.prune_method == "rescaled" else None,
            "sdgp_rescale_rule": (
                RESCALE_DESCRIPTIONS[c.rescale] if c.prune_method == "rescaled" else None
            ),
            "sdgp_rescale_eps": c.rescale_eps,
            "sdgp_nondivisible": c.nondivisible,
            "sdgp_sparse_layers": [p.name for p in plan if p.sparse],
            "sdgp_dense_layers": {p.name: p.reason for p in plan if not p.sparse},
            "sdgp_layers": [dataclasses.asdict(p) for p in plan],
            "sdgp_backend": c.backend,
            "sdgp_prune_paths": prune_path_counts(ctx.model),
        }
        if c.backend == "semi_structured":
            from impl.methods.sdgp_semi import semi_summary

            out.update(semi_summary(ctx.model))
        if c.profile:
            from impl.methods.sdgp_timing import time_accounting
            from impl.train import autocast_dtype

            if ctx.progress:  # it can take as long as a short run's training
                print(
                    "sdgp: timing every conv's forward and gradients for the summary's "
                    "sdgp_time (not in wall_seconds; --profile false skips it)",
                    file=sys.stderr,
                    flush=True,
                )

            trainer_ms = None
            fwd, bwd = ctx.extra.get("epoch_fwd_ms"), ctx.extra.get("epoch_bwd_ms")
            if isinstance(fwd, (int, float)) and isinstance(bwd, (int, float)):
                trainer_ms = float(fwd) + float(bwd)
            out["sdgp_time"] = time_accounting(
                ctx.model,
                tuple(ctx.input_shape),
                int(ctx.batch_size) or 1,
                c.n,
                c.m,
                method=c.prune_method,
                rescale=c.rescale,
                repeats=c.profile_repeats,
                nondivisible=c.nondivisible,
                iteration_ms=trainer_ms,
                amp_dtype=autocast_dtype(ctx.config),
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        """The random-pruning generator's state (a uint8 tensor), each layer's calls per
        pruning path and (semi-structured backend) its sparse and fallback calls and fallback
        reasons, all up to the last epoch's end."""
        out: dict[str, Any] = {"prune_paths": dict(self._prune_paths)}
        if self._semi_state:
            out["semi_state"] = dict(self._semi_state)
        if self.generator is not None:
            out["generator_state"] = self.generator.get_state()
        return out

    def load_state_dict(self, state: dict[str, Any], ctx: TrainContext) -> None:
        """Restore the generator and the call counts; (re)convert ``ctx.model`` if
        ``setup`` has not done it."""
        if self.generator is None or not sdgp_modules(ctx.model):
            self.setup(ctx)
        if "generator_state" in state and self.generator is not None:
            self.generator.set_state(state["generator_state"].to(torch.uint8).cpu())
        modules = sdgp_modules(ctx.model)
        for name, paths in state.get("prune_paths", {}).items():
            if name in modules:
                modules[name].prune_paths = dict(paths)
        self._prune_paths = dict(state.get("prune_paths", {}))
        for name, semi in state.get("semi_state", {}).items():
            if callable(getattr(modules.get(name), "load_semi_state", None)):
                modules[name].load_semi_state(semi)
        self._semi_state = dict(state.get("semi_state", {}))


__all__ = [
    "BACKENDS",
    "AUTHORS_LOSS_SCALE",
    "IMPLS",
    "MAX_GROUP",
    "METHOD_RESCALE_EPS",
    "NONDIVISIBLE_RULES",
    "PRUNE_METHODS",
    "RESCALE_EPS",
    "RESCALE_RULES",
    "SDGP",
    "LayerPlan",
    "SDGPConfig",
    "SDGPConv2d",
    "check_eps",
    "check_method",
    "check_nm",
    "conv_memory_format",
    "data_grad_density",
    "nm_keep_mask",
    "nm_prune",
    "rank_prune_seed",
    "nm_prune_ref",
    "plain_conv",
    "random_generator",
    "sdgp_conv_backward",
    "sdgp_convert",
    "prune_path_counts",
    "sdgp_modules",
    "sdgp_plan",
    "sdgp_restore",
]
