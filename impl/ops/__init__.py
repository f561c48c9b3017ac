"""Sparse operations: each has a reference (torch) path and a CUDA path behind one signature.

``impl="auto"`` picks the CUDA kernels when the tensors are on a GPU and the kernels load,
the reference otherwise; ``"ref"`` and ``"cuda"`` force one.
"""

from impl.ops.pattern import (
    IMPLS,
    PatternConv2d,
    PatternIndex,
    csr_transpose,
    has_cuda_kernels,
    pattern_conv2d,
    pattern_csr,
    pattern_index,
    pattern_positions,
    pattern_spmm,
)

__all__ = [
    "IMPLS",
    "PatternConv2d",
    "PatternIndex",
    "csr_transpose",
    "has_cuda_kernels",
    "pattern_conv2d",
    "pattern_csr",
    "pattern_index",
    "pattern_positions",
    "pattern_spmm",
]
