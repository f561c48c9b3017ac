"""Shared test set-up: the ``gpu`` marker skips cleanly where no CUDA GPU is present, and
the shell's dataset directories (PDTBENCH_DATA_DIR) do not reach the tests."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Queried at collection, never at import: an import must not touch the GPU.
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is present on this machine")
    for item in items:
        # The marker, not the keyword: a test parametrized with an id "gpu" (a scale) is not
        # a GPU test.
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_dataset_directories_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's PDTBENCH_DATA_DIR must not change what the tests see."""
    monkeypatch.delenv("PDTBENCH_DATA_DIR", raising=False)
