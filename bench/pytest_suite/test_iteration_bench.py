"""pytest-benchmark: one training iteration per method (the cases of bench/asv_iteration.py).

With ``--benchmark-disable`` (``make test``) each iteration runs once and nothing is timed, so
the check on the timed phases runs only when benchmarking (``pytest --benchmark-only``); the
phases' timing and the row's columns are checked in tests/test_bench_cases.py either way.
"""

from __future__ import annotations

import pytest
from _helpers import params, run_benchmark


@pytest.mark.parametrize(("case", "impl"), params("iteration"))
def test_iteration(benchmark, case, impl):
    """One training iteration per method in its post-pruning state: forward, backward, step."""
    row = run_benchmark(benchmark, case, impl)
    if row is not None:  # forward and backward are measured apart and both took time
        assert row["forward_ms"] > 0 and row["backward_ms"] > 0
