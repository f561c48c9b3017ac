"""Shared test set-up: the ``gpu`` marker skips cleanly where no CUDA GPU is present (and
where one is, the GPU tests share one pytest-xdist worker, so no two time the GPU at once),
the shell's dataset directories (PDTBENCH_DATA_DIR) do not reach the tests, a process a
test starts is not taken for an xdist worker, and a session run with PDT_KERNEL_LAUNCH_LOG set
records the CUDA kernels it launched."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator

import pytest
import torch

#: Where a test session appends the CUDA kernels it launched (one JSON line per process),
#: when set: the sanitizer steps of scripts/gpu/kernels.sh read it to show what they checked.
LAUNCH_LOG_VARIABLE = "PDT_KERNEL_LAUNCH_LOG"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Queried at collection, never at import: an import must not touch the GPU.
    if torch.cuda.is_available():
        # Under `pytest -n N --dist loadgroup` one worker runs every GPU test, in turn.
        mark = pytest.mark.xdist_group("gpu")
    else:
        mark = pytest.mark.skip(reason="needs a CUDA GPU; none is present on this machine")
    for item in items:
        # The marker, not the keyword: a test parametrized with an id "gpu" (a scale) is not
        # a GPU test.
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(mark)


_LOGGED_LAUNCHES: dict[str, int] = {}  # what this process's launch log holds so far


def _log_launches(**fields: object) -> None:
    """Append the kernels launched since the last record (a record per test that launched
    any, so that a run stopped at a time limit still shows what it checked; the log's
    records add up to the process's launches)."""
    path = os.environ.get(LAUNCH_LOG_VARIABLE)
    loader = sys.modules.get("impl.cuda.loader")  # not imported: nothing was launched
    if not path:
        return
    now = loader.launched() if loader is not None else {}
    new = {k: n - _LOGGED_LAUNCHES.get(k, 0) for k, n in now.items()}
    new = {k: n for k, n in new.items() if n}
    if not new and not fields:
        return
    _LOGGED_LAUNCHES.update(now)
    record = {"pid": os.getpid(), **fields, "launched": new}
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    _log_launches()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _log_launches(exitstatus=int(exitstatus))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_dataset_directories_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's PDTBENCH_DATA_DIR must not change what the tests see."""
    monkeypatch.delenv("PDTBENCH_DATA_DIR", raising=False)


XDIST_WORKER_VARIABLES = (
    "PYTEST_XDIST_WORKER",
    "PYTEST_XDIST_WORKER_COUNT",
    "PYTEST_XDIST_TESTRUNUID",
)


@pytest.fixture(autouse=True, scope="session")
def _subprocesses_are_not_xdist_workers() -> Iterator[None]:
    """A pytest a test starts (the benchmark suites) must run as a user's would: pytest-benchmark
    turns benchmarking off in any process that sees an xdist worker's variables. Removed once
    per session (xdist sets them when the worker starts), restored at its end."""
    with pytest.MonkeyPatch.context() as patch:
        for name in XDIST_WORKER_VARIABLES:
            patch.delenv(name, raising=False)
        yield
