"""The compiled CPU path of N:M pruning (SDGP Sec. III-A, Algorithm 1, and III-B).

:func:`impl.ops.nm.nm_prune_ref` defines the op in torch operations: per group offset one
comparison and two updates over the whole tensor, then the masks, the values and the rescale
sums, so that on the gradients of a small network the op costs far more in per-operation
overhead than in arithmetic (ResNet-20 at 16x16, batch 32, one core: 52-81 ms of a step of
82-89 ms without pruning, rescaled 2:4 to 16:32; docs/kernels.md). ``impl/cpu/nm_prune.c``
computes the same op in one pass per group of ``m`` channels (15-17 ms there). It is
compiled at first use by the system C compiler (``$CC``, else ``cc``; ``-O3``, no
fast-math) into a cache directory (``$PDT_CPU_KERNEL_CACHE``, else
``~/.cache/pdtbench/cpu-kernels``) under a name that hashes the source, the compiler and its
flags (a build there removes libraries not loaded for :data:`STALE_DAYS` days), and loaded
with :mod:`ctypes`. No torch headers: compiling takes 1.6 s (gcc 12 on a 2-core machine).

What it computes against the reference: the same kept positions for every method; for
``magnitude`` and ``random`` the same values bit for bit; for ``rescaled`` each plane's (or
channel's) two L1 sums are accumulated in float64 and rounded to the input's type, where the
reference sums in the input's type in torch's order, so a rescaled value may differ from the
reference's in its last bits (relative difference below :data:`RESCALE_RTOL` for float32).

It runs on as many threads as torch's intra-op pool (``torch.get_num_threads()``), as the
reference's operations do: a tensor is split by its leading dims (``O`` of the ``(O, C, I)``
view) into at most one slice per thread, each of at least :data:`PARALLEL_MIN_ELEMENTS`
elements, and each slice is one call of the kernel, the first on the calling thread and the
others on the threads of one per-process pool (:mod:`ctypes` releases the GIL during the
call). Every group is computed alone, so the values are the same bits whatever the thread
count; only the float64 statistics ``sum|x|`` and ``sum|y|`` are added up by slice (a
different order in their last bits). The channel rule, whose sums span all of ``O``, runs
on one thread.

Where it does not apply, :func:`nm_prune_cpu` returns ``None`` and the caller runs the
reference: a dtype other than float32 and float64, a NaN magnitude (ranked as ``torch.sort``
ranks it), the plane rule along a dim after the second (its sums span dims before the
grouping dim), a rescale with nothing to sum over, a rescale sum that fits float64 but not
the input's type (the reference's sums saturate in that type, in its own order). Magnitudes
are ranked by their integer bits, as the reference's fast path ranks them, so a
flush-denormals mode does not change the positions. A failure to compile or load is logged
once (a cached library that does not load is rebuilt once); ``PDT_CPU_KERNELS=0`` turns the
path off (the reference then runs everywhere), and SDGP's run summary counts the calls of
each path (``sdgp_prune_paths``).
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

from impl.ops import cpu_kernels

log = logging.getLogger(__name__)

SOURCE: Path = Path(__file__).resolve().parent.parent / "cpu" / "nm_prune.c"
CFLAGS: tuple[str, ...] = ("-O3", "-std=c11", "-shared", "-fPIC", "-Wall")
# Bound on |rescaled - reference| / |reference| for float32 (sums of up to 2**20 terms in
# another order; measured differences are a few units in the last place, ~1e-7).
RESCALE_RTOL = 1e-5
_RESULTS = {0: "ok", 1: "NaN magnitude", 2: "out of memory", 3: "bad arguments",
            4: "a rescale sum beyond the input type's range"}  # fmt: skip
_FALLBACK = (1, 4)  # codes after which the reference runs (nothing usable was written)
_RESCALE_CODES = {None: 0, "plane": 1, "channel": 2}
_FUNCTIONS = {torch.float32: "pdt_nm_prune_float", torch.float64: "pdt_nm_prune_double"}
# Elements per slice, at the least, when the kernel runs on several threads: handing a slice
# to a pool thread and waiting for it costs about 90 us on a 2-core machine, where pruning
# 2**18 float32 elements (2:4, rescaled) took 207 us on one thread and 196 us on two, and
# 2**19 elements 392 us against 291 us.
PARALLEL_MIN_ELEMENTS = 1 << 18


enabled = cpu_kernels.enabled
cache_dir = cpu_kernels.cache_dir
fallback_cache_dir = cpu_kernels.fallback_cache_dir
compiler = cpu_kernels.compiler
has_storage = cpu_kernels.has_storage
STALE_DAYS = cpu_kernels.STALE_DAYS
_STEM = "nm_prune"


def library_name(cc: str) -> str:
    """File name of the library built by ``cc``: hashes the source, compiler and flags
    (:func:`impl.ops.cpu_kernels.library_name`)."""
    return cpu_kernels.library_name(_STEM, SOURCE, cc, CFLAGS)


def prune_stale(directory: Path, keep: Path) -> list[Path]:
    """Remove, from ``directory``, the libraries of this kernel (``nm_prune-*.so``) not
    loaded or built for :data:`STALE_DAYS` days and temporary files of builds killed over a
    day ago, all but ``keep``; returns what it removed
    (:func:`impl.ops.cpu_kernels.prune_stale`)."""
    return cpu_kernels.prune_stale(directory, keep, _STEM)


def build(directory: Path | None = None, *, rebuild: bool = False) -> Path:
    """Compile ``impl/cpu/nm_prune.c`` into ``directory`` (default :func:`cache_dir`) unless
    the library of this source, compiler and flags is there already; returns its path
    (:func:`impl.ops.cpu_kernels.build`: written under a temporary name and renamed, mode
    0755; ``RuntimeError`` with the compiler's message when it cannot be built)."""
    return cpu_kernels.build(_STEM, SOURCE, CFLAGS, directory, rebuild=rebuild)


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The loaded library, or the reason it could not be built or loaded (logged once)."""
    lib = cpu_kernels.load(_STEM, SOURCE, CFLAGS, "N:M pruning")
    if isinstance(lib, str):
        return lib
    i64, c_int, ptr, dbl = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_double
    for name in _FUNCTIONS.values():
        fn = getattr(lib, name)
        fn.restype = c_int
        fn.argtypes = [ptr, ptr, ptr, i64, i64, i64, c_int, c_int, c_int, dbl, ptr]
    return lib


def is_available() -> bool:
    """Whether the compiled path is enabled and builds and loads here."""
    return enabled() and not isinstance(_library(), str)


def unavailable_reason() -> str | None:
    """Why the compiled path cannot run (``None`` when it can)."""
    return cpu_kernels.unavailable_reason(_library)


def slices(total: int, o: int, rule: str | None) -> list[tuple[int, int]]:
    """The ``[start, stop)`` ranges of the leading dims ``O`` that the kernel prunes as one
    call each, one per thread: ``min(torch.get_num_threads(), O,
    total // PARALLEL_MIN_ELEMENTS)`` near-equal ranges (at least one), and one range for
    the channel rule, whose sums span every ``o``. ``total`` is the tensor's element count."""
    workers = 1 if rule == "channel" else torch.get_num_threads()
    return cpu_kernels.even_slices(o, min(workers, total // PARALLEL_MIN_ELEMENTS))


def nm_prune_cpu(
    x: torch.Tensor,
    n: int,
    m: int,
    method: str,
    dim: int,
    rescale: str,
    generator: torch.Generator | None,
    eps: float,
    stats: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:
    """:func:`impl.ops.nm.nm_prune` of a CPU tensor on checked arguments, by the compiled
    kernel; ``None`` where it does not apply (see the module docstring) or is unavailable.

    Returns ``(y, l1_x, l1_y)``: ``y`` in ``x``'s memory format; with ``stats`` the float64
    sums ``sum|x|`` and ``sum|y|`` as 0-dim tensors (``None`` otherwise). ``random`` draws
    its keys with :func:`impl.ops.nm._random_scores`, the reference's draw, so a generator in
    the same state keeps the same positions on both paths.
    """
    from impl.ops.nm import _as_oci, _random_scores, _rescale_dims  # the reference's own

    fn_name = _FUNCTIONS.get(x.dtype)
    if fn_name is None or x.device.type != "cpu" or not has_storage(x) or not is_available():
        return None
    rule = rescale if method == "rescaled" else None
    if rule is not None:
        reduce = _rescale_dims(x, dim, rule)
        plane = [d for d in range(x.dim()) if d > dim]
        if rule == "plane" and reduce != plane or not reduce:
            return None  # a plane rule that also sums over dims before dim, or nothing to sum
        if rule == "plane" and dim == 0:
            rule = "channel"  # no batch dim: the plane is the whole channel
    xc = x.contiguous()
    o, c, i = _as_oci(xc, dim).shape
    keys = None
    if method == "random":  # drawn (O, I, C): the kernel reads them in that order
        keys = _random_scores(x, dim, generator).transpose(1, 2).contiguous()
    out = torch.empty_like(xc)
    lib = _library()
    assert not isinstance(lib, str)
    fn, step = getattr(lib, fn_name), c * i  # elements per o
    size, key_size = xc.element_size(), 8  # the keys are float64
    parts = slices(xc.numel(), o, rule)
    sums = {start: (ctypes.c_double * 2)() if stats else None for start, _ in parts}

    def run(start: int, stop: int) -> int:
        return fn(
            xc.data_ptr() + start * step * size,
            None if keys is None else keys.data_ptr() + start * step * key_size,
            out.data_ptr() + start * step * size,
            stop - start,
            c,
            i,
            n,
            m,
            _RESCALE_CODES[rule],
            float(eps),
            None if sums[start] is None else ctypes.addressof(sums[start]),
        )

    codes = cpu_kernels.run_slices(run, parts)  # the first slice here, the others on the pool
    if any(code in _FALLBACK for code in codes):
        return None
    for code in codes:
        if code != 0:
            raise RuntimeError(f"compiled N:M pruning failed: {_RESULTS.get(code, code)}")
    if not x.is_contiguous():
        out = torch.empty_like(x).copy_(out)
    if not stats:
        return out, None, None
    l1_x, l1_y = (
        torch.tensor(sum(s[j] for s in sums.values()), dtype=torch.float64) for j in (0, 1)
    )
    return out, l1_x, l1_y


__all__ = [
    "CFLAGS",
    "PARALLEL_MIN_ELEMENTS",
    "RESCALE_RTOL",
    "SOURCE",
    "STALE_DAYS",
    "build",
    "cache_dir",
    "compiler",
    "enabled",
    "fallback_cache_dir",
    "is_available",
    "library_name",
    "nm_prune_cpu",
    "prune_stale",
    "slices",
    "unavailable_reason",
]
