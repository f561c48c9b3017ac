"""Host time per call of the CUDA ops' Python paths, with the kernel launch stubbed out.

    python scripts/host_overhead.py [--calls 2000] [--through-op]

Runs on any machine (CPU tensors; ``loader.launch`` and the device checks replaced by
no-ops, so nothing touches a GPU): what remains is everything the host does per call but
CuPy's launch. ``--through-op`` times the registered ``torch.ops.pdtbench`` ops instead of
the public functions' direct calls (impl/ops/eager.py), for comparison. Prints one line per
call: the mean over ``--calls`` calls after a warm-up, in microseconds.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable


def _stub_launch() -> None:
    from impl.cuda import loader
    from impl.ops import device_check

    loader.launch = lambda *a, **k: None
    loader.multiprocessor_count = lambda device=None: 132
    device_check.require_cuda = lambda op, public, *t, sources=(): 0
    device_check.check_devices = lambda op, public, *t: None


def _mean_us(fn: Callable[[], object], calls: int) -> float:
    for _ in range(max(10, calls // 20)):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def cases(through_op: bool) -> dict[str, Callable[[], object]]:
    """The timed calls: name -> a call on CPU tensors of the papers' sizes."""
    import torch

    from impl.ops import eager, nm_cuda, pack_cuda, pattern_cuda
    from impl.ops.pattern import pattern_index

    if through_op:  # every call takes the registered op
        eager.direct_ok = lambda args: False  # type: ignore[assignment]
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(256, 1152, generator=gen) < 0.35
    idx = pattern_index(mask)
    w = torch.randn(256, 1152, generator=gen)
    vals = w[mask]
    b = torch.randn(1152, 64, generator=gen)
    grad = torch.randn(1024, 2048, 3, 3, generator=gen)
    gidx = pack_cuda.mask_index(torch.rand(grad.shape, generator=gen) < 0.5)
    buf = torch.randn(gidx.numel(), generator=gen)
    out = torch.empty_like(grad)
    act = torch.randn(128, 64, 28, 28, generator=gen)
    return {
        "pattern_csr_cuda (256 x 1152)": lambda: pattern_cuda.pattern_csr_cuda(
            w, idx.row_ptr, idx.col_ind
        ),
        "pattern_spmm_cuda(index=...)": lambda: pattern_cuda.pattern_spmm_cuda(
            vals, idx.row_ptr, idx.col_ind, b, index=idx
        ),
        "pack (72 MiB gradient, 50%)": lambda: pack_cuda.pack(grad.view(-1), gidx),
        "unpack (same)": lambda: pack_cuda.unpack(buf, gidx, out),
        "nm_prune_cuda (2:4 magnitude, 128x64x28x28)": lambda: nm_cuda.nm_prune_cuda(
            act, 2, 4, "magnitude"
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per case")
    parser.add_argument(
        "--through-op", action="store_true", help="time the registered ops, not direct calls"
    )
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("--calls must be >= 1")
    _stub_launch()
    for name, fn in cases(args.through_op).items():
        print(f"{name:46s} {_mean_us(fn, args.calls):8.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
