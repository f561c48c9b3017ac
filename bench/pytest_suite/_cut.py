"""A pytest-benchmark run that a time limit cuts keeps what it measured.

pytest-benchmark writes ``--benchmark-json`` once, when the session ends, and ``timeout``
ends a step with SIGTERM, which would lose every result. :class:`CutRecorder` (registered by
this suite's conftest) does two things:

* it turns the first SIGTERM into pytest's own interruption (``KeyboardInterrupt``), so the
  session still finishes and pytest-benchmark writes the JSON of the benchmarks that ended,
  with ``"pdtbench_run": {"complete": false, "cut_at": ...}`` saying where the cut fell
  (a second SIGTERM is ignored while that write runs);
* it appends each benchmark's statistics to ``<stem>.partial.jsonl`` beside the JSON as it
  ends, which survives even SIGKILL.
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import pytest


def beside_benchmark_json(benchmark_json: Any, suffix: str) -> Path | None:
    """``<stem><suffix>`` in the folder of pytest-benchmark's ``--benchmark-json PATH`` (a
    path, or an open file in older pytest-benchmark); None without that option."""
    if not benchmark_json:
        return None
    if not isinstance(benchmark_json, (str, Path)):  # an open file (older pytest-benchmark)
        benchmark_json = benchmark_json.name
    path = Path(benchmark_json)
    return path.with_name(f"{path.stem}{suffix}")


def partial_path(benchmark_json: Any) -> Path | None:
    """``<stem>.partial.jsonl`` beside pytest-benchmark's ``--benchmark-json PATH``; None
    without that option."""
    return beside_benchmark_json(benchmark_json, ".partial.jsonl")


def _has_rounds(metadata: Any) -> bool:
    """Whether a pytest-benchmark result holds at least one timed round."""
    return bool(getattr(getattr(metadata, "stats", None), "data", None))


class CutRecorder:
    """pytest hooks that keep a cut benchmark session's results (see the module's text)."""

    def __init__(self) -> None:
        self.current: str | None = None  # the node id of the test running
        self.cut_at: str | None = None  # where a SIGTERM stopped the session
        self.cut_test: str | None = None  # the test it stopped, if one was running
        self.partial: Path | None = None
        self._previous: Any = None
        self._config: pytest.Config | None = None

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.cut_at is not None:
            return  # the first one is being handled: let the JSON be written
        self.cut_test = self.current
        self.cut_at = f"{self.current or 'between tests'} (SIGTERM: a time limit)"
        raise KeyboardInterrupt(self.cut_at)

    def start(self, config: pytest.Config) -> None:
        """Install the SIGTERM handler (main thread of the main process only) and start an
        empty partial file; once. Called where the recorder is registered: under
        ``pytest bench`` this suite's conftest is read during collection, after the session
        started, so a ``pytest_sessionstart`` of the recorder alone never ran there (a cut
        then kept nothing)."""
        if self._config is not None:
            return
        self._config = config
        self.partial = partial_path(config.getoption("benchmark_json", default=None))
        if self.partial is not None:
            self.partial.parent.mkdir(parents=True, exist_ok=True)
            self.partial.write_text("")
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    @pytest.hookimpl
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """:meth:`start`, where the recorder was registered before the session began."""
        self.start(session.config)

    @pytest.hookimpl
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """Put the previous SIGTERM handler back."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any):  # noqa: ANN201
        """Remember which test runs, for ``cut_at``."""
        self.current = item.nodeid
        yield
        self.current = None

    @pytest.hookimpl
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> None:
        """Append the statistics of a benchmark that ended to the partial file."""
        if call.when != "call" or self.partial is None:
            return
        fixture = getattr(item, "funcargs", {}).get("benchmark")
        stats = getattr(fixture, "stats", None)
        if not _has_rounds(stats):
            return
        row = {"nodeid": item.nodeid, **stats.as_dict(include_data=False)}
        with open(self.partial, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
            f.flush()

    @pytest.hookimpl
    def pytest_keyboard_interrupt(self, excinfo: Any) -> None:
        """Drop the benchmark the interruption cut short: its rounds so far are not its
        measurement, and with none pytest-benchmark would fail on the empty statistics when
        it writes the JSON."""
        session = getattr(self._config, "_benchmarksession", None)
        if session is not None and isinstance(getattr(session, "benchmarks", None), list):
            session.benchmarks[:] = [
                b
                for b in session.benchmarks
                if _has_rounds(b) and getattr(b, "fullname", None) != self.cut_test
            ]

    @pytest.hookimpl
    def pytest_benchmark_update_json(
        self, config: pytest.Config, benchmarks: Any, output_json: dict
    ) -> None:
        """Say in the JSON whether the session ran to its end."""
        output_json["pdtbench_run"] = {"complete": self.cut_at is None, "cut_at": self.cut_at}
