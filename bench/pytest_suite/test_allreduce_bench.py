"""pytest-benchmark: Allreduce bytes per iteration per method (bench/asv_comm.py's cases).

The figure is the byte count in ``extra_info``; the timed call is the accounting itself.
"""

from __future__ import annotations

import pytest
from _helpers import SCALE, params, prepare

from bench import cases


@pytest.mark.parametrize(("case", "impl"), params("allreduce"))
def test_allreduce_bytes(benchmark, case, impl):
    """Bytes one data-parallel step all-reduces per method (dense, SDGP: all; others: fewer)."""
    prepared = prepare(case, impl)
    values = benchmark.pedantic(lambda: dict(prepared.values), rounds=1, iterations=1)
    row = cases.fill_row(cases.base_row(case, impl, SCALE), prepared, {}, impl)
    benchmark.extra_info.update({k: row[k] for k in prepared.values})
    benchmark.extra_info.update(
        suite="allreduce", case=case.name, impl=impl.name, unit="bytes", scale=SCALE
    )
    assert 0 < values["payload_bytes"] <= values["dense_bytes"]
    if impl.name.startswith(("dense@", "sdgp@")):  # neither changes the gradients sent
        assert values["payload_bytes"] == values["dense_bytes"]
    else:
        assert values["payload_bytes"] < values["dense_bytes"]
