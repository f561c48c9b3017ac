"""SDGP's data gradient on 2:4 sparse tensor cores (torch semi-structured sparsity).

The SDGP paper (McDanel et al. 2022) never ran its pruned data gradient on sparse hardware: it
estimated the saving as the dense data-gradient time times ``n/m`` (Sec. IV-C, Fig. 9), because
"their use is not currently supported in deep learning frameworks such as PyTorch". PyTorch now
has 2:4 semi-structured sparse matrices (``torch.sparse.to_sparse_semi_structured``; cuSPARSELt
and CUTLASS kernels, fp16/bf16 on sm_80 and newer). This module computes SDGP's dL/dD with them.

The algebra (per conv, ``groups == 1``; NCHW names, K output channels, C input channels, an
R x S kernel, output Ho x Wo):

* ``A = prune_2:4(dL/dO)`` as an ``(N*Ho*Wo) x K`` matrix (rows = output pixels, the
  reduction over output channels K: exactly SDGP's groups of 4 consecutive channels, Sec. III-A
  and Fig. 2b, which is why the authors run channels-last);
* ``B = W`` viewed as ``K x (C*R*S)`` (dense);
* ``col = A @ B`` (``(N*Ho*Wo) x (C*R*S)``) on sparse tensor cores, ``A`` compressed first;
* ``dL/dD = fold(col)`` (col2im, ``F.fold``) for a general conv; for a 1x1 conv without
  padding ``col`` *is* dL/dD in NHWC (stride 1) or its strided sub-grid (stride > 1).

The weight gradient stays dense (SDGP Sec. III-A), computed exactly as the reference
(:class:`impl.methods.sdgp.SDGPConv2d`) computes it.

Where the library cannot run the product (a CPU tensor, a GPU older than sm_80, a ROCm build,
a dtype other than fp16/bf16, ``n:m`` other than 2:4, grouped convs, ``K`` not a multiple of
the backend's minimum, a library error at run time) the layer takes the reference path of
:mod:`impl.methods.sdgp` for that call, logs the reason once per layer and reason
(``logging.warning``) and lists it in the module's ``fallback_reasons``. The result is never
computed another way: the reference is the same pruning followed by the input gradient of
:func:`impl.methods.sdgp.conv_grad` (``aten.convolution_backward``, the math of
``torch.nn.grad.conv2d_input``).

Pruning runs on the ``(N, Ho*Wo, K)`` view of dL/dO (contiguous when dL/dO is channels-last;
for NCHW a strided view, read through one transpose copy) with the reference op
:func:`impl.ops.nm.nm_prune_ref` along the last dim, or the project's N:M CUDA kernel
(:mod:`impl.ops.nm_cuda`) where it loads. Along its last dim the ``(N, L, K)`` view has the
groups of ``nm_prune(dL/dO, dim=1)``, its ``rescale="plane"`` factors are the same per
(sample, channel) sums over the pixels, and the reference draws ``random`` scores in the same
order, so the masks equal the reference's (the CUDA kernel's ``random`` draw is its own). The
library's own fused prune-and-compress (``prune_dense_static_sort``) prunes 4x4 tiles 2:4 along
rows *and* columns, which is not SDGP's rule; it is only timed, for reference (it does more
than SDGP needs, so it is not a lower bound of the pruning cost; ``bench/sdgp_semi.py``).

Nothing here touches the GPU at import time.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from impl.messages import first_line
from impl.methods.sdgp import (
    SDGPConv2d,
    _set_submodule,
    conv_grad,
    conv_memory_format,
    plain_conv,
    random_generator,
    sdgp_conv_backward,
    sdgp_conv_forward,
    sdgp_plan,
)
from impl.ops.nm import RESCALE_EPS, check_eps, check_method, check_nm, nm_prune_ref

if TYPE_CHECKING:
    from impl.flops import LayerDensity

logger = logging.getLogger(__name__)

#: Library backends: ``auto`` is cuSPARSELt where torch has it, CUTLASS otherwise (torch's rule).
SPARSE_BACKENDS: tuple[str, ...] = ("auto", "cusparselt", "cutlass")
#: Pruning implementations: ``auto`` is the N:M CUDA kernel where it loads, the reference else.
PRUNE_IMPLS: tuple[str, ...] = ("auto", "ref", "cuda")
#: dtypes this backend multiplies on sparse tensor cores (bf16 and fp16).
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)
#: Sparse tensor cores appeared with Ampere (sm_80; A100 whitepaper, "Fine-grained structured
#: sparsity"); H100/H200 are sm_90.
MIN_CAPABILITY: tuple[int, int] = (8, 0)
#: The only pattern sparse tensor cores run.
SEMI_N, SEMI_M = 2, 4
#: A precaution, not a documented limit: products whose operands or result exceed 2**31 - 1
#: elements take the reference path (no benchmarked ImageNet layer comes near it).
MAX_ELEMENTS = 2**31 - 1
#: (sparse_min_rows, sparse_min_cols, dense_min_rows, dense_min_cols) for fp16/bf16 when the
#: installed torch's class has no table entry: the values of torch 2.3 to 2.13
#: (``_DTYPE_SHAPE_CONSTRAINTS`` of ``torch/sparse/semi_structured.py``).
_DEFAULT_CONSTRAINTS: dict[str, tuple[int, int, int, int]] = {
    "cusparselt": (16, 16, 8, 8),
    "cutlass": (32, 64, 8, 8),
}
_PROTOTYPE_WARNING = "The PyTorch API of SparseSemiStructuredTensor is in prototype stage"
#: Rows of a matrix compressed for cuSPARSELt are padded to a multiple of this, beyond the
#: table's 16: torch sizes the compressed buffer by a formula (``numel * 9 / 16`` for 16-bit
#: types) that its maintainers say may not hold for small matrices (pytorch/pytorch#163125),
#: and ``_cslt_sparse_mm`` reads the row count back from that size. 128 rows is the size class
#: of the benchmarked layers (every N*Ho*Wo at batch 256 is a multiple of 128), so the padding
#: costs nothing there and keeps small problems in the same class.
CUSPARSELT_ROW_MULTIPLE = 128


# --------------------------------------------------------------------------------------------
# what the installed torch offers
# --------------------------------------------------------------------------------------------
def has_semi_structured_api() -> bool:
    """Whether this torch has ``torch.sparse.SparseSemiStructuredTensor`` and both backends."""
    sp = getattr(torch, "sparse", None)
    return all(
        hasattr(sp, name)
        for name in (
            "SparseSemiStructuredTensor",
            "SparseSemiStructuredTensorCUSPARSELT",
            "SparseSemiStructuredTensorCUTLASS",
        )
    )


@functools.cache
def cusparselt_available() -> bool:
    """Whether this torch build ships cuSPARSELt (``torch.backends.cusparselt.is_available()``)."""
    mod = getattr(torch.backends, "cusparselt", None)
    if mod is None:
        return False
    try:
        return bool(mod.is_available())
    except Exception:  # noqa: BLE001 - a broken build reads as "not available"
        return False


def _check_backend(backend: str) -> None:
    if backend not in SPARSE_BACKENDS:
        raise ValueError(f"unknown sparse backend {backend!r}; valid: {', '.join(SPARSE_BACKENDS)}")


def resolve_backend(backend: str = "auto") -> str:
    """``"cusparselt"`` or ``"cutlass"``: ``auto`` picks cuSPARSELt where torch ships it."""
    _check_backend(backend)
    if backend == "auto":
        return "cusparselt" if cusparselt_available() else "cutlass"
    return backend


def _semi_class(backend: str) -> Any:
    name = {
        "cusparselt": "SparseSemiStructuredTensorCUSPARSELT",
        "cutlass": "SparseSemiStructuredTensorCUTLASS",
    }[backend]
    return getattr(torch.sparse, name)


def shape_constraints(backend: str, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """``(sparse_min_rows, sparse_min_cols, dense_min_rows, dense_min_cols)`` of a backend.

    The sparse operand's rows and columns must be positive multiples of the first two, the
    dense operand's of the last two. Read from the installed torch's
    ``_DTYPE_SHAPE_CONSTRAINTS`` (so a version that changes them is followed), else the values
    of torch 2.3 to 2.13 (cuSPARSELt 16, 16, 8, 8; CUTLASS 32, 64, 8, 8 for fp16/bf16).
    """
    backend = resolve_backend(backend)
    if has_semi_structured_api():
        table = getattr(_semi_class(backend), "_DTYPE_SHAPE_CONSTRAINTS", {})
        if dtype in table:
            return tuple(int(v) for v in table[dtype])  # type: ignore[return-value]
    return _DEFAULT_CONSTRAINTS[backend]


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(index))  # type: ignore[return-value]


def device_capability(device: torch.device) -> tuple[int, int]:
    """The compute capability of a CUDA ``device`` (cached per device index)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _capability(index)


def library_status() -> dict[str, Any]:
    """What this process can use: torch, the API, cuSPARSELt, the GPU's name and capability.

    Queries the GPU only when CUDA is available (never at import).
    """
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "semi_structured_api": has_semi_structured_api(),
        "cusparselt_available": cusparselt_available(),
        "cusparselt_version": None,
        "hip": torch.version.hip,
        "gpu_name": None,
        "gpu_capability": None,
    }
    if out["cusparselt_available"]:
        try:
            out["cusparselt_version"] = torch.backends.cusparselt.version()
        except Exception:  # noqa: BLE001
            pass
    if torch.cuda.is_available():
        out["gpu_name"] = torch.cuda.get_device_name()
        out["gpu_capability"] = "sm_{}{}".format(*device_capability(torch.device("cuda")))
    return out


def unsupported_reason(
    *,
    n: int,
    m: int,
    device: torch.device,
    dtype: torch.dtype,
    groups: int,
    out_channels: int,
    rows: int,
    cols: int,
    backend: str = "auto",
    capability: tuple[int, int] | None = None,
    hip: bool | None = None,
    api: bool | None = None,
    cusparselt: bool | None = None,
) -> str:
    """Why the data-gradient GEMM ``(rows x K) @ (K x cols)`` cannot run 2:4 sparse ("": it can).

    ``rows`` = N*Ho*Wo, ``K`` = ``out_channels`` (the reduction, pruned 2:4), ``cols`` =
    C*R*S. The checks, in order: the pattern is 2:4; torch has the semi-structured API; the
    tensor is on a CUDA device of a CUDA (not ROCm) build with compute capability >= 8.0; the
    dtype is fp16 or bf16; the conv is not grouped; the requested backend exists in this build
    (and, for CUTLASS, the GPU is sm_8x: torch's CUTLASS 2:4 kernels refuse others);
    K is a positive multiple of the backend's sparse column minimum (cuSPARSELt 16, CUTLASS 64
    in torch 2.3-2.13); no operand exceeds :data:`MAX_ELEMENTS`. ``capability``, ``hip``,
    ``api`` and ``cusparselt`` are read from the running torch and GPU when ``None`` (tests pass
    them to check each rule without a GPU).
    """
    if (n, m) != (SEMI_N, SEMI_M):
        return f"n:m={n}:{m} is not 2:4, the only pattern sparse tensor cores run"
    if api is None:
        api = has_semi_structured_api()
    if not api:
        return f"torch {torch.__version__} has no torch.sparse.SparseSemiStructuredTensor"
    if device.type != "cuda":
        return f"device {device.type}: semi-structured sparsity needs a CUDA GPU"
    if hip is None:
        hip = torch.version.hip is not None
    if hip:
        return "ROCm build: the semi-structured backends here are CUDA's (cuSPARSELt, CUTLASS)"
    if capability is None:
        capability = device_capability(device)
    if tuple(capability) < MIN_CAPABILITY:
        return f"GPU sm_{capability[0]}{capability[1]} < sm_80: no sparse tensor cores"
    if dtype not in SUPPORTED_DTYPES:
        return f"dtype {str(dtype).replace('torch.', '')} (sparse path runs float16, bfloat16)"
    if groups != 1:
        return f"groups={groups}: grouped convolutions are not supported"
    _check_backend(backend)
    if cusparselt is None:
        cusparselt = cusparselt_available()
    if backend == "cusparselt" and not cusparselt:
        return "backend cusparselt requested but this torch build has no cuSPARSELt"
    concrete = backend if backend != "auto" else ("cusparselt" if cusparselt else "cutlass")
    if concrete == "cutlass" and capability[0] != 8:
        # torch's CUTLASS 2:4 kernels (_sparse_semi_structured_mm) check for compute
        # capability 8.x and raise elsewhere (pytorch/pytorch#132928): Hopper needs cuSPARSELt.
        return (
            f"GPU sm_{capability[0]}{capability[1]}: torch's CUTLASS 2:4 kernels run on sm_8x "
            "only (use the cusparselt backend)"
        )
    _, min_cols, _, _ = shape_constraints(concrete, dtype)
    if out_channels < min_cols or out_channels % min_cols:
        return (
            f"out_channels K={out_channels} is not a positive multiple of {min_cols} "
            f"({concrete}'s minimum for the sparse operand's columns)"
        )
    if max(rows * out_channels, rows * cols, out_channels * cols) > MAX_ELEMENTS:
        return f"GEMM {rows} x {out_channels} x {cols} exceeds 2**31 - 1 elements per operand"
    return ""


# --------------------------------------------------------------------------------------------
# the pieces of the sparse data gradient (each testable without a GPU)
# --------------------------------------------------------------------------------------------
def conv_output_hw(
    hw: tuple[int, int],
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
) -> tuple[int, int]:
    """Output height and width of a conv (torch.nn.Conv2d's formula)."""
    return tuple(  # type: ignore[return-value]
        (hw[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1
        for i in range(2)
    )


def grad_rows(grad_out: torch.Tensor) -> torch.Tensor:
    """dL/dO ``(N, K, Ho, Wo)`` as an ``(N, Ho*Wo, K)`` view (contiguous when channels-last).

    For NCHW dL/dO the view is strided (K is the slow dim); the pruning and the GEMM operand
    then read it through one transpose copy.
    """
    n, k, ho, wo = grad_out.shape
    return grad_out.permute(0, 2, 3, 1).reshape(n, ho * wo, k)


def rows_to_nchw(rows: torch.Tensor, out_hw: tuple[int, int]) -> torch.Tensor:
    """Inverse of :func:`grad_rows`: ``(N, Ho*Wo, K)`` as an ``(N, K, Ho, Wo)`` view."""
    n, _, k = rows.shape
    return rows.reshape(n, out_hw[0], out_hw[1], k).permute(0, 3, 1, 2)


@functools.cache
def _nm_kernel(device: torch.device) -> Any | None:
    """The project's N:M CUDA kernel module when it loads on GPU ``device``, else ``None``."""
    try:
        from impl.ops import nm_cuda
    except ImportError:
        return None
    try:
        return nm_cuda if nm_cuda.is_available(device) else None
    except Exception:  # noqa: BLE001 - a kernel that fails to load is "not available"
        return None


def prune_rows(
    rows: torch.Tensor,
    n: int,
    m: int,
    method: str = "rescaled",
    rescale: str = "plane",
    generator: torch.Generator | None = None,
    *,
    eps: float = RESCALE_EPS,
    impl: str = "auto",
) -> torch.Tensor:
    """N:M-prune ``(N, L, K)`` rows of dL/dO along K: SDGP's pruning (Sec. III-A/B) in GEMM layout.

    Equal to ``grad_rows(nm_prune(dL/dO, n, m, method, dim=1, rescale))``: the groups are the
    same 4 consecutive channels, ``rescale="plane"`` scales per (sample, channel) over the L
    pixels and ``"channel"`` per channel over samples and pixels, and the reference draws the
    ``random`` scores in the same order. ``impl``: ``"ref"`` (:func:`nm_prune_ref`), ``"cuda"``
    (:mod:`impl.ops.nm_cuda`, same kept positions for magnitude and rescaled, its own random
    draw) or ``"auto"`` (the kernel for CUDA tensors where it loads). Returns a new ``(N, L,
    K)`` tensor: contiguous from the kernel, with the input's strides from the reference.
    """
    check_nm(n, m)
    check_method(method, rescale)
    check_eps(eps)
    if impl not in PRUNE_IMPLS:
        raise ValueError(f"unknown prune impl {impl!r}; valid: {', '.join(PRUNE_IMPLS)}")
    if rows.dim() != 3:
        raise ValueError(f"rows must be (N, L, K); got shape {tuple(rows.shape)}")
    kernel = _nm_kernel(rows.device) if rows.is_cuda and impl != "ref" else None
    if impl == "cuda" and kernel is None:
        raise RuntimeError("prune impl 'cuda': the N:M kernel (impl.ops.nm_cuda) is not available")
    if kernel is not None:
        # Grouped along dim 1 of the (N, K, L) view, not dim 2 of (N, L, K): the same groups
        # and per-(sample, channel) sums, but the kernel's view is then O=N, C=K, I=L (one
        # thread block per sample and group of channels) instead of O=N*L with an inner loop
        # over the L pixels of every plane. The output keeps the input's strides, so
        # transposing back gives the (N, L, K) rows contiguous again.
        pruned = kernel.nm_prune_cuda(
            rows.transpose(1, 2), n, m, method, 1, rescale, generator, eps
        )
        return pruned.transpose(1, 2).contiguous()
    return nm_prune_ref(rows, n, m, method, 2, rescale, generator, eps=eps)


def assemble_data_grad(
    col: torch.Tensor,
    input_shape: tuple[int, int, int, int],
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
) -> torch.Tensor:
    """dL/dD ``(N, C, H, W)`` from the column gradient ``col = A @ W`` (``(N*Ho*Wo) x (C*R*S)``).

    A 1x1 conv without padding needs no fold: ``col`` is dL/dD in NHWC (stride 1; returned as
    a channels-last view) or its strided sub-grid (stride > 1; the rest is zero). Every other
    conv goes through ``F.fold`` (col2im, the adjoint of the unfold of the forward), which
    returns NCHW. The column index of ``col`` is ``c*R*S + r*S + s`` (``W.reshape(K, -1)``).
    """
    n, c, h, w = input_shape
    r, s = kernel
    ho, wo = conv_output_hw((h, w), kernel, stride, padding, dilation)
    if tuple(col.shape) != (n * ho * wo, c * r * s):
        raise ValueError(
            f"col must be ({n * ho * wo}, {c * r * s}) for input {tuple(input_shape)}, kernel "
            f"{tuple(kernel)}; got {tuple(col.shape)}"
        )
    if (r, s) == (1, 1) and tuple(padding) == (0, 0):
        sub = col.reshape(n, ho, wo, c)
        if tuple(stride) == (1, 1):
            return sub.permute(0, 3, 1, 2)
        out = col.new_zeros((n, h, w, c))
        sh, sw = stride
        out[:, : (ho - 1) * sh + 1 : sh, : (wo - 1) * sw + 1 : sw, :] = sub
        return out.permute(0, 3, 1, 2)
    cols = col.reshape(n, ho * wo, c * r * s).transpose(1, 2)
    return F.fold(
        cols, (h, w), kernel_size=kernel, dilation=dilation, padding=padding, stride=stride
    )


def data_grad_from_rows(
    a: torch.Tensor,
    weight: torch.Tensor,
    input_shape: tuple[int, int, int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    mm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.mm,
) -> torch.Tensor:
    """dL/dD from the ``(N*Ho*Wo) x K`` rows of a (pruned) dL/dO: ``fold(mm(a, W as K x CRS))``.

    With ``mm=torch.mm`` this is the dense math of the sparse path; it equals
    ``torch.nn.grad.conv2d_input`` for ``groups == 1`` (tests check it in float64).
    """
    k = weight.shape[0]
    b = weight.reshape(k, -1)
    col = mm(a, b)
    return assemble_data_grad(col, input_shape, tuple(weight.shape[2:]), stride, padding, dilation)  # type: ignore[arg-type]


def _round_up(v: int, mult: int) -> int:
    return -(-v // mult) * mult


def compress(a: torch.Tensor, backend: str = "auto") -> Any:
    """Compress a 2:4-pruned ``rows x K`` matrix for sparse tensor cores.

    Rows are zero-padded to the backend's row multiple (cuSPARSELt: also to
    :data:`CUSPARSELT_ROW_MULTIPLE`; a zero row is a valid 2:4 row); the
    columns must already be a multiple (:func:`unsupported_reason` checks it). cuSPARSELt:
    ``from_dense`` = one ``torch._cslt_compress`` kernel; CUTLASS: torch's Python conversion
    (several elementwise kernels). Returns a ``SparseSemiStructuredTensor`` of the padded shape.
    """
    backend = resolve_backend(backend)
    min_rows = shape_constraints(backend, a.dtype)[0]
    if backend == "cusparselt":
        min_rows = math.lcm(min_rows, CUSPARSELT_ROW_MULTIPLE)
    pad = _round_up(a.shape[0], min_rows) - a.shape[0]
    if pad:
        a = F.pad(a, (0, 0, 0, pad))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_PROTOTYPE_WARNING)
        return _semi_class(backend).from_dense(a.contiguous())


def semi_matmul(sa: Any, b: torch.Tensor, rows: int) -> torch.Tensor:
    """``(A @ b)[:rows]`` with ``A`` compressed by :func:`compress`, on sparse tensor cores.

    ``b`` (``K x cols``, dense) is zero-padded to the dense operand's column multiple (8 for
    fp16/bf16) so that no torch version's own padding path runs; the result is sliced back.
    Uses ``torch.mm`` on the semi-structured tensor, the public entry of torch 2.3 to 2.13
    (2.13 routes it through the ``semi_structured::cusparselt_mm`` / ``cutlass_mm`` custom ops,
    earlier versions call ``torch._cslt_sparse_mm`` / ``torch._sparse_semi_structured_mm``).
    """
    cols = b.shape[1]
    min_cols = shape_constraints(getattr(sa, "BACKEND", "auto"), b.dtype)[3]
    pad = _round_up(cols, min_cols) - cols
    bp = F.pad(b, (0, pad)) if pad else b.contiguous()
    out = torch.mm(sa, bp)
    return out[:rows, :cols]


def sparse_data_grad(
    rows: torch.Tensor,
    weight: torch.Tensor,
    input_shape: tuple[int, int, int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    backend: str = "auto",
) -> torch.Tensor:
    """dL/dD from 2:4-pruned ``(N, L, K)`` rows on sparse tensor cores (compress, product, fold).

    ``weight`` must have ``rows``' dtype (fp16 or bf16). Raises what the library raises; the
    module catches it and takes the reference path.
    """
    n, ell, k = rows.shape
    a = rows.reshape(n * ell, k)
    sa = compress(a, backend)
    col = semi_matmul(sa, weight.reshape(k, -1), n * ell)
    return assemble_data_grad(col, input_shape, tuple(weight.shape[2:]), stride, padding, dilation)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# the converted convolution
# --------------------------------------------------------------------------------------------
class _SDGPSemiConv2dFunction(torch.autograd.Function):
    """conv2d whose input gradient is SDGP's, on sparse tensor cores where the library runs."""

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
        module: SDGPSemiConv2d,
    ) -> torch.Tensor:
        ctx.module = module
        return sdgp_conv_forward(
            ctx, x, weight, bias, stride, padding, dilation, groups, int_padding
        )

    @staticmethod
    @once_differentiable  # a pruned gradient has no gradient of its own: create_graph's
    # first-order result is exact, differentiating it again raises torch's error
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        def data_grad(g: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return ctx.module.data_grad(g, x, weight, ctx.conv_args)

        # dL/dW and dL/db from the dense dL/dO, exactly as the reference computes them.
        return sdgp_conv_backward(ctx, grad_out, data_grad)


class SDGPSemiConv2d(SDGPConv2d):
    """An :class:`SDGPConv2d` whose dL/dD runs on 2:4 sparse tensor cores where it can.

    Forward, the weight gradient and the pruning rule are the reference's. For each backward
    the layer either multiplies the compressed 2:4 dL/dO rows on sparse tensor cores
    (``semi_calls`` counts them) or, where :func:`unsupported_reason` gives a reason or the
    library raises, computes the reference's ``conv_grad`` of the pruned dL/dO
    (``fallback_calls``; each distinct reason is logged once and kept in ``fallback_reasons``).
    Build with :meth:`from_conv` or :func:`sdgp_semi_convert`.
    """

    sparse_backend: str
    prune_impl: str
    layer_name: str

    @classmethod
    def from_conv(  # type: ignore[override]
        cls,
        conv: nn.Conv2d,
        n: int,
        m: int,
        method: str = "rescaled",
        rescale: str = "plane",
        generator: torch.Generator | None = None,
        eps: float = RESCALE_EPS,
        *,
        sparse_backend: str = "auto",
        prune_impl: str = "auto",
        name: str = "",
    ) -> SDGPSemiConv2d:
        """Wrap ``conv`` (parameters shared); ``name`` labels its log lines and fallback reasons."""
        new = super().from_conv(conv, n, m, method, rescale, generator, eps)
        assert isinstance(new, SDGPSemiConv2d)
        new.set_backend(sparse_backend, prune_impl)
        new.layer_name = name
        new.reset_semi_stats()
        return new

    def set_backend(self, sparse_backend: str = "auto", prune_impl: str = "auto") -> None:
        """Choose the library backend (``auto``, ``cusparselt``, ``cutlass``) and pruning impl."""
        _check_backend(sparse_backend)
        if prune_impl not in PRUNE_IMPLS:
            raise ValueError(f"unknown prune impl {prune_impl!r}; valid: {', '.join(PRUNE_IMPLS)}")
        self.sparse_backend = sparse_backend
        self.prune_impl = prune_impl
        self._failed: dict[tuple[Any, ...], str] = {}

    def reset_semi_stats(self) -> None:
        """Forget the sparse and fallback call counts and the fallback reasons."""
        self.semi_calls = 0
        self.fallback_calls = 0
        self.fallback_reasons: list[str] = []
        self._logged_reasons: set[str] = set()

    def semi_state(self) -> dict[str, Any]:
        """The call counts and fallback reasons so far (what a checkpoint keeps of them)."""
        return {
            "semi_calls": self.semi_calls,
            "fallback_calls": self.fallback_calls,
            "fallback_reasons": list(self.fallback_reasons),
        }

    def load_semi_state(self, state: dict[str, Any]) -> None:
        """Continue the counts of :meth:`semi_state` (a resumed run reports the whole run's
        calls, and its executed FLOPs weigh them). A reason restored here is still logged once
        by this process when a call meets it again."""
        self.semi_calls = int(state.get("semi_calls", 0))
        self.fallback_calls = int(state.get("fallback_calls", 0))
        self.fallback_reasons = [str(r) for r in state.get("fallback_reasons", [])]

    def executed_density(self) -> LayerDensity:
        """Fractions of the dense conv's multiply-adds this layer executes (:mod:`impl.flops`):
        forward and weight gradient all; the data gradient n/m = 1/2 on the calls that ran on
        sparse tensor cores (the 2:4 GEMM skips the pruned half) and all on the reference's
        calls (a dense conv backward of the pruned dL/dO), weighted by their counts so far
        (``semi_calls``, ``fallback_calls``); all before the first backward."""
        from impl.flops import LayerDensity

        calls = self.semi_calls + self.fallback_calls
        on_sparse = self.semi_calls / calls if calls else 0.0
        return LayerDensity(1.0, on_sparse * self.n / self.m + (1.0 - on_sparse), 1.0)

    def _note_fallback(self, reason: str) -> None:
        self.fallback_calls += 1
        if reason not in self.fallback_reasons:
            self.fallback_reasons.append(reason)
        if reason not in self._logged_reasons:
            self._logged_reasons.add(reason)
            logger.warning(
                "SDGP semi-structured backend, layer %s: reference data gradient (%s)",
                self.layer_name or "<unnamed>",
                reason,
            )

    def prune_rows_grad(self, grad_out: torch.Tensor) -> torch.Tensor:
        """The pruned dL/dO as ``(N, Ho*Wo, K)`` rows; updates the L1 statistics and the
        pruning path's count (``prune_paths``) as prune_grad: ``"cuda tensor"`` (the N:M
        kernel where it loads), ``"reference"`` for CPU rows."""
        rows = grad_rows(grad_out)
        self._count_path("cuda tensor" if rows.is_cuda else "reference")
        pruned = prune_rows(
            rows,
            self.n,
            self.m,
            self.prune_method,
            self.rescale,
            self.generator,
            eps=self.eps,
            impl=self.prune_impl,
        )
        self._add_l1_sums(grad_out, pruned)  # as the reference
        return pruned

    def support_reason(
        self, grad_out: torch.Tensor, x_shape: torch.Size, weight: torch.Tensor, groups: int
    ) -> str:
        """Why this call takes the reference path (``""``: it runs on sparse tensor cores)."""
        n, k, ho, wo = grad_out.shape
        rows = n * ho * wo
        cols = math.prod(weight.shape[1:])
        reason = unsupported_reason(
            n=self.n,
            m=self.m,
            device=grad_out.device,
            dtype=grad_out.dtype,
            groups=groups,
            out_channels=k,
            rows=rows,
            cols=cols,
            backend=self.sparse_backend,
        )
        if reason:
            return reason
        return self._failed.get(self._key(grad_out, x_shape), "")

    def _key(self, grad_out: torch.Tensor, x_shape: torch.Size) -> tuple[Any, ...]:
        return (grad_out.dtype, tuple(grad_out.shape), tuple(x_shape), self.sparse_backend)

    def data_grad(
        self,
        grad_out: torch.Tensor,
        x: torch.Tensor,
        weight: torch.Tensor,
        conv_args: tuple[tuple[int, int], tuple[int, int], tuple[int, int], int],
    ) -> torch.Tensor:
        """SDGP's dL/dD: sparse tensor cores where supported, the reference path otherwise.
        ``conv_args`` is ``(stride, padding, dilation, groups)``, integer padding."""
        stride, padding, dilation, groups = conv_args
        reason = self.support_reason(grad_out, x.shape, weight, groups)
        if reason:
            self._note_fallback(reason)
            pruned = self.prune_grad(grad_out)  # the reference's own pruning and statistics
            return conv_grad("input", pruned, x, weight, conv_args)
        rows = self.prune_rows_grad(grad_out)
        try:
            grad_x = sparse_data_grad(
                rows, weight, tuple(x.shape), stride, padding, dilation, self.sparse_backend
            )  # type: ignore[arg-type]
        except Exception as err:  # noqa: BLE001 - a library failure falls back, OOM does not
            if _is_oom(err):
                raise
            reason = f"library error {type(err).__name__}: {first_line(err, 200)}"
            self._failed[self._key(grad_out, x.shape)] = reason
            self._note_fallback(reason)
            pruned = rows_to_nchw(rows, tuple(grad_out.shape[2:]))  # type: ignore[arg-type]
            return conv_grad("input", pruned, x, weight, conv_args)
        self.semi_calls += 1
        return grad_x.contiguous(memory_format=conv_memory_format(x))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled() or not self.training:  # as SDGPConv2d: training only
            return nn.Conv2d.forward(self, input)
        input, padding, int_padding = self._padded(input)
        return _SDGPSemiConv2dFunction.apply(
            input,
            self.weight,
            self.bias,
            self.stride,
            padding,
            self.dilation,
            self.groups,
            int_padding,
            self,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, semi_structured={self.sparse_backend}"


def _is_oom(err: BaseException) -> bool:
    if isinstance(err, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    return "out of memory" in str(err).lower()


# --------------------------------------------------------------------------------------------
# conversion of a model and what the method reports
# --------------------------------------------------------------------------------------------
def sdgp_semi_convert(
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
    sparse_backend: str = "auto",
    prune_impl: str = "auto",
) -> nn.Module:
    """:func:`impl.methods.sdgp.sdgp_convert` with :class:`SDGPSemiConv2d` layers (in place).

    The same plan (:func:`impl.methods.sdgp.sdgp_plan`: convs with more than 3 input channels),
    the same shared parameters, the same generator rule for ``method="random"``. A reference
    ``SDGPConv2d`` is replaced by the semi-structured one; one already converted is
    reconfigured, or made a plain conv again where the plan now leaves its layer dense.
    ``n:m`` other than 2:4 is accepted: every call then takes the reference path with that
    reason. Returns ``model``.
    """
    check_nm(n, m)
    check_method(method, rescale)
    check_eps(eps)
    _check_backend(sparse_backend)
    if prune_impl not in PRUNE_IMPLS:
        raise ValueError(f"unknown prune impl {prune_impl!r}; valid: {', '.join(PRUNE_IMPLS)}")
    plans = sdgp_plan(model, n, m, nondivisible)
    generator = random_generator(model, method, generator, seed)
    for plan in plans:
        mod = model.get_submodule(plan.name)
        if not plan.sparse:
            if isinstance(mod, SDGPConv2d):  # converted before, dense now
                _set_submodule(model, plan.name, plain_conv(mod))
            continue
        if isinstance(mod, SDGPSemiConv2d):
            mod.configure(n, m, method, rescale, generator, eps)
            mod.set_backend(sparse_backend, prune_impl)
            continue
        if not plan.name:
            raise ValueError("the model itself is a Conv2d: wrap it in a module to convert it")
        new = SDGPSemiConv2d.from_conv(
            mod,
            n,
            m,
            method,
            rescale,
            generator,
            eps,
            sparse_backend=sparse_backend,
            prune_impl=prune_impl,
            name=plan.name,
        )
        _set_submodule(model, plan.name, new)
    return model


def semi_modules(model: nn.Module) -> dict[str, SDGPSemiConv2d]:
    """The semi-structured SDGP convs of ``model`` by qualified name."""
    return {k: v for k, v in model.named_modules() if isinstance(v, SDGPSemiConv2d)}


def semi_summary(model: nn.Module) -> dict[str, Any]:
    """What the semi-structured backend did, for ``summary.json``.

    ``sdgp_semi_calls`` (backward calls on sparse tensor cores), ``sdgp_semi_fallback_calls``
    (calls on the reference path), ``sdgp_semi_fallback_reasons`` (``[{"layer", "reason"}]``,
    each distinct reason of each layer once) and ``sdgp_semi_library``
    (:func:`library_status`).
    """
    mods = semi_modules(model)
    return {
        "sdgp_semi_layers": len(mods),
        "sdgp_semi_backend": sorted({m.sparse_backend for m in mods.values()}),
        "sdgp_semi_calls": sum(m.semi_calls for m in mods.values()),
        "sdgp_semi_fallback_calls": sum(m.fallback_calls for m in mods.values()),
        "sdgp_semi_fallback_reasons": [
            {"layer": name, "reason": r} for name, mod in mods.items() for r in mod.fallback_reasons
        ],
        "sdgp_semi_library": library_status(),
    }


__all__ = [
    "MAX_ELEMENTS",
    "MIN_CAPABILITY",
    "PRUNE_IMPLS",
    "SPARSE_BACKENDS",
    "SUPPORTED_DTYPES",
    "SDGPSemiConv2d",
    "assemble_data_grad",
    "compress",
    "conv_output_hw",
    "cusparselt_available",
    "data_grad_from_rows",
    "device_capability",
    "grad_rows",
    "has_semi_structured_api",
    "library_status",
    "prune_rows",
    "resolve_backend",
    "rows_to_nchw",
    "semi_matmul",
    "semi_modules",
    "semi_summary",
    "sdgp_semi_convert",
    "shape_constraints",
    "sparse_data_grad",
    "unsupported_reason",
]
