"""The device check of the CUDA custom ops, naming the public function that has ``impl``.

``torch.ops.pdtbench.*`` and the ``*_cuda`` functions run the kernels only; called on CPU
tensors they point at the dispatching function of :mod:`impl.ops` (which takes ``impl`` and
runs the reference there) instead of at an ``impl`` argument they do not have. Nothing here
touches the GPU at import time.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from impl.cuda import loader


def check_devices(op: str, public: str, *tensors: torch.Tensor) -> None:
    """``RuntimeError`` unless every tensor is a CUDA tensor, saying to call ``public`` (e.g.
    ``"impl.ops.nm_prune"``) with ``impl='ref'`` or ``'auto'``, or, where some are on the
    GPU and some not, to move the others there. No GPU work, no sync.
    ``meta`` tensors pass (shape checks and fakes trace the ops on them)."""
    if any(t.device.type not in ("cuda", "meta") for t in tensors):
        devices = sorted({str(t.device) for t in tensors})
        if any(t.device.type == "cuda" for t in tensors):  # 'auto' took the GPU: say what moves
            raise RuntimeError(
                f"{op}: the CUDA implementation needs every tensor on the GPU, got "
                f"{', '.join(devices)}; move the others (an index built on the CPU, say, with "
                f".to(device)) to the operands' device"
            )
        raise RuntimeError(
            f"{op}: the CUDA implementation needs CUDA tensors, got {', '.join(devices)}; "
            f"use impl='ref' (or 'auto') of {public}, which runs the reference on these tensors"
        )


def require_cuda(op: str, public: str, *tensors: torch.Tensor, sources: Sequence[str]) -> int:
    """The CUDA device index of ``tensors`` whose kernels (``sources``) load, as
    :func:`impl.cuda.loader.require_cuda`, after :func:`check_devices`."""
    check_devices(op, public, *tensors)
    return loader.require_cuda(op, *tensors, sources=sources)
