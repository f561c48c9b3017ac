"""Sparse operations: each has a reference (torch) path and a CUDA path behind one signature.

``impl="auto"`` picks the CUDA kernels when the tensors are on a GPU and the kernels load,
the reference otherwise; ``"ref"`` and ``"cuda"`` force one. Two ops also have a compiled
CPU path, which ``"auto"`` picks for CPU tensors where it builds and ``"cpu"`` forces:
:func:`nm_prune` (:mod:`impl.ops.nm_cpu`) and :func:`pattern_conv2d`
(:mod:`impl.ops.pattern_cpu`, :data:`CONV_IMPLS`).

* ClickTrain's pattern ops (Sec. 5.1, 5.2): :func:`pattern_positions`, :func:`pattern_index`,
  :func:`pattern_csr`, :func:`pattern_spmm`, :func:`pattern_conv2d`, :class:`PatternConv2d`
  (:mod:`impl.ops.pattern`);
* SDGP's N:M pruning (Sec. III-A/B): :func:`nm_prune` (:mod:`impl.ops.nm`, its CUDA path in
  :mod:`impl.ops.nm_cuda`);
* ClickTrain's sparse gradient communication (Sec. 5.3): :func:`mask_index`,
  :func:`grad_pack`, :func:`grad_unpack` (:mod:`impl.ops.pack_cuda`).

The pack ops are imported on first use (module ``__getattr__``), so that ``import impl.ops``
does not load the CUDA loader. Nothing here touches the GPU at import time. docs/kernels.md,
"On a CPU", runs each op.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from impl.ops.nm import nm_prune
from impl.ops.pattern import (
    CONV_IMPLS,
    IMPLS,
    PatternConv2d,
    PatternIndex,
    check_csr,
    csr_transpose,
    has_cuda_kernels,
    pattern_conv2d,
    pattern_csr,
    pattern_index,
    pattern_positions,
    pattern_spmm,
    resolve_conv_impl,
)

if TYPE_CHECKING:
    from impl.ops.pack_cuda import grad_pack, grad_unpack, mask_index

# name -> module that defines it, imported on first access
_LAZY: dict[str, str] = {
    "grad_pack": "impl.ops.pack_cuda",
    "grad_unpack": "impl.ops.pack_cuda",
    "mask_index": "impl.ops.pack_cuda",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'impl.ops' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "CONV_IMPLS",
    "IMPLS",
    "PatternConv2d",
    "PatternIndex",
    "check_csr",
    "csr_transpose",
    "grad_pack",
    "grad_unpack",
    "has_cuda_kernels",
    "mask_index",
    "nm_prune",
    "pattern_conv2d",
    "pattern_csr",
    "pattern_index",
    "pattern_positions",
    "pattern_spmm",
    "resolve_conv_impl",
]
