"""Tests of bench.measure: CPU timing, phase timing, flag pinning, input rotation, OOM test."""

from __future__ import annotations

import time

import pytest
import torch

from bench import measure


def test_summarize_quantiles_and_median():
    t = measure.summarize([5.0, 1.0, 3.0, 2.0, 4.0], "perf_counter")
    assert (t.median_ms, t.min_ms, t.n) == (3.0, 1.0, 5)
    assert t.p20_ms == pytest.approx(1.8) and t.p80_ms == pytest.approx(4.2)
    assert measure.summarize([7.0], "x").p80_ms == 7.0
    with pytest.raises(ValueError):
        measure.summarize([], "x")


def test_cpu_timing_calls_with_increasing_indices():
    seen = []

    def fn(i):
        seen.append(i)
        time.sleep(0.002)

    t = measure.cpu_timing(fn, warmup=2, repeats=3)
    assert seen == [0, 1, 2, 3, 4]
    assert t.n == 3 and t.clock == "perf_counter"
    assert 1.5 <= t.median_ms < 200


@pytest.mark.parametrize(("warmup", "repeats"), [(0, 0), (-1, 3)], ids=["no-repeats", "neg"])
def test_cpu_timing_rejects_bad_counts(warmup, repeats):
    with pytest.raises(ValueError):
        measure.cpu_timing(lambda i: None, warmup=warmup, repeats=repeats)


def test_phase_timing_times_each_phase_apart():
    order = []

    def slow(i):
        order.append(("slow", i))
        time.sleep(0.004)

    def fast(i):
        order.append(("fast", i))

    out = measure.phase_timing([("slow", slow), ("fast", fast)], "cpu", warmup=1, repeats=2)
    assert set(out) == {"slow", "fast"}
    assert out["slow"].median_ms > out["fast"].median_ms
    assert order == [("slow", 0), ("fast", 0), ("slow", 1), ("fast", 1), ("slow", 2), ("fast", 2)]


def test_pinned_flags_set_and_restore():
    before = measure.flags()
    with measure.pinned_flags(tf32_matmul=True, tf32_cudnn=False, cudnn_benchmark=True) as f:
        assert f == {"tf32_matmul": True, "tf32_cudnn": False, "cudnn_benchmark": True}
        assert torch.backends.cuda.matmul.allow_tf32 is True
        assert torch.backends.cudnn.benchmark is True
    assert measure.flags() == before


def test_pinned_flags_restore_after_an_error():
    before = measure.flags()
    with pytest.raises(RuntimeError), measure.pinned_flags(tf32_matmul=not before["tf32_matmul"]):
        raise RuntimeError("boom")
    assert measure.flags() == before


@pytest.mark.parametrize(
    ("nbytes", "device", "expected"),
    [
        (2**30, "cpu", 1),
        (2**20, "cpu", 8),
        (48 * 2**20, "cpu", 2),
        (100 * 2**20, "cuda", 2),
        (7, "cuda", 8),
        (0, "cpu", 1),
    ],
    ids=["big", "small-capped", "cpu-two", "cuda-two", "tiny", "zero"],
)
def test_rotation_sets(nbytes, device, expected):
    assert measure.rotation_sets(nbytes, device) == expected


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (torch.cuda.OutOfMemoryError("CUDA out of memory"), True),
        (MemoryError(), True),
        (RuntimeError("CUDA error: out of memory"), True),
        (RuntimeError("shape mismatch"), False),
        (ValueError("out of memory"), False),
    ],
    ids=["torch-oom", "memoryerror", "runtime-oom", "runtime-other", "valueerror"],
)
def test_is_out_of_memory(exc, expected):
    assert measure.is_out_of_memory(exc) is expected


@pytest.mark.gpu
def test_cuda_timing_on_a_gpu():
    x = torch.randn(1024, 1024, device="cuda")
    t = measure.cuda_timing(lambda i: x @ x, warmup_ms=2, rep_ms=5)
    assert t.clock == "cuda-events" and t.n >= 5 and t.median_ms > 0
