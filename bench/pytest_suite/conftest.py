"""Set-up of the pytest-benchmark suite: GPU skips, the scale, provenance in the JSON.

This directory is not a package (no ``__init__.py``), so asv, which imports every package
module of ``bench/``, never imports pytest through it.
"""

from __future__ import annotations

import pytest
import torch

from bench import cases


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every ``gpu``-marked benchmark, with the reason, where no CUDA GPU is present."""
    # Queried at collection, never at import: an import must not touch the GPU.
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is present on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    """Record the provenance of bench.cases (commit, versions, GPU, scale) in the JSON."""
    machine_info["pdtbench"] = cases.provenance()


def pytest_report_header(config: pytest.Config) -> str:
    """The scale the suite runs at, first in pytest's header."""
    return f"pdtbench benchmark scale: {cases.resolve_scale()} (PDTBENCH_BENCH_SMALL=1: smoke)"
