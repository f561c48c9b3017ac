"""Peak GPU memory of a run's training steps, kept across anything that resets torch's counter.

torch keeps one peak-allocation counter per device (``torch.cuda.max_memory_allocated``) and
any code may reset it: PruneTrain's batch chooser measures a probe iteration on a copy of the
model that way (:func:`impl.methods.prunetrain_memory.measure_iteration_bytes`). A single
reading at the end of a run then covers only the time since the last reset, and includes the
probe's own copy of the model. :class:`TrainingPeak` instead opens a window around each
epoch's training steps (reset as it opens, read as it closes) and keeps the largest reading,
so resets outside the windows change nothing and evaluation is not counted.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class TrainingPeak:
    """Largest bytes allocated by tensors on a CUDA device while training steps ran.

    Args:
        device: the training device; on anything but CUDA every method does nothing and
            :attr:`mib` is ``None`` (the CPU allocator keeps no statistics).
        carried: bytes already reached by this run before a resumption (from its checkpoint).
        reset, read: the counter's reset and read functions (default: torch's), replaceable
            so the bookkeeping can be checked without a GPU.
    """

    def __init__(
        self,
        device: torch.device,
        carried: int = 0,
        *,
        reset: Callable[[torch.device], None] | None = None,
        read: Callable[[torch.device], int] | None = None,
    ) -> None:
        if carried < 0:
            raise ValueError(f"carried peak must be >= 0 bytes, got {carried}")
        self.device = device
        self.active = device.type == "cuda"
        self.bytes = int(carried)
        self._reset = reset or torch.cuda.reset_peak_memory_stats
        self._read = read or torch.cuda.max_memory_allocated
        self._open = False

    def open(self) -> None:
        """Start a window: reset the device's peak counter (before an epoch's first step)."""
        if self.active:
            self._reset(self.device)
            self._open = True

    def close(self) -> int | None:
        """End the window and return its peak in bytes (``None`` off CUDA); keep the maximum."""
        if not self.active:
            return None
        if not self._open:
            raise RuntimeError("TrainingPeak.close() without a matching open()")
        self._open = False
        reading = int(self._read(self.device))
        self.bytes = max(self.bytes, reading)
        return reading

    @property
    def mib(self) -> float | None:
        """The run's peak so far in MiB (2**20 bytes); ``None`` off CUDA."""
        return self.bytes / 2**20 if self.active else None


__all__ = ["TrainingPeak"]
