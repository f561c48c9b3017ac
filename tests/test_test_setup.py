"""The test suite's own set-up (tests/conftest.py): which tests skip without a GPU, how GPU
tests share one pytest-xdist worker, and what environment a test's subprocess sees."""

from __future__ import annotations

import os
import subprocess
import sys

import conftest
import pytest
import torch


class FakeItem:
    """The part of a pytest item the collection hook reads and writes."""

    def __init__(self, *marks: pytest.MarkDecorator) -> None:
        self.own = [m.mark for m in marks]
        self.added: list[pytest.Mark] = []

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return next((m for m in self.own if m.name == name), None)

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.added.append(marker.mark)


def test_without_a_gpu_gpu_marked_tests_skip_and_others_run(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    gpu, plain = FakeItem(pytest.mark.gpu), FakeItem(pytest.mark.slow)
    conftest.pytest_collection_modifyitems(None, [gpu, plain])
    assert [m.name for m in gpu.added] == ["skip"]
    assert "CUDA GPU" in gpu.added[0].kwargs["reason"]
    assert plain.added == []


def test_with_a_gpu_gpu_tests_share_one_xdist_group_and_none_skips(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu, plain = FakeItem(pytest.mark.gpu), FakeItem()
    conftest.pytest_collection_modifyitems(None, [gpu, plain])
    assert [(m.name, m.args) for m in gpu.added] == [("xdist_group", ("gpu",))]
    assert plain.added == []


def test_a_subprocess_of_a_test_does_not_see_xdist_worker_variables():
    # Under `make test` (pytest -n 2) this process is a worker and xdist set these variables;
    # pytest-benchmark in a child that saw them would refuse --benchmark-only.
    env = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.environ))"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for name in conftest.XDIST_WORKER_VARIABLES:
        assert name not in os.environ and name not in env
