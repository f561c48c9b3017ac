"""Building, caching and loading the C kernels of ``impl/cpu/``, and running them on threads.

Each kernel source is compiled at first use by the system C compiler (``$CC``, else ``cc``
or ``gcc``) into a cache directory (``$PDT_CPU_KERNEL_CACHE``, else
``~/.cache/pdtbench/cpu-kernels``; a per-user directory under the temporary directory when
that cannot be written) under a name that hashes the source, the compiler, its flags and
the machine (:func:`library_name`), and loaded with :mod:`ctypes`. A build there removes
that kernel's libraries not loaded for :data:`STALE_DAYS` days. No torch headers: a build
takes one to a few seconds. ``PDT_CPU_KERNELS=0`` turns every compiled CPU path off (the
references then run).

The kernels of one call run on the threads of torch's intra-op pool count
(``torch.get_num_threads()``): the work is split by its leading dim into slices, the first
run on the calling thread and the others on one per-process pool (:data:`POOL`;
:mod:`ctypes` releases the GIL during a call).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

log = logging.getLogger(__name__)

#: A cached library not loaded for this many days is removed when another of the same
#: kernel is built there (each source change builds a new one, ~50 KB; loading marks it used).
STALE_DAYS = 30


class CompileError(RuntimeError):
    """The compiler ran and rejected the source or its flags (its message is the text)."""


def enabled() -> bool:
    """Whether the compiled CPU paths may be used (``PDT_CPU_KERNELS`` is not ``0``)."""
    return os.environ.get("PDT_CPU_KERNELS", "1") != "0"


def cache_dir() -> Path:
    """Where compiled libraries are kept: ``$PDT_CPU_KERNEL_CACHE``, else
    ``~/.cache/pdtbench/cpu-kernels`` (:func:`fallback_cache_dir` where that cannot be
    written and the variable is unset)."""
    env = os.environ.get("PDT_CPU_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pdtbench" / "cpu-kernels"


def fallback_cache_dir() -> Path:
    """The per-user directory under the system's temporary directory used when the default
    cache cannot be written (a read-only home)."""
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"pdtbench-cpu-kernels-{uid}"


def compiler() -> str | None:
    """The C compiler command: ``$CC`` when set (it may carry arguments, e.g. ``ccache gcc``),
    else ``cc`` or ``gcc`` on the PATH (``None``: none)."""
    cc = os.environ.get("CC", "").strip()
    if cc:
        return cc
    return shutil.which("cc") or shutil.which("gcc")


@functools.cache
def machine_identity() -> str:
    """What a library built with ``-march=native`` depends on: the architecture and, where
    ``/proc/cpuinfo`` can be read, the CPU's model name and feature flags (a cache shared by
    machines of different CPUs keeps one library per CPU)."""
    parts = [platform.machine()]
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                key = line.split(":", 1)[0].strip()
                if key in ("model name", "flags", "Features", "CPU part"):
                    parts.append(line.strip())
                if line.strip() == "":  # the first processor is enough
                    break
    except OSError:
        parts.append(platform.processor())
    return "\n".join(parts)


def library_name(stem: str, source: Path, cc: str, cflags: Sequence[str]) -> str:
    """File name of the library of ``source`` built by ``cc`` with ``cflags``:
    ``<stem>-<hash>.so``, the hash over the source, the compiler, the flags and the machine
    (:func:`machine_identity` when the flags ask for the native architecture)."""
    h = hashlib.sha256()
    for part in (source.read_bytes(), cc.encode(), " ".join(cflags).encode()):
        h.update(part)
        h.update(b"\0")
    h.update(platform.machine().encode())
    if any(flag.startswith(("-march=native", "-mcpu=native")) for flag in cflags):
        h.update(machine_identity().encode())
    return f"{stem}-{h.hexdigest()[:16]}.so"


def prune_stale(directory: Path, keep: Path, stem: str) -> list[Path]:
    """Remove, from ``directory``, the libraries of kernel ``stem`` (``<stem>-*.so``) not
    loaded or built for :data:`STALE_DAYS` days and temporary files of builds killed over a
    day ago, all but ``keep``; returns what it removed. Best effort: a file it cannot
    remove is left."""
    now, removed = time.time(), []
    for pattern, days in ((f"{stem}-*.so", STALE_DAYS), ("tmp*.so", 1)):
        for path in directory.glob(pattern):
            try:
                if path != keep and now - path.stat().st_mtime > days * 86400:
                    path.unlink()
                    removed.append(path)
            except OSError:
                continue
    return removed


def build(
    stem: str,
    source: Path,
    cflags: Sequence[str],
    directory: Path | None = None,
    *,
    rebuild: bool = False,
) -> Path:
    """Compile ``source`` into ``directory`` (default :func:`cache_dir`) unless the library of
    this source, compiler and flags is there already; returns its path.

    The library is written under a temporary name and renamed, so processes building at once
    never load a partial file; it is made readable by every user (mode 0755: a shared
    cache). ``rebuild=True`` replaces a library that is there (one that failed to load).
    Raises ``RuntimeError`` when there is no compiler, it cannot run or the directory cannot
    be written, and :class:`CompileError` (with the compiler's message) when it fails."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (set CC, or install cc/gcc)")
    directory = cache_dir() if directory is None else directory
    target = directory / library_name(stem, source, cc, cflags)
    if target.exists() and not rebuild:
        return target
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=directory)
        os.close(fd)
    except OSError as err:
        raise RuntimeError(f"cannot write the kernel cache {directory}: {err}") from err
    try:
        cmd = [*shlex.split(cc), *cflags, "-o", tmp, str(source), "-lm"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        except (OSError, subprocess.SubprocessError) as err:
            raise RuntimeError(f"{' '.join(cmd)} could not run: {err}") from err
        if proc.returncode != 0:
            raise CompileError(f"{' '.join(cmd)} failed:\n{proc.stderr.strip()}")
        os.chmod(tmp, 0o755)  # mkstemp made it 0600: other users of a shared cache load it
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    prune_stale(directory, target, stem)
    return target


#: Flags that ask for the building machine's own instruction set.
NATIVE_FLAGS: tuple[str, ...] = ("-march=native", "-mcpu=native", "-mtune=native")


def portable_flags(cflags: Sequence[str]) -> tuple[str, ...]:
    """``cflags`` without :data:`NATIVE_FLAGS`: the build for a compiler that rejects them
    (older GCC on some ARM machines, compilers for another target), at the baseline
    instruction set of the architecture."""
    return tuple(flag for flag in cflags if flag not in NATIVE_FLAGS)


def _build_here_or_fallback(stem: str, source: Path, cflags: Sequence[str]) -> Path:
    """:func:`build` in :func:`cache_dir`, or in :func:`fallback_cache_dir` where the default
    cache cannot be written (never in place of a cache the user named)."""
    try:
        return build(stem, source, cflags, cache_dir())
    except RuntimeError as err:
        if "cannot write the kernel cache" not in str(err):
            raise
        if os.environ.get("PDT_CPU_KERNEL_CACHE"):
            raise  # the user's choice: say why it failed rather than build elsewhere
        return build(stem, source, cflags, fallback_cache_dir())


def _build_native_or_portable(stem: str, source: Path, cflags: Sequence[str]) -> Path:
    """:func:`_build_here_or_fallback` with ``cflags``; where the compiler fails and
    ``cflags`` ask for the native instruction set, once more with :func:`portable_flags`
    (logged: the kernel then runs at the architecture's baseline). A compiler that cannot
    run, an unwritable cache, or a second failure raises."""
    try:
        return _build_here_or_fallback(stem, source, cflags)
    except CompileError as err:
        portable = portable_flags(cflags)
        if portable == tuple(cflags):
            raise
        log.warning("building %s with %s failed; building it without: %s", source.name,
                    " ".join(f for f in cflags if f in NATIVE_FLAGS), err)  # fmt: skip
        try:
            return _build_here_or_fallback(stem, source, portable)
        except RuntimeError as again:
            raise RuntimeError(f"{err}\nand without the native flags: {again}") from again


def load(stem: str, source: Path, cflags: Sequence[str], what: str) -> ctypes.CDLL | str:
    """The library of ``source`` built (:func:`build`) and loaded, or the reason it could not
    be (logged as a warning naming ``what``, whose reference then runs). An unwritable
    default cache builds under :func:`fallback_cache_dir` (not a cache the user named); a
    compiler that fails on ``-march=native`` (:data:`NATIVE_FLAGS`) builds with
    :func:`portable_flags`; a cached library that does not load is rebuilt once."""
    try:
        path = _build_native_or_portable(stem, source, cflags)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:  # a cached library that does not load (truncated, foreign): rebuild
            path.unlink()
            path = _build_native_or_portable(stem, source, cflags)
            lib = ctypes.CDLL(str(path))
        try:
            os.utime(path)  # used now: prune_stale keeps it
        except OSError:
            pass  # a cache of another user's, read-only here
    except (OSError, RuntimeError) as err:
        log.warning("the compiled CPU %s is unavailable, using the reference: %s", what, err)
        return str(err)
    return lib


def unavailable_reason(library: Callable[[], ctypes.CDLL | str]) -> str | None:
    """Why a compiled path cannot run (``None`` when it can): turned off by
    ``PDT_CPU_KERNELS=0`` (checked first, so nothing is built then), else the reason
    ``library()`` (a kernel module's cached :func:`load`) returned instead of a library."""
    if not enabled():
        return "turned off by PDT_CPU_KERNELS=0"
    lib = library()
    return lib if isinstance(lib, str) else None


def has_storage(x: torch.Tensor) -> bool:
    """Whether ``x`` holds memory a kernel may read: not a fake tensor (torch.compile's
    tracing, ``FakeTensorMode``), not a meta tensor, not one wrapped by a ``torch.func``
    transform (``vmap``, ``grad``). The kernels read ``data_ptr()``; a fake's is no memory."""
    from torch._subclasses.fake_tensor import is_fake

    return (
        x.device.type != "meta"
        and not is_fake(x)
        and not torch._C._functorch.is_functorch_wrapped_tensor(x)
    )


class SlicePool:
    """The threads that run a kernel's slices beyond the caller's: one pool per process,
    grown (the smaller one shut down) when a call needs more threads than it has.

    A forked child forgets the parent's pool (``os.register_at_fork``): the copy has none of
    the parent's threads, so work submitted to it would never run. Submission holds a lock,
    so a pool is never shut down between another caller's choice of it and its submit."""

    def __init__(self) -> None:
        self.forget()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self.forget)

    def forget(self) -> None:
        """Drop the pool (without touching its threads) and the lock: a fresh start."""
        self.lock = threading.Lock()
        self.pool: ThreadPoolExecutor | None = None
        self.workers = 0

    def submit(self, tasks: list[Callable[[], int]]) -> list[Future[int]]:
        """Start ``tasks`` on the pool, each on a thread of its own; their futures."""
        with self.lock:
            if self.pool is None or self.workers < len(tasks):
                if self.pool is not None:
                    self.pool.shutdown(wait=False)  # its running tasks still finish
                self.pool = ThreadPoolExecutor(len(tasks), thread_name_prefix="pdt-cpu-kernel")
                self.workers = len(tasks)
            return [self.pool.submit(task) for task in tasks]


#: The process's pool for every compiled CPU kernel.
POOL = SlicePool()


def even_slices(n: int, count: int) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges splitting ``range(n)`` into ``max(1, min(count, n))``
    near-equal parts (one empty range for ``n == 0``)."""
    count = max(1, min(count, n))
    return [(n * k // count, n * (k + 1) // count) for k in range(count)]


def run_slices(call: Callable[[int, int], int], parts: Sequence[tuple[int, int]]) -> list[int]:
    """``call(start, stop)`` for every range of ``parts``, the first on this thread and the
    others at once on :data:`POOL`; their return codes, in the order of ``parts``."""
    if len(parts) == 1:
        return [call(*parts[0])]
    pending = POOL.submit([functools.partial(call, *part) for part in parts[1:]])
    return [call(*parts[0]), *(f.result() for f in pending)]


__all__ = [
    "NATIVE_FLAGS",
    "POOL",
    "STALE_DAYS",
    "CompileError",
    "SlicePool",
    "build",
    "cache_dir",
    "compiler",
    "enabled",
    "even_slices",
    "fallback_cache_dir",
    "has_storage",
    "library_name",
    "load",
    "machine_identity",
    "portable_flags",
    "prune_stale",
    "run_slices",
    "unavailable_reason",
]
