"""N:M pruning along one dimension: SDGP's pruning of output data gradients (the op).

McDanel, Dinh and Magallanes, "Accelerating DNN Training with Structured Data Gradient
Pruning" (2022), Sec. III-A (Algorithm 1) and III-B. :func:`nm_prune` keeps ``n`` of every
``m`` consecutive elements along ``dim``; :func:`nm_prune_ref` is its torch reference, which
defines the op, :mod:`impl.ops.nm_cuda` its CUDA path and :mod:`impl.ops.nm_cpu` its compiled
CPU path. The method that applies it to every convolution's dL/dO during training is
:mod:`impl.methods.sdgp`.

Three pruning functions (Sec. III-B):

* ``random``: keep ``n`` of every ``m`` elements chosen uniformly at random (every n-subset
  of a group equally likely; the authors' kernel shuffles with a biased swap, this does not);
* ``magnitude``: keep the ``n`` largest ``|x|`` of every group; ties go to the lowest index;
* ``rescaled``: magnitude, then rescale the kept values so that the L1 norm is preserved.
  ``rescale="plane"`` (default) is the rule of the authors' code, per (sample, channel)
  plane over the spatial dims: ``y *= sum_hw |x| / (sum_hw |y| + eps)`` with ``eps=1e-4``;
  ``rescale="channel"`` is the rule of the paper's text (Sec. III-B, Fig. 4 caption), per
  channel over the batch and spatial dims, with the same ``eps``.

:func:`nm_prune` keeps the authors' literal ``eps=1e-4`` as its default; on unscaled fp32
gradients that constant is not negligible, and the SDGP method uses ``1e-4 / 2**16`` instead
(:data:`impl.methods.sdgp.METHOD_RESCALE_EPS`, whose docstring says why).

Groups are ``m`` consecutive elements along ``dim`` (the channel dim of NCHW gradients; the
authors run channels-last so a group is contiguous). **When the length of ``dim`` is not a
multiple of ``m``** the last, partial group of ``r < m`` elements is treated as a full group
padded with ``m - r`` elements that can never be kept (magnitude score ``-inf``): it keeps
``min(n, r)`` of its ``r`` elements. For magnitude pruning this is what an N:M kernel computes
on a tensor padded to a multiple of ``m`` with elements it never keeps; random pruning draws
its ``min(n, r)`` among the ``r`` real elements (a padded random kernel would sometimes keep a
padding slot). Groups never span another axis.
"""

from __future__ import annotations

import importlib
import math
import threading
from typing import Any

import torch
import torch.nn.functional as F

from impl.ops import nm_cpu

PRUNE_METHODS: tuple[str, ...] = ("random", "magnitude", "rescaled")
RESCALE_RULES: tuple[str, ...] = ("plane", "channel")
IMPLS: tuple[str, ...] = ("auto", "ref", "cuda", "cpu")
MAX_GROUP = 32  # the authors' kernel keeps one group per thread in registers, m <= 32
RESCALE_EPS = 1e-4  # the constant of the authors' rescale rule

# The CUDA implementation of nm_prune. It defines ``is_available(device) -> bool`` and
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
    """Raise ``ValueError`` on an unknown pruning function or rescale rule (names the valid).

    Both are always checked: an unknown ``rescale`` is refused even with a ``method`` that
    does not rescale (a misspelt rule fails at once, not when the method changes)."""
    if method not in PRUNE_METHODS:
        raise ValueError(
            f"unknown N:M pruning function {method!r} (prune_method); "
            f"valid: {', '.join(PRUNE_METHODS)}"
        )
    if rescale not in RESCALE_RULES:
        raise ValueError(
            f"unknown rescale rule {rescale!r} (rescale); valid: {', '.join(RESCALE_RULES)}"
        )


def check_eps(eps: float, name: str = "eps") -> None:
    """Raise ``ValueError`` unless ``eps`` (the rescale denominator's additive constant, Sec.
    III-B) is a finite real number >= 0: a negative one can divide by zero or flip a sign,
    a NaN makes every rescaled value NaN, an infinite one every value zero. ``name`` names
    it in the message."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < math.inf:
        raise ValueError(f"{name} must be a finite number >= 0; got {eps!r}")


def check_generator(generator: torch.Generator | None) -> None:
    """Raise ``TypeError`` unless ``generator`` (the random source of ``method="random"``) is
    a ``torch.Generator`` or None."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {generator!r}")


def check_options(
    n: int,
    m: int,
    method: str,
    rescale: str,
    eps: float,
    generator: torch.Generator | None = None,
) -> None:
    """The checks of :func:`nm_prune`'s options, for every path and for a layer configured
    with them (:func:`check_nm`, :func:`check_method`, :func:`check_eps`,
    :func:`check_generator`): ``ValueError`` (``TypeError`` for the generator)."""
    check_nm(n, m)
    check_method(method, rescale)
    check_eps(eps)
    check_generator(generator)


def check_prune_args(
    x: torch.Tensor,
    n: int,
    m: int,
    method: str,
    dim: int,
    rescale: str,
    eps: float,
    generator: torch.Generator | None = None,
) -> int:
    """``dim`` as a non-negative index after :func:`check_options` and the check of ``x`` (a
    floating tensor outside autograd with ``dim`` in range): what every path of
    :func:`nm_prune` checks before it touches ``x``."""
    check_options(n, m, method, rescale, eps, generator)
    return _check_tensor(x, dim)


def _check_tensor(x: torch.Tensor, dim: int) -> int:
    """``dim`` as a non-negative index after checking ``x`` (a floating tensor with a dim to
    group along, not part of an autograd graph) and ``dim``; ``ValueError`` otherwise."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a floating-point torch.Tensor; got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(
            f"x must be a floating-point tensor (float16, bfloat16, float32, float64); "
            f"got {x.dtype}"
        )
    if x.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            "nm_prune works on gradients outside autograd (it is not differentiable); x "
            "requires grad: pass x.detach(), or call it under torch.no_grad()"
        )
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension to group along")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be an int in [{-x.dim()}, {x.dim() - 1}]; got {dim!r}")
    return dim % x.dim()


# --------------------------------------------------------------------------------------------
# the op
# --------------------------------------------------------------------------------------------
def _load_cuda(device: torch.device) -> Any | None:
    """The CUDA implementation module, or ``None`` when it is absent or cannot run on GPU
    ``device``."""
    try:
        mod = importlib.import_module(_CUDA_MODULE)
    except ModuleNotFoundError as err:
        if err.name is not None and _CUDA_MODULE.startswith(err.name):
            return None
        raise
    return mod if mod.is_available(device) else None


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
        x: a floating-point tensor (any layout; the output keeps the input's memory format).
            Not modified. Not part of an autograd graph: SDGP prunes gradients, so pass
            ``x.detach()`` (or call under ``torch.no_grad()``) for a tensor that requires
            grad. NCHW and channels-last give bit-identical results on the CPU (the
            reference, ``impl="ref"``, and the compiled kernel, which prunes a contiguous
            copy), for every ``method``; the compiled kernel keeps the reference's positions
            and, but for ``"rescaled"`` (last bits, :data:`impl.ops.nm_cpu.RESCALE_RTOL`), its
            values. On the CUDA path they keep the same positions (bit for bit for
            ``"magnitude"``, the same draw for ``"random"``); ``"rescaled"`` values may
            differ in the last bits between layouts and from the reference (the factors'
            sums run in the kernel's order: float32 rounding of the factor; docs/kernels.md
            gives the bound the GPU tests check).
        n: elements kept per group, ``1 <= n <= m``.
        m: group size, ``m <= 32``.
        method: ``"random"``, ``"magnitude"`` or ``"rescaled"`` (rescaled magnitude).
        dim: the grouping dimension (1: the channels of an NCHW tensor).
        rescale: ``"plane"`` (authors' code: per sample and channel, over the other dims) or
            ``"channel"`` (paper text: per channel, over every other dim). Used only when
            ``method == "rescaled"``, but validated always: an unknown name raises
            ``ValueError`` with every ``method``.
        generator: the random source of ``method="random"`` (reproducible draws); ``None``
            uses torch's global generator.
        impl: ``"auto"`` (the CUDA kernel for CUDA tensors, the compiled CPU kernel of
            :mod:`impl.ops.nm_cpu` for CPU tensors, each where it is available and applies;
            the reference otherwise), ``"ref"``, ``"cuda"`` or ``"cpu"`` (the compiled CPU
            kernel; the reference for what it does not take: other dtypes, NaN magnitudes).
        eps: the additive constant of the rescale denominator (authors: ``1e-4``).

    Returns:
        A new tensor of ``x``'s shape, dtype, device and memory format, with at most ``n``
        nonzeros per group.

    Raises:
        ValueError: ``n``/``m`` outside ``1 <= n <= m <= 32``, a non-floating ``x``, an
            ``x`` that requires grad while grad mode is on, a bad ``dim``, an unknown
            ``method``, ``rescale`` (whatever the method) or ``impl``, an ``eps`` that is
            not a finite number >= 0, an ``x`` under a ``torch.func`` transform (vmap).
        TypeError: a ``generator`` that is not a ``torch.Generator``.
        RuntimeError: ``impl="cuda"`` where the CUDA kernel is not available, ``impl="cpu"``
            for a tensor not on the CPU or where the compiled CPU kernel does not build.

    A meta or fake ``x`` (shape inference, torch.compile's tracing) gives an empty tensor of
    the result's shape, dtype and layout, as the CUDA op's fake implementation does.
    """
    dim = check_prune_args(x, n, m, method, dim, rescale, eps, generator)
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; valid: {', '.join(IMPLS)}")
    if impl == "cpu" and x.device.type != "cpu":
        raise RuntimeError(
            f"the compiled CPU path of nm_prune takes CPU tensors, got a tensor on "
            f"{x.device.type}; use impl='auto'"
        )
    if impl == "cuda" and not x.is_cuda:
        raise RuntimeError(
            f"the CUDA kernel of nm_prune is not available for a CPU tensor (expected module "
            f"{_CUDA_MODULE}); use impl='ref' or impl='auto'"
        )
    if not x.is_cuda and not nm_cpu.has_storage(x):  # (CUDA tensors: the op's own fake)
        from torch._subclasses.fake_tensor import is_fake

        if x.device.type == "meta" or is_fake(x):  # tracing: the result's shape alone
            return torch.empty_like(x)  # as the CUDA op's fake implementation
        raise ValueError(
            "nm_prune does not run under torch.func transforms (vmap, grad): its groups are "
            "ranked with data-dependent branches; call it on the whole batched tensor"
        )
    if impl in ("auto", "cpu") and not x.is_cuda:
        return _prune_cpu(x, n, m, method, dim, rescale, generator, eps, impl=impl)[0]
    if impl != "ref":
        cuda = _load_cuda(x.device) if x.is_cuda else None
        if cuda is not None:
            return cuda.nm_prune_cuda(x, n, m, method, dim, rescale, generator, eps)
        if impl == "cuda":
            where = "a CPU tensor" if not x.is_cuda else "this build"
            raise RuntimeError(
                f"the CUDA kernel of nm_prune is not available for {where} "
                f"(expected module {_CUDA_MODULE}); use impl='ref' or impl='auto'"
            )
    return nm_prune_ref(x, n, m, method, dim, rescale, generator, eps=eps)


# Groups up to this size are ranked by pairwise comparisons (every group: m <= 32), larger ones
# by a stable sort (same result; the sort also ranks scores that hold a NaN).
PAIRWISE_MAX_M = MAX_GROUP
# The integer dtype of a float's width: a bitwise AND of the bits with all-ones or all-zeros
# keeps a value exactly (NaN, infinities and -0.0 included) or makes it +0.0, as torch.where.
_BITS = {torch.float64: torch.int64, torch.float32: torch.int32}


def _as_oci(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` as (O, C, I): dims before ``dim``, ``dim``, dims after (a view when contiguous)."""
    o = math.prod(t.shape[:dim])
    i = math.prod(t.shape[dim + 1 :])
    return t.reshape(o, t.shape[dim], i)


def _better(a: torch.Tensor, b: torch.Tensor, descending: bool) -> torch.Tensor:
    return a > b if descending else a < b


def _may_have_nan(s: torch.Tensor) -> bool:
    """Whether floating ``s`` has a NaN: one sum (NaN propagates through it), then, only when
    the sum is NaN (a NaN, or infinities of both signs), the exact elementwise check."""
    if not s.is_floating_point():
        return False
    return bool(torch.isnan(s.sum())) and bool(torch.isnan(s).any())


def _group_ranks(s4: torch.Tensor, rank: torch.Tensor, descending: bool) -> None:
    """Write into uint8 ``rank`` each element's position in a stable sort of its group.

    ``s4`` is (O, G, k, I) NaN-free scores, a group being the k elements along dim 2; position
    = the elements strictly better, plus the equal ones at a lower index (so ties go to the
    lowest index). Every pair of a group is compared once: for each offset ``d`` one
    comparison of elements ``j + d`` and ``j`` for all ``j`` at once.
    """
    k = s4.shape[2]
    rank.zero_()
    for d in range(1, k):
        later_wins = _better(s4[:, :, d:], s4[:, :, : k - d], descending).view(torch.uint8)
        rank[:, :, : k - d] += later_wins
        rank[:, :, d:] += 1 - later_wins  # the lower index wins ties


def _stable_ranks(s3: torch.Tensor, m: int, descending: bool) -> torch.Tensor:
    """Position of each of (O, C, I) NaN-free scores in a stable sort of its group of ``m``
    along C, as contiguous uint8 (O, C, I). A partial last group of ``r < m`` elements is ranked
    among its own elements, which is its ranking when padded with elements that never win."""
    o, c, i = s3.shape
    rank = torch.empty((o, c, i), dtype=torch.uint8, device=s3.device)
    full = c - c % m
    if full:
        g = full // m
        _group_ranks(s3[:, :full].reshape(o, g, m, i), rank[:, :full].view(o, g, m, i), descending)
    if full < c:
        _group_ranks(s3[:, full:].unsqueeze(1), rank[:, full:].unsqueeze(1), descending)
    return rank


_SCRATCH = threading.local()  # per thread: {name: flat buffer}, see _scratch


def _scratch(name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
    """A contiguous tensor of ``shape`` whose contents are undefined, for a temporary value.

    On the CPU it is a view of a buffer kept per thread and ``name`` (grown when too small),
    so a temporary of several MB costs no allocation per call: the operating system hands
    large blocks back and forth with page faults on every first touch, which on these sizes
    costs more than the arithmetic. A caller must be done with the view before the next call
    with the same name. Elsewhere it is a new tensor.
    """
    numel = math.prod(shape)
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    buffers = getattr(_SCRATCH, "buffers", None)
    if buffers is None:
        buffers = _SCRATCH.buffers = {}
    buf = buffers.get((name, dtype))
    if buf is None or buf.numel() < numel:
        buf = buffers[(name, dtype)] = torch.empty(numel, dtype=dtype)
    return buf[:numel].view(shape)


def _keep_bits_mask(keys: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """All-ones where a score is among the ``n`` best of its group of ``m``, zero elsewhere.

    ``keys`` are (O, C, I) nonnegative, NaN-free float scores viewed as their integer bits
    (int32 for float32, int64 for float64), which order like the floats (``+inf`` last).
    Same groups, order and ties as :func:`_stable_ranks` (the lowest index wins): element
    ``j`` of a group starts at ``j - n`` (it loses every tie to a lower index), and for each
    pair ``j < k`` one comparison ``key_j < key_k`` (0 or 1, written as the keys' integer
    type) moves one rank from ``k`` to ``j``; an element is kept where its rank ends below
    zero, and the sign bit spread by an arithmetic shift is the mask. A group of no more than
    ``n`` elements (a partial last group, or every group when ``n == m``) keeps all without a
    comparison. Per offset ``d`` of the pairs: one comparison and two in-place updates over
    the whole tensor, so the operator count grows with ``m``, not with the size.

    Returns contiguous (O, C, I) of the keys' dtype: -1 where kept, 0 elsewhere.
    """
    o, c, i = keys.shape
    dtype, dev = keys.dtype, keys.device
    rank = _scratch("rank", (o, c, i), dtype, dev)
    full = c - c % m
    spans = [(0, full, m)] if full else []
    if full < c:
        spans.append((full, c, c - full))
    for lo, hi, k in spans:
        if k <= n:  # every element of these groups is kept
            rank[:, lo:hi].fill_(-1)
            continue
        g = (hi - lo) // k
        s4 = keys[:, lo:hi].reshape(o, g, k, i)
        r4 = rank[:, lo:hi].view(o, g, k, i)
        r4.copy_(torch.arange(-n, k - n, dtype=dtype, device=dev).view(k, 1))
        for d in range(1, k):
            later_wins = _scratch("pair", (o, g, k - d, i), dtype, dev)
            torch.lt(s4[:, :, : k - d], s4[:, :, d:], out=later_wins)  # 1: j + d scores higher
            r4[:, :, : k - d] += later_wins
            r4[:, :, d:] -= later_wins
    shift = torch.tensor(keys.element_size() * 8 - 1, dtype=dtype, device=dev)
    return torch.bitwise_right_shift(rank, shift, out=rank)


def _keep_grouped(s3: torch.Tensor, n: int, m: int, descending: bool) -> torch.Tensor:
    """Keep mask of (O, C, I) scores, groups of m along C; contiguous bool (O, C, I)."""
    if m <= PAIRWISE_MAX_M and not _may_have_nan(s3):
        return _stable_ranks(s3, m, descending) < n
    o, c, i = s3.shape
    groups = -(-c // m)
    pad = groups * m - c
    if pad:  # the padding ranks last: never kept while a real element is left
        s3 = F.pad(s3, (0, 0, 0, pad), value=-math.inf if descending else math.inf)
    s4 = s3.reshape(o, groups, m, i)
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
    if scores.dim() == 0:
        raise ValueError("scores must have at least one dimension (the groups run along dim)")
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
    each group the ``n`` best scores are kept (ties: lowest index). Groups are ranked by
    pairwise comparisons, or by a stable sort when a score is NaN (same result). Rescaling
    accumulates in float32 (float64 for float64 inputs); a plane or channel with nothing kept
    stays zero. A strided ``x`` (channels-last) is pruned as its contiguous copy and the
    result takes its layout, so the memory format changes neither the sums nor the values.
    """
    dim = check_prune_args(x, n, m, method, dim, rescale, eps, generator)
    return _prune_ref(x, n, m, method, dim, rescale, generator, eps, stats=False)[0]


def _rescale_dims(x: torch.Tensor, dim: int, rescale: str) -> list[int]:
    """The dims each rescale factor sums over (see the module docstring)."""
    if rescale == "plane" and dim != 0 and x.dim() > 1:
        return [d for d in range(x.dim()) if d not in (0, dim)]
    return [d for d in range(x.dim()) if d != dim]  # "channel", or no separate batch dim


def _prune_ref(
    x: torch.Tensor,
    n: int,
    m: int,
    method: str,
    dim: int,
    rescale: str,
    generator: torch.Generator | None,
    eps: float,
    stats: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """:func:`nm_prune_ref` on checked arguments, and with ``stats`` the float64 sums
    ``sum|x|`` and ``sum|y|`` (``None`` where the general path ran: compute them apart)."""
    if x.numel() == 0:
        return x.clone(), None, None
    if not x.is_contiguous():
        # Prune the contiguous copy, so that every layout (channels-last) gets the contiguous
        # result bit for bit (the rescale sums of a strided tensor would be reduced in another
        # order; the mask is layout independent) and the fast path runs rather than the
        # general path's many passes.
        out, sum_x, sum_y = _prune_ref(
            x.contiguous(), n, m, method, dim, rescale, generator, eps, stats
        )
        return torch.empty_like(x).copy_(out), sum_x, sum_y
    fast = _prune_ref_fast(x, n, m, method, dim, rescale, generator, eps, stats)
    if fast is not None:
        return fast
    x3 = _as_oci(x, dim)  # a view: x is contiguous here
    scores = _random_scores(x, dim, generator) if method == "random" else x3.abs()
    keep = _keep_grouped(scores, n, m, descending=True)
    y = torch.where(keep, x3, torch.zeros((), dtype=x.dtype, device=x.device)).reshape(x.shape)
    if method == "rescaled":
        xl = x3.reshape(x.shape)
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        reduce = _rescale_dims(x, dim, rescale)
        if reduce:
            sx = xl.abs().sum(dim=reduce, keepdim=True, dtype=acc)
            sy = y.abs().sum(dim=reduce, keepdim=True, dtype=acc)
        else:
            sx, sy = xl.abs().to(acc), y.abs().to(acc)
        # A plane with nothing kept stays zero (also when eps = 0, where 0/0 would be NaN).
        scale = torch.where(sy > 0, sx / (sy + eps), torch.zeros((), dtype=acc, device=x.device))
        y = (y.to(acc) * scale).to(x.dtype)
    return y, None, None  # contiguous, as x is here


def _prune_cpu(
    x: torch.Tensor,
    n: int,
    m: int,
    method: str,
    dim: int,
    rescale: str,
    generator: torch.Generator | None,
    eps: float,
    *,
    impl: str = "auto",
    stats: bool = False,
    option: str = "impl",
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, str]:
    """:func:`nm_prune`'s dispatch for a tensor off the GPU, on checked arguments:
    ``(y, l1_x, l1_y, path)``, by the compiled kernel (``path == "cpu kernel"``) where
    ``impl`` (``"auto"``, ``"cpu"``; ``"ref"`` skips it) allows it and it applies, else by the
    reference (``"reference"``; the sums ``None`` where it does not have them at hand).
    The result takes ``x``'s layout. ``impl="cpu"`` raises ``RuntimeError`` where the
    kernel cannot build; ``option`` names the setting in that message, and in the
    ``ValueError`` for an ``impl`` that is unknown or ``"cuda"`` (which a tensor off the GPU
    cannot take: :func:`nm_prune` refuses it the same way)."""
    if impl not in IMPLS:
        raise ValueError(f"unknown {option} {impl!r}; valid: {', '.join(IMPLS)}")
    if impl == "cuda":
        raise ValueError(
            f"{option}='cuda' needs CUDA tensors, got one on {x.device.type}; use {option}='auto'"
        )
    if impl in ("auto", "cpu"):
        compiled = nm_cpu.nm_prune_cpu(x, n, m, method, dim, rescale, generator, eps, stats)
        if compiled is not None:
            return (*compiled, "cpu kernel")
        if impl == "cpu" and not nm_cpu.is_available():
            raise RuntimeError(
                f"{option}='cpu': the compiled CPU path of nm_prune is not available "
                f"({nm_cpu.unavailable_reason()}); use {option}='ref' or {option}='auto'"
            )
    return (*_prune_ref(x, n, m, method, dim, rescale, generator, eps, stats), "reference")


# Elements of x the fast path handles at once on the CPU (a slice of whole samples, 2 MB of
# float32): its temporaries then stay in the CPU's last-level cache instead of streaming through
# memory several times (measured on ResNet-20 gradients: 8.2 ms per 2M-element call against
# 10.3 unsliced and 10.0 with slices of 2**17).
CHUNK_ELEMENTS = 1 << 19


def _slice_rows(o: int, plane: int, sliced: bool, device: torch.device) -> int:
    """Rows of the ``[o, plane]`` tensor the fast path handles at once: about
    :data:`CHUNK_ELEMENTS` elements on the CPU where the sums allow slicing, else all ``o``.
    On a GPU slicing only multiplies launches (a dozen or more kernels per slice, and a
    host-device sync for the NaN check), and its caches are no reason to cut the work."""
    if not sliced or device.type != "cpu":
        return o
    return max(1, CHUNK_ELEMENTS // max(plane, 1))


def _prune_ref_fast(
    x: torch.Tensor,
    n: int,
    m: int,
    method: str,
    dim: int,
    rescale: str,
    generator: torch.Generator | None,
    eps: float,
    stats: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:
    """The general path's result, bit for bit, in fewer passes over memory; ``None`` where it
    does not apply (``x`` not contiguous, not float32/float64, NaN magnitudes, groups ranked
    by sort, or a rescale without a dim to sum over).

    The same operations on tensors of the same layout: ``|x|``, the ranking of
    :func:`_stable_ranks` done by :func:`_keep_bits_mask`, the pruned values by a bitwise AND
    with its all-ones or all-zeros mask (exactly ``torch.where(keep, x, 0)``), the rescale
    sums over ``|x|`` and its masked copy (exactly ``|y|``), and ``y * scale`` in place. When
    every sum stays within one index of the dims before ``dim`` (magnitude, random, and the
    plane rule on dim 1) this runs on slices of about :data:`CHUNK_ELEMENTS` elements: the
    same per-plane sums, elementwise steps and groups (on the CPU only:
    :func:`_slice_rows`). With ``stats``, ``sum|x|`` and
    ``sum|y|`` of ``|x|`` and ``|y * scale| == |y| * scale`` (``scale >= 0``), each summed
    whole as ``t.sum(dtype=torch.float64)`` does: in one slice that very sum, over slices a
    sum of float64 copies gathered from every slice.
    """
    bits = _BITS.get(x.dtype)
    rescaled = method == "rescaled"
    reduce = _rescale_dims(x, dim, rescale) if rescaled else []
    if bits is None or not x.is_contiguous() or m > PAIRWISE_MAX_M or (rescaled and not reduce):
        return None
    x3 = _as_oci(x, dim)  # a view
    o, c, i = x3.shape
    sliced = not rescaled or (dim == 1 and 0 not in reduce)
    step = _slice_rows(o, c * i, sliced, x.device)
    scores = _random_scores(x, dim, generator) if method == "random" else None
    out = torch.empty_like(x)
    out3 = out.view(o, c, i)
    f64, dev = torch.float64, x.device
    # Over several slices the L1 sums are taken over float64 copies of the whole tensor, as one
    # sum of it does; in one slice, over the slice itself (the same sum of the same values).
    wide = stats and step < o
    wide_x = _scratch("l1_dense", (o, c, i), f64, dev) if wide else None
    wide_y = _scratch("l1_pruned", (o, c, i), f64, dev) if wide else None
    l1_x = l1_y = None
    zero = torch.zeros((), dtype=x.dtype, device=dev)
    for lo in range(0, o, step):
        hi = min(o, lo + step)
        xs = x3[lo:hi]
        a = torch.abs(xs, out=_scratch("abs", tuple(xs.shape), x.dtype, dev))
        if wide_x is not None:
            wide_x[lo:hi].copy_(a)
        elif stats:
            l1_x = a.sum(dtype=f64)
        if rescaled:
            al = a.view(x.shape if step == o else (hi - lo, *x.shape[1:]))
            sx = al.sum(dim=reduce, keepdim=True, dtype=x.dtype)
            if bool(torch.isnan(sx).any()):  # a NaN |x| (sums of |x| >= 0 are NaN only so)
                return None
        elif method == "magnitude" and bool(torch.isnan(a.sum() if l1_x is None else l1_x)):
            return None
        # Random keys are drawn transposed (see _random_scores): ranked in a contiguous copy.
        keys = a if scores is None else scores[lo:hi].contiguous()
        mask = _keep_bits_mask(keys.view(_BITS[keys.dtype]), n, m).to(bits)
        torch.bitwise_and(xs.view(bits), mask, out=out3[lo:hi].view(bits))
        if rescaled or stats:
            a.view(bits).bitwise_and_(mask)  # |y|
        if rescaled:
            sy = al.sum(dim=reduce, keepdim=True, dtype=x.dtype)
            scale = torch.where(sy > 0, sx / (sy + eps), zero)
            out3[lo:hi].view(al.shape).mul_(scale)
            if stats:
                al.mul_(scale)  # |y * scale|
        if wide_y is not None:
            wide_y[lo:hi].copy_(a)
        elif stats:
            l1_y = a.sum(dtype=f64)
    if wide_x is not None and wide_y is not None:
        return out, wide_x.sum(), wide_y.sum()
    return out, l1_x, l1_y


__all__ = [
    "IMPLS",
    "MAX_GROUP",
    "PRUNE_METHODS",
    "RESCALE_EPS",
    "RESCALE_RULES",
    "check_eps",
    "check_generator",
    "check_method",
    "check_nm",
    "check_options",
    "check_prune_args",
    "nm_keep_mask",
    "nm_prune",
    "nm_prune_ref",
]
