"""asv benchmarks of one training iteration per method (forward, backward, step).

``params = (cases, implementations)`` from :mod:`bench.cases` suite ``iteration``: ResNet-18/34/50
and VGG-16 at CIFAR (batch 128) and ImageNet (batch 64) resolution on the GPU scale, small
variants on the CPU scales; implementations are the methods in their post-pruning state
(:mod:`bench.method_states`) on each device.

* ``time_iteration``: forward + backward + optimizer step (and the method's hooks), timed by
  asv; synchronises on a GPU.
* ``track_forward_ms``, ``track_backward_ms``, ``track_step_ms``: the median of each phase,
  measured apart (CUDA events or ``perf_counter``) by :func:`bench.cases.measure_prepared`.
* ``track_forward_backward_tflops``: executed FLOPs of forward + backward
  (:func:`impl.flops.training_flops` times the batch) over their measured time.
"""

from __future__ import annotations

import math

from bench import cases, measure

_SCALE = cases.resolve_scale()
_CASES = [c.name for c in cases.grid("iteration", _SCALE)]
_IMPLS = list(cases.implementations("iteration", _SCALE))


class Iteration:
    """Per-iteration time of each method's model (see the module docstring)."""

    param_names = ["case", "impl"]
    params = (_CASES, _IMPLS)
    timeout = 1200.0
    number = 1
    repeat = (1, 5, 30.0)
    warmup_time = 0.0

    def setup(self, case: str, impl: str) -> None:
        """Build the method's model in its post-pruning state and run one warm-up iteration
        (cuDNN autotuning, allocator); skips (NotImplementedError) where it cannot run."""
        self.case, self.impl = cases.find("iteration", case, impl, _SCALE)
        self.prepared = cases.prepare(self.case, self.impl, _SCALE)  # Unavailable -> skip
        self._flags = measure.pinned_flags(**self.prepared.flags)
        self._flags.__enter__()
        self.prepared.call(0)  # first iteration: cuDNN autotuning, allocator warm-up
        measure.synchronize(self.prepared.device)
        self.calls = 1

    def teardown(self, case: str, impl: str) -> None:
        """Restore the TF32 and cuDNN flags and free the model."""
        flags = getattr(self, "_flags", None)
        if flags is not None:
            flags.__exit__(None, None, None)
        self.prepared = None

    def time_iteration(self, case: str, impl: str) -> None:
        """One training iteration (forward, backward, optimizer step, the method's hooks), in
        seconds; synchronises on a GPU before it returns."""
        self.prepared.call(self.calls)
        self.calls += 1
        measure.synchronize(self.prepared.device)

    def _row(self) -> dict:
        timings = cases.measure_prepared(self.prepared, _SCALE)
        row = cases.base_row(self.case, self.impl, _SCALE)
        return cases.fill_row(row, self.prepared, timings, self.impl)

    def _value(self, key: str) -> float:
        value = self._row().get(key)
        return math.nan if value is None else float(value)

    def track_forward_ms(self, case: str, impl: str) -> float:
        """Median forward time per iteration (ms): model, loss and the method's regularizer."""
        return self._value("forward_ms")

    track_forward_ms.unit = "ms"  # type: ignore[attr-defined]

    def track_backward_ms(self, case: str, impl: str) -> float:
        """Median backward time per iteration (ms): ``loss.backward()``, with whatever the
        method's modules do in it (SDGP's gradient pruning, pattern SpMM backward)."""
        return self._value("backward_ms")

    track_backward_ms.unit = "ms"  # type: ignore[attr-defined]

    def track_step_ms(self, case: str, impl: str) -> float:
        """Median step time per iteration (ms): the method's work after backward (gradient
        masking), the optimizer step and its work after the step (masks re-applied)."""
        return self._value("step_ms")

    track_step_ms.unit = "ms"  # type: ignore[attr-defined]

    def track_forward_backward_tflops(self, case: str, impl: str) -> float:
        """Executed FLOPs of forward + backward (impl.flops.training_flops times the batch)
        over their measured time, in TFLOP/s."""
        return self._value("tflops")

    track_forward_backward_tflops.unit = "TFLOP/s"  # type: ignore[attr-defined]
