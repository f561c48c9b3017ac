"""Allreduce bytes per iteration per method (bench/asv_comm.py's cases): a count, not a timing.

The bytes one data-parallel step all-reduces are deterministic, so these are plain tests, not
benchmarks: they never enter pytest-benchmark's timing table. Each asserts its counts and
records them (:func:`conftest.byte_counts`); the run prints them as a table of their own
after the timings and, with ``--benchmark-json PATH``, writes them to
``PATH``'s ``<stem>-allreduce-bytes.json``. They run under ``--benchmark-only`` too (the
conftest keeps them from being skipped as non-benchmarks).
"""

from __future__ import annotations

import pytest
from _helpers import SCALE, params, prepare

from bench import cases


@pytest.mark.byte_count
@pytest.mark.parametrize(("case", "impl"), params("allreduce"))
def test_allreduce_bytes(byte_counts, case, impl):
    """Bytes one data-parallel step all-reduces per method (dense, SDGP: all; others: fewer)."""
    prepared = prepare(case, impl)
    values = dict(prepared.values)
    row = cases.fill_row(cases.base_row(case, impl, SCALE), prepared, {}, impl)
    byte_counts.append(
        {"suite": "allreduce", "case": case.name, "impl": impl.name, "unit": "bytes",
         "scale": SCALE, **{k: row[k] for k in prepared.values}}
    )  # fmt: skip
    assert 0 < values["payload_bytes"] <= values["dense_bytes"]
    if impl.name.startswith(("dense@", "sdgp@")):  # neither changes the gradients sent
        assert values["payload_bytes"] == values["dense_bytes"]
    else:
        assert values["payload_bytes"] < values["dense_bytes"]
