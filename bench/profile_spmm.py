"""A launch sequence of the pattern SpMM kernels for a profiler (Nsight Compute) to read.

    python -m bench.profile_spmm [--sparsity 0.65 0.95] [--variants row_tiled warp_row pipelined]
                                 [--calls 3] [--n 50176]

On a GPU: for each sparsity, the paper's problem (256 x 1152 filters of ClickTrain's pattern
masks, :func:`bench.sparsity.benchmark_mask`, times a 1152 x ``n`` dense matrix; Sec. 5.2),
then for each variant ``--calls`` launches of its kernel, one after another, each call
between ``torch.cuda.synchronize()``. It prints one line per launch, in launch order
(sparsity, variant, kernel, call), so that a profiler's ``--launch-skip`` / ``--launch-count``
or its per-kernel rows can be matched to a problem. Run under Nsight Compute, with the clocks
left alone (docs/gpu-session.md, "Profiling the SpMM kernels"):

    ncu --clock-control none --kernel-name regex:pdt_spmm --section SpeedOfLight \\
        --section WarpStateStats --section MemoryWorkloadAnalysis --csv \\
        python3 -m bench.profile_spmm > spmm-ncu.csv

Without a GPU (or without the kernels) it exits with status 2 and says why.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

PAPER_SHAPE = (256, 128, 3, 3)  # ClickTrain's filter matrix, 256 x 1152 (Sec. 5.2)


def launch_plan(
    sparsities: Sequence[float], variants: Sequence[str], calls: int
) -> list[tuple[float, str, int]]:
    """The launches, in order: ``(sparsity, variant, call)`` for each sparsity, each variant,
    each call."""
    return [(s, v, c) for s in sparsities for v in variants for c in range(calls)]


def _parser() -> argparse.ArgumentParser:
    from impl.ops.pattern_cuda import SPMM_VARIANTS

    p = argparse.ArgumentParser(
        prog="python -m bench.profile_spmm", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--sparsity", type=float, nargs="+", default=[0.65, 0.95])
    p.add_argument("--variants", nargs="+", default=list(SPMM_VARIANTS), choices=SPMM_VARIANTS)
    p.add_argument("--calls", type=int, default=3, help="launches of each variant (>= 1)")
    p.add_argument("--n", type=int, default=50176, help="columns of the dense matrix (224*224)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.calls < 1 or args.n < 1:
        print("--calls and --n must be >= 1", file=sys.stderr)
        return 2
    if any(not 0.0 <= s < 1.0 for s in args.sparsity):
        print(f"--sparsity must lie in [0, 1), got {args.sparsity}", file=sys.stderr)
        return 2
    import torch

    from impl.cuda import loader

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to profile", file=sys.stderr)
        return 2
    if not loader.has_cuda_kernels(torch.device("cuda"), sources=("pattern.cu",)):
        print(f"the pattern kernels do not load: {loader.cuda_kernels_error()}", file=sys.stderr)
        return 2
    from bench.sparsity import benchmark_mask
    from impl.ops import pattern_cuda
    from impl.ops.pattern import pattern_index

    f, k = PAPER_SHAPE[0], PAPER_SHAPE[1] * PAPER_SHAPE[2] * PAPER_SHAPE[3]
    gen = torch.Generator().manual_seed(0)
    b = torch.randn(k, args.n, generator=gen).cuda()
    problems = {}
    for s in args.sparsity:
        mask, kind = benchmark_mask(PAPER_SHAPE, s, seed=0)
        idx = pattern_index(mask.reshape(f, k).cuda())
        vals = torch.randn(idx.col_ind.numel(), generator=gen).cuda()
        problems[s] = (idx, vals, kind)
    for s, variant, call in launch_plan(args.sparsity, args.variants, args.calls):
        idx, vals, kind = problems[s]
        torch.cuda.synchronize()
        pattern_cuda._spmm(vals, idx.row_ptr, idx.col_ind, b, variant=variant)
        torch.cuda.synchronize()
        name = pattern_cuda.spmm_kernel(variant)
        print(f"sparsity {s:.2f} ({kind} mask)\t{variant}\t{name}\tcall {call}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
