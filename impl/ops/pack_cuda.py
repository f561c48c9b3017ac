"""Gradient pack and unpack for sparse communication (ClickTrain Sec. 5.3), reference and CUDA.

Once the pruned weights stay zero their gradients need not be sent: before the Allreduce a
worker gathers the gradients at the mask's nonzero positions into one contiguous buffer
(:func:`grad_pack`), and after it scatters the reduced buffer back (:func:`grad_unpack`,
zero elsewhere). The positions are flat indices into the (flattened) gradient, built once
from the mask with :func:`mask_index`.

Each op has a torch reference (``*_ref``, which defines it) and a CUDA path
(``impl/cuda/pack.cu``, element-size generic: 1, 2, 4 or 8 bytes, int32 or int64 indices)
exposed as a ``torch.library.custom_op`` with a fake implementation; ``impl="auto"`` picks
CUDA when the tensors are on a GPU and the kernels load. Nothing here touches the GPU or
CuPy at import time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from impl.cuda import loader
from impl.ops import device_check, eager

_SRC = "pack.cu"
IMPLS: tuple[str, ...] = ("auto", "ref", "cuda")
_INDEX_SUFFIX = {torch.int32: "i32", torch.int64: "i64"}
_BLOCK = 256


EXPAND_TILE: int = loader.DEFINES["PDT_EXPAND_TILE"]  # positions per tile of expand


def _kernel_names() -> tuple[str, ...]:
    return tuple(
        f"pdt_{kind}_b{size}_{isuf}"
        for kind in ("pack", "unpack", "expand")
        for size in (1, 2, 4, 8)
        for isuf in _INDEX_SUFFIX.values()
    )


KERNELS: tuple[str, ...] = _kernel_names()  # every kernel this module may launch


def mask_index(mask: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Flat positions (row-major) of ``mask``'s nonzeros, sorted: int32 when ``mask`` has
    fewer than 2^31 elements (half the index bytes to read), else int64; or ``dtype``."""
    if dtype is None:
        dtype = torch.int32 if mask.numel() < 2**31 else torch.int64
    if dtype not in _INDEX_SUFFIX:
        raise ValueError(f"index dtype must be int32 or int64, got {dtype}")
    if dtype == torch.int32 and mask.numel() >= 2**31:
        raise ValueError(f"{mask.numel()} elements need int64 indices")
    return torch.flatten(mask != 0).nonzero().flatten().to(dtype)


def _check(index: torch.Tensor) -> None:
    if index.dtype not in _INDEX_SUFFIX or index.dim() != 1:
        raise ValueError(
            f"index must be a 1-D int32 or int64 tensor, got {index.dtype} {tuple(index.shape)}"
        )


def _check_positions(index: torch.Tensor, numel: int, *, unique: bool) -> None:
    """Every flat position in ``[0, numel)`` (and with ``unique`` none twice), read where the
    index lives on the CPU: the CUDA kernels trust the index, and on a GPU the read would
    stall the device (the same rule as :func:`impl.ops.pattern.check_csr`)."""
    if index.is_cuda or not index.numel():
        return
    lo, hi = int(index.min()), int(index.max())
    if lo < 0 or hi >= numel:
        bad = lo if lo < 0 else hi
        raise ValueError(f"index must lie in [0, {numel}) (the flat positions); got {bad}")
    if unique and torch.unique(index).numel() != index.numel():
        raise ValueError("index must not repeat a position (each is written once)")


def grad_pack_ref(grad: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The reference of :func:`grad_pack`: ``grad.flatten()[index]`` (``[nnz]``, by
    ``index_select``, which reads int32 positions as they are); positions outside
    ``[0, grad.numel())`` raise ``ValueError`` (read on the CPU only)."""
    _check(index)
    _check_positions(index, grad.numel(), unique=False)
    return grad.reshape(-1).index_select(0, index)


def grad_unpack_ref(
    buffer: torch.Tensor, index: torch.Tensor, shape: Sequence[int]
) -> torch.Tensor:
    """The reference of :func:`grad_unpack`: a zero tensor of ``shape`` holding ``buffer`` at
    the flat positions ``index``. As on the CUDA path, ``buffer`` has ``index``'s shape; the
    positions (read on the CPU only) lie in the tensor and are unique, or ``ValueError``."""
    _check(index)
    if buffer.shape != index.shape:
        raise ValueError(f"buffer {tuple(buffer.shape)} must match index {tuple(index.shape)}")
    _check_positions(index, math.prod(shape), unique=True)
    out = torch.zeros(list(shape), dtype=buffer.dtype, device=buffer.device)
    out.view(-1).scatter_(0, index.to(torch.int64), buffer)  # scatter_ takes int64 only
    return out


def _element_bits(dtype: torch.dtype) -> tuple[int, torch.dtype]:
    size = torch.empty((), dtype=dtype).element_size()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(size)
    if view is None:
        raise ValueError(f"pack/unpack move 1, 2, 4 or 8-byte elements; {dtype} has {size}")
    return size, view


def _grid(n: int, device: int) -> tuple[int, int, int]:
    return (max(1, min(-(-n // _BLOCK), loader.multiprocessor_count(device) * 16)), 1, 1)


def expand_starts(index: torch.Tensor, numel: int) -> torch.Tensor:
    """The tile table of :func:`expand` for a strictly ascending ``index`` into ``numel``
    positions: int64 ``[tiles + 1]`` (``tiles = ceil(numel / EXPAND_TILE)``), entry ``t`` the
    number of positions of ``index`` below ``t * EXPAND_TILE`` (so the last is ``nnz``), on
    ``index``'s device. Built once per index, as the index is. An index on the CPU is checked
    to be strictly ascending and in ``[0, numel)`` (ValueError); on a GPU it is trusted."""
    _check(index)
    _check_positions(index, numel, unique=False)
    if not index.is_cuda and index.numel() > 1 and not bool((index[1:] > index[:-1]).all()):
        raise ValueError("expand needs a strictly ascending index (mask_index builds one)")
    tiles = -(-numel // EXPAND_TILE)
    bounds = torch.arange(tiles + 1, device=index.device, dtype=torch.int64) * EXPAND_TILE
    bounds = bounds.clamp_(max=numel)  # int64: an int32 index may address 2**31 positions
    return torch.searchsorted(index, bounds)


def _pack(grad: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    _check(index)
    dev = device_check.require_cuda("grad_pack", "impl.ops.grad_pack", grad, index, sources=(_SRC,))
    size, view = _element_bits(grad.dtype)
    src = grad.contiguous().view(-1)
    if out is None:
        out = torch.empty(index.numel(), dtype=grad.dtype, device=grad.device)
    if out.numel():
        loader.launch(
            _SRC,
            f"pdt_pack_b{size}_{_INDEX_SUFFIX[index.dtype]}",
            _grid(out.numel(), dev),
            (_BLOCK, 1, 1),
            [src.view(view), index.contiguous(), out.view(view), np.int64(out.numel())],
            dev,
        )
    return out


def _check_into(buffer: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> None:
    """What writing ``buffer`` into ``out`` at ``index`` needs (ValueError otherwise): a 1-D
    int32 or int64 index, a buffer of its shape and of ``out``'s dtype, ``out`` contiguous."""
    _check(index)
    if buffer.shape != index.shape:
        raise ValueError(f"buffer {tuple(buffer.shape)} must match index {tuple(index.shape)}")
    if buffer.dtype != out.dtype:
        raise ValueError(f"buffer {buffer.dtype} and out {out.dtype} differ")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous (it is written through its flat view)")


def _unpack_into(buffer: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> None:
    """``out.view(-1)[index] = buffer`` (``out`` contiguous; other elements untouched)."""
    _check_into(buffer, index, out)
    dev = device_check.require_cuda(
        "grad_unpack", "impl.ops.grad_unpack", buffer, index, out, sources=(_SRC,)
    )
    size, view = _element_bits(buffer.dtype)
    if buffer.numel():
        loader.launch(
            _SRC,
            f"pdt_unpack_b{size}_{_INDEX_SUFFIX[index.dtype]}",
            _grid(buffer.numel(), dev),
            (_BLOCK, 1, 1),
            [
                buffer.contiguous().view(view),
                index.contiguous(),
                out.view(-1).view(view),
                np.int64(buffer.numel()),
            ],
            dev,
        )


def _expand_into(
    buffer: torch.Tensor, index: torch.Tensor, starts: torch.Tensor, out: torch.Tensor
) -> None:
    """Every element of ``out``: ``buffer[j]`` at ``index[j]``, zero elsewhere (``index``
    strictly ascending, ``starts`` its :func:`expand_starts` for ``out.numel()``)."""
    _check_into(buffer, index, out)
    tiles = -(-out.numel() // EXPAND_TILE)
    if starts.dtype != torch.int64 or starts.shape != (tiles + 1,):
        raise ValueError(
            f"starts must be expand_starts(index, {out.numel()}): int64 [{tiles + 1}], "
            f"got {starts.dtype} {tuple(starts.shape)}"
        )
    dev = device_check.require_cuda(
        "grad_expand", "impl.ops.pack_cuda.expand", buffer, index, starts, out, sources=(_SRC,)
    )
    size, view = _element_bits(buffer.dtype)
    if out.numel():
        loader.launch(
            _SRC,
            f"pdt_expand_b{size}_{_INDEX_SUFFIX[index.dtype]}",
            (max(1, min(tiles, loader.multiprocessor_count(dev) * 8)), 1, 1),
            (_BLOCK, 1, 1),
            [
                buffer.contiguous().view(view),
                index.contiguous(),
                starts.contiguous(),
                out.view(-1).view(view),
                np.int64(out.numel()),
            ],
            dev,
        )


def _unpack(buffer: torch.Tensor, index: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    out = torch.zeros(list(shape), dtype=buffer.dtype, device=buffer.device)
    _unpack_into(buffer, index, out)
    return out


@torch.library.custom_op("pdtbench::grad_pack", mutates_args=())
def _grad_pack_op(grad: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return _pack(grad, index)


@_grad_pack_op.register_fake
def _(grad, index):
    return grad.new_empty((index.shape[0],))


@torch.library.custom_op("pdtbench::grad_unpack", mutates_args=())
def _grad_unpack_op(buffer: torch.Tensor, index: torch.Tensor, shape: list[int]) -> torch.Tensor:
    return _unpack(buffer, index, shape)


@_grad_unpack_op.register_fake
def _(buffer, index, shape):
    return buffer.new_empty(shape)


@torch.library.custom_op("pdtbench::grad_unpack_into", mutates_args=("out",))
def _grad_unpack_into_op(buffer: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> None:
    _unpack_into(buffer, index, out)


@_grad_unpack_into_op.register_fake
def _(buffer, index, out):
    return None


@torch.library.custom_op("pdtbench::grad_expand_into", mutates_args=("out",))
def _grad_expand_into_op(
    buffer: torch.Tensor, index: torch.Tensor, starts: torch.Tensor, out: torch.Tensor
) -> None:
    _expand_into(buffer, index, starts, out)


@_grad_expand_into_op.register_fake
def _(buffer, index, starts, out):
    return None


def _use_cuda(impl: str, *tensors: torch.Tensor) -> bool:
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; valid: {', '.join(IMPLS)}")
    if impl == "ref":
        return False
    if impl == "cuda":
        return True  # the op raises a clear error without a GPU or kernels
    return all(t.is_cuda for t in tensors) and loader.has_cuda_kernels(
        tensors[0].device, sources=(_SRC,)
    )


def grad_pack(grad: torch.Tensor, index: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """Gather ``grad`` (any shape, read flat in row-major order) at the flat positions
    ``index`` into one contiguous ``[nnz]`` buffer (ClickTrain Sec. 5.3: only the gradients
    of unpruned weights are communicated)."""
    if _use_cuda(impl, grad, index):
        return eager.call(torch.ops.pdtbench.grad_pack, _pack, grad, index)
    return grad_pack_ref(grad, index)


def grad_unpack(
    buffer: torch.Tensor, index: torch.Tensor, shape: Sequence[int], impl: str = "auto"
) -> torch.Tensor:
    """Scatter a (reduced) ``[nnz]`` buffer back into a zero tensor of ``shape`` at the flat
    positions ``index`` (unique): the inverse of :func:`grad_pack` on the kept positions."""
    if _use_cuda(impl, buffer, index):
        return eager.call(torch.ops.pdtbench.grad_unpack, _unpack, buffer, index, list(shape))
    return grad_unpack_ref(buffer, index, shape)


def pack(flat: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """CUDA gather ``flat.reshape(-1)[index]`` into a new ``[nnz]`` tensor (the kernel of
    :func:`grad_pack`, for callers that dispatch themselves, e.g. :mod:`impl.comm`)."""
    return eager.call(torch.ops.pdtbench.grad_pack, _pack, flat, index)


def unpack(packed: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """CUDA scatter ``out.view(-1)[index] = packed`` in place (``out`` contiguous; elements
    off ``index`` are left as they are: zero them first for :func:`grad_unpack`'s result).
    Returns ``out``."""
    eager.call(torch.ops.pdtbench.grad_unpack_into, _unpack_into, packed, index, out, mutated=(2,))
    return out


def expand(
    packed: torch.Tensor, index: torch.Tensor, starts: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """CUDA: write all of ``out`` (contiguous) in one pass: ``packed[j]`` at the flat
    position ``index[j]``, zero everywhere else (the unpack of ClickTrain Sec. 5.3's sparse
    Allreduce, zeros at pruned positions). ``index`` must be strictly ascending (as
    :func:`mask_index` builds it) and ``starts`` its :func:`expand_starts` for
    ``out.numel()``. Unlike zeroing ``out`` and then :func:`unpack`, which writes the kept
    positions twice and scatters them, each element is written once, coalesced. Returns
    ``out``."""
    eager.call(
        torch.ops.pdtbench.grad_expand_into, _expand_into, packed, index, starts, out, mutated=(3,)
    )
    return out


__all__ = [
    "EXPAND_TILE",
    "IMPLS",
    "KERNELS",
    "expand",
    "expand_starts",
    "grad_pack",
    "grad_pack_ref",
    "grad_unpack",
    "grad_unpack_ref",
    "mask_index",
    "pack",
    "unpack",
]
