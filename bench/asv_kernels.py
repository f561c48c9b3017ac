"""asv benchmarks of the kernels: calibration, CSR conversion, SpMM, convolution, N:M pruning.

Every class is a grid ``params = (cases, implementations)`` from :mod:`bench.cases` at the
scale of ``PDTBENCH_BENCH_SCALE`` / ``PDTBENCH_BENCH_SMALL`` (see docs/benchmarks.md). ``setup``
builds the inputs and pins the TF32 and cuDNN flags; an implementation that cannot run here
(no GPU, a kernel or library missing, a pair that does not apply) raises
``NotImplementedError`` with the reason, which asv records as skipped.

* ``time_op``: one call, timed by asv; on a GPU it synchronises before it returns.
* ``track_tflops`` / ``track_gbps``: the rate from :func:`bench.cases.measure_prepared`
  (CUDA events, do_bench style, or ``perf_counter``) and the FLOPs / bytes of the case.
* ``*Fraction.track_fraction_of_peak``: that rate over the data-sheet peak of
  :mod:`bench.peaks` (GPU only; an unknown GPU raises).
"""

from __future__ import annotations

import math

from bench import cases, measure

_SCALE = cases.resolve_scale()


def _names(
    suite: str, kinds: tuple[str, ...] | None = None, device: str | None = None
) -> tuple[list[str], list[str]]:
    """``(case names, implementation names)`` of ``suite`` at this scale, optionally filtered."""
    impls = cases.implementations(suite, _SCALE)
    grid = [c for c in cases.grid(suite, _SCALE) if kinds is None or c.params["kind"] in kinds]
    used = [
        n
        for n, i in impls.items()
        if any(i.accepts(c) for c in grid) and (device is None or i.device == device)
    ]
    return [c.name for c in grid], used


class _Setup:
    """Shared set-up of the kernel benchmarks (asv skips names starting with ``_``)."""

    suite = ""
    kinds: tuple[str, ...] | None = None
    rate = "tflops"
    gpu_only = False
    param_names = ["case", "impl"]
    params: tuple[list[str], list[str]] = ([], [])
    timeout = 900.0
    number = 1
    repeat = (1, 10, 20.0)
    warmup_time = 0.05

    def setup(self, case: str, impl: str) -> None:
        c, i = cases.find(self.suite, case, impl, _SCALE)
        if not i.accepts(c):
            raise NotImplementedError(f"{impl} does not apply to {case}")
        if self.gpu_only and i.device != "cuda":
            raise NotImplementedError("data-sheet peaks (bench/peaks.py) exist only for GPUs")
        self.case, self.impl = c, i
        self.prepared = cases.prepare(c, i, _SCALE)  # bench.Unavailable -> asv skip
        self._flags = measure.pinned_flags(**self.prepared.flags)
        self._flags.__enter__()
        # one untimed call: cuDNN autotuning, library handles and lazy module loading happen
        # here, not in the one sample `asv run --quick` takes
        self.prepared.call(0)
        measure.synchronize(self.prepared.device)
        self.calls = 1

    def teardown(self, case: str, impl: str) -> None:
        flags = getattr(self, "_flags", None)
        if flags is not None:
            flags.__exit__(None, None, None)
        self.prepared = None

    def _row(self) -> dict:
        timings = cases.measure_prepared(self.prepared, _SCALE)
        row = cases.base_row(self.case, self.impl, _SCALE)
        return cases.fill_row(row, self.prepared, timings, self.impl)

    def _rate(self) -> float:
        value = self._row().get(self.rate)
        return math.nan if value is None else float(value)


class _Kernel(_Setup):
    def time_op(self, case: str, impl: str) -> None:
        self.prepared.call(self.calls)
        self.calls += 1
        measure.synchronize(self.prepared.device)


class _TFLOPs(_Kernel):
    rate = "tflops"

    def track_tflops(self, case: str, impl: str) -> float:
        return self._rate()

    track_tflops.unit = "TFLOP/s"  # type: ignore[attr-defined]


class _GBps(_Kernel):
    rate = "gbps"

    def track_gbps(self, case: str, impl: str) -> float:
        return self._rate()

    track_gbps.unit = "GB/s"  # type: ignore[attr-defined]


class _Fraction(_Setup):
    gpu_only = True

    def track_fraction_of_peak(self, case: str, impl: str) -> float:
        from bench import peaks

        row = self._row()
        spec = peaks.lookup(row.get("gpu_name") or "")  # raises on an unknown GPU
        if self.rate == "gbps":
            return float(row["gbps"]) / spec.mem_gbps
        return float(row["tflops"]) / spec.tflops(self.impl.math)

    track_fraction_of_peak.unit = "fraction"  # type: ignore[attr-defined]


class CalibrationCopy(_GBps):
    """Device copy: the measured bandwidth other rows are a fraction of."""

    suite, kinds = "calibration", ("copy",)
    params = _names(suite, kinds)


class CalibrationGemm(_TFLOPs):
    """Square float32 GEMM: the measured peak other rows are a fraction of."""

    suite, kinds = "calibration", ("gemm",)
    params = _names(suite, kinds)


class CSRConversion(_GBps):
    """Dense filter matrix to CSR (ClickTrain Sec. 5.1) against cuSPARSE, torch and scipy."""

    suite = "csr"
    params = _names(suite)


class CSRConversionFraction(_Fraction):
    """CSR conversion bandwidth as a fraction of the GPU's data-sheet bandwidth."""

    suite, rate = "csr", "gbps"
    params = _names(suite, device="cuda")


class SpMM(_TFLOPs):
    """Pattern SpMM (Sec. 5.2) against cuSPARSE / MKL CSR SpMM and dense GEMM."""

    suite = "spmm"
    params = _names(suite)


class SpMMFraction(_Fraction):
    """SpMM TFLOP/s as a fraction of the GPU's data-sheet peak for its math."""

    suite, rate = "spmm", "tflops"
    params = _names(suite, device="cuda")


class Conv2d(_TFLOPs):
    """Pattern convolution against cuDNN (benchmark mode) or torch's dense CPU convolution."""

    suite = "conv"
    params = _names(suite)


class Conv2dFraction(_Fraction):
    """Convolution TFLOP/s as a fraction of the GPU's data-sheet peak for its math."""

    suite, rate = "conv", "tflops"
    params = _names(suite, device="cuda")


class NMPrune(_GBps):
    """SDGP's N:M pruning of an output gradient, kernel against reference and copy."""

    suite = "nm_prune"
    params = _names(suite)


class NMPruneFraction(_Fraction):
    """N:M pruning bandwidth as a fraction of the GPU's data-sheet bandwidth."""

    suite, rate = "nm_prune", "gbps"
    params = _names(suite, device="cuda")


class GradPack(_GBps):
    """Gradient pack and unpack of the sparse Allreduce (ClickTrain Sec. 5.3) against torch."""

    suite = "pack"
    params = _names(suite)


class GradPackFraction(_Fraction):
    """Pack / unpack bandwidth as a fraction of the GPU's data-sheet bandwidth."""

    suite, rate = "pack", "gbps"
    params = _names(suite, device="cuda")
