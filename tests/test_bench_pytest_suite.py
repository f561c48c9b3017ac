"""The pytest-benchmark suite keeps deterministic byte counts out of its timing table."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, None), ("out/pytest-benchmark.json", "out/pytest-benchmark-allreduce-bytes.json"),
     (Path("/tmp/x/pb.json"), "/tmp/x/pb-allreduce-bytes.json")],
    ids=["no-json", "relative-str", "absolute-path"],
)  # fmt: skip
def test_byte_counts_go_beside_the_benchmark_json(given, expected, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench" / "pytest_suite"))  # as pytest imports it
    spec = importlib.util.spec_from_file_location(
        "bench_suite_conftest", ROOT / "bench" / "pytest_suite" / "conftest.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    got = module.byte_counts_path(given)
    assert (None if got is None else str(got)) == expected


@pytest.mark.slow
def test_allreduce_bytes_are_counted_apart_from_the_timings(tmp_path):
    out = tmp_path / "pytest-benchmark.json"
    env = {**os.environ, "PDTBENCH_BENCH_SMALL": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
         "bench/pytest_suite/test_allreduce_bench.py", "-k", "dense or clicktrain",
         "--benchmark-only", "--benchmark-json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 passed" in proc.stdout  # run, not skipped as non-benchmarks, under --benchmark-only
    assert "Allreduce bytes per iteration (counted, not timed)" in proc.stdout
    saved = json.loads((tmp_path / "pytest-benchmark-allreduce-bytes.json").read_text())
    rows = {r["impl"]: r for r in saved["rows"]}
    assert set(rows) == {"dense@cpu", "clicktrain@cpu"}
    assert rows["dense@cpu"]["payload_bytes"] == rows["dense@cpu"]["dense_bytes"] > 0
    assert 0 < rows["clicktrain@cpu"]["payload_bytes"] < rows["dense@cpu"]["payload_bytes"]
    # pytest-benchmark leaves the JSON absent or empty when nothing was timed
    text = out.read_text() if out.exists() else ""
    timed = json.loads(text)["benchmarks"] if text.strip() else []
    assert not any("allreduce" in b["name"] for b in timed)  # no byte count as a timing


CUT_CONFTEST = """
import sys
sys.path.insert(0, {suite!r})
from _cut import CutRecorder


def pytest_configure(config):
    config.pluginmanager.register(CutRecorder(), "pdtbench-cut")
"""

CUT_TESTS = """
import os
import signal


def test_one(benchmark):
    benchmark(sum, range(10))


def test_two(benchmark):
    calls = []

    def cut():  # two rounds measured, then what `timeout` sends when a step's limit ends
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    benchmark.pedantic(cut, rounds=5, iterations=1)


def test_three(benchmark):
    benchmark(sum, range(10))
"""


# The suite's own conftest, read where a copy of the suite's layout puts it.
REAL_CONFTEST = """
import sys
sys.path[:0] = [{root!r}, {suite!r}]
_path = {suite!r} + "/conftest.py"
exec(compile(open(_path).read(), _path, "exec"))
"""


@pytest.mark.parametrize("given", ["suite", "parent"])
@pytest.mark.slow
def test_a_session_cut_by_sigterm_keeps_the_benchmarks_that_ended(tmp_path, given):
    """Run as ``pytest bench/pytest_suite`` (the suite's conftest read at start-up) and as
    ``pytest bench`` (read during collection, after the session began: the cut kept nothing
    there, not even the partial file)."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(
        REAL_CONFTEST.format(root=str(ROOT), suite=str(ROOT / "bench" / "pytest_suite"))
    )
    (suite / "test_cut.py").write_text(CUT_TESTS)
    out = tmp_path / "out" / "pb.json"
    out.parent.mkdir()  # pytest-benchmark before 5.3 opens the file at start-up
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
         "suite" if given == "suite" else ".", "--benchmark-only", "--benchmark-json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]  # interrupted
    saved = json.loads(out.read_text())
    assert [b["name"] for b in saved["benchmarks"]] == ["test_one"]
    assert saved["pdtbench_run"]["complete"] is False
    assert "test_cut.py::test_two (SIGTERM" in saved["pdtbench_run"]["cut_at"]
    partial = [
        json.loads(line) for line in (out.parent / "pb.partial.jsonl").read_text().splitlines()
    ]
    assert [r["nodeid"] for r in partial] == ["suite/test_cut.py::test_one"]
    assert partial[0]["stats"]["rounds"] >= 1


@pytest.mark.slow
def test_a_session_that_ends_says_it_is_complete(tmp_path):
    (tmp_path / "conftest.py").write_text(
        CUT_CONFTEST.format(suite=str(ROOT / "bench" / "pytest_suite"))
    )
    (tmp_path / "test_whole.py").write_text(CUT_TESTS.split("def test_two")[0])
    out = tmp_path / "pb.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_whole.py",
         "--benchmark-only", "--benchmark-json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads(out.read_text())["pdtbench_run"] == {"complete": True, "cut_at": None}
    assert len((tmp_path / "pb.partial.jsonl").read_text().splitlines()) == 1


def _helpers_module(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench" / "pytest_suite"))
    spec = importlib.util.spec_from_file_location(
        "bench_suite_helpers", ROOT / "bench" / "pytest_suite" / "_helpers.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Recorder:
    """The part of pytest-benchmark's fixture that run_benchmark uses, disabled."""

    disabled = True

    def __init__(self):
        self.rounds = self.warmup_rounds = None

    def pedantic(self, fn, rounds, warmup_rounds, iterations):
        self.rounds, self.warmup_rounds = rounds, warmup_rounds
        fn()


def test_cpu_kernels_get_the_rounds_that_bench_run_times(monkeypatch):
    import dataclasses
    import time

    import torch

    from bench import cases, measure

    helpers = _helpers_module(monkeypatch)
    monkeypatch.setattr(helpers, "SCALE", "smoke")
    case, impl = cases.find(
        "nm_prune", cases.grid("nm_prune", "smoke")[0].name, "copy@cpu", "smoke"
    )
    plain = _Recorder()
    assert helpers.run_benchmark(plain, case, impl) is None
    assert plain.rounds == cases.SCALE_CONFIGS["smoke"].cpu_repeats == 3  # no minimum time
    timed = dataclasses.replace(
        cases.SCALE_CONFIGS["smoke"], cpu_min_time_s=0.25, cpu_max_repeats=50
    )
    monkeypatch.setitem(cases.SCALE_CONFIGS, "smoke", timed)
    fast = _Recorder()
    helpers.run_benchmark(fast, case, impl)  # a copy of 64 KiB: microseconds a call
    assert fast.rounds == 50
    calls = []

    def slow_first(i):  # 0.4 s the first call (growing buffers, say), 20 ms after
        calls.append(i)
        time.sleep(0.4 if len(calls) == 1 else 0.02)

    monkeypatch.setattr(
        helpers, "prepare", lambda c, i: cases.Prepared([("op", slow_first)], torch.device("cpu"))
    )
    paced = _Recorder()
    helpers.run_benchmark(paced, case, impl)
    assert 9 <= paced.rounds <= 13  # 0.25 s / 20 ms, from a call after the warm-up
    assert measure.cpu_rounds(0.01, 5, 0.25, 50) == 25
    assert measure.cpu_rounds(1.0, 5, 0.25, 50) == 5
    assert measure.cpu_rounds(0.001, 5, 0.25, None) == 5  # no cap given: repeats
    assert measure.cpu_rounds(0.0, 5, 0.25, 50) == 50 and measure.cpu_rounds(0.0, 5, 0.0, 50) == 5
    for bad in ((5, 0.25, 4), (0, 0.25, 50), (5, -1.0, 50), (5, float("nan"), 50)):
        with pytest.raises(ValueError):
            measure.cpu_rounds(0.01, *bad)


def test_iterations_get_the_warm_up_and_rounds_that_bench_run_gives_them(monkeypatch):
    # at the gpu scale bench.run warms an iteration up 3 times (cuDNN's autotuning, the
    # allocator); pytest-benchmark's rounds did 1, so its first rounds timed the warm-up
    import dataclasses

    from bench import cases

    helpers = _helpers_module(monkeypatch)
    monkeypatch.setattr(helpers, "SCALE", "smoke")
    smoke = cases.SCALE_CONFIGS["smoke"]
    monkeypatch.setitem(
        cases.SCALE_CONFIGS, "smoke", dataclasses.replace(smoke, iter_warmup=3, iter_repeats=4)
    )
    case = cases.grid("iteration", "smoke")[0]
    _, impl = cases.find("iteration", case.name, "dense@cpu", "smoke")
    rec = _Recorder()
    helpers.run_benchmark(rec, case, impl)
    assert (rec.rounds, rec.warmup_rounds) == (4, 3)


@pytest.mark.slow
def test_saved_benchmarks_name_their_case_group_and_shapes(tmp_path):
    # the parameters were Case and Impl objects, which pytest-benchmark saved as
    # "UNSERIALIZABLE[...]", every benchmark in one group (null), and no shape in extra_info
    out = tmp_path / "pb.json"
    env = {**os.environ, "PDTBENCH_BENCH_SMALL": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
         "bench/pytest_suite/test_kernels_bench.py", "-k", "test_csr and 37x13x3x3-s95",
         "--benchmark-only", "--benchmark-json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    saved = json.loads(out.read_text())["benchmarks"]
    assert len(saved) >= 3  # pattern_csr, torch's to_sparse_csr, the copy, scipy
    assert "UNSERIALIZABLE" not in json.dumps(saved)
    assert {b["group"] for b in saved} == {"csr/37x13x3x3-s95"}
    impls = {b["params"]["impl"] for b in saved}
    assert {"pattern_csr[ref]@cpu", "copy@cpu"} <= impls
    for b in saved:
        assert b["params"]["case"] == "37x13x3x3-s95"
        assert b["extra_info"]["case_params"]["weight_shape"] == [37, 13, 3, 3]
        assert b["extra_info"]["baseline"] == (b["params"]["impl"] != "pattern_csr[ref]@cpu")
        assert b["extra_info"]["rotated_mib"] > 0  # the span its operands rotate through
    (ours,) = (b for b in saved if b["params"]["impl"] == "pattern_csr[ref]@cpu")
    info = ours["extra_info"]  # what the gather's rows say of it too
    assert info["bytes_sectors"] > info["bytes"] and info["gbps_sectors"] > info["gbps"]
    assert info["rotated_index_mib"] > 0 and info["rotated_out_mib"] > 0
