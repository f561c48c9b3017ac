"""Hand-written CUDA kernels (``*.cu``) and the one module that loads them (:mod:`.loader`).

Importing this package never touches the GPU nor imports CuPy; see :mod:`impl.cuda.loader`.
"""

from impl.cuda.loader import (
    DEFINES,
    KERNEL_DIR,
    SOURCES,
    compile_options,
    cuda_kernels_error,
    expand_source,
    has_cuda_kernels,
    kernels_environment_error,
    nvcc_command,
    source_hash,
)

__all__ = [
    "DEFINES",
    "KERNEL_DIR",
    "SOURCES",
    "compile_options",
    "cuda_kernels_error",
    "expand_source",
    "has_cuda_kernels",
    "kernels_environment_error",
    "nvcc_command",
    "source_hash",
]
