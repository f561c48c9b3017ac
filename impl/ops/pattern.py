"""Pattern-sparse operations of ClickTrain (Sec. 5.1 and 5.2): reference (torch) implementations.

After ClickTrain finalizes a pattern for every kernel and removes unimportant kernels, the
positions of the nonzero weights never change again. The paper therefore builds the CSR
structure (``rowPtr``, ``colInd``) of each layer's filter matrix once (Sec. 5.1) and before
every convolution only gathers the current weight values at those positions ("dense to CSR
with predefined positions", ``Convert2CSR``), then runs a sparse-times-dense product (SpMM,
Sec. 5.2) on the im2col matrix of the input.

The filter matrix of a conv with weight ``[F, C, R, S]`` is ``F x (C*R*S)`` in im2col order
(row ``f``, column ``c*R*S + r*S + s``), the order of ``weight.reshape(F, -1)`` and of
``torch.nn.functional.unfold``.

Every op takes ``impl``: ``"auto"`` (the default) picks the CUDA kernels when the tensors are
on a GPU and the kernels load, the reference otherwise; ``"ref"`` forces the reference;
``"cuda"`` forces the kernels (:mod:`impl.ops.pattern_cuda`; without a GPU or kernels that
load it raises a ``RuntimeError`` naming the reason). The conv (:func:`pattern_conv2d`,
:class:`PatternConv2d`) also takes ``"cpu"``, the compiled direct sparse convolution of
:mod:`impl.ops.pattern_cpu` (no im2col matrix), which its ``"auto"`` picks for CPU tensors
where it builds. The reference multiplies with torch's
own sparse CSR routines (MKL on CPU, cuSPARSE on GPU), which only ever touch the nonzero
positions: its executed work is the sparse work.

The reference path (``"ref"``, and ``"auto"`` when it picks the reference) checks the CSR
index contents with :func:`check_csr` (int64; ``row_ptr`` from 0 to ``nnz``, non-decreasing;
columns in range and strictly increasing within each row) and raises ``ValueError`` naming
the argument and the valid range. The CUDA path checks dtypes and sizes only: reading index
contents would synchronise with the GPU.
"""

from __future__ import annotations

import functools
import math
import operator
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from impl.flops import LayerDensity

IMPLS: tuple[str, ...] = ("auto", "ref", "cuda")
#: The pattern conv's implementations: :data:`IMPLS` and ``"cpu"``, the compiled direct
#: sparse convolution of :mod:`impl.ops.pattern_cpu`.
CONV_IMPLS: tuple[str, ...] = (*IMPLS, "cpu")

# dtypes torch's CPU sparse CSR routines accept; others are computed in float32 and cast back.
_CPU_SPARSE_DTYPES = (torch.float32, torch.float64)


def has_cuda_kernels(device: torch.device | int | None = None) -> bool:
    """Whether the CUDA pattern kernels (impl/cuda/pattern.cu) load on GPU ``device``
    (default: the current GPU)."""
    from impl.cuda import has_cuda_kernels as _loads

    return _loads(device, sources=("pattern.cu",))


_CUDA_DTYPES = (torch.float32, torch.float64)


def resolve_conv_impl(impl: str, *tensors: torch.Tensor) -> str:
    """The path :func:`pattern_conv2d` takes for ``impl`` and its operands: ``"ref"``,
    ``"cuda"`` or ``"cpu"`` ("auto" and ``"cpu"`` without operands: returned as given, a
    module being configured). "auto" takes the compiled CPU path when
    :func:`impl.ops.pattern_cpu.applies` to the operands (CPU tensors of one dtype, float32
    or float64, the library built), the CUDA kernels or the reference as
    :func:`_resolve_impl` says otherwise; ``"cpu"`` where it does not apply raises
    ``RuntimeError`` naming the reason; an unknown ``impl`` raises ``ValueError``."""
    if impl not in CONV_IMPLS:
        raise ValueError(f"unknown impl {impl!r}; valid: {', '.join(CONV_IMPLS)}")
    if impl not in ("auto", "cpu") or (tensors and tensors[0].is_cuda):
        if impl == "cpu":
            raise RuntimeError("impl='cpu' takes CPU tensors; use impl='auto' or 'cuda'")
        return _resolve_impl(impl, *tensors)
    if not tensors:  # a module being configured: checked again when it runs
        return impl
    from impl.ops import pattern_cpu

    reason = pattern_cpu.applies(*tensors)
    if reason is None:
        return "cpu"
    if impl == "cpu":
        raise RuntimeError(
            f"the compiled CPU pattern conv cannot run these operands ({reason}); "
            "use impl='ref' or impl='auto'"
        )
    return "ref"


def _resolve_impl(impl: str, *tensors: torch.Tensor) -> str:
    """``"ref"`` or ``"cuda"`` for ``impl`` and the operands: "auto" takes the CUDA kernels
    when every operand is a CUDA tensor of one dtype, float32 or float64, and the kernels
    load (operands of two dtypes take the reference, which computes them as it does on the
    CPU; the kernels read every operand in one dtype)."""
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; valid: {', '.join(IMPLS)}")
    on_gpu = (
        bool(tensors)
        and all(t.is_cuda and t.dtype in _CUDA_DTYPES for t in tensors)
        and len({t.dtype for t in tensors}) == 1
    )
    if impl == "ref" or (impl == "auto" and not on_gpu):
        return "ref"
    if on_gpu and has_cuda_kernels(tensors[0].device):  # the operands' GPU, not the current
        return "cuda"
    if impl == "auto":
        return "ref"
    if not tensors:  # a module being configured: checked again when it runs
        return "cuda"
    from impl.cuda import cuda_kernels_error

    reason = (
        cuda_kernels_error()
        if on_gpu
        else "operands are not CUDA tensors of one dtype, float32 or float64"
    )
    raise RuntimeError(
        f"CUDA kernels not available for the pattern ops ({reason}); use impl='ref' or impl='auto'"
    )


# -- CSR structure ---------------------------------------------------------------------------


def pattern_positions(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR structure ``(row_ptr, col_ind)`` of the nonzero positions of a finalized mask.

    Built once per layer after pattern finalization (Sec. 5.1): ``mask`` is ``[F, C, R, S]``
    (a conv weight's shape) or ``[F, K]``, nonzero where a weight is kept. Rows are filters,
    columns im2col positions ``c*R*S + r*S + s``; ``row_ptr`` has ``F + 1`` int64 entries,
    ``col_ind`` one int64 column per kept weight, sorted within each row.
    """
    if mask.dim() < 2:
        raise ValueError(f"mask must be [F, K] or [F, C, R, S], got {mask.dim()} dims")
    flat = mask.reshape(mask.shape[0], math.prod(mask.shape[1:])) != 0  # 0 rows too
    counts = flat.sum(dim=1)
    row_ptr = torch.zeros(flat.shape[0] + 1, dtype=torch.int64, device=mask.device)
    row_ptr[1:] = torch.cumsum(counts, dim=0)
    col_ind = flat.nonzero(as_tuple=True)[1].to(torch.int64)
    return row_ptr, col_ind


def csr_rows(row_ptr: torch.Tensor, nnz: int | None = None) -> torch.Tensor:
    """Row index of every stored entry of a CSR matrix (the COO rows), int64.

    ``nnz``: the number of stored entries (``col_ind.numel()``), which must equal
    ``row_ptr[-1]``. Given, it sizes the result without reading ``row_ptr``; on a GPU torch
    would otherwise copy the total to the host and wait for the device on every call.
    """
    n_rows = row_ptr.numel() - 1
    rows = torch.arange(n_rows, device=row_ptr.device, dtype=torch.int64)
    return torch.repeat_interleave(rows, row_ptr.diff(), output_size=nnz)


def csr_transpose(
    row_ptr: torch.Tensor, col_ind: torch.Tensor, n_cols: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CSR structure of the transposed matrix: ``(row_ptr_t, col_ind_t, perm)``.

    ``values_t = values[perm]`` are the transposed matrix's values in its CSR order. The
    backward pass multiplies by the transposed filter matrix (Sec. 5.2, backward phase).
    ``(row_ptr, col_ind)`` is checked by :func:`check_csr` (columns in ``[0, n_cols)``).
    """
    check_csr(row_ptr, col_ind, None, n_cols, width="n_cols")
    return _transpose(row_ptr, col_ind, n_cols)


def _transpose(
    row_ptr: torch.Tensor, col_ind: torch.Tensor, n_cols: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`csr_transpose` of a structure already checked (or built by pattern_positions)."""
    n_rows = row_ptr.numel() - 1
    rows = csr_rows(row_ptr, col_ind.numel())
    key = col_ind * max(n_rows, 1) + rows
    perm = torch.argsort(key, stable=True)
    counts = torch.bincount(col_ind, minlength=n_cols)
    row_ptr_t = torch.zeros(n_cols + 1, dtype=torch.int64, device=row_ptr.device)
    row_ptr_t[1:] = torch.cumsum(counts, dim=0)
    return row_ptr_t, rows[perm], perm


class PatternIndex(NamedTuple):
    """CSR structure of one layer's filter matrix and of its transpose, built once.

    Args:
        row_ptr: ``[F + 1]`` int64 row pointers of the ``F x K`` filter matrix.
        col_ind: ``[nnz]`` int64 column of each kept weight.
        t_row_ptr: ``[K + 1]`` row pointers of the transposed ``K x F`` matrix.
        t_col_ind: ``[nnz]`` columns of the transposed matrix.
        t_perm: ``[nnz]`` positions of the transposed matrix's values among ``values``.
        shape: ``(F, K)``.
    """

    row_ptr: torch.Tensor
    col_ind: torch.Tensor
    t_row_ptr: torch.Tensor
    t_col_ind: torch.Tensor
    t_perm: torch.Tensor
    shape: tuple[int, int]


def pattern_index(mask: torch.Tensor) -> PatternIndex:
    """The :class:`PatternIndex` of a finalized mask (``[F, C, R, S]`` or ``[F, K]``)."""
    row_ptr, col_ind = pattern_positions(mask)
    n_rows, n_cols = mask.shape[0], math.prod(mask.shape[1:])
    t_row_ptr, t_col_ind, t_perm = _transpose(row_ptr, col_ind, n_cols)
    return PatternIndex(row_ptr, col_ind, t_row_ptr, t_col_ind, t_perm, (n_rows, n_cols))


def check_index_matches(
    index: PatternIndex, row_ptr: torch.Tensor, col_ind: torch.Tensor, n_cols: int
) -> None:
    """Refuse (``ValueError``) a :class:`PatternIndex` that is not the index of the CSR
    structure ``(row_ptr, col_ind)`` of an ``F x n_cols`` matrix.

    The SpMM multiplies with the index's structure and its gradients read the index's
    transpose, so an index of another structure would give a wrong product silently. The
    index's own tensors (``index.row_ptr``, ``index.col_ind``) pass at no cost; other tensors
    are compared by contents, which on a GPU copies a flag to the host.
    """
    want = (row_ptr.numel() - 1, n_cols)
    if tuple(index.shape) != want:
        raise ValueError(f"index is for a {index.shape} matrix, the arguments for {want}")
    for name, given, own in (
        ("row_ptr", row_ptr, index.row_ptr),
        ("col_ind", col_ind, index.col_ind),
    ):
        if given is own:
            continue
        if given.shape != own.shape or given.device != own.device or not torch.equal(given, own):
            raise ValueError(
                f"index.{name} differs from the {name} passed: build the index of this "
                "structure (pattern_index) or pass index=None"
            )


def check_csr(
    row_ptr: torch.Tensor,
    col_ind: torch.Tensor,
    n_rows: int | None = None,
    n_cols: int | None = None,
    *,
    width: str = "the matrix's width",
    contents: bool | None = None,
) -> None:
    """Check a CSR structure ``(row_ptr, col_ind)`` of an ``n_rows x n_cols`` matrix, contents
    included; ``ValueError`` naming the argument and the valid range otherwise.

    The structure :func:`pattern_positions` builds and the CUDA kernels assume (Sec. 5.1):
    1-D int64 tensors; ``row_ptr`` has ``n_rows + 1`` entries, starts at 0, never decreases
    and ends at ``nnz = col_ind.numel()``; every column is in ``[0, n_cols)``; within a row
    the columns strictly increase (sorted, no duplicate: the SpMM kernel reads at most 32
    entries of a row per 32 columns, and the gradient scatter writes each position once).
    ``width`` names ``n_cols`` in the message.

    The contents are read only where the indices live on the CPU (or with ``contents=True``):
    on a GPU, reading them would copy them to the host and stall the device on every call,
    so there (the reference path on CUDA tensors, as the CUDA path) only dtypes, dimensions
    and lengths are checked, and a benchmark of the reference times the operation.
    """
    for name, t in (("row_ptr", row_ptr), ("col_ind", col_ind)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a 1-D int64 tensor, got {type(t).__name__}")
        if t.dtype != torch.int64:
            raise ValueError(
                f"{name} must be an int64 tensor (as pattern_positions builds it), got {t.dtype}"
            )
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if n_rows is not None and row_ptr.numel() != n_rows + 1:
        raise ValueError(
            f"row_ptr must have {n_rows + 1} entries (rows + 1), got {row_ptr.numel()}"
        )
    if row_ptr.numel() == 0:
        raise ValueError("row_ptr must have rows + 1 >= 1 entries, got 0")
    if contents is None:
        contents = row_ptr.device.type == "cpu" and col_ind.device.type == "cpu"
    if not contents:
        return
    nnz = col_ind.numel()
    ptr = row_ptr.cpu()
    if int(ptr[0]) != 0:
        raise ValueError(f"row_ptr[0] must be 0, got {int(ptr[0])}")
    steps = ptr.diff()
    if steps.numel() and bool((steps < 0).any()):
        f = int((steps < 0).nonzero()[0])
        raise ValueError(
            f"row_ptr must be non-decreasing (row lengths >= 0): row_ptr[{f}] = {int(ptr[f])} "
            f"> row_ptr[{f + 1}] = {int(ptr[f + 1])}"
        )
    if int(ptr[-1]) != nnz:
        raise ValueError(
            f"row_ptr[-1] = {int(ptr[-1])} must equal the number of entries of col_ind ({nnz})"
        )
    if nnz == 0:
        return
    cols = col_ind.cpu()
    lo, hi = int(cols.min()), int(cols.max())
    if n_cols is not None and (lo < 0 or hi >= n_cols):
        j = int(((cols < 0) | (cols >= n_cols)).nonzero()[0])
        raise ValueError(
            f"col_ind must lie in [0, {n_cols}) ({width}); col_ind[{j}] = {int(cols[j])}"
        )
    if lo < 0:
        j = int((cols < 0).nonzero()[0])
        raise ValueError(f"col_ind must be >= 0; col_ind[{j}] = {int(cols[j])}")
    # Entry j + 1 must exceed entry j unless a row starts at j + 1.
    rises = cols.diff() > 0
    starts = ptr[1:-1]
    rises[starts[(starts > 0) & (starts < nnz)] - 1] = True
    if not bool(rises.all()):
        j = int((~rises).nonzero()[0])
        f = int(torch.searchsorted(ptr, j, right=True)) - 1
        raise ValueError(
            f"col_ind must strictly increase within each row (sorted, no duplicate column): "
            f"row {f} has col_ind[{j + 1}] = {int(cols[j + 1])} after col_ind[{j}] = "
            f"{int(cols[j])}"
        )


# -- conversion -------------------------------------------------------------------------------


def pattern_csr(
    dense: torch.Tensor,
    row_ptr: torch.Tensor,
    col_ind: torch.Tensor,
    impl: str = "auto",
    *,
    index: PatternIndex | None = None,
) -> torch.Tensor:
    """CSR values of ``dense`` at predefined positions (Sec. 5.1, ``Convert2CSR``).

    ``dense`` is ``[F, K]`` or a conv weight ``[F, C, R, S]`` (read as ``F x C*R*S``);
    returns the ``[nnz]`` values ``dense[f, col_ind[j]]`` for ``row_ptr[f] <= j <
    row_ptr[f + 1]``, in CSR order. Differentiable: the gradient flows back to the
    positions read, and is zero elsewhere. The reference path raises ``ValueError`` on an
    index that :func:`check_csr` refuses (columns must lie in ``[0, K)``).

    ``index`` (the :class:`PatternIndex` of ``(row_ptr, col_ind)``, :func:`pattern_index`)
    says that the positions were fixed and checked once, when the pattern was: the reference
    then checks only that they are the index's (:func:`check_index_matches`, free for the
    index's own tensors), not every position on every call, as ClickTrain converts with
    positions predefined when the pattern is chosen.
    """
    use = _resolve_impl(impl, dense)
    if dense.dim() < 2:
        raise ValueError(f"dense must have at least 2 dims, got {dense.dim()}")
    if use == "cuda":
        from impl.ops.pattern_cuda import pattern_csr_cuda

        return pattern_csr_cuda(dense, row_ptr, col_ind)
    flat = dense.flatten(1)
    if index is None:
        check_csr(row_ptr, col_ind, flat.shape[0], flat.shape[1], width="the matrix's width")
    else:
        check_index_matches(index, row_ptr, col_ind, flat.shape[1])
    return flat[csr_rows(row_ptr, col_ind.numel()), col_ind]


# -- SpMM -------------------------------------------------------------------------------------


def _csr(values: torch.Tensor, row_ptr: torch.Tensor, col_ind: torch.Tensor, shape) -> torch.Tensor:
    with warnings.catch_warnings():
        # torch marks sparse CSR as beta; the ops used here are stable since torch 2.0.
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(row_ptr, col_ind, values, size=shape)


def check_floating(**tensors: torch.Tensor | None) -> None:
    """``ValueError`` naming each of ``tensors`` (None skipped) that is not floating point:
    the pattern products compute in floating point, and an integer operand would come back
    rounded or wrapped into its own dtype (``torch.nn.functional.conv2d`` refuses it too)."""
    bad = [
        f"{k} ({t.dtype})"
        for k, t in tensors.items()
        if t is not None and not t.is_floating_point()
    ]
    if bad:
        raise ValueError(f"pattern ops need floating-point tensors; got {', '.join(bad)}")


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    if t.device.type == "cpu" and t.dtype not in _CPU_SPARSE_DTYPES:
        return torch.float32
    return t.dtype


def _autocast_off(backward: Callable[..., Any]) -> Callable[..., Any]:
    """An autograd backward (a Function's, or a CUDA custom op's) run with autocast off on its
    gradient's device, as the pattern ops' forward runs (:func:`pattern_conv2d`), even when
    ``.backward()`` is called inside autocast (``torch.amp.custom_bwd`` needs one device type
    per function): the pattern kernels take float32 or float64 only."""

    @functools.wraps(backward)
    def run(ctx: Any, grad_out: torch.Tensor) -> Any:
        device = grad_out.device.type
        if not torch.amp.is_autocast_available(device):  # "meta" (fake tensors): none to turn off
            return backward(ctx, grad_out)
        with torch.autocast(device, enabled=False):
            return backward(ctx, grad_out)

    return run


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` in float32 when it is a 16-bit float (float64 and integers as they are)."""
    return t.float() if t is not None and t.dtype in (torch.float16, torch.bfloat16) else t


def _spmm_2d(
    values, row_ptr, col_ind, shape, b: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``A @ b`` for CSR ``A`` of ``shape`` and dense ``[K, N]`` ``b``.

    ``out``: a contiguous ``[F, N]`` buffer of ``b``'s dtype to write the product into (its
    contents are ignored). The same sparse-dense product as ``torch.sparse.mm``, which
    allocates and zero-fills a result and copies it once more; bit for bit the same values.
    """
    dtype = _compute_dtype(b)
    a = _csr(values.to(dtype), row_ptr, col_ind, shape)
    if out is not None and dtype == b.dtype:
        return torch.addmm(out, a, b, beta=0.0, alpha=1.0, out=out)
    return torch.sparse.mm(a, b.to(dtype)).to(b.dtype)


def _sddmm_2d(row_ptr, col_ind, shape, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """``(left @ right)`` sampled at the CSR positions: ``[nnz]`` values (SDDMM)."""
    dtype = _compute_dtype(left)
    zeros = torch.zeros(col_ind.numel(), dtype=dtype, device=left.device)
    pattern = _csr(zeros, row_ptr, col_ind, shape)
    out = torch.sparse.sampled_addmm(pattern, left.to(dtype), right.to(dtype), beta=0.0)
    return out.values().to(left.dtype)


def _to_2d(b: torch.Tensor) -> torch.Tensor:
    """``[B, K, N] -> [K, B*N]`` (batch folded into the columns)."""
    return b.permute(1, 0, 2).reshape(b.shape[1], b.shape[0] * b.shape[2])


def _from_2d(c: torch.Tensor, batch: int, n: int) -> torch.Tensor:
    """``[F, B*N] -> [B, F, N]`` (explicit sizes: ``B`` or ``N`` may be 0)."""
    return c.reshape(c.shape[0], batch, n).permute(1, 0, 2)


class _PatternSpMM(torch.autograd.Function):
    """``out = A @ B`` for CSR ``A`` with fixed positions; gradients only at those positions.

    ``index`` may be None: the transpose that the input gradient needs is then built in the
    backward, and only when that gradient is asked for (a forward alone never builds it).
    """

    @staticmethod
    def forward(ctx, values, b, row_ptr, col_ind, shape, index: PatternIndex | None):  # type: ignore[override]
        batched = b.dim() == 3
        b2 = _to_2d(b) if batched else b
        out = _spmm_2d(values, row_ptr, col_ind, shape, b2)
        ctx.index = index
        ctx.shape = shape
        ctx.batch = (b.shape[0], b.shape[2]) if batched else None
        ctx.save_for_backward(values, b2, row_ptr, col_ind)
        if not batched:
            return out
        # a contiguous tensor of its own, as the CUDA path returns: a view of ``out`` would
        # be refused an in-place edit by autograd, and permuted it is slow to read
        return _from_2d(out, b.shape[0], b.shape[2]).clone(memory_format=torch.contiguous_format)

    @staticmethod
    @_autocast_off
    def backward(ctx, grad_out):  # type: ignore[override]
        values, b2, row_ptr, col_ind = ctx.saved_tensors
        shape = ctx.shape
        g2 = _to_2d(grad_out) if ctx.batch is not None else grad_out
        grad_values = grad_b = None
        if ctx.needs_input_grad[0]:
            # SDDMM: dL/dA = grad_out @ B^T, only at the stored positions.
            grad_values = _sddmm_2d(row_ptr, col_ind, shape, g2, b2.t())
        if ctx.needs_input_grad[1]:
            # dL/dB = A^T @ grad_out, with A^T in CSR from the index's transpose (built here
            # when no index was given).
            index = ctx.index
            if index is None:
                index = PatternIndex(
                    row_ptr, col_ind, *_transpose(row_ptr, col_ind, shape[1]), shape
                )
            shape_t = (shape[1], shape[0])
            values_t = values[index.t_perm]
            gb = _spmm_2d(values_t, index.t_row_ptr, index.t_col_ind, shape_t, g2)
            grad_b = _from_2d(gb, *ctx.batch) if ctx.batch is not None else gb
        return grad_values, grad_b, None, None, None, None


def pattern_spmm(
    values: torch.Tensor,
    row_ptr: torch.Tensor,
    col_ind: torch.Tensor,
    dense_b: torch.Tensor,
    impl: str = "auto",
    *,
    index: PatternIndex | None = None,
) -> torch.Tensor:
    """Sparse (CSR, predefined positions) times dense matrix product (Sec. 5.2).

    ``A`` is the ``F x K`` CSR matrix ``(values, row_ptr, col_ind)`` with ``K =
    dense_b.shape[-2]``; ``dense_b`` is ``[K, N]`` or batched ``[B, K, N]``; returns ``A @
    dense_b``: ``[F, N]`` or ``[B, F, N]``. Differentiable in ``values`` (gradient at the
    stored positions only, an SDDMM) and in ``dense_b`` (``A^T @ grad``). ``index`` may pass
    a precomputed :class:`PatternIndex` with the transposed structure, saving its
    construction in every backward that asks for the gradient of ``dense_b`` (without an
    index the transpose is built there; a forward alone never builds it): it must be the
    index of ``(row_ptr, col_ind)`` (``ValueError`` otherwise, :func:`check_index_matches`),
    and its transposed fields are trusted as built by :func:`pattern_index`. The reference
    path raises ``ValueError`` on an index that :func:`check_csr` refuses (columns must lie
    in ``[0, K)``); any path refuses operands that are not floating point
    (:func:`check_floating`).
    """
    check_floating(values=values, dense_b=dense_b)
    if "meta" in (values.device.type, dense_b.device.type):  # shape inference: the result's shape
        if dense_b.dim() not in (2, 3):
            raise ValueError(f"dense_b must be [K, N] or [B, K, N], got {tuple(dense_b.shape)}")
        rows = (row_ptr.numel() - 1, dense_b.shape[-1])
        dtype = torch.promote_types(values.dtype, dense_b.dtype)
        return torch.empty((*dense_b.shape[:-2], *rows), dtype=dtype, device="meta")
    if torch.is_autocast_enabled(dense_b.device.type):  # float32, as pattern_conv2d does
        with torch.autocast(dense_b.device.type, enabled=False):
            return pattern_spmm(_f32(values), row_ptr, col_ind, _f32(dense_b), impl, index=index)
    use = _resolve_impl(impl, values, dense_b)
    if use == "cuda":
        from impl.ops.pattern_cuda import pattern_spmm_cuda

        return pattern_spmm_cuda(values, row_ptr, col_ind, dense_b, index=index)
    if dense_b.dim() not in (2, 3):
        raise ValueError(f"dense_b must be [K, N] or [B, K, N], got {tuple(dense_b.shape)}")
    n_cols = dense_b.shape[-2]
    check_csr(row_ptr, col_ind, None, n_cols, width="the rows of dense_b")
    if values.shape != col_ind.shape:
        raise ValueError(f"values {tuple(values.shape)} must match col_ind {tuple(col_ind.shape)}")
    if index is not None:
        check_index_matches(index, row_ptr, col_ind, n_cols)
    shape = (row_ptr.numel() - 1, n_cols)
    return _PatternSpMM.apply(values, dense_b, row_ptr, col_ind, shape, index)


# -- convolution ------------------------------------------------------------------------------


def conv_output_size(
    h: int,
    w: int,
    r: int,
    s: int,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
) -> tuple[int, int]:
    """Output height and width of a convolution (the formula of ``torch.nn.Conv2d``)."""
    ho = (h + 2 * padding[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
    wo = (w + 2 * padding[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1
    return ho, wo


def conv_pattern_index(
    x: torch.Tensor, weight: torch.Tensor, pattern: torch.Tensor | PatternIndex
) -> PatternIndex:
    """The :class:`PatternIndex` of a pattern conv's ``pattern`` (a keep mask shaped like
    ``weight`` or an index already built), after checking that ``x`` is ``[B, C, H, W]``,
    ``weight`` ``[F, C, R, S]`` with the same ``C`` (no groups) and the index is for the
    ``F x C*R*S`` filter matrix; ``ValueError`` otherwise."""
    if x.dim() != 4 or weight.dim() != 4:
        raise ValueError(
            f"x must be [B, C, H, W] and weight [F, C, R, S]; got {tuple(x.shape)}, "
            f"{tuple(weight.shape)}"
        )
    if x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"x has {x.shape[1]} channels but weight expects {weight.shape[1]} (groups unsupported)"
        )
    index = pattern if isinstance(pattern, PatternIndex) else pattern_index(pattern)
    f_out, k = weight.shape[0], math.prod(weight.shape[1:])
    if index.shape != (f_out, k):
        raise ValueError(f"pattern is for a {index.shape} filter matrix, weight is {(f_out, k)}")
    return index


def _pair(v: int | Sequence[int], name: str = "value") -> tuple[int, int]:
    """``v`` as two ints: an integer for both dims, or a sequence of two integers (bools and
    strings are neither)."""
    items = v if isinstance(v, Sequence) else (v, v)
    try:
        if len(items) == 2 and not any(isinstance(e, (bool, str)) for e in items):
            return (operator.index(items[0]), operator.index(items[1]))
    except TypeError:  # not an integer (a float, a float tensor)
        pass
    raise ValueError(f"{name} must be an int or two ints, got {v!r}")


def conv_geometry(
    stride: int | Sequence[int], padding: int | Sequence[int], dilation: int | Sequence[int]
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """``(stride, padding, dilation)`` of a pattern conv as pairs of ints, checked as
    ``torch.nn.functional.conv2d`` checks them: stride and dilation at least 1, padding at
    least 0, integers only (``"same"``-style strings are not supported); ``ValueError``
    otherwise."""
    st, pad, dil = _pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation")
    for name, pair, least in (("stride", st, 1), ("padding", pad, 0), ("dilation", dil, 1)):
        if min(pair) < least:
            raise ValueError(f"{name} must be at least {least} in both dims, got {pair}")
    return st, pad, dil


def _im2col_values(
    x: torch.Tensor, geometry: tuple, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The ``[C*R*S, B*P*Q]`` im2col matrix of ``x`` (into ``out`` when given), one strided copy."""
    (r, s), (sh, sw), (ph, pw), (dh, dw), (ho, wo) = geometry
    b, c = x.shape[0], x.shape[1]
    xt = F.pad(x, (pw, pw, ph, ph)).transpose(0, 1).contiguous()  # [C, B, Hp, Wp]
    st_c, st_b, st_h, st_w = xt.stride()
    view = xt.as_strided(
        (c, r, s, b, ho, wo), (st_c, st_h * dh, st_w * dw, st_b, st_h * sh, st_w * sw)
    )
    if out is None:
        return view.reshape(c * r * s, b * ho * wo)
    out.view(c, r, s, b, ho, wo).copy_(view)
    return out


def _col2im(grad_cols: torch.Tensor, shape: torch.Size, geometry: tuple) -> torch.Tensor:
    """col2im: the ``[B, C, H, W]`` gradient of the input from that of its im2col matrix."""
    (r, s), (sh, sw), (ph, pw), (dh, dw), (ho, wo) = geometry
    b, c, h, w = shape
    g = grad_cols.reshape(c, r, s, b, ho, wo)
    grad = grad_cols.new_zeros(c, b, h + 2 * ph, w + 2 * pw)
    for i in range(r):
        for j in range(s):
            rows = slice(i * dh, i * dh + sh * (ho - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (wo - 1) + 1, sw)
            grad[:, :, rows, cols] += g[:, i, j]
    grad = grad[:, :, ph : ph + h, pw : pw + w]
    return grad.transpose(0, 1)


class _Im2Col(torch.autograd.Function):
    """im2col into the ``[C*R*S, B*P*Q]`` layout the SpMM reads (rows in im2col order).

    Same values as ``F.unfold`` (permuted so the batch joins the columns), built with one
    strided copy; the backward pass (col2im) adds the ``R*S`` shifted slices back.
    """

    @staticmethod
    def forward(ctx, x, kernel, stride, padding, dilation, out_hw):  # type: ignore[override]
        geometry = (kernel, stride, padding, dilation, out_hw)
        ctx.geometry = (x.shape, geometry)
        return _im2col_values(x, geometry)

    @staticmethod
    def backward(ctx, grad_cols):  # type: ignore[override]
        shape, geometry = ctx.geometry
        return _col2im(grad_cols, shape, geometry), None, None, None, None, None


def im2col(
    x: torch.Tensor,
    kernel: tuple[int, int],
    stride: tuple[int, int] = (1, 1),
    padding: tuple[int, int] = (0, 0),
    dilation: tuple[int, int] = (1, 1),
) -> torch.Tensor:
    """The ``[C*R*S, B*P*Q]`` im2col matrix of ``x`` ``[B, C, H, W]`` (autograd-aware).

    Row ``c*R*S + r*S + s``, column ``b*P*Q + p*Q + q`` holds the input under kernel
    position ``(r, s)`` of output pixel ``(p, q)`` of sample ``b``: ``F.unfold(x)`` with the
    batch moved into the columns.
    """
    kernel = _pair(kernel, "kernel")
    if min(kernel) < 1:
        raise ValueError(f"kernel must be at least 1 in both dims, got {kernel}")
    stride, padding, dilation = conv_geometry(stride, padding, dilation)
    ho = (x.shape[2] + 2 * padding[0] - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    wo = (x.shape[3] + 2 * padding[1] - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    if ho < 1 or wo < 1:
        raise ValueError(f"input {tuple(x.shape)} is smaller than the kernel {kernel}")
    return _Im2Col.apply(x, kernel, stride, padding, dilation, (ho, wo))


def pattern_conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    pattern: PatternIndex | torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    impl: str = "auto",
    *,
    workspace: _Workspace | None = None,
) -> torch.Tensor:
    """2-D convolution with a pattern-sparse weight, as SpMM on the im2col matrix (Sec. 5.2).

    ``x`` is ``[B, C, H, W]``, ``weight`` the dense-shaped ``[F, C, R, S]`` parameter and
    ``pattern`` its kept positions: a :class:`PatternIndex` (built once with
    :func:`pattern_index`) or a mask of ``weight``'s shape. Forward: the weight's values at
    the kept positions (:func:`pattern_csr`) times :func:`im2col` of ``x``. Backward: the input
    gradient is the transposed sparse filter matrix times the output gradient, folded back
    (col2im); the weight gradient is computed only at the kept positions (SDDMM) and is
    exactly zero elsewhere. Equals ``conv2d(x, weight * mask, ...)``. Groups are not
    supported. ``impl``: :data:`CONV_IMPLS`; ``"cpu"`` (and ``"auto"`` on CPU tensors where
    it builds) computes the same three products by the direct sparse convolution of
    :mod:`impl.ops.pattern_cpu`, without the im2col matrix, equal to the reference to
    rounding. ``workspace`` (the reference path on the CPU): the buffers of a
    :class:`PatternConv2d`, reused across calls. The CPU paths check ``pattern``'s
    ``row_ptr``/``col_ind`` with :func:`check_csr` (with a ``workspace``, once per
    structure: again only after the index tensors are written). Operands that are not
    floating point are refused (:func:`check_floating`).
    """
    check_floating(x=x, weight=weight, bias=bias)
    if bias is not None and tuple(bias.shape) != tuple(weight.shape[:1]):
        raise ValueError(
            f"bias must be [F] = {tuple(weight.shape[:1])} for weight "
            f"{tuple(weight.shape)}, got {tuple(bias.shape)}"
        )
    if "meta" in (x.device.type, weight.device.type):  # shape inference: the result's shape
        if x.dim() != 4 or weight.dim() != 4 or x.shape[1] != weight.shape[1]:
            conv_pattern_index(x, weight, pattern)  # its ValueError
        return F.conv2d(x.to("meta"), weight.to("meta"), None if bias is None else
                        bias.to("meta"), *conv_geometry(stride, padding, dilation))  # fmt: skip
    if torch.is_autocast_enabled(x.device.type):
        # No 16-bit pattern kernels: under autocast the op runs as autocast runs the ops it
        # has no low-precision rule for, on float32 copies of 16-bit operands, autocast off
        # inside (a float32 output; the next autocast op casts it again).
        with torch.autocast(x.device.type, enabled=False):
            return pattern_conv2d(_f32(x), _f32(weight), pattern, _f32(bias), stride, padding,
                                  dilation, impl, workspace=workspace)  # fmt: skip
    index = conv_pattern_index(x, weight, pattern)
    stride, padding, dilation = conv_geometry(stride, padding, dilation)
    path = resolve_conv_impl(impl, x, weight, *([] if bias is None else [bias]))
    if path == "cuda":
        from impl.ops.pattern_cuda import pattern_conv2d_cuda

        return pattern_conv2d_cuda(x, weight, index, bias, stride, padding, dilation)
    r, s = weight.shape[2], weight.shape[3]
    h_out, w_out = conv_output_size(x.shape[2], x.shape[3], r, s, stride, padding, dilation)
    if h_out < 1 or w_out < 1:
        raise ValueError(f"input {tuple(x.shape)} is smaller than the kernel {(r, s)}")
    flat = weight.flatten(1)
    if workspace is None:
        check_csr(index.row_ptr, index.col_ind, flat.shape[0], flat.shape[1], width="C*R*S")
    else:
        workspace.check(index, flat.shape[0], flat.shape[1])
    geometry = ((r, s), stride, padding, dilation, (h_out, w_out))
    if path == "cpu" and x.numel() > 0 and weight.numel() > 0:
        from impl.ops.pattern_cpu import pattern_conv_cpu

        out = pattern_conv_cpu(weight, x, index, geometry)  # [B, F, P, Q]
    else:
        values = flat[csr_rows(index.row_ptr, index.col_ind.numel()), index.col_ind]  # pattern_csr
        out = _PatternConvRef.apply(values, x, index, geometry, workspace)  # [B, F, P, Q]
    if bias is not None:
        out = out + bias.view(1, -1, 1, 1)
    return out


def pattern_conv_unsupported(conv: nn.Conv2d) -> str | None:
    """Why :class:`PatternConv2d` cannot run ``conv`` (groups, a padding mode other than
    zeros, or padding given as "same"/"valid"), or None where it can."""
    if conv.groups != 1:
        return f"supports groups=1 only, got groups={conv.groups}"
    if conv.padding_mode != "zeros":
        return f"needs padding_mode='zeros', got {conv.padding_mode}"
    if isinstance(conv.padding, str):
        return f"needs numeric padding, not {conv.padding!r}"
    return None


class _Workspace:
    """The large buffers one :class:`PatternConv2d` reuses from one iteration to the next.

    The im2col matrix of a layer and its gradient are ``C*R*S x B*P*Q`` (75 MB for a 16-channel
    3x3 conv at batch 128 on 32x32 images). On the CPU an allocation that large is mapped
    from the operating system and page-faulted in on first touch, every iteration (glibc
    maps blocks above at most 32 MB directly); writing into a kept buffer instead is several
    times faster. The forward buffer is saved for the backward pass, so it is reused only
    once the autograd node of the last forward that saved it is gone (a weak reference);
    while that graph lives, a new forward gets a new buffer. The backward buffer is only
    read within one backward call. Copies and pickles of the module start empty.
    """

    def __init__(self) -> None:
        self._cols: torch.Tensor | None = None
        self._cols_owner: weakref.ref | None = None
        self._out: torch.Tensor | None = None
        self._grad_cols: torch.Tensor | None = None
        self._grad_busy = False
        self._checked: tuple | None = None

    def check(self, index: PatternIndex, n_rows: int, n_cols: int) -> None:
        """:func:`check_csr` of ``index``'s ``row_ptr``/``col_ind``, skipped when the same
        tensors passed it already and were not written since (torch's version counter, which
        an in-place write such as ``load_state_dict`` bumps): a layer's structure is checked
        once, not on every forward."""
        key = tuple(
            (t.data_ptr(), t._version, t.numel(), t.device) for t in (index.row_ptr, index.col_ind)
        )
        if key != self._checked:
            check_csr(index.row_ptr, index.col_ind, n_rows, n_cols, width="C*R*S")
            self._checked = key

    def __deepcopy__(self, memo: dict) -> _Workspace:
        return _Workspace()

    def __reduce__(self) -> tuple:
        return (_Workspace, ())

    @staticmethod
    def _fits(buf: torch.Tensor | None, shape: tuple[int, int], like: torch.Tensor) -> bool:
        return (
            buf is not None
            and tuple(buf.shape) == shape
            and buf.dtype == like.dtype
            and buf.device == like.device
        )

    def cols(self, owner: Any, shape: tuple[int, int], like: torch.Tensor) -> torch.Tensor:
        """The forward im2col buffer, now owned by the autograd node ``owner``."""
        busy = self._cols_owner is not None and self._cols_owner() is not None
        if busy or not self._fits(self._cols, shape, like):
            self._cols = torch.empty(shape, dtype=like.dtype, device=like.device)
        self._cols_owner = weakref.ref(owner)
        return self._cols

    def out(self, shape: tuple[int, int], like: torch.Tensor) -> torch.Tensor:
        """The forward product's buffer (read before the forward returns)."""
        if not self._fits(self._out, shape, like):
            self._out = torch.empty(shape, dtype=like.dtype, device=like.device)
        return self._out

    def take_grad_cols(self, shape: tuple[int, int], like: torch.Tensor) -> torch.Tensor | None:
        """The backward im2col-gradient buffer; ``None`` while another backward holds it."""
        if self._grad_busy:
            return None
        if not self._fits(self._grad_cols, shape, like):
            self._grad_cols = torch.empty(shape, dtype=like.dtype, device=like.device)
        self._grad_busy = True
        return self._grad_cols

    def give_grad_cols(self) -> None:
        """Hand the backward buffer back."""
        self._grad_busy = False


class _PatternConvRef(torch.autograd.Function):
    """The reference pattern conv: im2col, CSR SpMM and both of their backward passes.

    The operations of :func:`im2col` followed by :func:`pattern_spmm` and the reshape to
    ``[B, F, P, Q]``, in the same order on the same values (bit for bit the same results),
    with the im2col matrix and the products written into buffers (of ``workspace`` on the
    CPU, fresh otherwise) instead of allocated by ``torch.sparse.mm``, which zero-fills a
    result and then copies it.
    """

    @staticmethod
    def forward(ctx, values, x, index: PatternIndex, geometry, workspace):  # type: ignore[override]
        ws = workspace if workspace is not None and x.device.type == "cpu" else None
        (r, s), _, _, _, (ho, wo) = geometry
        b, c = x.shape[0], x.shape[1]
        f_out = index.shape[0]
        k, n = c * r * s, b * ho * wo
        if ws is not None:
            cols = ws.cols(ctx, (k, n), x)
        else:
            cols = torch.empty((k, n), dtype=x.dtype, device=x.device)
        _im2col_values(x, geometry, cols)
        # The reshape below copies unless B or F is 1, where it would return a view of `buf`.
        buf = ws.out((f_out, n), x) if ws is not None and b > 1 and f_out > 1 else None
        out = _spmm_2d(values, index.row_ptr, index.col_ind, index.shape, cols, out=buf)
        ctx.save_for_backward(values, cols)
        ctx.index, ctx.geometry, ctx.x_shape, ctx.ws = index, geometry, x.shape, ws
        # [F, B*P*Q] -> [B, F, P, Q]
        res = out.reshape(f_out, b, ho, wo).transpose(0, 1)
        # at B or F of 1 that is already contiguous, a view of `out`: a copy of its own, so
        # that autograd allows in-place edits of the result (as pattern_spmm's)
        return res.clone() if b == 1 or f_out == 1 else res.contiguous()

    @staticmethod
    @_autocast_off
    def backward(ctx, grad_out):  # type: ignore[override]
        values, cols = ctx.saved_tensors
        index: PatternIndex = ctx.index
        g2 = grad_out.transpose(0, 1).reshape(index.shape[0], -1)  # [F, B*P*Q]
        grad_values = grad_x = None
        if ctx.needs_input_grad[0]:
            # SDDMM: dL/dA = grad_out @ B^T, only at the stored positions.
            grad_values = _sddmm_2d(index.row_ptr, index.col_ind, index.shape, g2, cols.t())
        if ctx.needs_input_grad[1]:
            # dL/dB = A^T @ grad_out, with A^T in CSR from the precomputed transpose; then col2im.
            shape_t = (index.shape[1], index.shape[0])
            values_t = values[index.t_perm]
            ws: _Workspace | None = ctx.ws
            buf = ws.take_grad_cols(tuple(cols.shape), g2) if ws is not None else None
            try:
                if buf is None:
                    buf = torch.empty(cols.shape, dtype=g2.dtype, device=g2.device)
                grad_cols = _spmm_2d(values_t, index.t_row_ptr, index.t_col_ind, shape_t, g2, buf)
                grad_x = _col2im(grad_cols, ctx.x_shape, ctx.geometry)
            finally:
                if ws is not None:
                    ws.give_grad_cols()
        return grad_values, grad_x, None, None, None


class PatternConv2d(nn.Conv2d):
    """A conv whose weight keeps only fixed positions, run as pattern SpMM (Sec. 5.2, stage 5).

    A subclass of :class:`torch.nn.Conv2d`, so code that looks for convolutions (weight
    counts, FLOPs) still finds it. The weight stays a dense-shaped ``[F, C, R, S]``
    parameter (zero outside the mask), so a model's state dict keeps its keys and the
    optimizer its parameter; the CSR structure is built once from the mask and stored as
    buffers.

    Args:
        weight: the dense-shaped weight parameter (shared, not copied).
        mask: kept positions, ``weight``'s shape.
        bias: optional bias parameter (shared).
        stride, padding, dilation: as for :class:`torch.nn.Conv2d`.
        impl: ``"auto"``, ``"ref"``, ``"cuda"`` or ``"cpu"`` (see the module docstring).
    """

    def __init__(
        self,
        weight: nn.Parameter,
        mask: torch.Tensor,
        bias: nn.Parameter | None = None,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        impl: str = "auto",
    ) -> None:
        if weight.dim() != 4:
            raise ValueError(f"weight must be [F, C, R, S], got {tuple(weight.shape)}")
        if mask.shape != weight.shape:
            raise ValueError(f"mask {tuple(mask.shape)} must match weight {tuple(weight.shape)}")
        resolve_conv_impl(impl)
        stride, padding, dilation = conv_geometry(stride, padding, dilation)
        f_out, c_in, r, s = weight.shape
        # Built on the meta device: no memory, the real parameters are assigned right after.
        super().__init__(
            c_in,
            f_out,
            (r, s),
            stride=stride,
            padding=padding,
            dilation=dilation,
            bias=bias is not None,
            device="meta",
            dtype=weight.dtype,
        )
        self.weight = weight
        self.bias = bias
        self.impl = impl
        self._workspace = _Workspace()  # reused im2col buffers (reference path, CPU)
        idx = pattern_index(mask.to(weight.device))
        self.register_buffer("mask", (mask != 0).to(weight.device))
        self.register_buffer("row_ptr", idx.row_ptr)
        self.register_buffer("col_ind", idx.col_ind)
        self.register_buffer("t_row_ptr", idx.t_row_ptr)
        self.register_buffer("t_col_ind", idx.t_col_ind)
        self.register_buffer("t_perm", idx.t_perm)
        with torch.no_grad():
            self.weight.mul_(self.mask)

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, mask: torch.Tensor, impl: str = "auto") -> PatternConv2d:
        """Wrap ``conv``'s parameters (shared, not copied) with the kept positions ``mask``;
        ``ValueError`` for a conv it cannot run (:func:`pattern_conv_unsupported`). The shared
        weight is zeroed outside ``mask`` in place, so ``conv`` itself then computes the pruned
        convolution too; pass a copy (``copy.deepcopy(conv)``) to keep ``conv`` dense."""
        why = pattern_conv_unsupported(conv)
        if why:
            raise ValueError(f"PatternConv2d {why}")
        return cls(
            conv.weight, mask, conv.bias, conv.stride, conv.padding, conv.dilation, impl=impl
        )

    def index(self) -> PatternIndex:
        """The layer's :class:`PatternIndex` (from its buffers)."""
        k = self.weight[0].numel()
        return PatternIndex(
            self.row_ptr,
            self.col_ind,
            self.t_row_ptr,
            self.t_col_ind,
            self.t_perm,
            (self.weight.shape[0], k),
        )

    def nnz(self) -> int:
        """Number of kept weights."""
        return int(self.col_ind.numel())

    def density(self) -> float:
        """Fraction of the weight's positions that are kept, in [0, 1]."""
        return self.nnz() / max(self.weight.numel(), 1)

    def executed_density(self) -> LayerDensity:
        """Fractions of the dense conv's multiply-adds this layer executes (:mod:`impl.flops`).

        The same for the forward pass, the input gradient and the weight gradient: each
        touches only the ``nnz`` kept weights (SpMM, transposed SpMM, SDDMM).
        """
        from impl.flops import LayerDensity

        return LayerDensity.uniform(self.density())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return pattern_conv2d(
            x,
            self.weight,
            self.index(),
            self.bias,
            self.stride,
            self.padding,
            self.dilation,
            impl=self.impl,
            workspace=self._workspace,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, density={self.density():.3f}"
