"""NVRTC called directly through :mod:`ctypes`: the loader's compile path without CuPy or a GPU.

At run time the loader hands each expanded source to CuPy's ``RawModule``, which compiles it
with NVRTC (the loader's options plus :data:`impl.cuda.loader.CUPY_NVRTC_OPTIONS`) to a cubin
for the device's architecture. :func:`compile_loader_sources` makes the same call for any
architecture on any machine that has a ``libnvrtc`` (the CUDA toolkit's, or the
``nvidia-cuda-nvrtc`` wheel that CUDA builds of torch and CuPy bring), and writes the cubins,
so that their machine code can be read (:mod:`impl.cuda.sass_hazards`): nvcc's cubins are
close to these but not the same code, and on a GPU machine the library CuPy loaded names the
exact compiler (:func:`loaded_library`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import os
import re
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

_ARCH = re.compile(r"sm_\d+[a-z]?")


@dataclass(frozen=True)
class Compiled:
    """One NVRTC compile: its status (``0``: success), its log, and the cubin (``None`` when
    the compile failed)."""

    status: int
    log: str
    cubin: bytes | None


def find_library() -> str | None:
    """The path of a ``libnvrtc`` that loads: ``$PDT_NVRTC_LIB``, the loader's search path,
    the ``nvidia-cuda-nvrtc`` wheel on ``sys.path`` (``nvidia/<cuda>/lib``), then
    ``/usr/local/cuda*/lib64``; ``None`` where there is none."""
    env = os.environ.get("PDT_NVRTC_LIB")
    if env:
        return env
    candidates = []
    found = ctypes.util.find_library("nvrtc")
    if found:
        candidates.append(found)
    for base in dict.fromkeys([sys.prefix, *sys.path]):
        candidates += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", "libnvrtc.so*")))
    candidates += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
    for cand in candidates:
        if "builtins" in Path(cand).name:
            continue
        try:
            ctypes.CDLL(cand)
        except OSError:
            continue
        return cand
    return None


def loaded_library(maps: str | Path = "/proc/self/maps") -> str | None:
    """The ``libnvrtc`` this process has mapped (CuPy's, after it compiled a kernel), read from
    ``maps``; ``None`` when none is (or the file cannot be read)."""
    try:
        text = Path(maps).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        name = Path(path).name
        if name.startswith("libnvrtc.so") and "builtins" not in name:
            return path
    return None


def load(path: str | None = None) -> ctypes.CDLL:
    """Load NVRTC from ``path`` (default: :func:`find_library`). Raises ``FileNotFoundError``
    when there is none. Its builtins library, which NVRTC opens by name at the first compile,
    is loaded first from the same directory, so that a copy outside the loader's search path
    (a wheel) works too."""
    path = path or find_library()
    if path is None:
        raise FileNotFoundError(
            "no libnvrtc found (set PDT_NVRTC_LIB, or pip install nvidia-cuda-nvrtc)"
        )
    for builtins in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*"))):
        with contextlib.suppress(OSError):
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(path)


def version(lib: ctypes.CDLL) -> tuple[int, int]:
    """NVRTC's ``(major, minor)`` version (``nvrtcVersion``)."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def _check(lib: ctypes.CDLL, status: int, call: str) -> None:
    if status != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        why = lib.nvrtcGetErrorString(status) or b"?"
        raise RuntimeError(f"{call} failed: {why.decode(errors='replace')} ({status})")


def compile_program(
    lib: ctypes.CDLL, source: str, name: str, options: Sequence[str], *, cubin: bool = True
) -> Compiled:
    """Compile ``source`` (named ``name`` in messages) with ``options``; the cubin is read
    when ``cubin`` and the compile succeeded (``options`` must then name a real architecture,
    ``-arch=sm_XY``). Raises ``RuntimeError`` when NVRTC fails outside the compile itself."""
    prog = ctypes.c_void_p()
    _check(
        lib,
        lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
        "nvrtcCreateProgram",
    )
    try:
        opts = [o.encode() for o in options]
        status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        buf = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = buf.value.decode(errors="replace")
        binary = None
        if cubin and status == 0:
            _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            out = ctypes.create_string_buffer(size.value)
            _check(lib, lib.nvrtcGetCUBIN(prog, out), "nvrtcGetCUBIN")
            binary = out.raw
        return Compiled(status, log, binary)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def loader_options(arch: str) -> list[str]:
    """The options CuPy gives NVRTC for the loader's sources on a GPU of ``arch`` (``sm_90``):
    the loader's own, CuPy's, and the architecture. Raises ``ValueError`` for a malformed
    ``arch``."""
    from impl.cuda import loader

    if not _ARCH.fullmatch(arch):
        raise ValueError(f"arch must look like 'sm_90', got {arch!r}")
    return [*loader.compile_options(), *loader.CUPY_NVRTC_OPTIONS, f"-arch={arch}"]


def compile_loader_sources(
    arch: str, out_dir: str | Path, library: str | None = None
) -> list[Path]:
    """Compile every source of :data:`impl.cuda.loader.SOURCES` (expanded, as the loader
    compiles it) with :func:`loader_options` for ``arch`` and write ``out_dir/<stem>.cubin``
    and NVRTC's log beside it (``<stem>.log``, empty when it had nothing to say); the cubins'
    paths, in the loader's order. Raises ``RuntimeError`` with NVRTC's log when a source
    does not compile, ``FileNotFoundError`` without a ``libnvrtc``."""
    from impl.cuda import loader

    options = loader_options(arch)
    lib = load(library)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # one thread per source: NVRTC compiles distinct programs concurrently, and ctypes lets
    # go of the GIL during each call (the longest source then sets the time, not the sum)
    with ThreadPoolExecutor(max_workers=len(loader.SOURCES)) as pool:
        results = pool.map(
            lambda src: compile_program(lib, loader.expand_source(src), src, options),
            loader.SOURCES,
        )
    paths = []
    for src, done in zip(loader.SOURCES, results):
        if done.status != 0 or done.cubin is None:
            raise RuntimeError(f"NVRTC failed on {src} for {arch}:\n{done.log}")
        path = out / (Path(src).stem + ".cubin")
        path.write_bytes(done.cubin)
        path.with_suffix(".log").write_text(done.log)
        paths.append(path)
    return paths
