"""Per-iteration timing of forward and backward, without a host sync per iteration on GPU.

On a GPU each phase is bracketed by CUDA events and read once per epoch; on the CPU a
monotonic clock (``time.perf_counter``) is read around each phase.
"""

from __future__ import annotations

import statistics
import time

import torch


def synchronize(device: torch.device | str) -> None:
    """Wait until ``device`` has finished the work queued on it (a GPU's; nothing on the CPU,
    whose work is done when its call returns): a host clock read after it counts that work."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PhaseTimer:
    """Times named phases (e.g. "fwd", "bwd") of each iteration, in milliseconds."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._events: dict[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = {}
        self._times: dict[str, list[float]] = {}
        self._open: dict[str, object] = {}

    @property
    def cuda(self) -> bool:
        """Whether the phases are timed by CUDA events (a GPU device)."""
        return self.device.type == "cuda"

    def start(self, phase: str) -> None:
        """Mark the start of ``phase`` for the current iteration."""
        if self.cuda:  # events on ``device``'s stream, whatever the current GPU
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            self._open[phase] = ev
        else:
            self._open[phase] = time.perf_counter()

    def stop(self, phase: str) -> None:
        """Mark the end of ``phase`` for the current iteration (``ValueError`` for a phase
        not started)."""
        if phase not in self._open:
            raise ValueError(f"phase {phase!r} was not started (call start({phase!r}) first)")
        begin = self._open.pop(phase)
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream(self.device))
            self._events.setdefault(phase, []).append((begin, end))  # type: ignore[arg-type]
        else:
            ms = (time.perf_counter() - begin) * 1e3  # type: ignore[operator]
            self._times.setdefault(phase, []).append(ms)

    def times(self, phase: str) -> list[float]:
        """All recorded durations of ``phase`` in ms (synchronises the GPU once)."""
        if self.cuda and self._events.get(phase):
            torch.cuda.synchronize(self.device)
            done = [b.elapsed_time(e) for b, e in self._events.pop(phase)]
            self._times.setdefault(phase, []).extend(done)
        return list(self._times.get(phase, []))

    def median(self, phase: str) -> float:
        """Median duration of ``phase`` in ms (NaN when nothing was recorded)."""
        t = self.times(phase)
        return float(statistics.median(t)) if t else float("nan")

    def reset(self) -> None:
        """Forget every recorded duration."""
        self._events.clear()
        self._times.clear()
        self._open.clear()
