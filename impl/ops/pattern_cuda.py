"""CUDA path of the pattern-sparse ops of ClickTrain (Sec. 5.1 and 5.2), as torch custom ops.

The kernels live in ``impl/cuda/pattern.cu`` and load through :mod:`impl.cuda.loader`. The
public functions take exactly the arguments of the references in :mod:`impl.ops.pattern`
and return what they return, so the dispatchers' ``impl="cuda"`` can call them:

* :func:`pattern_csr_cuda` -- ``Convert2CSR`` with predefined positions (Sec. 5.1);
* :func:`pattern_spmm_cuda` -- CSR (predefined positions) times dense, with the SDDMM weight
  gradient and the transposed SpMM input gradient (Sec. 5.2);
* :func:`pattern_conv2d_cuda` -- the pattern convolution, by default with the
  implicit-im2col forward kernel (no column matrix), or as explicit im2col + SpMM.

Each is a ``torch.library.custom_op`` (namespace ``pdtbench``) with a fake implementation
(shapes and dtypes only) and, where the reference is differentiable, a registered autograd
formula, so autograd and ``torch.compile`` see real ops. float32 and float64 only; CSR
indices are int64 with the columns of each row sorted and unique (as
:func:`impl.ops.pattern.pattern_positions` builds them). The index contents are not
validated here (that would synchronise with the GPU); ``impl="ref"`` validates them.

Nothing here touches the GPU or CuPy at import time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from impl.cuda import loader
from impl.ops import device_check, eager, timed_choice
from impl.ops.pattern import (
    PatternIndex,
    _autocast_off,
    check_index_matches,
    conv_geometry,
    conv_output_size,
    conv_pattern_index,
)
from impl.ops.pattern import _transpose as csr_transpose  # unchecked: no host sync

_SRC = "pattern.cu"
# The function of impl.ops that takes ``impl`` for each op (named when a CPU tensor arrives).
_PUBLIC = {
    "pattern_csr": "impl.ops.pattern_csr",
    "pattern_csr (backward)": "impl.ops.pattern_csr",
    "pattern_spmm": "impl.ops.pattern_spmm",
    "pattern_spmm (weight gradient)": "impl.ops.pattern_spmm",
    "pattern_conv2d": "impl.ops.pattern_conv2d",
}
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_VEC = {torch.float32: 4, torch.float64: 2}  # elements per 16-byte load
WARPS: int = loader.DEFINES["PDT_SPMM_WARPS"]
TILE_N = {
    torch.float32: loader.DEFINES["PDT_SPMM_TN_F32"],
    torch.float64: loader.DEFINES["PDT_SPMM_TN_F64"],
}
ROWS_PER_WARP = {  # rows of one warp of the row-tiled SpMM kernel
    torch.float32: loader.DEFINES["PDT_SPMM_RW_F32"],
    torch.float64: loader.DEFINES["PDT_SPMM_RW_F64"],
}
#: The SpMM kernels (``impl/cuda/pattern.cu``): ``warp_row`` is the paper's design (Sec. 5.2,
#: one warp per output row, B's tile in shared memory); ``row_tiled`` gives each warp several
#: rows so that one shared-memory read of B serves all of them; ``pipelined`` is
#: ``row_tiled`` with B's next K-step copied in (cp.async) while the current one multiplies.
#: All sum each row in the same order, so they give the same bits; which is faster depends on
#: the sparsity and the GPU.
SPMM_VARIANTS: tuple[str, ...] = ("row_tiled", "warp_row", "pipelined")
#: SpMM kernels not yet shown correct and timed on a GPU: they run when named (``variant=``,
#: :func:`forced_path`, the benchmark's own rows) but the automatic choice never picks them.
SPMM_UNPROVEN: tuple[str, ...] = ("pipelined",)
#: The SpMM kernels with a warp of several rows (the row-tiled grid, 32-bit offsets).
_SPMM_ROW_TILED: tuple[str, ...] = ("row_tiled", "pipelined")
_SPMM_KERNEL = {
    "row_tiled": "pdt_spmm_tiled",
    "warp_row": "pdt_spmm",
    "pipelined": "pdt_spmm_piped",
}
CONV_TILE: int = 32 * loader.DEFINES["PDT_CONV_CPT"]  # output positions per conv block
SDDMM_SEG: int = loader.DEFINES["PDT_SDDMM_SEG"]
SDDMM_ROWS = {  # rows of the filter matrix per block of the row-tiled SDDMM kernel
    torch.float32: loader.DEFINES["PDT_SDDMM_RT_F32"],
    torch.float64: loader.DEFINES["PDT_SDDMM_RT_F64"],
}
#: The SDDMM kernels of the weight gradient (``impl/cuda/pattern.cu``): ``row_tiled`` gives a
#: block several rows of the filter matrix, so that one read of the dense operand's row
#: serves each of them that keeps it; ``block_row`` is a block per row and a warp per kept
#: weight. Both sum each weight in the same order over the same split, so they give the same
#: bits.
SDDMM_VARIANTS: tuple[str, ...] = ("row_tiled", "block_row")
_GATHER_BLOCK = 128
_SDDMM_BLOCK = 256  # threads of both SDDMM kernels (the row-tiled one's __launch_bounds__)
_MAX_GRID_YZ = 65535
_MAX_INT = 2**31 - 1


def _kernel_names() -> tuple[str, ...]:
    names = []
    for suf in _SUFFIX.values():
        names += [f"pdt_csr_gather_{suf}", f"pdt_csr_scatter_{suf}", f"pdt_conv_implicit_{suf}"]
        names += [f"pdt_conv_implicit_tiled_{suf}"]
        for kind in ("vec", "scalar"):
            names += [f"pdt_spmm_{suf}_{kind}", f"pdt_spmm_tiled_{suf}_{kind}"]
            names += [f"pdt_spmm_piped_{suf}_{kind}"]
            names += [f"pdt_sddmm_{suf}_{kind}", f"pdt_sddmm_tiled_{suf}_{kind}"]
    return tuple(names)


KERNELS: tuple[str, ...] = _kernel_names()  # every kernel this module may launch


# -- launch planning (pure functions of sizes; tested without a GPU) --------------------------


def _suffix(dtype: torch.dtype, op: str) -> str:
    try:
        return _SUFFIX[dtype]
    except KeyError:
        raise ValueError(f"{op}: CUDA kernels take float32 or float64, got {dtype}") from None


def vector_ok(dtype: torch.dtype, n: int, strides: Sequence[int], ptrs: Sequence[int]) -> bool:
    """Whether 16-byte vector loads are safe: ``n`` (the row length) and every row/batch
    ``strides`` (in elements) are multiples of the vector width and every pointer is 16-byte
    aligned. Otherwise the kernels' scalar fallback runs."""
    vec = _VEC[dtype]
    return n % vec == 0 and all(s % vec == 0 for s in strides) and all(p % 16 == 0 for p in ptrs)


def spmm_grid(
    dtype: torch.dtype, n_rows: int, n_cols: int, batch: int, variant: str = "warp_row"
) -> tuple[int, int, int]:
    """Grid of an SpMM kernel (:data:`SPMM_VARIANTS`): (row tiles of WARPS rows, or of WARPS
    x :data:`ROWS_PER_WARP` rows for ``row_tiled`` and ``pipelined``; column tiles of TILE_N;
    batch)."""
    tiled = timed_choice.check_path("spmm", variant) in _SPMM_ROW_TILED
    rows = WARPS * (ROWS_PER_WARP[dtype] if tiled else 1)
    grid = (math.ceil(n_rows / rows), math.ceil(n_cols / TILE_N[dtype]), batch)
    if grid[1] > _MAX_GRID_YZ or grid[2] > _MAX_GRID_YZ:
        raise ValueError(
            f"pattern_spmm: {n_cols} columns x batch {batch} exceed one launch "
            f"(at most {_MAX_GRID_YZ * TILE_N[dtype]} columns and {_MAX_GRID_YZ} batches)"
        )
    return grid


def spmm_kernel(variant: str) -> str:
    """The kernel family of an SpMM variant (:data:`SPMM_VARIANTS`), e.g. ``pdt_spmm_tiled``
    for ``row_tiled``: the prefix of its names in ``pattern.cu`` and in a profiler's rows."""
    return _SPMM_KERNEL[timed_choice.check_path("spmm", variant)]


def spmm_kernels(dtype: torch.dtype, n_cols_a: int) -> tuple[str, ...]:
    """Every SpMM kernel that can run an ``F x n_cols_a`` sparse matrix of ``dtype``: all of
    :data:`SPMM_VARIANTS`, except the row-tiled ones where a warp's rows could hold 2^31 - 32
    nonzeros or more (their 32-bit offsets, plus a lane)."""
    if ROWS_PER_WARP[dtype] * n_cols_a < _MAX_INT - 31:
        return SPMM_VARIANTS
    return tuple(v for v in SPMM_VARIANTS if v not in _SPMM_ROW_TILED)


def spmm_variants(dtype: torch.dtype, n_cols_a: int) -> tuple[str, ...]:
    """The SpMM kernels the automatic choice times for an ``F x n_cols_a`` sparse matrix of
    ``dtype``, in order of preference when none has been timed: ``row_tiled`` first (its
    shared-memory traffic per useful multiply-add is at most that of ``warp_row``); those of
    :func:`spmm_kernels` but :data:`SPMM_UNPROVEN`."""
    return tuple(v for v in spmm_kernels(dtype, n_cols_a) if v not in SPMM_UNPROVEN)


# -- interchangeable paths, timed once per problem (impl.ops.timed_choice) --------------------

#: The interchangeable CUDA paths of each op, the default (where none is timed) first.
#: ``spmm``: the SpMM kernel (:data:`SPMM_VARIANTS`). ``conv_forward``: the implicit-im2col
#: conv kernel, :data:`ROWS_PER_WARP` filters per warp or one. ``sddmm``: the SDDMM kernel
#: (:data:`SDDMM_VARIANTS`). The kernels of each of these give the same bits, so they are
#: always timed on a GPU. ``weight_grad``: the gradient of
#: the kept weights, by the SDDMM kernel (only the kept positions; the issue's design) or
#: ``dense`` (the dense weight gradient by cuBLAS / cuDNN, then gathered at the kept
#: positions). ``input_grad``: the gradient of the dense operand (the conv input), by the
#: transposed pattern SpMM (ClickTrain Sec. 5.2: the backward handles the sparse weight as the
#: forward does) or ``dense`` (cuBLAS / cuDNN with the pruned weights as zeros). The gradient
#: paths sum in different orders, so they are timed only where the user has let cuDNN pick
#: its algorithms by timing too (``torch.backends.cudnn.benchmark``); otherwise the default
#: runs.
PATHS: dict[str, tuple[str, ...]] = {
    "spmm": timed_choice.register("spmm", SPMM_VARIANTS, same_bits=True),
    "conv_forward": timed_choice.register(
        "conv_forward", ("implicit_tiled", "implicit"), same_bits=True
    ),
    "sddmm": timed_choice.register("sddmm", SDDMM_VARIANTS, same_bits=True),
    "weight_grad": timed_choice.register("weight_grad", ("sddmm", "dense"), same_bits=False),
    "input_grad": timed_choice.register("input_grad", ("spmm", "dense"), same_bits=False),
}
#: ``forced_path(op, path)``: ``op`` runs ``path`` within the block (``timed_choice.forced``).
forced_path = timed_choice.forced
_pick = timed_choice.pick


def sddmm_split(
    n_rows: int, n_cols: int, batch: int, sms: int, vec: int
) -> tuple[int, int, int, int]:
    """How the SDDMM splits its reduction over (batch, columns): ``(n_chunk, b_group,
    grid_y, grid_z)``, aiming at about 4 blocks per SM in total for ``n_rows`` blocks per
    split. ``n_chunk`` is a multiple of ``vec`` (aligned vector loads); each split writes one
    row of partial sums. The split fixes the summation order, so both SDDMM kernels take the
    one for the row-tiled kernel's row blocks (:func:`sddmm_row_blocks`)."""
    target = max(1, math.ceil(4 * sms / max(n_rows, 1)))
    if batch >= target:
        b_group = math.ceil(batch / target)
        n_chunk = n_cols
    else:
        b_group = 1
        n_splits = min(math.ceil(target / batch), max(1, math.ceil(n_cols / SDDMM_SEG)))
        n_chunk = math.ceil(n_cols / n_splits)
    n_chunk = max(vec, math.ceil(n_chunk / vec) * vec)
    grid_y = math.ceil(n_cols / n_chunk) if n_cols else 1
    grid_z = math.ceil(batch / b_group)
    return n_chunk, b_group, grid_y, grid_z


def sddmm_row_blocks(dtype: torch.dtype, n_rows: int) -> int:
    """Blocks of the row-tiled SDDMM along the ``n_rows`` rows of the filter matrix (one per
    :data:`SDDMM_ROWS` rows): the ``n_rows`` argument of :func:`sddmm_split` for both SDDMM
    kernels, so that they split the reduction alike and give the same bits."""
    return math.ceil(n_rows / SDDMM_ROWS[dtype])


def _pair(v: int | Sequence[int]) -> list[int]:
    return [int(v), int(v)] if isinstance(v, int) else [int(v[0]), int(v[1])]


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` with unit stride along its last dim (a copy only when it has none)."""
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _check_index(op: str, *idx: torch.Tensor) -> None:
    for t in idx:
        if t.dtype != torch.int64 or t.dim() != 1:
            raise ValueError(f"{op}: CSR indices must be 1-D int64, got {t.dtype} {tuple(t.shape)}")


# -- kernel launches (no autograd) ------------------------------------------------------------


def _csr_gather(
    dense: torch.Tensor,
    row_ptr: torch.Tensor,
    col_ind: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    op = "pattern_csr"
    suf = _suffix(dense.dtype, op)
    _check_index(op, row_ptr, col_ind)
    dev = device_check.require_cuda(op, _PUBLIC[op], dense, row_ptr, col_ind, sources=(_SRC,))
    flat = _rows(dense.flatten(1))
    n_rows = flat.shape[0]
    if row_ptr.numel() != n_rows + 1:
        raise ValueError(f"{op}: row_ptr must have {n_rows + 1} entries, got {row_ptr.numel()}")
    val = out if out is not None else dense.new_empty(col_ind.numel())
    if val.numel() and n_rows:
        loader.launch(
            _SRC,
            f"pdt_csr_gather_{suf}",
            (min(n_rows, _MAX_INT), 1, 1),
            (_GATHER_BLOCK, 1, 1),
            [
                flat,
                np.int64(flat.stride(0)),
                row_ptr.contiguous(),
                col_ind.contiguous(),
                val,
                np.int64(n_rows),
            ],
            dev,
        )
    return val


def _csr_scatter(
    values: torch.Tensor, row_ptr: torch.Tensor, col_ind: torch.Tensor, shape: Sequence[int]
) -> torch.Tensor:
    op = "pattern_csr (backward)"
    suf = _suffix(values.dtype, op)
    _check_index(op, row_ptr, col_ind)
    if row_ptr.numel() != (shape[0] if len(shape) else 0) + 1:
        raise ValueError(f"{op}: row_ptr has {row_ptr.numel()} entries for shape {list(shape)}")
    if values.numel() != col_ind.numel():
        raise ValueError(f"{op}: {values.numel()} values for {col_ind.numel()} columns")
    dev = device_check.require_cuda(op, _PUBLIC[op], values, row_ptr, col_ind, sources=(_SRC,))
    out = torch.zeros(list(shape), dtype=values.dtype, device=values.device)
    n_rows = out.shape[0] if out.dim() else 0
    if values.numel() and n_rows:
        flat = out.view(n_rows, -1)
        loader.launch(
            _SRC,
            f"pdt_csr_scatter_{suf}",
            (min(n_rows, _MAX_INT), 1, 1),
            (_GATHER_BLOCK, 1, 1),
            [
                values.contiguous(),
                np.int64(flat.stride(0)),
                row_ptr.contiguous(),
                col_ind.contiguous(),
                flat,
                np.int64(n_rows),
            ],
            dev,
        )
    return out


def _spmm(
    values: torch.Tensor,
    row_ptr: torch.Tensor,
    col_ind: torch.Tensor,
    dense_b: torch.Tensor,
    out: torch.Tensor | None = None,
    variant: str | None = None,
) -> torch.Tensor:
    """``A @ dense_b`` for CSR ``A`` (``[F, K]``) and ``dense_b`` ``[K, N]`` or ``[B, K, N]``;
    ``out`` (tests poison it) must be a contiguous ``[B, F, N]`` tensor. ``variant`` picks the
    kernel (:data:`SPMM_VARIANTS`); by default the faster one, timed once per problem on a
    GPU (:mod:`impl.ops.timed_choice`), or the one :func:`forced_path` names."""
    op = "pattern_spmm"
    suf = _suffix(dense_b.dtype, op)
    _check_index(op, row_ptr, col_ind)
    if values.dtype != dense_b.dtype:
        raise ValueError(f"{op}: values {values.dtype} and dense_b {dense_b.dtype} differ")
    if values.dim() != 1 or values.numel() != col_ind.numel():  # the kernels read both by nnz
        raise ValueError(
            f"{op}: values {tuple(values.shape)} must be 1-D, one per column index "
            f"({col_ind.numel()})"
        )
    if dense_b.dim() not in (2, 3):
        raise ValueError(f"{op}: dense_b must be [K, N] or [B, K, N], got {tuple(dense_b.shape)}")
    dev = device_check.require_cuda(
        op, _PUBLIC[op], values, row_ptr, col_ind, dense_b, sources=(_SRC,)
    )
    batched = dense_b.dim() == 3
    b3 = _rows(dense_b if batched else dense_b.unsqueeze(0))
    batch, k, n = b3.shape
    n_rows = row_ptr.numel() - 1
    if max(k, n, n_rows) > _MAX_INT // 2:
        raise ValueError(f"{op}: sizes {(n_rows, k, n)} exceed the 32-bit range of the kernel")
    # What is returned: for a [K, N] dense_b a [F, N] tensor of its own, not a view of a
    # [1, F, N] one (autograd refuses in-place edits of an op's view outputs).
    if out is None:
        size = (batch, n_rows, n) if batched else (n_rows, n)
        result = torch.empty(size, dtype=dense_b.dtype, device=dense_b.device)
        out = result if batched else result.unsqueeze(0)
    else:
        result = out if batched else out[0]
    if out.numel():
        if values.numel() == 0 or k == 0:
            out.zero_()
        else:
            ldb, sb = b3.stride(1), b3.stride(0)
            vec = vector_ok(dense_b.dtype, n, (ldb, sb), (b3.data_ptr(), out.data_ptr()))
            args = [
                values.contiguous(),
                row_ptr.contiguous(),
                col_ind.contiguous(),
                b3,
                out,
                np.int32(n_rows),
                np.int32(k),
                np.int32(n),
                np.int64(ldb),
                np.int64(sb),
                np.int64(n),
                np.int64(n_rows * n),
            ]

            def run(v: str) -> None:
                name = _SPMM_KERNEL[v]  # v is one of SPMM_VARIANTS (checked below)
                loader.launch(
                    _SRC,
                    f"{name}_{suf}_{'vec' if vec else 'scalar'}",
                    spmm_grid(dense_b.dtype, n_rows, n, batch, v),
                    (32 * WARPS, 1, 1),
                    args,
                    dev,
                )

            runnable = spmm_kernels(dense_b.dtype, k)
            if variant is not None:
                if timed_choice.check_path("spmm", variant) not in runnable:
                    raise ValueError(f"{op}: the {variant} kernel cannot take K = {k} columns")
                chosen = variant
            else:
                problem = (
                    f"{dense_b.dtype} {n_rows}x{k}x{n} batch {batch} nnz {values.numel()} "
                    f"{'vec' if vec else 'scalar'} {out.device}"
                )
                # an unproven kernel is a candidate only when forced: it runs, never wins
                pinned = timed_choice.forced_path("spmm")
                candidates = tuple(v for v in runnable if v not in SPMM_UNPROVEN or v == pinned)
                chosen = _pick("spmm", problem, candidates, run, out)
            run(chosen)
    return result


def _sddmm(
    row_ptr: torch.Tensor,
    col_ind: torch.Tensor,
    grad_out: torch.Tensor,
    dense_b: torch.Tensor,
    partial: torch.Tensor | None = None,
    variant: str | None = None,
) -> torch.Tensor:
    """``(grad_out @ dense_b^T)`` at the CSR positions, summed over the batch: ``[nnz]``.
    ``partial`` (tests poison it) must be a contiguous ``[splits, nnz]`` tensor, one row per
    split of :func:`sddmm_split`. ``variant`` picks the kernel (:data:`SDDMM_VARIANTS`); by
    default the faster one, timed once per problem on a GPU, or the one :func:`forced_path`
    names."""
    op = "pattern_spmm (weight gradient)"
    suf = _suffix(grad_out.dtype, op)
    _check_index(op, row_ptr, col_ind)
    if grad_out.dtype != dense_b.dtype:
        raise ValueError(f"{op}: grad {grad_out.dtype} and dense_b {dense_b.dtype} differ")
    if grad_out.dim() not in (2, 3) or row_ptr.numel() - 1 != grad_out.shape[-2]:
        # the kernels walk row_ptr over the gradient's rows: fewer reads past its end, more
        # leave rows of the result unwritten
        raise ValueError(
            f"{op}: row_ptr of {row_ptr.numel() - 1} rows for a gradient "
            f"{tuple(grad_out.shape)} ([F, N] or [B, F, N])"
        )
    dev = device_check.require_cuda(
        op, _PUBLIC[op], row_ptr, col_ind, grad_out, dense_b, sources=(_SRC,)
    )
    g3 = _rows(grad_out if grad_out.dim() == 3 else grad_out.unsqueeze(0))
    b3 = _rows(dense_b if dense_b.dim() == 3 else dense_b.unsqueeze(0))
    batch, n_rows, n = g3.shape
    if b3.shape[0] != batch or b3.shape[2] != n:
        raise ValueError(f"{op}: grad {tuple(g3.shape)} and dense {tuple(b3.shape)} disagree")
    k = b3.shape[1]
    if max(k, n, n_rows) > _MAX_INT // 2:
        raise ValueError(f"{op}: sizes {(n_rows, k, n)} exceed the 32-bit range of the kernel")
    nnz = col_ind.numel()
    if nnz == 0 or n == 0 or batch == 0:
        return torch.zeros(nnz, dtype=grad_out.dtype, device=grad_out.device)
    vec_w = _VEC[grad_out.dtype]
    ptrs = (g3.data_ptr(), b3.data_ptr())
    strides = (g3.stride(1), g3.stride(0), b3.stride(1), b3.stride(0))
    vec = vector_ok(grad_out.dtype, n, strides, ptrs)
    row_blocks = sddmm_row_blocks(grad_out.dtype, n_rows)
    n_chunk, b_group, gy, gz = sddmm_split(
        row_blocks, n, batch, loader.multiprocessor_count(dev), vec_w if vec else 1
    )
    if partial is None:
        partial = torch.empty(gy * gz, nnz, dtype=grad_out.dtype, device=grad_out.device)
    elif (
        partial.shape != (gy * gz, nnz)
        or not partial.is_contiguous()
        or partial.dtype != grad_out.dtype
        or partial.device != grad_out.device
    ):
        raise ValueError(
            f"{op}: partial must be a contiguous [{gy * gz}, {nnz}] {grad_out.dtype} tensor "
            f"on {grad_out.device}"
        )
    index = [row_ptr.contiguous(), col_ind.contiguous()]
    tail = [
        np.int64(g3.stride(1)),
        np.int64(g3.stride(0)),
        np.int64(b3.stride(1)),
        np.int64(b3.stride(0)),
        np.int32(n_chunk),
        np.int32(b_group),
        np.int64(nnz),
    ]
    kind = "vec" if vec else "scalar"

    def run(v: str) -> None:
        if v == "row_tiled":
            sizes = [np.int32(n_rows), np.int32(k), np.int32(n), np.int32(batch)]
            name, grid = f"pdt_sddmm_tiled_{suf}_{kind}", (row_blocks, gy, gz)
        else:
            sizes = [np.int32(n), np.int32(batch)]
            name, grid = f"pdt_sddmm_{suf}_{kind}", (n_rows, gy, gz)
        args = [*index, g3, b3, partial, *sizes, *tail]
        loader.launch(_SRC, name, grid, (_SDDMM_BLOCK, 1, 1), args, dev)

    if variant is not None:
        chosen = timed_choice.check_path("sddmm", variant)
    else:
        problem = (
            f"{grad_out.dtype} {n_rows}x{k}x{n} batch {batch} nnz {nnz} {kind} {grad_out.device}"
        )
        chosen = _pick("sddmm", problem, SDDMM_VARIANTS, run, partial)
    run(chosen)
    return partial[0] if partial.shape[0] == 1 else partial.sum(0)


def _check_conv_operands(
    op: str, x: torch.Tensor, weight_dtype: torch.dtype, filters: int, bias: torch.Tensor | None
) -> None:
    """ValueError unless the weight (or its values) and the bias have ``x``'s dtype and the
    bias has one value per filter: the kernels read every operand in ``x``'s dtype and one
    bias value per filter, unchecked."""
    if weight_dtype != x.dtype:
        raise ValueError(f"{op}: input {x.dtype} and weight {weight_dtype} differ; cast one")
    if bias is None:
        return
    if bias.dtype != x.dtype:
        raise ValueError(f"{op}: input {x.dtype} and bias {bias.dtype} differ; cast one")
    if tuple(bias.shape) != (filters,):
        raise ValueError(f"{op}: bias {tuple(bias.shape)} is not one value per filter ({filters})")


def _conv_implicit(
    x: torch.Tensor,
    weight_shape: Sequence[int],
    values: torch.Tensor,
    row_ptr: torch.Tensor,
    col_ind: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    out: torch.Tensor | None = None,
    variant: str | None = None,
) -> torch.Tensor:
    """The implicit-im2col pattern convolution (kernels 3b/3c of ``pattern.cu``): ``variant``
    (``PATHS["conv_forward"]``) picks the kernel, by default the faster, timed once per
    problem on a GPU (both give the same bits)."""
    op = "pattern_conv2d"
    suf = _suffix(x.dtype, op)
    _check_index(op, row_ptr, col_ind)
    _check_conv_operands(op, x, values.dtype, int(weight_shape[0]), bias)
    if x.dim() != 4 or x.shape[1] != int(weight_shape[1]):  # the kernels stride by the weight's
        raise ValueError(
            f"{op}: input of shape {tuple(x.shape)} for a weight of {int(weight_shape[1])} "
            "input channels (N, C, H, W with C the weight's)"
        )
    tensors = [x, values, row_ptr, col_ind] + ([bias] if bias is not None else [])
    dev = device_check.require_cuda(op, _PUBLIC[op], *tensors, sources=(_SRC,))
    f_out, c, r, s = (int(v) for v in weight_shape)
    xc = x.contiguous()  # NCHW (a channels-last input is copied)
    batch, _, h, w = xc.shape
    ho, wo = conv_output_size(h, w, r, s, stride, padding, dilation)
    if ho <= 0 or wo <= 0:
        raise ValueError(f"{op}: output size {(ho, wo)} is empty for input {(h, w)}")
    dh, dw = _pair(dilation)
    # The kernels' 32-bit offset of a column's first pixel: c*H*W + r*dh*W + s*dw at most.
    last_offset = (c - 1) * h * w + (r - 1) * dh * w + (s - 1) * dw
    if c * h * w > _MAX_INT or batch * ho * wo > _MAX_INT or last_offset > _MAX_INT:
        raise ValueError(f"{op}: sizes exceed the 32-bit range of the kernel")
    if out is None:
        out = torch.empty(batch, f_out, ho, wo, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    tiles = math.ceil(batch * ho * wo / CONV_TILE)
    b = bias.contiguous() if bias is not None else None
    args = [xc, values.contiguous(), row_ptr.contiguous(), col_ind.contiguous(), b, out]
    args += [np.int32(v) for v in (batch, c, h, w, f_out, r, s, ho, wo)]
    args += [np.int32(v) for v in (*stride, *padding, *dilation)]
    args += [np.int32(b is not None)]

    def run(v: str) -> None:
        tiled = v == "implicit_tiled"
        rows = math.ceil(f_out / (WARPS * (ROWS_PER_WARP[x.dtype] if tiled else 1)))
        name = f"pdt_conv_implicit_{'tiled_' if tiled else ''}{suf}"
        for tile0 in range(0, tiles, _MAX_GRID_YZ):
            grid = (rows, min(_MAX_GRID_YZ, tiles - tile0), 1)
            loader.launch(_SRC, name, grid, (32 * WARPS, 1, 1), [*args, np.int64(tile0)], dev)

    fits = ROWS_PER_WARP[x.dtype] * c * r * s < _MAX_INT - 31  # its 32-bit offsets (+ a lane)
    candidates = PATHS["conv_forward"] if fits else ("implicit",)
    if variant is not None:
        timed_choice.check_path("conv_forward", variant)
        if variant not in candidates:
            raise ValueError(f"{op}: the {variant} kernel cannot take C*R*S = {c * r * s}")
        chosen = variant
    else:
        problem = (
            f"{x.dtype} x{list(xc.shape)} w{[f_out, c, r, s]} nnz {col_ind.numel()} "
            f"stride {list(stride)} padding {list(padding)} dilation {list(dilation)} {x.device}"
        )
        chosen = _pick("conv_forward", problem, candidates, run, out)
    run(chosen)
    return out


# -- custom ops -------------------------------------------------------------------------------


@torch.library.custom_op("pdtbench::csr_scatter", mutates_args=())
def _csr_scatter_op(
    values: torch.Tensor, row_ptr: torch.Tensor, col_ind: torch.Tensor, shape: list[int]
) -> torch.Tensor:
    return _csr_scatter(values, row_ptr, col_ind, shape)


@_csr_scatter_op.register_fake
def _(values, row_ptr, col_ind, shape):
    return values.new_empty(shape)


@torch.library.custom_op("pdtbench::pattern_csr", mutates_args=())
def _pattern_csr_op(
    dense: torch.Tensor, row_ptr: torch.Tensor, col_ind: torch.Tensor
) -> torch.Tensor:
    return _csr_gather(dense, row_ptr, col_ind)


@_pattern_csr_op.register_fake
def _(dense, row_ptr, col_ind):
    return dense.new_empty((col_ind.shape[0],))


def _pattern_csr_setup(ctx, inputs, output) -> None:
    dense, row_ptr, col_ind = inputs
    ctx.save_for_backward(row_ptr, col_ind)
    ctx.shape = list(dense.shape)


@_autocast_off
def _pattern_csr_backward(ctx, grad):
    row_ptr, col_ind = ctx.saved_tensors
    return torch.ops.pdtbench.csr_scatter(grad, row_ptr, col_ind, ctx.shape), None, None


_pattern_csr_op.register_autograd(_pattern_csr_backward, setup_context=_pattern_csr_setup)


@torch.library.custom_op("pdtbench::spmm", mutates_args=())
def _spmm_op(
    values: torch.Tensor, row_ptr: torch.Tensor, col_ind: torch.Tensor, dense_b: torch.Tensor
) -> torch.Tensor:
    return _spmm(values, row_ptr, col_ind, dense_b)


def _spmm_fake(values, row_ptr, col_ind, dense_b):
    f_rows = row_ptr.shape[0] - 1
    shape = (*dense_b.shape[:-2], f_rows, dense_b.shape[-1])
    return dense_b.new_empty(shape)


_spmm_op.register_fake(_spmm_fake)


@torch.library.custom_op("pdtbench::sddmm", mutates_args=())
def _sddmm_op(
    row_ptr: torch.Tensor, col_ind: torch.Tensor, grad_out: torch.Tensor, dense_b: torch.Tensor
) -> torch.Tensor:
    return _sddmm(row_ptr, col_ind, grad_out, dense_b)


@_sddmm_op.register_fake
def _(row_ptr, col_ind, grad_out, dense_b):
    return grad_out.new_empty((col_ind.shape[0],))


@torch.library.custom_op("pdtbench::pattern_spmm", mutates_args=())
def _pattern_spmm_op(
    values: torch.Tensor,
    row_ptr: torch.Tensor,
    col_ind: torch.Tensor,
    t_row_ptr: torch.Tensor,
    t_col_ind: torch.Tensor,
    t_perm: torch.Tensor,
    dense_b: torch.Tensor,
) -> torch.Tensor:
    return _pattern_spmm_impl(values, row_ptr, col_ind, t_row_ptr, t_col_ind, t_perm, dense_b)


def _pattern_spmm_impl(values, row_ptr, col_ind, t_row_ptr, t_col_ind, t_perm, dense_b):
    """What the ``pdtbench::pattern_spmm`` op runs: the product (the transpose serves only
    its backward)."""
    return _spmm(values, row_ptr, col_ind, dense_b)


@_pattern_spmm_op.register_fake
def _(values, row_ptr, col_ind, t_row_ptr, t_col_ind, t_perm, dense_b):
    return _spmm_fake(values, row_ptr, col_ind, dense_b)


def _pattern_spmm_setup(ctx, inputs, output) -> None:
    values, row_ptr, col_ind, t_row_ptr, t_col_ind, t_perm, dense_b = inputs
    ctx.save_for_backward(values, row_ptr, col_ind, t_row_ptr, t_col_ind, t_perm, dense_b)


def _tf32() -> str:
    """torch's TF32 switches, part of a gradient problem's name: the dense paths follow them,
    so a choice timed with TF32 on is not reused with it off."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    return f"tf32 {int(matmul)}{int(cudnn)}"


def _spmm_problem(values: torch.Tensor, row_ptr: torch.Tensor, dense_b: torch.Tensor) -> str:
    """The name of a ``pattern_spmm`` gradient problem for :func:`_pick`."""
    return (
        f"pattern_spmm {dense_b.dtype} {row_ptr.numel() - 1} rows nnz {values.numel()} "
        f"b{list(dense_b.shape)} {_tf32()} {dense_b.device}"
    )


@_autocast_off
def _pattern_spmm_backward(ctx, grad):
    values, row_ptr, col_ind, t_row_ptr, t_col_ind, t_perm, dense_b = ctx.saved_tensors
    grad_values = grad_b = None
    problem = _spmm_problem(values, row_ptr, dense_b)
    k = dense_b.shape[-2]
    if ctx.needs_input_grad[0]:  # dL/dA = grad @ B^T at the stored positions only

        def weight_grad(path: str) -> torch.Tensor:
            if path == "dense":  # cuBLAS, then the kept positions
                full = torch.einsum("...fn,...kn->fk", grad, dense_b)
                return torch.ops.pdtbench.pattern_csr(full, row_ptr, col_ind)
            return torch.ops.pdtbench.sddmm(row_ptr, col_ind, grad, dense_b)

        paths = PATHS["weight_grad"]
        grad_values = weight_grad(_pick("weight_grad", problem, paths, weight_grad, grad))
    if ctx.needs_input_grad[6]:  # dL/dB = A^T @ grad, A^T from the precomputed transpose
        if t_row_ptr.numel() == 0:  # no index was given (a real one has K + 1 entries)
            t_row_ptr, t_col_ind, t_perm = csr_transpose(row_ptr, col_ind, k)

        def input_grad(path: str) -> torch.Tensor:
            if path == "dense":  # the sparse matrix as a dense one with zeros, cuBLAS
                shape = [row_ptr.numel() - 1, k]
                a = torch.ops.pdtbench.csr_scatter(values, row_ptr, col_ind, shape)
                return torch.matmul(a.t(), grad)
            return torch.ops.pdtbench.spmm(values[t_perm], t_row_ptr, t_col_ind, grad)

        paths = PATHS["input_grad"]
        grad_b = input_grad(_pick("input_grad", problem, paths, input_grad, grad))
    return grad_values, None, None, None, None, None, grad_b


_pattern_spmm_op.register_autograd(_pattern_spmm_backward, setup_context=_pattern_spmm_setup)


@torch.library.custom_op("pdtbench::pattern_conv2d", mutates_args=())
def _pattern_conv2d_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    row_ptr: torch.Tensor,
    col_ind: torch.Tensor,
    t_row_ptr: torch.Tensor,
    t_col_ind: torch.Tensor,
    t_perm: torch.Tensor,
    bias: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
) -> torch.Tensor:
    return _pattern_conv2d_impl(
        x, weight, row_ptr, col_ind, t_row_ptr, t_col_ind, t_perm, bias, stride, padding, dilation
    )


def _pattern_conv2d_impl(
    x, weight, row_ptr, col_ind, t_row_ptr, t_col_ind, t_perm, bias, stride, padding, dilation
):
    """What the ``pdtbench::pattern_conv2d`` op runs: the kept weights gathered, then the
    implicit-im2col convolution (the transpose serves only its backward)."""
    values = _csr_gather(weight, row_ptr, col_ind)
    return _conv_implicit(
        x, weight.shape, values, row_ptr, col_ind, bias, stride, padding, dilation
    )


@_pattern_conv2d_op.register_fake
def _(x, weight, row_ptr, col_ind, t_row_ptr, t_col_ind, t_perm, bias, stride, padding, dilation):
    ho, wo = conv_output_size(
        x.shape[2], x.shape[3], weight.shape[2], weight.shape[3], stride, padding, dilation
    )
    return x.new_empty((x.shape[0], weight.shape[0], ho, wo))


def _pattern_conv2d_setup(ctx, inputs, output) -> None:
    x, weight, row_ptr, col_ind, t_row_ptr, t_col_ind, t_perm, bias, stride, padding, dil = inputs
    ctx.save_for_backward(x, weight, row_ptr, col_ind, t_row_ptr, t_col_ind, t_perm)
    ctx.conv = (list(stride), list(padding), list(dil))
    ctx.has_bias = bias is not None


def _conv_backward_dense(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, conv: tuple, want: list[bool]
) -> tuple[torch.Tensor | None, ...]:
    """torch's (cuDNN's) dense convolution backward: ``want`` = [input, weight, bias]."""
    stride, padding, dilation = conv
    return torch.ops.aten.convolution_backward(
        grad, x, weight, None, stride, padding, dilation, False, [0, 0], 1, want
    )


@_autocast_off
def _pattern_conv2d_backward(ctx, grad):
    x, weight, row_ptr, col_ind, t_row_ptr, t_col_ind, t_perm = ctx.saved_tensors
    stride, padding, dilation = ctx.conv
    f_out, _, r, s = weight.shape
    g = grad.flatten(2)  # [B, F, L] (flatten: also at batch 0)
    grad_x = grad_w = grad_b = None
    problem = (
        f"pattern_conv2d {x.dtype} x{list(x.shape)} w{list(weight.shape)} nnz {col_ind.numel()} "
        f"stride {stride} padding {padding} dilation {dilation} {_tf32()} {x.device}"
    )
    w2d = weight.flatten(1)
    if ctx.needs_input_grad[0]:

        def input_grad(path: str) -> torch.Tensor:
            values = torch.ops.pdtbench.pattern_csr(w2d, row_ptr, col_ind)
            if path == "dense":  # cuDNN with the pruned weights as zeros
                kept = torch.ops.pdtbench.csr_scatter(values, row_ptr, col_ind, list(weight.shape))
                return _conv_backward_dense(grad, x, kept, ctx.conv, [True, False, False])[0]
            cols = torch.ops.pdtbench.spmm(values[t_perm], t_row_ptr, t_col_ind, g)  # [B, K, L]
            return F.fold(cols, x.shape[2:], (r, s), dilation, padding, stride)  # col2im

        paths = PATHS["input_grad"]
        grad_x = input_grad(_pick("input_grad", problem, paths, input_grad, grad))
    if ctx.needs_input_grad[1]:  # the kept positions only, scattered into the weight's shape

        def weight_grad(path: str) -> torch.Tensor:
            if path == "dense":  # cuDNN's dense weight gradient, then the kept positions
                full = _conv_backward_dense(grad, x, weight, ctx.conv, [False, True, False])[1]
                gv = torch.ops.pdtbench.pattern_csr(full.flatten(1), row_ptr, col_ind)
            else:  # SDDMM on the im2col matrix
                cols = F.unfold(x, (r, s), dilation=dilation, padding=padding, stride=stride)
                gv = torch.ops.pdtbench.sddmm(row_ptr, col_ind, g, cols)
            return torch.ops.pdtbench.csr_scatter(gv, row_ptr, col_ind, list(weight.shape))

        paths = PATHS["weight_grad"]
        grad_w = weight_grad(_pick("weight_grad", problem, paths, weight_grad, grad))
    if ctx.has_bias and ctx.needs_input_grad[7]:
        grad_b = grad.sum(dim=(0, 2, 3))
    return grad_x, grad_w, None, None, None, None, None, grad_b, None, None, None


_pattern_conv2d_op.register_autograd(_pattern_conv2d_backward, setup_context=_pattern_conv2d_setup)


# -- public functions (the references' signatures) --------------------------------------------


def pattern_csr_cuda(
    dense: torch.Tensor, row_ptr: torch.Tensor, col_ind: torch.Tensor
) -> torch.Tensor:
    """CSR values of ``dense`` at predefined positions (Sec. 5.1, ``Convert2CSR``), on the GPU.

    Same arguments and result as :func:`impl.ops.pattern.pattern_csr` (without ``impl``):
    ``dense`` ``[F, K]`` or ``[F, C, R, S]``; returns the ``[nnz]`` values in CSR order;
    differentiable (the gradient is scattered back to the positions read, zero elsewhere).
    """
    if dense.dim() < 2:
        raise ValueError(f"dense must have at least 2 dims, got {dense.dim()}")
    flat = dense.flatten(1)
    return eager.call(torch.ops.pdtbench.pattern_csr, _csr_gather, flat, row_ptr, col_ind)


def pattern_spmm_cuda(
    values: torch.Tensor,
    row_ptr: torch.Tensor,
    col_ind: torch.Tensor,
    dense_b: torch.Tensor,
    *,
    index: PatternIndex | None = None,
) -> torch.Tensor:
    """Pattern SpMM (Sec. 5.2) on the GPU: CSR ``A`` (``F x K``) times ``dense_b``.

    Same arguments and result as :func:`impl.ops.pattern.pattern_spmm` (without ``impl``):
    ``dense_b`` ``[K, N]`` or ``[B, K, N]``; returns ``[F, N]`` or ``[B, F, N]``
    (contiguous). Differentiable in ``values`` (SDDMM at the stored positions) and in
    ``dense_b`` (the transposed SpMM, with the transpose from ``index`` or, without one, built
    in the backward).
    """
    if dense_b.dim() not in (2, 3):
        raise ValueError(f"dense_b must be [K, N] or [B, K, N], got {tuple(dense_b.shape)}")
    if values.shape != col_ind.shape:
        raise ValueError(f"values {tuple(values.shape)} must match col_ind {tuple(col_ind.shape)}")
    n_cols = dense_b.shape[-2]
    if index is None:  # the transpose waits for a backward that needs it
        t_row_ptr = t_col_ind = t_perm = row_ptr.new_empty(0)
    else:
        check_index_matches(index, row_ptr, col_ind, n_cols)
        t_row_ptr, t_col_ind, t_perm = index.t_row_ptr, index.t_col_ind, index.t_perm
    return eager.call(
        torch.ops.pdtbench.pattern_spmm,
        _pattern_spmm_impl,
        values,
        row_ptr,
        col_ind,
        t_row_ptr,
        t_col_ind,
        t_perm,
        dense_b,
    )


def pattern_conv2d_cuda(
    x: torch.Tensor,
    weight: torch.Tensor,
    pattern: PatternIndex | torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    *,
    implicit: bool = True,
) -> torch.Tensor:
    """2-D convolution with a pattern-sparse weight on the GPU (Sec. 5.2), training-ready.

    Same arguments and result as :func:`impl.ops.pattern.pattern_conv2d` (without
    ``impl``): equals ``conv2d(x, weight * mask, bias, stride, padding, dilation)``. With
    ``implicit=True`` the forward kernel reads the input directly (implicit im2col, no
    column matrix); with ``implicit=False`` it is ``pattern_csr`` + ``unfold`` + SpMM. The
    backward of both: input gradient = col2im of the transposed SpMM, weight gradient =
    SDDMM at the kept positions only (zero elsewhere).
    """
    device_check.check_devices("pattern_conv2d", _PUBLIC["pattern_conv2d"], x, weight)
    _check_conv_operands("pattern_conv2d", x, weight.dtype, weight.shape[0], bias)
    index = conv_pattern_index(x, weight, pattern)
    st, pad, dil = (list(v) for v in conv_geometry(stride, padding, dilation))
    if implicit:
        return eager.call(
            torch.ops.pdtbench.pattern_conv2d,
            _pattern_conv2d_impl,
            x,
            weight,
            index.row_ptr,
            index.col_ind,
            index.t_row_ptr,
            index.t_col_ind,
            index.t_perm,
            bias,
            st,
            pad,
            dil,
        )
    r, s = weight.shape[2], weight.shape[3]
    ho, wo = conv_output_size(x.shape[2], x.shape[3], r, s, st, pad, dil)
    cols = F.unfold(x, (r, s), dilation=dil, padding=pad, stride=st)  # [B, K, L]
    values = pattern_csr_cuda(weight, index.row_ptr, index.col_ind)
    out = pattern_spmm_cuda(values, index.row_ptr, index.col_ind, cols, index=index)
    out = out.reshape(x.shape[0], weight.shape[0], ho, wo)
    if bias is not None:
        out = out + bias.view(1, -1, 1, 1)
    return out


__all__ = [
    "KERNELS",
    "conv_output_size",
    "pattern_conv2d_cuda",
    "pattern_csr_cuda",
    "pattern_spmm_cuda",
    "sddmm_row_blocks",
    "sddmm_split",
    "spmm_grid",
    "spmm_kernel",
    "spmm_variants",
    "SDDMM_ROWS",
    "SDDMM_VARIANTS",
    "SPMM_VARIANTS",
    "ROWS_PER_WARP",
    "PATHS",
    "forced_path",
    "vector_ok",
]
