"""SDGP: structured (N:M) pruning of output data gradients during training.

McDanel, Dinh and Magallanes, "Accelerating DNN Training with Structured Data Gradient
Pruning" (2022). Every convolution with more than 3 input channels computes its input (data)
gradient dL/dD from an N:M-pruned copy of its output gradient dL/dO (Sec. III-A, Algorithm 1,
Fig. 2), while its weight gradient dL/dW is computed from the dense dL/dO (Sec. III-A: "SDGP
creates a copy of dL/dO to store the pruned data gradient tensor").

Three pruning functions (Sec. III-B):

* ``random``: keep ``n`` of every ``m`` elements chosen uniformly at random (every n-subset
  of a group equally likely; the authors' kernel shuffles with a biased swap, this does not);
* ``magnitude``: keep the ``n`` largest ``|x|`` of every group; ties go to the lowest index;
* ``rescaled``: magnitude, then rescale the kept values so that the L1 norm is preserved.
  ``rescale="plane"`` (default) is the rule of the authors' code, per (sample, channel)
  plane over the spatial dims: ``y *= sum_hw |x| / (sum_hw |y| + eps)`` with ``eps=1e-4``;
  ``rescale="channel"`` is the rule of the paper's text (Sec. III-B, Fig. 4 caption), per
  channel over the batch and spatial dims, with the same ``eps``.

The scale of ``eps``: the authors trained with fp16 autocast and ``GradScaler`` (initial scale
2**16, growing), so their ``1e-4`` was added to loss-scaled gradient sums; on unscaled fp32
gradients it stands for about ``1e-4 / 2**16 ~ 1.5e-9``. Applied literally to unscaled fp32
gradients, ``1e-4`` is no longer negligible (per-plane sums of |dL/dO| are often ~1e-4 late in
training) and shrinks the data gradient instead of preserving its L1 norm (measured on digits
with ResNet-20: sum|pruned| / sum|dense| of 0.68 on average, 0.42 in the worst layer, against
0.999 with eps ~ 0). :func:`nm_prune` keeps the literal ``1e-4`` as its default; the ``SDGP``
method defaults to ``1e-4 / 2**16`` (``METHOD_RESCALE_EPS``), the authors' constant in
unscaled-gradient units, and records the value used and sum|pruned| / sum|dense| per epoch
(``sdgp_l1_ratio_*``).

Groups are ``m`` consecutive elements along ``dim`` (the channel dim of NCHW gradients; the
authors run channels-last so a group is contiguous). **When the length of ``dim`` is not a
multiple of ``m``** the last, partial group of ``r < m`` elements is treated as a full group
padded with ``m - r`` elements that can never be kept (magnitude score ``-inf``): it keeps
``min(n, r)`` of its ``r`` elements. This is exactly what an N:M kernel computes on a tensor
zero-padded to a multiple of ``m``. Groups never span another axis. :func:`sdgp_convert`
can instead leave such layers dense (``nondivisible="dense"``) and lists them.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from impl.methods.base import Method, MethodConfig, TrainContext

PRUNE_METHODS: tuple[str, ...] = ("random", "magnitude", "rescaled")
RESCALE_RULES: tuple[str, ...] = ("plane", "channel")
IMPLS: tuple[str, ...] = ("auto", "ref", "cuda")
NONDIVISIBLE_RULES: tuple[str, ...] = ("pad", "dense")
BACKENDS: tuple[str, ...] = ("reference", "semi_structured")
MAX_GROUP = 32  # the authors' kernel keeps one group per thread in registers, m <= 32
RESCALE_EPS = 1e-4  # the constant of the authors' rescale rule
# The authors trained under torch.cuda.amp.GradScaler, whose initial loss scale is 2**16: their
# 1e-4 was added to gradient sums 2**16 times (or more) larger than unscaled fp32 ones.
AUTHORS_LOSS_SCALE = 2**16
METHOD_RESCALE_EPS = RESCALE_EPS / AUTHORS_LOSS_SCALE  # ~1.5e-9: SDGPConfig's default
MIN_INPUT_CHANNELS = 4  # convs with <= 3 input channels (the stem) stay dense (authors' rule)

# The CUDA implementation of nm_prune. It defines ``is_available() -> bool`` and
# ``nm_prune_cuda(x, n, m, method, dim, rescale, generator, eps)`` with the semantics of
# :func:`nm_prune_ref`, which defines the op (the random draw is its own, see that module).
_CUDA_MODULE = "impl.ops.nm_cuda"


# --------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------
def check_nm(n: int, m: int) -> None:
    """Raise ``ValueError`` unless ``1 <= n <= m <= 32`` are integers (Sec. III-A: m <= 32)."""
    for name, v in (("n", n), ("m", m)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an int with 1 <= n <= m <= {MAX_GROUP}; got {v!r}")
    if not 1 <= n <= m <= MAX_GROUP:
        raise ValueError(f"need 1 <= n <= m <= {MAX_GROUP}; got n={n}, m={m}")


def check_method(method: str, rescale: str) -> None:
    """Raise ``ValueError`` on an unknown pruning function or rescale rule (names the valid)."""
    if method not in PRUNE_METHODS:
        raise ValueError(f"unknown method {method!r}; valid: {', '.join(PRUNE_METHODS)}")
    if rescale not in RESCALE_RULES:
        raise ValueError(f"unknown rescale {rescale!r}; valid: {', '.join(RESCALE_RULES)}")


def _check_tensor(x: torch.Tensor, dim: int) -> int:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a floating-point torch.Tensor; got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(
            f"x must be a floating-point tensor (float16, bfloat16, float32, float64); "
            f"got {x.dtype}"
        )
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension to group along")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be an int in [{-x.dim()}, {x.dim() - 1}]; got {dim!r}")
    return dim % x.dim()


# --------------------------------------------------------------------------------------------
# the op
# --------------------------------------------------------------------------------------------
def _load_cuda() -> Any | None:
    """The CUDA implementation module, or ``None`` when it is absent or cannot run here."""
    try:
        mod = importlib.import_module(_CUDA_MODULE)
    except ModuleNotFoundError as err:
        if err.name is not None and _CUDA_MODULE.startswith(err.name):
            return None
        raise
    return mod if mod.is_available() else None


def nm_prune(
    x: torch.Tensor,
    n: int,
    m: int,
    method: str = "rescaled",
    dim: int = 1,
    rescale: str = "plane",
    generator: torch.Generator | None = None,
    impl: str = "auto",
    *,
    eps: float = RESCALE_EPS,
) -> torch.Tensor:
    """N:M-prune ``x``: of every ``m`` consecutive elements along ``dim`` keep ``n`` (SDGP).

    Sec. III-A (Algorithm 1) and III-B of the SDGP paper; see the module docstring for the
    pruning functions, the two rescale rules and the rule for a partial last group.

    Args:
        x: a floating-point tensor (any layout; NCHW and channels-last give the same values,
            and the output keeps the input's memory format). Not modified.
        n: elements kept per group, ``1 <= n <= m``.
        m: group size, ``m <= 32``.
        method: ``"random"``, ``"magnitude"`` or ``"rescaled"`` (rescaled magnitude).
        dim: the grouping dimension (1: the channels of an NCHW tensor).
        rescale: ``"plane"`` (authors' code: per sample and channel, over the other dims) or
            ``"channel"`` (paper text: per channel, over every other dim); only read when
            ``method == "rescaled"``.
        generator: the random source of ``method="random"`` (reproducible draws); ``None``
            uses torch's global generator.
        impl: ``"auto"`` (the CUDA kernel for CUDA tensors when it is available, the
            reference otherwise), ``"ref"`` or ``"cuda"``.
        eps: the additive constant of the rescale denominator (authors: ``1e-4``).

    Returns:
        A new tensor of ``x``'s shape, dtype, device and memory format, with at most ``n``
        nonzeros per group.

    Raises:
        ValueError: ``n``/``m`` outside ``1 <= n <= m <= 32``, a non-floating ``x``, a bad
            ``dim``, an unknown ``method``, ``rescale`` or ``impl``.
        RuntimeError: ``impl="cuda"`` where the CUDA kernel is not available.
    """
    check_nm(n, m)
    check_method(method, rescale)
    dim = _check_tensor(x, dim)
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; valid: {', '.join(IMPLS)}")
    if impl != "ref":
        cuda = _load_cuda() if x.is_cuda else None
        if cuda is not None:
            return cuda.nm_prune_cuda(x, n, m, method, dim, rescale, generator, eps)
        if impl == "cuda":
            where = "a CPU tensor" if not x.is_cuda else "this build"
            raise RuntimeError(
                f"the CUDA kernel of nm_prune is not available for {where} "
                f"(expected module {_CUDA_MODULE}); use impl='ref' or impl='auto'"
            )
    return nm_prune_ref(x, n, m, method, dim, rescale, generator, eps=eps)


PAIRWISE_MAX_M = 8  # groups up to this size are ranked by pairwise comparisons, larger by sort


def _as_oci(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` as (O, C, I): dims before ``dim``, ``dim``, dims after (a view when contiguous)."""
    o = math.prod(t.shape[:dim])
    i = math.prod(t.shape[dim + 1 :])
    return t.reshape(o, t.shape[dim], i)


def _better(a: torch.Tensor, b: torch.Tensor, descending: bool) -> torch.Tensor:
    return a > b if descending else a < b


def _keep_grouped(s3: torch.Tensor, n: int, m: int, descending: bool) -> torch.Tensor:
    """Keep mask of (O, C, I) scores, groups of m along C; contiguous bool (O, C, I)."""
    o, c, i = s3.shape
    groups = -(-c // m)
    pad = groups * m - c
    if pad:  # the padding ranks last: never kept while a real element is left
        s3 = F.pad(s3, (0, 0, 0, pad), value=-math.inf if descending else math.inf)
    s4 = s3.reshape(o, groups, m, i)
    has_nan = s4.is_floating_point() and bool(torch.isnan(s4).any())
    if m <= PAIRWISE_MAX_M and not has_nan:
        # Position of element k in a stable sort: the elements strictly better than it, plus
        # the equal ones at a lower index. Keep it when that position is < n.
        cols = [s4[:, :, k] for k in range(m)]
        keep_cols = []
        for k in range(m):
            rank = torch.zeros(cols[k].shape, dtype=torch.uint8, device=s4.device)
            for j in range(m):
                if j < k:
                    rank += ~_better(cols[k], cols[j], descending)  # s_j better or equal
                elif j > k:
                    rank += _better(cols[j], cols[k], descending)
            keep_cols.append(rank < n)
        keep = torch.stack(keep_cols, dim=2)
    else:
        # NaN ranks above every number (torch.sort's order), ties keep the lower index.
        last = s4.transpose(2, 3).contiguous()
        order = torch.sort(last, dim=-1, descending=descending, stable=True).indices
        keep_last = torch.zeros(last.shape, dtype=torch.bool, device=s4.device)
        keep_last.scatter_(-1, order[..., :n], True)
        keep = keep_last.transpose(2, 3)
    return keep.reshape(o, groups * m, i)[:, :c].contiguous()


def nm_keep_mask(
    scores: torch.Tensor, n: int, m: int, dim: int = -1, *, descending: bool = True
) -> torch.Tensor:
    """Boolean mask keeping, of every ``m`` consecutive ``scores`` along ``dim``, the ``n`` best.

    Best = largest (``descending=True``); ties go to the lowest index, and NaN ranks above
    every number (the order of ``torch.sort(..., stable=True)``). A partial last group of
    ``r < m`` elements keeps ``min(n, r)``. Same shape as ``scores`` (floating point),
    contiguous.
    """
    check_nm(n, m)
    dim = dim % scores.dim()
    keep = _keep_grouped(_as_oci(scores, dim), n, m, descending)
    return keep.reshape(scores.shape)


def _random_scores(x: torch.Tensor, dim: int, generator: torch.Generator | None) -> torch.Tensor:
    """Uniform scores for ``x``, (O, C, I)-shaped, drawn in the order of ``x.movedim(dim, -1)``.

    float64 uniforms: a tie between two of a group's scores (which the lowest-index rule
    would break toward the lower index, a bias) has probability ~m^2 / 2^53 per group. The
    draw order does not depend on the memory format of ``x``.
    """
    o = math.prod(x.shape[:dim])
    i = math.prod(x.shape[dim + 1 :])
    c = x.shape[dim]
    gen_device = generator.device if generator is not None else x.device
    u = torch.rand((o, i, c), generator=generator, dtype=torch.float64, device=gen_device)
    return u.to(x.device).transpose(1, 2)


def nm_prune_ref(
    x: torch.Tensor,
    n: int,
    m: int,
    method: str = "rescaled",
    dim: int = 1,
    rescale: str = "plane",
    generator: torch.Generator | None = None,
    *,
    eps: float = RESCALE_EPS,
) -> torch.Tensor:
    """The reference (torch) implementation of :func:`nm_prune`; it defines the op.

    Vectorised over a logical (O, C, I) view of ``x`` (dims before ``dim``, ``dim``, dims
    after): scores are ``|x|``, or float64 uniforms for ``random``, drawn in the logical
    order of ``x.movedim(dim, -1)`` so that the memory format does not change the draw; in
    each group the ``n`` best scores are kept (ties: lowest index). Groups of up to 8 are
    ranked by pairwise comparisons, larger ones by a stable sort (same result). Rescaling
    accumulates in float32 (float64 for float64 inputs); a plane or channel with nothing
    kept stays zero.
    """
    check_nm(n, m)
    check_method(method, rescale)
    dim = _check_tensor(x, dim)
    if x.numel() == 0:
        return x.clone()
    x3 = _as_oci(x, dim)  # a view of contiguous NCHW; a logical-order copy otherwise
    scores = _random_scores(x, dim, generator) if method == "random" else x3.abs()
    keep = _keep_grouped(scores, n, m, descending=True)
    y = torch.where(keep, x3, torch.zeros((), dtype=x.dtype, device=x.device)).reshape(x.shape)
    if method == "rescaled":
        xl = x3.reshape(x.shape)
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        if rescale == "plane" and dim != 0 and x.dim() > 1:
            reduce = [d for d in range(x.dim()) if d not in (0, dim)]
        else:  # "channel" (or no separate batch dim): every dim but the grouping one
            reduce = [d for d in range(x.dim()) if d != dim]
        if reduce:
            sx = xl.abs().sum(dim=reduce, keepdim=True, dtype=acc)
            sy = y.abs().sum(dim=reduce, keepdim=True, dtype=acc)
        else:
            sx, sy = xl.abs().to(acc), y.abs().to(acc)
        # A plane with nothing kept stays zero (also when eps = 0, where 0/0 would be NaN).
        scale = torch.where(sy > 0, sx / (sy + eps), torch.zeros((), dtype=acc, device=x.device))
        y = (y.to(acc) * scale).to(x.dtype)
    out = torch.empty_like(x)  # preserve_format: keeps NCHW / channels-last strides
    out.copy_(y)
    return out


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
        # The very call nn.Conv2d makes, so the output is bit-identical.
        out = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
        ctx.save_for_backward(x, weight)
        ctx.conv_args = (stride, int_padding, dilation, groups)
        ctx.bias_shape = None if bias is None else list(bias.shape)
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.prune = prune
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conv_args
        in_dtype, w_dtype = x.dtype, weight.dtype
        if grad_out.dtype != x.dtype or grad_out.dtype != weight.dtype:
            # Under autocast the conv ran in grad_out's dtype on cast copies of x and weight:
            # compute the gradients in that dtype and hand them back in the leaves' dtypes.
            x, weight = x.to(grad_out.dtype), weight.to(grad_out.dtype)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            pruned = ctx.prune(grad_out)
            grad_x = torch.nn.grad.conv2d_input(
                x.shape, weight, pruned, stride, padding, dilation, groups
            )
        want_w = ctx.needs_input_grad[1]
        want_b = ctx.bias_shape is not None and ctx.needs_input_grad[2]
        if want_w or want_b:
            # Weight and bias gradients from the dense output gradient, in one call as the
            # dense conv's own backward does.
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

    Forward is the original conv, bit for bit. The weight and bias are the original module's
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
            device="meta",  # nothing allocated or initialised: the parameters are conv's
            dtype=conv.weight.dtype,
        )
        new.weight = conv.weight
        new.bias = conv.bias
        new.train(conv.training)
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
        check_nm(n, m)
        check_method(method, rescale)
        self.n, self.m, self.prune_method, self.rescale = n, m, method, rescale
        self.generator, self.eps = generator, eps
        self.reset_stats()

    def reset_stats(self) -> None:
        """Forget the L1 sums accumulated by :meth:`prune_grad`."""
        self._l1_dense: torch.Tensor | float = 0.0
        self._l1_pruned: torch.Tensor | float = 0.0
        self.prune_calls = 0

    def l1_ratio(self) -> float:
        """sum|pruned dL/dO| / sum|dense dL/dO| since the last reset (NaN before any backward)."""
        if self.prune_calls == 0:
            return float("nan")
        return float(self._l1_pruned) / max(float(self._l1_dense), 1e-30)

    def prune_grad(self, grad_out: torch.Tensor) -> torch.Tensor:
        """The pruned output gradient used for dL/dD (channels = dim 1)."""
        pruned = nm_prune(
            grad_out,
            self.n,
            self.m,
            self.prune_method,
            dim=1,
            rescale=self.rescale,
            generator=self.generator,
            eps=self.eps,
        )
        with torch.no_grad():  # device-side sums: no host sync per step
            self._l1_dense = self._l1_dense + grad_out.abs().sum(dtype=torch.float64)
            self._l1_pruned = self._l1_pruned + pruned.abs().sum(dtype=torch.float64)
        self.prune_calls += 1
        return pruned

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return super().forward(input)
        padding: Any = self.padding
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding = (0, 0)
            int_padding = (0, 0)
        else:
            int_padding = self._int_padding
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
    reconfigured. For ``method="random"`` all layers draw from one ``generator``; when none is
    given one is created on the model's device and seeded with ``seed``.

    ``backend="semi_structured"`` converts to :class:`impl.methods.sdgp_semi.SDGPSemiConv2d`
    (dL/dD on 2:4 sparse tensor cores where the library runs, this reference elsewhere, with
    the reason logged).

    Returns ``model``; :func:`sdgp_plan` (same arguments) lists the layers left dense.
    """
    check_nm(n, m)
    check_method(method, rescale)
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
    if generator is None and method == "random":
        param = next(model.parameters(), None)
        device = param.device if param is not None else torch.device("cpu")
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
    for plan in plans:
        mod = model.get_submodule(plan.name)
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
            this Trainer's gradients are unscaled (module docstring); pass 1e-4 for the
            literal constant.
        prune_seed: seed of the random-pruning generator; ``None`` uses the run's seed.
        profile: at the end of the run, time every conv's forward, data-gradient and
            weight-gradient passes and the pruning (Fig. 9) and write the paper's estimate.
        profile_repeats: timed repeats per measurement (median; one warm-up before).
        backend: ``reference`` (``conv2d_input`` on the pruned dL/dO) or ``semi_structured``
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

    def validate(self, train_config: Any) -> None:
        """Check n, m, the pruning function, the rescale and nondivisible rules."""
        c = self.config
        check_nm(c.n, c.m)
        check_method(c.prune_method, c.rescale)
        if c.nondivisible not in NONDIVISIBLE_RULES:
            raise ValueError(
                f"unknown nondivisible {c.nondivisible!r}; valid: {', '.join(NONDIVISIBLE_RULES)}"
            )
        if not c.rescale_eps >= 0:
            raise ValueError(f"rescale_eps must be >= 0; got {c.rescale_eps}")
        if c.profile_repeats < 1:
            raise ValueError(f"profile_repeats must be >= 1; got {c.profile_repeats}")
        if c.backend not in BACKENDS:
            raise ValueError(f"unknown backend {c.backend!r}; valid: {', '.join(BACKENDS)}")

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
        """Reset the per-layer L1 statistics."""
        for mod in sdgp_modules(ctx.model).values():
            mod.reset_stats()

    def epoch_metrics(self, ctx: TrainContext) -> dict[str, Any]:
        """Mean over layers of sum|pruned dL/dO| / sum|dense dL/dO| this epoch."""
        ratios = [r for r in (v.l1_ratio() for v in sdgp_modules(ctx.model).values())]
        ratios = [r for r in ratios if not math.isnan(r)]
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
        }
        if c.backend == "semi_structured":
            from impl.methods.sdgp_semi import semi_summary

            out.update(semi_summary(ctx.model))
        if c.profile:
            from impl.methods.sdgp_timing import time_accounting

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
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        """The random-pruning generator's state (a uint8 tensor)."""
        if self.generator is None:
            return {}
        return {"generator_state": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any], ctx: TrainContext) -> None:
        """Restore the generator; (re)convert ``ctx.model`` if ``setup`` has not done it."""
        if self.generator is None or not sdgp_modules(ctx.model):
            self.setup(ctx)
        if "generator_state" in state and self.generator is not None:
            self.generator.set_state(state["generator_state"].to(torch.uint8).cpu())


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
    "check_method",
    "check_nm",
    "data_grad_density",
    "nm_keep_mask",
    "nm_prune",
    "nm_prune_ref",
    "sdgp_convert",
    "sdgp_modules",
    "sdgp_plan",
]
