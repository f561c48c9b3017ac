"""Choosing between equivalent GPU code paths by timing them once per problem.

Some ops of :mod:`impl.ops` have several CUDA paths that compute the same thing (two SpMM
kernels; a sparse or a dense weight gradient). Which is faster depends on the sizes, the
sparsity and the GPU, and nothing here has been measured on every GPU, so the ops time the
candidates on the first call of each problem (CUDA events, a warm-up then a few calls) and
keep the fastest for the rest of the process, as cuDNN's benchmark mode does for its
convolution algorithms. What was picked, and the times that picked it, are readable
(:func:`timed_choices`), and so is how often each path ran (:func:`uses`), so that benchmark
rows can say which paths they measured.

:func:`forced` pins one path (the benchmarks time each path apart this way). Nothing here
touches the GPU at import time.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensor

_PATHS: dict[str, tuple[tuple[str, ...], bool]] = {}
_CHOICE: dict[tuple[str, str], str] = {}
_TIMES: dict[tuple[str, str], dict[str, float]] = {}
_FORCED: dict[str, list[str]] = {}
_USES: collections.Counter[tuple[str, str]] = collections.Counter()
_HOW: dict[tuple[str, str], str] = {}


_timing_depth = 0  # > 0 while choose_timed times candidates


def record_use(op: str, path: str, how: str = "default") -> None:
    """Count one call of ``op`` that ran ``path`` (the ops call it for every choice), except
    calls made while :func:`choose_timed` times candidates; ``how`` it was chosen (``forced``,
    ``fallback`` from a forced path that cannot run the problem, ``timed``, ``default``)
    is kept per (op, path) for :func:`how_chosen`."""
    if _timing_depth == 0:
        _USES[(op, path)] += 1
        _HOW[(op, path)] = how


def how_chosen() -> dict[str, str]:
    """How each ``"op path"`` of :func:`uses` was chosen the last time it ran."""
    return {f"{op} {path}": how for (op, path), how in sorted(_HOW.items())}


def uses() -> dict[str, int]:
    """Calls so far by ``"op path"``: the difference of two readings says which paths a
    piece of work (say one training iteration) ran, and how often."""
    return {f"{op} {path}": n for (op, path), n in sorted(_USES.items())}


def register(op: str, paths: Sequence[str], same_bits: bool) -> tuple[str, ...]:
    """Declare ``op``'s interchangeable paths, the default (where none is timed) first.
    ``same_bits``: whether they give identical results, so that timing may always choose;
    otherwise :func:`pick` times them only under ``torch.backends.cudnn.benchmark``, where
    the user has let cuDNN choose its algorithms by timing too. Returns ``paths``."""
    paths = tuple(paths)
    if not paths:
        raise ValueError(f"{op}: no paths")
    _PATHS[op] = (paths, same_bits)
    return paths


def registered() -> dict[str, tuple[str, ...]]:
    """Every registered op and its paths."""
    return {op: paths for op, (paths, _) in _PATHS.items()}


def pick(
    op: str,
    problem: str,
    candidates: Sequence[str],
    run: Callable[[str], object],
    like: torch.Tensor,
) -> str:
    """The path of ``op`` to run on ``problem``: the forced one (:func:`forced`) where it is
    among ``candidates`` (the paths that can run this problem); else, where
    :func:`register`'s rule lets ``op`` be chosen by timing, the timed choice (timed now if
    :func:`can_time`, else the one remembered from an earlier timing, say during CUDA-graph
    capture); else the first candidate. ``run(path)`` runs one path (for timing). Every pick
    is counted (:func:`uses`)."""
    if op not in _PATHS:
        raise ValueError(f"unknown op {op!r}; registered: {', '.join(sorted(_PATHS))}")
    same_bits = _PATHS[op][1]
    path_forced = forced_path(op)
    remembered = _CHOICE.get((op, problem))
    if path_forced in candidates:
        path, how = path_forced, "forced"
    elif path_forced is not None:
        path, how = candidates[0], "fallback"
    elif not (same_bits or torch.backends.cudnn.benchmark):
        path, how = candidates[0], "default"
    elif remembered in candidates:  # timed before (in eager mode, if this is a capture)
        path, how = remembered, "timed" if len(candidates) > 1 else "default"
    elif can_time(like):
        device = like.device
        path = choose_timed(
            op, problem, candidates, lambda p: cuda_ms(lambda: run(p), device=device)
        )
        how = "timed" if len(candidates) > 1 else "default"
    else:
        path, how = candidates[0], "default"
    record_use(op, path, how)
    return path


@contextlib.contextmanager
def _forced(op: str, path: str) -> Iterator[None]:
    stack = _FORCED.setdefault(op, [])
    stack.append(path)
    try:
        yield
    finally:
        stack.pop()


def check_path(op: str, path: str) -> str:
    """``path`` when it is one of the registered ``op``'s paths; ValueError naming the valid
    ops or paths otherwise."""
    if op not in _PATHS:
        raise ValueError(f"unknown op {op!r}; valid: {', '.join(sorted(_PATHS))}")
    if path not in _PATHS[op][0]:
        raise ValueError(f"unknown {op} path {path!r}; valid: {', '.join(_PATHS[op][0])}")
    return path


def forced(op: str, path: str) -> contextlib.AbstractContextManager:
    """A context in which :func:`forced_path` of ``op`` (a registered op) is ``path`` (one of
    its paths, :func:`check_path`; the innermost block wins): ``op`` runs ``path``, untimed,
    wherever that path can run. The benchmarks time each path apart this way."""
    return _forced(op, check_path(op, path))


def forced_path(op: str) -> str | None:
    """The path :func:`forced` pins for ``op`` now, or None."""
    stack = _FORCED.get(op)
    return stack[-1] if stack else None


def choose_timed(
    op: str, problem: str, candidates: Sequence[str], time_ms: Callable[[str], float]
) -> str:
    """The fastest of ``candidates`` for ``op`` on ``problem`` (a string naming the sizes,
    dtype and device) by ``time_ms(path)`` in milliseconds, timed once per ``(op, problem)``
    and remembered; the first candidate wins a tie. A lone candidate is not timed."""
    if not candidates:
        raise ValueError(f"{op}: no candidate path for {problem}")
    key = (op, problem)
    if key in _CHOICE and _CHOICE[key] in candidates:
        return _CHOICE[key]
    if len(candidates) == 1:
        return candidates[0]
    global _timing_depth
    _timing_depth += 1  # the calls made while timing are not uses
    try:
        times = {p: float(time_ms(p)) for p in candidates}
    finally:
        _timing_depth -= 1
    best = min(candidates, key=lambda p: times[p])
    _CHOICE[key] = best
    _TIMES[key] = times
    return best


def timed_choices() -> dict[str, dict[str, object]]:
    """What :func:`choose_timed` picked so far: ``{"op: problem": {"path": ..., "ms":
    {path: milliseconds per call}}}``."""
    return {
        f"{op}: {problem}": {"path": path, "ms": dict(_TIMES.get((op, problem), {}))}
        for (op, problem), path in _CHOICE.items()
    }


def cuda_ms(fn: Callable[[], object], reps: int = 3, device: torch.device | None = None) -> float:
    """Milliseconds per call of ``fn`` on the current CUDA stream of ``device`` (the current
    device by default; the ops pass their tensors' device, whose stream their kernels use):
    one warm-up call, then ``reps`` calls between two CUDA events (it synchronises once)."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
        fn()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / reps


def can_time(t: torch.Tensor) -> bool:
    """Whether paths may be timed for a tensor: a real GPU tensor (not one that torch.compile
    traces with fake tensors, where nothing runs), and no CUDA graph being captured (a
    capture must not synchronise)."""
    if not t.is_cuda or _tracing(t):
        return False
    with torch.cuda.device(t.device):  # the capture that matters is on the tensor's GPU
        return not torch.cuda.is_current_stream_capturing()


def _tracing(t: torch.Tensor) -> bool:
    """Whether ``t`` is a fake tensor or torch.compile is tracing."""
    return isinstance(t, FakeTensor) or torch.compiler.is_compiling()


__all__ = [
    "can_time",
    "choose_timed",
    "check_path",
    "cuda_ms",
    "forced",
    "forced_path",
    "how_chosen",
    "pick",
    "record_use",
    "register",
    "registered",
    "timed_choices",
    "uses",
]
