"""Timing for the benchmarks: CUDA events on a GPU, ``time.perf_counter`` on the CPU.

GPU (:func:`cuda_timing`): ``triton.testing.do_bench``-style. A few calls estimate the
time of one; then enough warm-up calls to fill ``warmup_ms`` and enough timed calls to fill
``rep_ms`` (at least ``min_reps``), each bracketed by its own pair of CUDA events on the
current stream, read after one final synchronisation; the result is the median. Each call
receives its index ``i``; a benchmark rotates through ``n_sets`` copies of its inputs with
it, so that repeated calls do not find their operands in L2 (50 MB on an H100).

Host-bound calls: an event pair around one call measures from the moment the GPU passes the
start event to the moment it passes the end event; when the host needs longer to issue the call
(Python, dispatch, a CuPy launch: tens of microseconds) than the GPU needs to run it, the GPU
idles in between and the events time the host. :func:`cuda_timing` therefore also records the
host's wall time per call (``host_ms``) and, after a sleep kernel that keeps the GPU busy while
the host queues ``amortize`` calls, the per-call mean of those back-to-back calls between one
pair of events (``amortized_ms``: device time without launch gaps, for a call that does not wait
on the host; a call that synchronises, as cuSPARSE's dense-to-CSR conversions must to size their
output from the nonzero count, waits each time, and its ``amortized_ms`` is its whole time a
call, round trip included); and :func:`host_bound` flags a timing whose events may be host time.
A host-bound row compares launch overheads, not kernels.

CPU (:func:`cpu_timing`): ``warmup`` untimed calls, then ``repeats`` calls each bracketed by
``time.perf_counter``, and more while the timed calls add up to less than ``min_time_s`` (at
most ``max_repeats``): a millisecond op gets enough samples that a few slow ones (page faults
of a fresh output, the other core busy) do not move the median; the median.

TF32 and cuDNN flags change what a float32 matmul or convolution computes, so they are set
explicitly around every measurement (:func:`pinned_flags`) and recorded with each row.

Function names avoid asv's benchmark prefixes (``time_``, ``track_``, ``mem_``,
``peakmem_``): asv imports every module of ``bench/``.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from impl.env import tf32_enabled

#: Bytes the rotated inputs of one benchmark should span on a GPU (over twice an H100's L2).
ROTATE_BYTES_CUDA = 128 * 2**20
#: The same on the CPU (over a typical last-level cache).
ROTATE_BYTES_CPU = 64 * 2**20
#: At most this many copies on a GPU: enough that inputs down to 32 KB (the 95%-sparse values
#: of the paper's 256 x 1152 filter are 57 KB; a 128 x 64 1x1 filter is 32 KB) still span
#: :data:`ROTATE_BYTES_CUDA`, past the L2 of an H100 or H200 (50 MB), so a timing reads
#: memory, not cache. (Each copy costs a launch or two to build: 4096 of them, milliseconds.)
MAX_SETS_CUDA = 4096
#: ... and on the CPU, where building the copies costs host time in every run: inputs down to
#: 1 MB (the paper's filter is 1.2 MB) span :data:`ROTATE_BYTES_CPU`, past a 32 MB L3.
MAX_SETS = 64
#: A GPU call whose event median is below this (ms) is flagged host-bound (:func:`host_bound`).
HOST_BOUND_DEVICE_MS = 0.020
#: ... or whose event median exceeds its amortised per-call time by this factor.
HOST_BOUND_AMORTIZED_RATIO = 1.5
#: Calls whose estimated time is above this (ms) skip the back-to-back batch: the host's
#: launch overhead (tens of microseconds) cannot be what such a timing measures.
AMORTIZE_MAX_MS = 1.0
#: Clock cycles per millisecond assumed to size the sleep kernel (2 GHz: no GPU clocks faster,
#: so the sleep lasts at least as long as asked).
_SLEEP_CYCLES_PER_MS = 2_000_000
_MAX_SLEEP_MS = 50.0


@dataclass(frozen=True)
class Timing:
    """Summary of repeated timings of one call, in milliseconds.

    Args:
        median_ms: median time of one call.
        p20_ms, p80_ms: 20th and 80th percentiles.
        min_ms: fastest call.
        n: timed calls.
        clock: ``"cuda-events"`` or ``"perf_counter"``.
        host_ms: host wall time per timed call (GPU only; None on the CPU); information:
            with many calls queued the host waits on the GPU.
        amortized_ms: per-call mean of back-to-back calls between one pair of events, the
            GPU kept busy while they were queued (GPU only; None where not measured).
        issue_ms: host time per call to queue those back-to-back calls while a sleep kernel
            held the GPU (GPU only; None where not measured).
        host_bound: :func:`host_bound` of the above (GPU only; None on the CPU).
    """

    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    n: int
    clock: str
    host_ms: float | None = None
    amortized_ms: float | None = None
    host_bound: bool | None = None
    issue_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict."""
        return asdict(self)


def host_bound(
    event_ms: float, issue_ms: float | None = None, amortized_ms: float | None = None
) -> bool:
    """Whether a GPU timing of ``event_ms`` per call (event median) may measure the host.

    True when ``event_ms < HOST_BOUND_DEVICE_MS`` (20 us: launch overhead is of that order);
    and, where back-to-back calls were measured, when the host needs at least as long to
    issue a call (``issue_ms``, timed while a sleep kernel held the GPU, so the host could not
    be blocked by a full launch queue) as the GPU needs to run it (``amortized_ms``), or when
    ``event_ms > HOST_BOUND_AMORTIZED_RATIO * amortized_ms`` (calls timed one by one ran
    slower than back to back). All times in milliseconds. The host's wall time per timed
    call is not used: with many calls queued, the host waits on the GPU, so that time
    follows the device's even when the device is the bottleneck.
    """
    if event_ms < HOST_BOUND_DEVICE_MS:
        return True
    if amortized_ms is None or amortized_ms <= 0:
        return False
    if issue_ms is not None and issue_ms >= amortized_ms:
        return True
    return event_ms > HOST_BOUND_AMORTIZED_RATIO * amortized_ms


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    pos = q * (len(sorted_values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


def summarize(times_ms: Sequence[float], clock: str) -> Timing:
    """A :class:`Timing` of ``times_ms`` (at least one value)."""
    if not times_ms:
        raise ValueError("no timings to summarise")
    t = sorted(float(x) for x in times_ms)
    return Timing(
        median_ms=float(statistics.median(t)),
        p20_ms=_quantile(t, 0.2),
        p80_ms=_quantile(t, 0.8),
        min_ms=t[0],
        n=len(t),
        clock=clock,
    )


def flags() -> dict[str, Any]:
    """The flags that change float32 math: TF32 for matmul and cuDNN (as torch's either way
    of setting them leaves them: :func:`impl.env.tf32_enabled`), cuDNN benchmark mode."""
    matmul, conv = tf32_enabled()
    return {
        "tf32_matmul": matmul,
        "tf32_cudnn": conv,
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    }


@contextlib.contextmanager
def pinned_flags(
    tf32_matmul: bool = False, tf32_cudnn: bool = False, cudnn_benchmark: bool = False
) -> Iterator[dict[str, Any]]:
    """Set the TF32 and cuDNN-benchmark flags for the block and restore them after; yields them."""
    before = flags()
    torch.backends.cuda.matmul.allow_tf32 = bool(tf32_matmul)
    torch.backends.cudnn.allow_tf32 = bool(tf32_cudnn)
    torch.backends.cudnn.benchmark = bool(cudnn_benchmark)
    try:
        yield flags()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before["tf32_matmul"]
        torch.backends.cudnn.allow_tf32 = before["tf32_cudnn"]
        torch.backends.cudnn.benchmark = before["cudnn_benchmark"]


def rotation_sets(bytes_per_set: float, device: torch.device | str) -> int:
    """How many copies of a benchmark's inputs to rotate through: enough that the copies span
    :data:`ROTATE_BYTES_CUDA` (GPU, at most :data:`MAX_SETS_CUDA` copies) or
    :data:`ROTATE_BYTES_CPU` (at most :data:`MAX_SETS`); at least 1.
    """
    if bytes_per_set <= 0:
        return 1
    cuda = torch.device(device).type == "cuda"
    target, cap = (ROTATE_BYTES_CUDA, MAX_SETS_CUDA) if cuda else (ROTATE_BYTES_CPU, MAX_SETS)
    return int(min(cap, max(1, math.ceil(target / bytes_per_set))))


def rotated(make: Callable[[int], torch.Tensor], count: int | None = None) -> list[torch.Tensor]:
    """``make(j)`` for ``j < count``, or as many of them as it takes to span the rotation bytes
    of :func:`rotation_sets` (at least one): the inputs a timing rotates through, so that a
    call does not find its operands in the cache the previous call left (docs/benchmarks.md);
    at most ``count`` when given (sets derived from another rotated list cannot outnumber
    it)."""
    first = make(0)
    n = rotation_sets(first.numel() * first.element_size(), first.device)
    n = n if count is None else min(count, n)
    return [first] + [make(j) for j in range(1, n)]


def rotated_mib(bytes_per_set: float, sets: int) -> float:
    """MiB that ``sets`` rotated copies of ``bytes_per_set`` bytes span: a row whose span is
    below the device's last-level cache (50 MB of L2 on an H100 or H200) times cached reads."""
    return round(bytes_per_set * sets / 2**20, 2)


#: Bytes of one DRAM sector: the unit a GPU reads from memory (an L2 sector on NVIDIA GPUs
#: since Volta), so a gather that needs one 4-byte value of a sector still reads 32 bytes.
SECTOR_BYTES = 32
#: Bytes of one cache line, the unit an x86-64 or Arm server CPU reads from memory.
CPU_LINE_BYTES = 64


def fetch_bytes(device: torch.device | str) -> int:
    """The unit a gather on ``device`` reads from memory, in bytes: :data:`SECTOR_BYTES` on
    a GPU, :data:`CPU_LINE_BYTES` on the CPU."""
    return SECTOR_BYTES if torch.device(device).type == "cuda" else CPU_LINE_BYTES


def sector_bytes(positions: torch.Tensor, itemsize: int, sector: int = SECTOR_BYTES) -> float:
    """Bytes of the distinct ``sector``-byte sectors that a gather of the elements at
    ``positions`` (flat, ascending; elements of ``itemsize`` bytes from a sector-aligned
    start) touches: what the gather must read from memory at the least, against the
    ``positions.numel() * itemsize`` bytes it uses. ValueError on an unsorted index."""
    if positions.numel() == 0:
        return 0.0
    if positions.numel() > 1 and bool((positions[1:] < positions[:-1]).any()):
        raise ValueError("positions must be ascending")
    sectors = torch.div(positions.to(torch.int64) * itemsize, sector, rounding_mode="floor")
    return float(sectors.unique_consecutive().numel() * sector)


def synchronize(device: torch.device | str) -> None:
    """Wait for the GPU when ``device`` is a CUDA device; nothing on the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _repeat_cap(repeats: int, max_repeats: int | None, min_time_s: float, warmup: int = 0) -> int:
    """The most calls a CPU timing takes (``max_repeats``, default ``repeats``), after
    checking the counts of :func:`cpu_timing` and :func:`cpu_rounds`."""
    cap = repeats if max_repeats is None else max_repeats
    if repeats < 1 or warmup < 0 or cap < repeats or not min_time_s >= 0:
        raise ValueError(
            f"need repeats >= 1, warmup >= 0, max_repeats >= repeats and min_time_s >= 0; "
            f"got {repeats}, {warmup}, {max_repeats}, {min_time_s}"
        )
    return cap


def cpu_timing(
    fn: Callable[[int], Any],
    *,
    warmup: int = 1,
    repeats: int = 5,
    min_time_s: float = 0.0,
    max_repeats: int | None = None,
) -> Timing:
    """Median, in ms, of calls ``fn(i)`` timed with ``time.perf_counter`` after ``warmup``
    untimed ones: ``repeats`` calls, then more until the timed calls sum to ``min_time_s``
    seconds or their number reaches ``max_repeats`` (default ``repeats``: no more)."""
    max_repeats = _repeat_cap(repeats, max_repeats, min_time_s, warmup)
    for i in range(warmup):
        fn(i)
    times: list[float] = []
    i = warmup
    while len(times) < repeats or (len(times) < max_repeats and sum(times) < min_time_s * 1e3):
        t0 = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t0) * 1e3)
        i += 1
    return summarize(times, "perf_counter")


def cpu_rounds(
    seconds_per_call: float, repeats: int, min_time_s: float, max_repeats: int | None
) -> int:
    """Calls :func:`cpu_timing` would time for an op of ``seconds_per_call``: ``repeats``, or
    as many as add up to ``min_time_s``, at most ``max_repeats`` (default ``repeats``). For
    timers that take a count up front (pytest-benchmark's rounds)."""
    cap = _repeat_cap(repeats, max_repeats, min_time_s)
    if seconds_per_call <= 0:
        return cap if min_time_s > 0 else repeats
    return max(repeats, min(cap, math.ceil(min_time_s / seconds_per_call)))


def _sleep_kernel(ms: float) -> bool:
    """Keep the current stream busy for about ``ms`` (torch's spin kernel); False if absent."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return False
    sleep(int(min(ms, _MAX_SLEEP_MS) * _SLEEP_CYCLES_PER_MS))
    return True


def cuda_timing(
    fn: Callable[[int], Any],
    *,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    min_reps: int = 5,
    max_reps: int = 1000,
    amortize: int = 20,
) -> Timing:
    """do_bench-style median of ``fn(i)`` on the current CUDA stream (see the module docstring).

    Also the host's wall time per timed call and, when ``amortize > 0`` and a call takes at
    most :data:`AMORTIZE_MAX_MS`, the per-call mean of ``min(amortize, timed calls)``
    back-to-back calls between one pair of events queued behind a sleep kernel
    (``amortized_ms``) with the host's time to queue each (``issue_ms``), and the
    :func:`host_bound` flag.
    """
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps; got {min_reps}, {max_reps}")
    if amortize < 0:
        raise ValueError(f"need amortize >= 0; got {amortize}")
    # The first call, untimed: one-time work (cuDNN's algorithm search, library handles, a
    # kernel compile, timed_choice's trial of paths) would inflate the estimate and so cut
    # the number of timed calls to the minimum.
    fn(0)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    n_est = 3
    for i in range(1, 1 + n_est):
        fn(i)
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / n_est, 1e-3)
    n_warm = max(1, int(warmup_ms / est))
    n_rep = int(min(max_reps, max(min_reps, rep_ms / est)))
    for i in range(1 + n_est, 1 + n_est + n_warm):
        fn(i)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    offset = 1 + n_est + n_warm
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k in range(n_rep):
        starts[k].record()
        fn(offset + k)
        ends[k].record()
    host_ms = (time.perf_counter() - t0) * 1e3 / n_rep
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    amortized = issue = None
    amortize = min(amortize, n_rep) if est <= AMORTIZE_MAX_MS else 0
    if amortize > 0 and _sleep_kernel(1.5 * amortize * host_ms + 0.1):
        offset += n_rep
        t1 = time.perf_counter()  # the GPU sleeps: queuing cannot block on a full queue
        start.record()
        for k in range(amortize):
            fn(offset + k)
        end.record()
        issue = (time.perf_counter() - t1) * 1e3 / amortize
        torch.cuda.synchronize()
        amortized = start.elapsed_time(end) / amortize
    t = summarize(times, "cuda-events")
    return Timing(
        **{
            **t.to_dict(),
            "host_ms": host_ms,
            "amortized_ms": amortized,
            "issue_ms": issue,
            "host_bound": host_bound(t.median_ms, issue, amortized),
        }
    )


def phase_timing(
    phases: Sequence[tuple[str, Callable[[int], Any]]],
    device: torch.device | str,
    *,
    warmup: int = 1,
    repeats: int = 5,
    after_warmup: Callable[[], Any] | None = None,
) -> dict[str, Timing]:
    """Time each phase of a repeated sequence (e.g. forward then backward) separately.

    Every iteration runs all ``phases`` in order; each phase is bracketed by CUDA events (GPU,
    read after one synchronisation at the end) or ``time.perf_counter`` (CPU). Returns a
    :class:`Timing` per phase name, over ``repeats`` iterations after ``warmup``.
    ``after_warmup`` runs between the two (e.g. resetting the peak-memory counter, so that
    cuDNN's algorithm search and the ops' path trials in the warm-up do not count).
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0; got {repeats}, {warmup}")
    cuda = torch.device(device).type == "cuda"
    for i in range(warmup):
        for _, fn in phases:
            fn(i)
    marks: dict[str, list] = {name: [] for name, _ in phases}
    if cuda:
        torch.cuda.synchronize(device)
    if after_warmup is not None:
        after_warmup()
    for i in range(warmup, warmup + repeats):
        for name, fn in phases:
            if cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn(i)
                e.record()
                marks[name].append((s, e))
            else:
                t0 = time.perf_counter()
                fn(i)
                marks[name].append((time.perf_counter() - t0) * 1e3)
    if cuda:
        torch.cuda.synchronize(device)
        return {
            n: summarize([s.elapsed_time(e) for s, e in v], "cuda-events") for n, v in marks.items()
        }
    return {n: summarize(v, "perf_counter") for n, v in marks.items()}


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error (torch, CuPy, or a RuntimeError saying so)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    name = type(exc).__name__
    if name == "OutOfMemoryError":  # cupy.cuda.memory.OutOfMemoryError
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "cuda_error_out_of_memory" in text
    )
