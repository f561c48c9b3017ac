"""pytest-benchmark: the kernel suites of bench.cases (the same cases as bench/asv_kernels.py).

These time the kernels; they do not check what the kernels compute. That is the work of the
tests under tests/, against references: the pattern ops in tests/test_pattern_ops.py and
tests/test_pattern_cpu.py, N:M in tests/test_nm_cpu.py and tests/test_sdgp.py, every CUDA
kernel (its emulation on a CPU) in tests/test_cuda_ops.py, and the rows' derived columns in
tests/test_bench_cases.py. With ``--benchmark-disable`` (``make test``) each pair runs once,
to show that it runs here; a pair that raises fails its test.
"""

from __future__ import annotations

import pytest
from _helpers import params, run_benchmark


@pytest.mark.parametrize(("case", "impl"), params("calibration"))
def test_calibration(benchmark, case, impl):
    """A device copy (GB/s) and a float32 GEMM (TFLOP/s): the measured bandwidth and peak."""
    run_benchmark(benchmark, case, impl)


@pytest.mark.parametrize(("case", "impl"), params("csr"))
def test_csr(benchmark, case, impl):
    """CSR conversion: pattern_csr against cuSPARSE dense2csr, to_sparse_csr and scipy."""
    run_benchmark(benchmark, case, impl)


@pytest.mark.parametrize(("case", "impl"), params("spmm"))
def test_spmm(benchmark, case, impl):
    """Pattern SpMM against torch CSR SpMM and dense GEMM (fp32 and TF32) across sparsity."""
    run_benchmark(benchmark, case, impl)


@pytest.mark.parametrize(("case", "impl"), params("conv"))
def test_conv(benchmark, case, impl):
    """Pattern conv against cuDNN (TF32 off and on) or torch's dense CPU conv, fwd and fwd+bwd."""
    run_benchmark(benchmark, case, impl)


@pytest.mark.parametrize(("case", "impl"), params("nm_prune"))
def test_nm_prune(benchmark, case, impl):
    """SDGP's N:M pruning: the kernel against the torch reference and a device copy."""
    run_benchmark(benchmark, case, impl)


@pytest.mark.parametrize(("case", "impl"), params("pack"))
def test_pack(benchmark, case, impl):
    """Gradient pack and unpack for the sparse Allreduce: the kernels against torch indexing."""
    run_benchmark(benchmark, case, impl)
