"""Time N:M pruning of one large CPU tensor three ways: the torch reference, the compiled
kernel as one call, and the compiled kernel sliced over torch's threads (SDGP Sec. III-A,
III-B; rescaled magnitude, the plane rule).

The three run interleaved, ``--rounds`` times ``--calls`` calls each, rotating through six
inputs (so they are not all in cache); the medians of the per-round medians are printed, in
ms, with the sliced kernel's speed-up over one call.

    .venv/bin/python scripts/nm_cpu_threads.py [--threads 2] [--rounds 9] [--calls 10]
        [--shape 16 256 28 28]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from impl.ops import nm_cpu
from impl.ops.nm import nm_prune

CONFIGS = ((2, 4), (4, 8), (8, 16), (16, 32))
INPUTS = 6
MODES = ("reference", "one call", "sliced")


def _median_ms(xs: list[torch.Tensor], n: int, m: int, mode: str, calls: int) -> float:
    default = nm_cpu.PARALLEL_MIN_ELEMENTS
    nm_cpu.PARALLEL_MIN_ELEMENTS = 1 << 62 if mode == "one call" else default
    try:
        times = []
        for k in range(calls):
            t0 = time.perf_counter()
            nm_prune(
                xs[k % len(xs)], n, m, "rescaled", impl="ref" if mode == "reference" else "cpu"
            )
            times.append(time.perf_counter() - t0)
    finally:
        nm_cpu.PARALLEL_MIN_ELEMENTS = default
    return statistics.median(times) * 1e3


def main() -> None:
    """Print, per N:M configuration, the median time of each mode in ms."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--shape", type=int, nargs=4, default=[16, 256, 28, 28])
    args = ap.parse_args()
    if args.threads < 1 or args.rounds < 1 or args.calls < 1 or min(args.shape) < 1:
        ap.error("--threads, --rounds, --calls and every --shape size must be >= 1")
    if not nm_cpu.is_available():
        raise SystemExit(f"the compiled CPU kernel is not available: {nm_cpu.unavailable_reason()}")
    torch.set_num_threads(args.threads)
    gens = [torch.Generator().manual_seed(k) for k in range(INPUTS)]
    xs = [torch.randn(*args.shape, generator=g) for g in gens]
    slices = len(nm_cpu.slices(xs[0].numel(), args.shape[0], "plane"))
    plural = "" if slices == 1 else "s"
    print(f"shape {'x'.join(map(str, args.shape))}, {args.threads} threads, {slices} slice{plural}")
    results: dict[tuple[int, int, str], list[float]] = {}
    for _ in range(args.rounds):
        for n, m in CONFIGS:
            for mode in MODES:
                results.setdefault((n, m, mode), []).append(_median_ms(xs, n, m, mode, args.calls))
    for n, m in CONFIGS:
        ms = {mode: statistics.median(results[(n, m, mode)]) for mode in MODES}
        print(
            f"{n}:{m} reference {ms['reference']:.2f} ms, one call {ms['one call']:.2f} ms, "
            f"sliced {ms['sliced']:.2f} ms ({ms['one call'] / ms['sliced']:.2f}x)"
        )


if __name__ == "__main__":
    main()
