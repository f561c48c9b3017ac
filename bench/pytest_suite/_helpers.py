"""What every benchmark test of this suite does with a (case, implementation) of bench.cases."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from bench import Unavailable, cases, measure

SCALE = cases.resolve_scale()

#: Columns of a row copied into pytest-benchmark's ``extra_info``.
EXTRA = (
    "suite",
    "case",
    "impl",
    "impl_label",
    "baseline",
    "device",
    "math",
    "dtype",
    "tf32_matmul",
    "tf32_cudnn",
    "cudnn_benchmark",
    "flops",
    "flops_nominal",
    "bytes",
    "bytes_sectors",
    "tflops",
    "gbps",
    "gbps_sectors",
    "frac_peak_spec",
    "frac_bw_spec",
    "nnz",
    "sparsity_actual",
    "rotated_mib",
    "rotated_index_mib",
    "rotated_out_mib",
    "scale",
)


def params(suite: str) -> list[Any]:
    """``pytest.param(case, impl)`` for every pair of ``suite`` at this scale, GPU ones marked."""
    out = []
    for case, impl in cases.pairs(suite, SCALE):
        marks = [pytest.mark.gpu] if impl.device == "cuda" else []
        out.append(pytest.param(case, impl, id=f"{case.name}-{impl.name}", marks=marks))
    return out


def prepare(case: cases.Case, impl: cases.Impl) -> cases.Prepared:
    """The prepared case, or a skip with the reason it cannot run here."""
    try:
        return cases.prepare(case, impl, SCALE)
    except Unavailable as exc:
        pytest.skip(str(exc))


def _median_ms(benchmark: Any) -> float | None:
    stats = getattr(benchmark, "stats", None)
    inner = getattr(stats, "stats", None)
    median = getattr(inner, "median", None)
    return None if median is None else float(median) * 1e3


def run_benchmark(benchmark: Any, case: cases.Case, impl: cases.Impl) -> dict[str, Any] | None:
    """Time one pair with pytest-benchmark; put the row's derived figures in ``extra_info``.

    Each round is one call (all phases), synchronised on a GPU. The benchmark's group is
    ``suite/case`` (pytest-benchmark's table puts a case's implementations together) and its
    params the two names. With
    ``--benchmark-disable`` the call runs once and nothing is derived (returns None).
    """
    prepared = prepare(case, impl)
    # one table per case, its implementations side by side; names, not the objects
    # pytest-benchmark would save as "UNSERIALIZABLE[...]"
    benchmark.group = f"{case.suite}/{case.name}"
    benchmark.params = {"case": case.name, "impl": impl.name}
    cfg = cases.scale_config(SCALE)
    counter = itertools.count()

    def call() -> None:
        prepared.call(next(counter))
        measure.synchronize(prepared.device)

    cuda = prepared.device.type == "cuda"
    rounds = cfg.pytest_cuda_rounds if cuda else cfg.cpu_repeats
    warmup = cfg.cpu_warmup
    if len(prepared.phases) > 1:  # training iterations: as many as bench.run's, after as many
        rounds, warmup = cfg.iter_repeats, cfg.iter_warmup
    with measure.pinned_flags(**prepared.flags):
        if not cuda and len(prepared.phases) == 1 and cfg.cpu_min_time_s > 0:
            # as bench.run times a CPU kernel: enough rounds to add up to cpu_min_time_s,
            # from one call timed after the warm-up (a first call may cost several)
            one = measure.cpu_timing(lambda i: call(), warmup=cfg.cpu_warmup, repeats=1)
            rounds = measure.cpu_rounds(
                one.median_ms / 1e3, rounds, cfg.cpu_min_time_s, cfg.cpu_max_repeats
            )
        benchmark.pedantic(call, rounds=rounds, warmup_rounds=warmup, iterations=1)
    median = _median_ms(benchmark)
    if getattr(benchmark, "disabled", False) or median is None:
        return None
    timings = {"op": measure.summarize([median], "pytest-benchmark")}
    if len(prepared.phases) > 1:  # phases apart: one more, shorter measurement
        timings = cases.measure_prepared(prepared, SCALE)
    row = cases.fill_row(cases.base_row(case, impl, SCALE), prepared, timings, impl)
    benchmark.extra_info.update({k: row.get(k) for k in EXTRA if k in row})
    benchmark.extra_info["case_params"] = dict(case.params)  # shapes, sparsity, N:M, model
    for key in ("forward_ms", "backward_ms", "step_ms", "iteration_ms"):
        if key in row:
            benchmark.extra_info[key] = row[key]
    return row
