"""Learning-rate schedules as pure functions of training progress.

Being stateless, a schedule resumes exactly and is unaffected by a method that changes the
batch size (and therefore the number of iterations per epoch) in the middle of training.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def lr_multiplier(
    schedule: str,
    epoch_progress: float,
    epochs: int,
    *,
    warmup_fraction: float = 0.2,
    milestones: Sequence[int] = (),
    gamma: float = 0.1,
    warmup_start: float = 0.04,
) -> float:
    """Multiplier of the base learning rate at ``epoch_progress`` (fractional epochs done).

    "onecycle": linear from ``warmup_start`` (0.04, the DAWNBench CIFAR recipes'; the SDGP
    authors' CIFAR-10 script: 1e-4) up to 1 over ``warmup_fraction`` of training, then linear
    down to 0 (a piecewise-linear one-cycle); "cosine": half a cosine from 1 to 0; "step":
    ``gamma`` to the number of milestones passed; "constant": 1.
    """
    t = min(max(epoch_progress / epochs, 0.0), 1.0)
    if schedule == "constant":
        return 1.0
    if schedule == "step":
        return gamma ** sum(1 for m in milestones if epoch_progress >= m)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * t))
    if schedule == "onecycle":
        start = warmup_start
        if warmup_fraction > 0 and t < warmup_fraction:
            return start + (1.0 - start) * t / warmup_fraction
        return max(0.0, (1.0 - t) / (1.0 - warmup_fraction))
    raise ValueError(f"unknown schedule {schedule!r}")
