"""pytest-benchmark: the kernel suites of bench.cases (the same cases as bench/asv_kernels.py)."""

from __future__ import annotations

import pytest
from _helpers import params, run_benchmark


@pytest.mark.parametrize(("case", "impl"), params("calibration"))
def test_calibration(benchmark, case, impl):
    run_benchmark(benchmark, case, impl)


@pytest.mark.parametrize(("case", "impl"), params("csr"))
def test_csr(benchmark, case, impl):
    run_benchmark(benchmark, case, impl)


@pytest.mark.parametrize(("case", "impl"), params("spmm"))
def test_spmm(benchmark, case, impl):
    run_benchmark(benchmark, case, impl)


@pytest.mark.parametrize(("case", "impl"), params("conv"))
def test_conv(benchmark, case, impl):
    run_benchmark(benchmark, case, impl)


@pytest.mark.parametrize(("case", "impl"), params("nm_prune"))
def test_nm_prune(benchmark, case, impl):
    run_benchmark(benchmark, case, impl)
