"""Set-up of the pytest-benchmark suite: GPU skips, the scale, provenance in the JSON, the
byte counts that are reported apart from the timings, and a cut session's results kept.

This directory is not a package (no ``__init__.py``), so asv, which imports every package
module of ``bench/``, never imports pytest through it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from _cut import CutRecorder, beside_benchmark_json

from bench import cases

# rows of the ``byte_count`` tests of this session (deterministic counts, not timings)
_BYTE_COUNTS: list[dict[str, Any]] = []
# pytest-benchmark's reason for skipping a test without its fixture under --benchmark-only
_NON_BENCHMARK_SKIP = "Skipping non-benchmark"


def pytest_configure(config: pytest.Config) -> None:
    """Declare the ``byte_count`` marker (a count reported apart from the timings) and keep a
    cut session's results (:class:`_cut.CutRecorder`)."""
    config.addinivalue_line(
        "markers", "byte_count: a deterministic count, reported apart from the timing table"
    )
    if not config.pluginmanager.has_plugin("pdtbench-cut"):
        recorder = CutRecorder()
        config.pluginmanager.register(recorder, "pdtbench-cut")
        recorder.start(config)  # now: under `pytest bench` the session has already begun


@pytest.fixture(scope="session")
def byte_counts() -> list[dict[str, Any]]:
    """The session's byte-count rows: a ``byte_count`` test appends its row here, and the
    terminal summary prints them and writes them beside ``--benchmark-json``."""
    return _BYTE_COUNTS


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every ``gpu``-marked benchmark, with the reason, where no CUDA GPU is present;
    keep the ``byte_count`` tests running under ``--benchmark-only`` (they are counts, not
    benchmarks, so pytest-benchmark would skip them)."""
    for item in items:
        if item.get_closest_marker("byte_count") is not None:
            item.own_markers[:] = [
                m for m in item.own_markers
                if not (m.name == "skip" and _NON_BENCHMARK_SKIP in str(m.kwargs.get("reason")))
            ]  # fmt: skip
    # Queried at collection, never at import: an import must not touch the GPU.
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is present on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def byte_counts_path(benchmark_json: Any) -> Path | None:
    """Where the byte counts go beside pytest-benchmark's ``--benchmark-json PATH``:
    ``<stem>-allreduce-bytes.json`` in PATH's folder; None without that option."""
    return beside_benchmark_json(benchmark_json, "-allreduce-bytes.json")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Print the byte counts as their own table (bytes, not seconds) and write them as JSON
    beside ``--benchmark-json``."""
    if not _BYTE_COUNTS:
        return
    tr = terminalreporter
    tr.write_sep("-", "Allreduce bytes per iteration (counted, not timed)")
    for row in _BYTE_COUNTS:
        tr.write_line(
            f"{row['case']:<28} {row['impl']:<18} payload {int(row['payload_bytes']):>12,} B "
            f"of {int(row['dense_bytes']):>12,} B ({row['payload_fraction']:.3f} of dense)"
        )
    path = byte_counts_path(config.getoption("benchmark_json", default=None))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"pdtbench": cases.provenance(), "rows": _BYTE_COUNTS},
                                   indent=1, default=str))  # fmt: skip
        tr.write_line(f"byte counts written to {path}")


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    """Record the provenance of bench.cases (commit, versions, GPU, scale) in the JSON."""
    machine_info["pdtbench"] = cases.provenance()


def pytest_report_header(config: pytest.Config) -> str:
    """The scale the suite runs at, first in pytest's header."""
    return f"pdtbench benchmark scale: {cases.resolve_scale()} (PDTBENCH_BENCH_SMALL=1: smoke)"
