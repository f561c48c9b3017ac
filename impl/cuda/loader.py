"""The one module that loads the hand-written CUDA kernels of ``impl/cuda/*.cu``.

Kernels are compiled at first use by NVRTC through CuPy's ``RawModule`` and cached in this
process by (source, hash of the expanded source and options, GPU index, compute capability);
CuPy also keeps the compiled binary on disk (``~/.cupy/kernel_cache``), keyed by the source
text, the options and the architecture. Local headers (``#include "x.cuh"``) are pasted into
each source before compilation, so the hash (ours and CuPy's) covers them.

A launch passes each torch tensor as its device pointer (``data_ptr()``, a 64-bit value: no
DLPack export per call) while CuPy's current stream is torch's current stream, so kernels run
in torch's stream order. The launch path caches what it looks up (the kernel function per
source, name and device; the environment check), so a
repeated call pays only the launch itself. :func:`as_cupy` (DLPack, zero copy) remains for
code that wants CuPy arrays.

Nothing here touches the GPU, or imports CuPy, at import time. A failure to load (no GPU,
no CuPy, a compile error) is logged once and kept: :func:`has_cuda_kernels` then returns
``False`` and :func:`cuda_kernels_error` says why, and a CUDA op raises a ``RuntimeError``
that quotes the reason.

The compile options (:func:`compile_options`) are shared with the nvcc compile check of the
test suite (:func:`nvcc_command`), so that both compile the same code.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import logging
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

KERNEL_DIR: Path = Path(__file__).resolve().parent
SOURCES: tuple[str, ...] = ("pattern.cu", "nm_prune.cu", "pack.cu")

# Tunables of the kernels, passed as -D to NVRTC and to nvcc; the host code computes its
# launch grids from the same numbers (the .cuh defaults are the same values).
DEFINES: dict[str, int] = {
    "PDT_SPMM_WARPS": 8,
    "PDT_SPMM_TK": 32,
    "PDT_SPMM_TN_F32": 256,
    "PDT_SPMM_TN_F64": 128,
    "PDT_SPMM_RW_F32": 8,
    "PDT_SPMM_RW_F64": 4,
    "PDT_CONV_CPT": 4,
    "PDT_SDDMM_SEG": 1024,
    "PDT_SDDMM_EB": 1024,
    "PDT_SDDMM_KC": 128,
    "PDT_SDDMM_RT_F32": 8,
    "PDT_SDDMM_RT_F64": 4,
    "PDT_NM_BLOCK": 256,
    "PDT_EXPAND_TILE": 2048,
}
CXX_STD = "c++17"
# What CuPy's RawModule appends to our options when it calls NVRTC (cupy/cuda/compiler.py,
# CuPy 13-14): the compile checks add them too, so that they compile what runs. -ftz=true
# flushes float32 denormals; the N:M kernels therefore rank by integer keys and do the float32
# arithmetic that must match torch through explicit non-flushing PTX (pdt_common.cuh).
CUPY_NVRTC_OPTIONS: tuple[str, ...] = ("-ftz=true", "--device-as-default-execution-space")

_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$', re.MULTILINE)
_PRAGMA_ONCE_RE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once[ \t]*$", re.MULTILINE)


def compile_options() -> tuple[str, ...]:
    """Options given to NVRTC (and, with the same defines, to nvcc in the compile check).

    No fast-math: the N:M kernels must round exactly like the torch reference.
    """
    return (f"--std={CXX_STD}", *(f"-D{k}={v}" for k, v in sorted(DEFINES.items())))


def nvcc_command(
    sources: Sequence[str | Path], arch: str, out_dir: str | Path, nvcc: str = "nvcc"
) -> list[str]:
    """The nvcc command line that compiles ``sources`` to cubins for ``arch`` (e.g. "sm_80").

    ``-Xptxas -v`` makes ptxas print each kernel's registers and spill bytes. Uses the
    options of :func:`compile_options` (nvcc spells ``--std`` the same way).
    """
    return [
        nvcc,
        "-cubin",
        f"-arch={arch}",
        "-Xptxas",
        "-v",
        f"-I{KERNEL_DIR}",
        "-odir",
        str(out_dir),
        *compile_options(),
        "-ftz=true",  # as CuPy compiles (CUPY_NVRTC_OPTIONS)
        *(str(s) for s in sources),
    ]


def expand_source(name: str, kernel_dir: Path | None = None) -> str:
    """The text of ``kernel_dir/name`` with its local ``#include "..."`` files pasted in.

    Each header is pasted once (``#pragma once`` lines are dropped). Raises
    ``FileNotFoundError`` for a missing file.
    """
    root = KERNEL_DIR if kernel_dir is None else Path(kernel_dir)
    seen: set[str] = set()

    def expand(path: Path) -> str:
        text = _PRAGMA_ONCE_RE.sub("", path.read_text())

        def repl(match: re.Match[str]) -> str:
            inc = match.group(1)
            if inc in seen:
                return f"// (already included: {inc})"
            seen.add(inc)
            return f"// ---- begin {inc}\n{expand(root / inc)}\n// ---- end {inc}"

        return _INCLUDE_RE.sub(repl, text)

    return expand(root / name)


def source_hash(name: str, kernel_dir: Path | None = None) -> str:
    """SHA-256 (hex) of the expanded source and the compile options."""
    h = hashlib.sha256(expand_source(name, kernel_dir).encode())
    h.update("\0".join(compile_options()).encode())
    return h.hexdigest()


# -- loading ----------------------------------------------------------------------------------

_lock = threading.Lock()
_modules: dict[tuple[str, str, int, tuple[int, int]], Any] = {}  # by source hash and GPU
_loaded: dict[tuple[str, int], Any] = {}  # (source, device index) -> module: the fast path
_errors: dict[tuple[str, int], str] = {}  # (source, device index) -> why it failed
_last_error: str | None = None
# The launch path's caches: a kernel call must not look up its module, function or stream
# again (each lookup is host time that per-call CUDA events would count as kernel time).
# (source, kernel name, device index) -> RawKernel of the module loaded with compile_options()
_functions: dict[tuple[str, str, int], Any] = {}
_environment_ok = False  # a GPU and CuPy were found once: that does not change in a process
# kernel name -> launches in this process (a dict increment per launch); what a sanitizer run
# launched is read from it (launched())
_launches: collections.Counter[str] = collections.Counter()


def clear_caches() -> None:
    """Forget loaded modules, kernel functions, streams and recorded failures (tests use it)."""
    global _last_error, _environment_ok
    with _lock:
        _modules.clear()
        _loaded.clear()
        _errors.clear()
        _functions.clear()
        _dynamic_smem_set.clear()
        max_shared_per_block.cache_clear()
        _last_error = None
        _environment_ok = False


def _environment_error() -> str | None:
    """Why no kernel can load in this process, or ``None`` (checked once when it is None)."""
    global _environment_ok
    if _environment_ok:
        return None
    if not torch.cuda.is_available():
        return (
            "no CUDA GPU: torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda})"
        )
    try:
        import cupy  # noqa: F401
    except Exception as err:  # ImportError, or a CuPy that fails to initialise
        return f"CuPy could not be imported ({type(err).__name__}: {err}); pip install cupy-cuda13x"
    _environment_ok = True
    return None


def _device_index(device: torch.device | int | None) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"not a CUDA device: {dev}")
    return dev.index if dev.index is not None else torch.cuda.current_device()


def _record(source: str, index: int, message: str) -> None:
    global _last_error
    if (source, index) not in _errors:
        log.warning("CUDA kernels of %s unavailable on cuda:%d: %s", source, index, message)
    _errors[(source, index)] = message
    _last_error = message


def _module(source: str, index: int) -> Any:
    """The compiled RawModule of ``source`` on GPU ``index`` (compiles at first use)."""
    mod = _loaded.get((source, index))
    if mod is not None:
        return mod
    import cupy

    with _lock:
        cc = torch.cuda.get_device_capability(index)
        key = (source, source_hash(source), index, cc)
        mod = _modules.get(key)
        if mod is None:
            with cupy.cuda.Device(index):
                mod = cupy.RawModule(code=expand_source(source), options=compile_options())
                mod.compile()  # NVRTC and module load now, so that failures surface here
            _modules[key] = mod
        _loaded[(source, index)] = mod
    return mod


def load(source: str, device: torch.device | int | None = None) -> Any:
    """Compile (at first use) and return the CuPy ``RawModule`` of ``source`` on ``device``.

    Raises ``RuntimeError`` with the reason when the kernels cannot load; the reason is kept
    for :func:`cuda_kernels_error`.
    """
    if source not in SOURCES:
        raise ValueError(f"unknown kernel source {source!r}; valid: {', '.join(SOURCES)}")
    env = _environment_error()
    if env is not None:
        global _last_error
        _last_error = env
        raise RuntimeError(f"CUDA kernels unavailable: {env}")
    index = _device_index(device)
    if (source, index) in _errors:
        raise RuntimeError(f"CUDA kernels unavailable: {_errors[(source, index)]}")
    try:
        return _module(source, index)
    except Exception as err:
        _record(source, index, f"{source} failed to compile or load: {type(err).__name__}: {err}")
        raise RuntimeError(f"CUDA kernels unavailable: {_errors[(source, index)]}") from err


def has_cuda_kernels(
    device: torch.device | int | None = None, sources: Sequence[str] | None = None
) -> bool:
    """Whether the CUDA kernels load on ``device`` (default: the current GPU).

    Compiles ``sources`` (default: all) at the first call; never raises. Without a GPU or
    CuPy it returns ``False`` at once; :func:`cuda_kernels_error` says why.
    """
    try:
        for source in sources if sources is not None else SOURCES:
            load(source, device)
    except Exception:
        return False
    return True


def cuda_kernels_error() -> str | None:
    """The reason of the last failure to load kernels (``None`` when nothing failed yet)."""
    if _last_error is None:
        env = _environment_error()
        if env is not None:
            return env
    return _last_error


def kernels_environment_error() -> str | None:
    """Why no kernel can run in this process at all (no CUDA GPU, no CuPy), or ``None``.

    ``None`` with :func:`has_cuda_kernels` false means a kernel source failed to compile or
    load on a GPU that could run it (:func:`cuda_kernels_error` has the compiler's log): a
    failure to report, where a reason of this function's is a machine's limit.
    """
    return _environment_error()


def get_function(source: str, name: str, device: torch.device | int | None = None) -> Any:
    """The CuPy ``RawKernel`` ``name`` of ``source`` on ``device``, looked up once.

    Cached per (source, name, device index); the module behind it is the one compiled with
    :func:`compile_options` (fixed for the process), so the key names the options too.
    """
    index = _device_index(device)
    key = (source, name, index)
    kernel = _functions.get(key)
    if kernel is None:
        import cupy

        with cupy.cuda.Device(index):  # CuPy loads a function onto the current device
            kernel = load(source, index).get_function(name)
        _functions[key] = kernel
    return kernel


# -- launching --------------------------------------------------------------------------------

_DLPACK_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.bool: torch.uint8}


def as_cupy(t: torch.Tensor) -> Any:
    """A CuPy array sharing ``t``'s memory (DLPack, no copy). 16-bit floats cross as int16
    and bools as uint8 (same bits), since CuPy has no bfloat16. Call it inside
    :func:`torch_stream` so that DLPack finds the two libraries on the same stream."""
    import cupy

    t = t.detach()
    view = _DLPACK_VIEW.get(t.dtype)
    if view is not None:
        t = t.view(view)
    return cupy.from_dlpack(t)


def torch_stream(device: torch.device | int | None = None) -> Any:
    """torch's current stream on ``device`` as a CuPy ``ExternalStream`` (a context manager)."""
    import cupy

    index = _device_index(device)
    # A new wrapper each time (a cheap Python object): CuPy keeps the enclosing device and
    # stream on the wrapper while it is entered, so one shared wrapper must never be entered
    # twice at once.
    return cupy.cuda.ExternalStream(torch.cuda.current_stream(index).cuda_stream, index)


def launch(
    source: str,
    name: str,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    args: Sequence[Any],
    device: torch.device | int | None = None,
    shared_mem: int = 0,
) -> None:
    """Launch kernel ``name`` of ``source`` on torch's current stream of ``device``.

    ``args``: torch tensors (passed as device pointers, :func:`kernel_args`), ``None`` (a
    null pointer) and numpy scalars whose types match the kernel's parameters exactly
    (``numpy.int32`` for ``int``, ``numpy.int64`` for ``long long``, ``numpy.float64`` for
    ``double``). ``shared_mem``: dynamic shared memory per block, in bytes; the kernel is
    opted in to it once per size (up to :func:`max_shared_per_block`, static included).
    """
    import cupy

    if any(g <= 0 for g in grid) or any(b <= 0 for b in block):
        raise ValueError(f"empty launch of {name}: grid {grid}, block {block}")
    index = _device_index(device)
    kernel = get_function(source, name, index)
    cargs = kernel_args(args, index, name)
    key = (source, name, index)
    if shared_mem > _dynamic_smem_set.get(key, 0):
        # Opt in to this much dynamic shared memory whatever its size: without it the limit
        # is 48 KiB less the kernel's static shared memory, not 48 KiB.
        with cupy.cuda.Device(index):
            kernel.max_dynamic_shared_size_bytes = shared_mem
        _dynamic_smem_set[key] = shared_mem
    with cupy.cuda.Device(index), torch_stream(index):
        kernel(grid, block, cargs, shared_mem=shared_mem)
    _launches[name] += 1


def launched() -> dict[str, int]:
    """``{kernel name: launches}`` of this process so far, every kernel :func:`launch` has
    started (the record a sanitizer run uses to show which kernels it checked,
    ``scripts/gpu/sanitizer_coverage.py``)."""
    return dict(_launches)


_DEFAULT_DYNAMIC_SMEM = 48 * 1024  # static + dynamic without opting in
_ATTR_SMEM_OPTIN = 97  # cudaDevAttrMaxSharedMemoryPerBlockOptin
_dynamic_smem_set: dict[tuple[str, str, int], int] = {}  # the opt-in made per kernel


@functools.cache
def max_shared_per_block(device: int) -> int:
    """The most shared memory (bytes) one block may use on GPU ``device`` after opting in
    (sm_80: 163 KiB, sm_90: 227 KiB), static and dynamic together."""
    import cupy

    queries = (  # CuPy's device attributes, its device properties, the runtime attribute 97
        lambda: cupy.cuda.Device(device).attributes["MaxSharedMemoryPerBlockOptin"],
        lambda: cupy.cuda.runtime.getDeviceProperties(device)["sharedMemPerBlockOptin"],
        lambda: cupy.cuda.runtime.deviceGetAttribute(_ATTR_SMEM_OPTIN, device),
    )
    for query in queries:
        try:
            value = int(query())
        except Exception:  # noqa: BLE001 (an older CuPy lacks one of these)
            continue
        if value > 0:
            return value
    return _DEFAULT_DYNAMIC_SMEM


def kernel_args(args: Sequence[Any], index: int, name: str = "kernel") -> tuple[Any, ...]:
    """The launch arguments of ``args`` for a kernel on GPU ``index``.

    A tensor becomes its device pointer as ``numpy.uint64`` (the tensor must be on
    ``cuda:index``: ValueError otherwise), ``None`` a null pointer, a numpy scalar itself;
    anything else is a TypeError (Python ints and floats have no fixed C type).
    """
    import numpy as np

    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if not a.is_cuda or a.device.index != index:
                raise ValueError(f"{name}: tensor on {a.device}, expected cuda:{index}")
            out.append(np.uint64(a.data_ptr()))
        elif a is None:
            out.append(np.uint64(0))
        elif isinstance(a, np.generic):
            out.append(a)
        else:
            raise TypeError(
                f"{name}: pass numpy scalars of the kernel's exact types, got {type(a)}"
            )
    return tuple(out)


def require_cuda(op: str, *tensors: torch.Tensor, sources: Sequence[str] = SOURCES) -> int:
    """Check that ``tensors`` are on one CUDA device whose kernels load; return its index.

    Raises ``RuntimeError`` naming ``op`` and the reason otherwise (a CPU tensor, no GPU,
    no CuPy, a compile error).
    """
    devices = {t.device for t in tensors}
    if any(d.type != "cuda" for d in devices):
        raise RuntimeError(
            f"{op}: the CUDA implementation needs CUDA tensors, got "
            f"{', '.join(sorted(str(d) for d in devices))}; use impl='ref' (or 'auto')"
        )
    if len(devices) > 1:
        raise RuntimeError(f"{op}: tensors on several devices: {sorted(map(str, devices))}")
    index = _device_index(next(iter(devices)))
    for source in sources:
        try:
            load(source, index)
        except RuntimeError as err:
            raise RuntimeError(f"{op}: {err}") from err
    return index


def multiprocessor_count(device: torch.device | int | None = None) -> int:
    """Number of SMs of ``device`` (used to size grid-stride launches)."""
    return int(torch.cuda.get_device_properties(_device_index(device)).multi_processor_count)


__all__ = [
    "max_shared_per_block",
    "CUPY_NVRTC_OPTIONS",
    "CXX_STD",
    "DEFINES",
    "KERNEL_DIR",
    "SOURCES",
    "as_cupy",
    "clear_caches",
    "compile_options",
    "cuda_kernels_error",
    "expand_source",
    "get_function",
    "has_cuda_kernels",
    "kernel_args",
    "launch",
    "launched",
    "load",
    "multiprocessor_count",
    "nvcc_command",
    "require_cuda",
    "source_hash",
    "torch_stream",
]
