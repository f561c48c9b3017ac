"""The compiled CPU path of the pattern conv (ClickTrain Sec. 5.2, stage 5): a direct
sparse convolution with the batch innermost (``impl/cpu/pattern_conv.c``).

The reference (:func:`impl.ops.pattern.pattern_conv2d` with ``impl="ref"``) is the paper's
formulation: SpMM of the sparse filter matrix with the im2col matrix of the input, on
torch's CSR routines. On a CPU its im2col and col2im copies (nine times the input for 3x3
kernels, written and read every step) cost more than its sparse products, and the stage-5
convolutions run slower than the dense convolution they replace (docs/clicktrain.md). This
path computes the same three products without the column matrix:

- the input is copied once into a zero-padded ``[C, Hp, Wp, B]`` array, so that the ``B``
  samples under one kept weight at one output pixel are contiguous;
- forward: each output vector of ``B`` lanes is the sum, over the kept weights of its
  filter (its CSR row, in that order), of one weight times one contiguous vector of that
  array, accumulated in registers and stored into the NCHW output;
- input gradient: the same gather over the transposed filter matrix on the output gradient
  padded by ``(R-1)*dh`` rows and ``(S-1)*dw`` columns (stride 1), or each kept weight's
  contribution added into a per-channel buffer (other strides);
- weight gradient: one dot product over ``(p, q, b)`` per kept weight (SDDMM).

It executes the same multiply-adds as the reference (the kept weights only) in another
order, so its results equal the reference's to rounding (a relative difference of a few
units in the last place; :data:`RTOL`). Each output element is summed by one thread in a
fixed order: the results do not depend on the thread count. Compiled with ``-O3
-march=native`` (:mod:`impl.ops.cpu_kernels`; the library's name hashes the machine's CPU):
vector width and fused multiply-add follow the machine. A compiler that rejects
``-march=native`` builds it without (logged; the architecture's baseline vectors).

It applies to float32 and float64 CPU tensors of one dtype that hold memory
(:func:`impl.ops.cpu_kernels.has_storage`); :func:`applies` says why not otherwise, and the
caller then runs the reference.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch

from impl.ops import cpu_kernels

SOURCE: Path = Path(__file__).resolve().parent.parent / "cpu" / "pattern_conv.c"
CFLAGS: tuple[str, ...] = ("-O3", "-march=native", "-std=gnu11", "-shared", "-fPIC", "-Wall")
#: Bound on the relative difference from the reference (float32): sums of the same products
#: in another order, with fused multiply-adds where the machine has them.
RTOL = 1e-5
_STEM = "pattern_conv"
_SUFFIX = {torch.float32: "float", torch.float64: "double"}
# Output elements per thread, at the least, before a call is split over threads (handing a
# slice to a pool thread costs tens of microseconds).
PARALLEL_MIN_ELEMENTS = 1 << 15
_ARGS = {  # pointer and int64 arguments, per kernel
    "layout": (2, 10),
    "forward": (5, 16),
    "input_grad": (5, 22),
    "weight_grad": (5, 20),
}


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The loaded library, or the reason it could not be built or loaded (logged once)."""
    lib = cpu_kernels.load(_STEM, SOURCE, CFLAGS, "pattern conv")
    if isinstance(lib, str):
        return lib
    for kernel, (pointers, ints) in _ARGS.items():
        for suffix in _SUFFIX.values():
            fn = getattr(lib, f"pdt_pconv_{kernel}_{suffix}")
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p] * pointers + [ctypes.c_int64] * ints
    return lib


def build(directory: Path | None = None, *, rebuild: bool = False) -> Path:
    """Compile ``impl/cpu/pattern_conv.c`` into ``directory`` (default the kernel cache)
    unless it is built there already; its path (:func:`impl.ops.cpu_kernels.build`)."""
    return cpu_kernels.build(_STEM, SOURCE, CFLAGS, directory, rebuild=rebuild)


def unavailable_reason() -> str | None:
    """Why the compiled pattern conv cannot run here (``None`` when it can)."""
    return cpu_kernels.unavailable_reason(_library)


def is_available() -> bool:
    """Whether the compiled pattern conv is enabled and builds and loads here."""
    return unavailable_reason() is None


def applies(*tensors: torch.Tensor) -> str | None:
    """Why the compiled path cannot take these operands (``None`` when it can): every one a
    CPU tensor with memory, all float32 or all float64, and the library available."""
    if not tensors or any(t.device.type != "cpu" for t in tensors):
        return "operands are not CPU tensors"
    if len({t.dtype for t in tensors}) != 1 or tensors[0].dtype not in _SUFFIX:
        return "operands are not all float32 or all float64"
    if not all(cpu_kernels.has_storage(t) for t in tensors):
        return "an operand holds no memory (fake, meta or a torch.func transform's)"
    return unavailable_reason()


def _call(kernel: str, dtype: torch.dtype, n: int, work: int, *args: Any) -> None:
    """Run ``kernel`` over ``range(n)`` of its leading dim (the last two arguments), split
    into one slice per torch thread when ``work`` (elements written) is large enough."""
    lib = _library()
    assert not isinstance(lib, str)
    fn = getattr(lib, f"pdt_pconv_{kernel}_{_SUFFIX[dtype]}")
    threads = min(torch.get_num_threads(), max(1, work // PARALLEL_MIN_ELEMENTS))
    codes = cpu_kernels.run_slices(
        lambda start, stop: fn(*args, start, stop), cpu_kernels.even_slices(n, threads)
    )
    if 3 in codes:
        raise ValueError(
            f"compiled pattern conv ({kernel}): the CSR structure is out of range (row "
            "pointers decreasing or beyond nnz, a column or filter index out of range)"
        )
    if any(codes):
        raise MemoryError(f"compiled pattern conv ({kernel}): a table could not be allocated")


def _padded(t: torch.Tensor, top: int, bottom: int, left: int, right: int) -> torch.Tensor:
    """``[B, C, H, W]`` -> ``[C, top+H+bottom, left+W+right, B]`` with zero borders."""
    b, c, h, w = t.shape
    t = t.contiguous()
    out = torch.empty((c, top + h + bottom, left + w + right, b), dtype=t.dtype)
    _call("layout", t.dtype, c, out.numel(), t.data_ptr(), out.data_ptr(),
          b, c, h, w, top, bottom, left, right)  # fmt: skip
    return out


class _PatternConvCpu(torch.autograd.Function):
    """Forward, input gradient and weight gradient of the pattern conv by the C kernels; the
    kernels read the kept weights from the dense weight and write its gradient at the kept
    positions (zero elsewhere)."""

    @staticmethod
    def forward(ctx, weight, x, index, geometry):  # type: ignore[override]
        (r, s), (sh, sw), (ph, pw), (dh, dw), (ho, wo) = geometry
        b, c, h, w = x.shape
        f_out, nnz = weight.shape[0], index.col_ind.numel()
        weight = weight.contiguous()
        xt = _padded(x, ph, ph, pw, pw)
        out = torch.empty((b, f_out, ho, wo), dtype=x.dtype)
        _call("forward", x.dtype, f_out, out.numel(), xt.data_ptr(), weight.data_ptr(),
              index.row_ptr.data_ptr(), index.col_ind.data_ptr(), out.data_ptr(), nnz,
              b, c, f_out, r, s, xt.shape[1], xt.shape[2], ho, wo, sh, sw, dh, dw)  # fmt: skip
        ctx.save_for_backward(weight, xt)
        ctx.index, ctx.geometry, ctx.x_shape = index, geometry, x.shape
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        weight, xt = ctx.saved_tensors
        index = ctx.index
        (r, s), (sh, sw), (ph, pw), (dh, dw), (ho, wo) = ctx.geometry
        b, c, h, w = ctx.x_shape
        f_out, nnz = weight.shape[0], index.col_ind.numel()
        top, left = (r - 1) * dh, (s - 1) * dw
        # rows and columns below/right the stride-1 gather reads past the gradient
        stride1 = sh == 1 and sw == 1
        bottom = max(0, h + ph - ho) if stride1 else 0
        right = max(0, w + pw - wo) if stride1 else 0
        gp = _padded(grad_out.to(xt.dtype), top, bottom, left, right)
        grad_weight = grad_x = None
        if ctx.needs_input_grad[1]:
            grad_x = torch.empty((b, c, h, w), dtype=xt.dtype)
            _call("input_grad", xt.dtype, c, grad_x.numel(), gp.data_ptr(), weight.data_ptr(),
                  index.t_row_ptr.data_ptr(), index.t_col_ind.data_ptr(), grad_x.data_ptr(),
                  nnz, b, c, f_out, h, w, r, s, ho, wo, gp.shape[1], gp.shape[2], top, left,
                  sh, sw, ph, pw, dh, dw)  # fmt: skip
        if ctx.needs_input_grad[0]:
            grad_weight = torch.zeros_like(weight)
            _call("weight_grad", xt.dtype, f_out, f_out * ho * wo * b,
                  xt.data_ptr(), gp.data_ptr(), index.row_ptr.data_ptr(),
                  index.col_ind.data_ptr(), grad_weight.data_ptr(), nnz, b, c, f_out, r, s,
                  xt.shape[1], xt.shape[2], ho, wo, gp.shape[1], gp.shape[2], top, left, sh,
                  sw, dh, dw)  # fmt: skip
        return grad_weight, grad_x, None, None


def _check_index(index: Any, f_out: int, k: int) -> None:
    """The sizes the kernels rely on (their contents are range-checked by the kernels): int64
    contiguous CPU tensors, ``row_ptr`` of ``F + 1`` and ``t_row_ptr`` of ``K + 1`` entries,
    ``col_ind`` and ``t_col_ind`` of one length; ``ValueError`` otherwise."""
    sizes = {"row_ptr": f_out + 1, "t_row_ptr": k + 1}
    nnz = index.col_ind.numel()
    for name in ("row_ptr", "col_ind", "t_row_ptr", "t_col_ind"):
        t = getattr(index, name)
        if t.dtype != torch.int64 or t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous int64 CPU tensor")
        want = sizes.get(name, nnz)
        if t.dim() != 1 or t.numel() != want:
            raise ValueError(f"{name} must have {want} entries, got {tuple(t.shape)}")


def pattern_conv_cpu(
    weight: torch.Tensor, x: torch.Tensor, index: Any, geometry: tuple
) -> torch.Tensor:
    """The ``[B, F, P, Q]`` pattern conv of ``x`` ``[B, C, H, W]`` with the weight ``[F, C,
    R, S]`` at the kept positions of ``index`` (a :class:`impl.ops.pattern.PatternIndex`),
    autograd-aware; the weight's gradient is zero outside them. ``geometry`` is ``((R, S),
    stride, padding, dilation, (P, Q))`` as pairs of ints. The operands must pass
    :func:`applies`. No bias. ``ValueError`` for an index of the wrong sizes or with entries
    out of range."""
    _check_index(index, weight.shape[0], weight[0].numel())
    return _PatternConvCpu.apply(weight, x, index, geometry)


__all__ = [
    "CFLAGS",
    "PARALLEL_MIN_ELEMENTS",
    "RTOL",
    "SOURCE",
    "applies",
    "build",
    "is_available",
    "pattern_conv_cpu",
    "unavailable_reason",
]
