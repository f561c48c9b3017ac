"""``python -m impl.cuda.preflight [NAME]``: exit 1, saying why, where a GPU is visible but
the hand-written kernels cannot run on it (no CuPy, or a CuPy that fails to start); exit 0
otherwise, a machine without a GPU included (its own commands refuse the gpu scale).

``make bench-gpu`` and ``make gpu-check`` run it first: without it, every kernel row of a
GPU benchmark would be skipped and only the vendor baselines measured (docs/benchmarks.md).
"""

from __future__ import annotations

import sys

import torch

from impl.cuda.loader import kernels_environment_error

INSTALL_HINT = "EXTRAS=dev,cuda make setup installs CuPy (cupy-cuda13x; on CUDA 12 cupy-cuda12x)"


def preflight_error() -> str | None:
    """Why the kernels cannot run on the GPU this machine has, or ``None`` (no GPU, or they
    can: their own compile errors are reported when they load)."""
    if not torch.cuda.is_available():
        return None
    return kernels_environment_error()


def main(argv: list[str] | None = None) -> int:
    """Print the reason and return 1 where :func:`preflight_error` has one; 0 otherwise."""
    args = sys.argv[1:] if argv is None else argv
    name = args[0] if args else "preflight"
    why = preflight_error()
    if why is None:
        return 0
    print(f"{name}: the CUDA kernels cannot run here: {why}; {INSTALL_HINT}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
