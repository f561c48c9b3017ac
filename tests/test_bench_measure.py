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
    with pytest.raises(ValueError):
        measure.phase_timing([("op", lambda i: None)], "cpu", warmup=warmup, repeats=repeats)


def test_the_fewest_counts_are_accepted():
    """One timed call and no warm-up is a valid (if noisy) timing, for every timer."""
    seen = []
    assert measure.cpu_timing(seen.append, warmup=0, repeats=1).n == 1
    assert measure.phase_timing([("op", seen.append)], "cpu", warmup=0, repeats=1)["op"].n == 1
    assert seen == [0, 0]


def test_synchronize_waits_only_on_a_cuda_device(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    measure.synchronize("cpu")
    assert waited == []
    measure.synchronize("cuda:0")
    assert waited == ["cuda:0"]


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
    assert 3.5 <= out["slow"].median_ms < 1000  # milliseconds of one call, not a clock reading
    assert order == [("slow", 0), ("fast", 0), ("slow", 1), ("fast", 1), ("slow", 2), ("fast", 2)]
    order.clear()
    measure.phase_timing(
        [("fast", fast)], "cpu", warmup=2, repeats=2, after_warmup=lambda: order.append("reset")
    )
    assert order == [("fast", 0), ("fast", 1), "reset", ("fast", 2), ("fast", 3)]


def test_pinned_flags_set_and_restore():
    before = measure.flags()
    with measure.pinned_flags(tf32_matmul=True, tf32_cudnn=False, cudnn_benchmark=True) as f:
        assert f == {"tf32_matmul": True, "tf32_cudnn": False, "cudnn_benchmark": True}
        assert torch.backends.cuda.matmul.allow_tf32 is True
        assert torch.backends.cudnn.benchmark is True
    assert measure.flags() == before


def test_flags_read_tf32_set_through_torchs_per_backend_precision():
    """After ``fp32_precision`` is set, reading ``allow_tf32`` raises (torch refuses a mix of
    its two ways); the flags, and every result's environment, read the newer setting."""
    from impl.env import tf32_enabled

    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        assert tf32_enabled() == (True, False)
        assert measure.flags()["tf32_matmul"] is True and measure.flags()["tf32_cudnn"] is False
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        assert tf32_enabled()[0] is False
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def _set_flags(tf32_matmul: bool, tf32_cudnn: bool, cudnn_benchmark: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = tf32_matmul
    torch.backends.cudnn.allow_tf32 = tf32_cudnn
    torch.backends.cudnn.benchmark = cudnn_benchmark


def test_pinned_flags_restore_each_flag_to_its_own_value():
    # Start from three values no two of which agree by chance, so that a flag restored from
    # another's saved value is seen. The flags are saved and set by hand: torch's matmul
    # module serves allow_tf32 through __setattr__, which pytest's monkeypatch (9.2) cannot
    # undo.
    saved = measure.flags()
    try:
        for on in (True, False):
            _set_flags(on, not on, on)
            before = measure.flags()
            assert before == {"tf32_matmul": on, "tf32_cudnn": not on, "cudnn_benchmark": on}
            with measure.pinned_flags(not on, on, not on):
                assert measure.flags() == {k: not v for k, v in before.items()}
            assert measure.flags() == before
    finally:
        _set_flags(saved["tf32_matmul"], saved["tf32_cudnn"], saved["cudnn_benchmark"])
    assert measure.flags() == saved


def test_pinned_flags_restore_after_an_error():
    before = measure.flags()
    with pytest.raises(RuntimeError), measure.pinned_flags(tf32_matmul=not before["tf32_matmul"]):
        raise RuntimeError("boom")
    assert measure.flags() == before


@pytest.mark.parametrize(
    ("nbytes", "device", "expected"),
    [
        (2**30, "cpu", 1),
        (2**20, "cpu", 64),
        (48 * 2**20, "cpu", 2),
        (100 * 2**20, "cuda", 2),
        (7, "cuda", 4096),
        (1152 * 256 * 4, "cuda", 114),
        (1152 * 256 * 4 * 0.05, "cuda", 2276),  # the paper filter's 95%-sparse values
        (128 * 64 * 4, "cuda", 4096),  # a 128 x 64 1x1 filter: 128 MiB exactly
        (7, "cpu", 64),
        (0, "cpu", 1),
    ],
    ids=[
        "big",
        "small-capped",
        "cpu-two",
        "cuda-two",
        "tiny",
        "paper-filter",
        "paper-values",
        "pointwise-filter",
        "cpu-tiny",
        "zero",
    ],  # fmt: skip
)
def test_rotation_sets(nbytes, device, expected):
    assert measure.rotation_sets(nbytes, device) == expected


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (torch.cuda.OutOfMemoryError("CUDA out of memory"), True),
        (MemoryError(), True),
        (RuntimeError("CUDA error: out of memory"), True),
        (RuntimeError("CUDA_ERROR_OUT_OF_MEMORY: cuMemAlloc failed"), True),  # CuPy, driver
        (RuntimeError("shape mismatch"), False),
        (ValueError("out of memory"), False),
    ],
    ids=["torch-oom", "memoryerror", "runtime-oom", "driver-oom", "runtime-other", "valueerror"],
)
def test_is_out_of_memory(exc, expected):
    assert measure.is_out_of_memory(exc) is expected


@pytest.mark.gpu
def test_cuda_timing_on_a_gpu():
    x = torch.randn(1024, 1024, device="cuda")
    t = measure.cuda_timing(lambda i: x @ x, warmup_ms=2, rep_ms=5)
    assert t.clock == "cuda-events" and t.n >= 5 and t.median_ms > 0


# -- host-bound GPU timings ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event_ms", "issue_ms", "amortized_ms", "expected"),
    [
        (0.003, None, None, True),  # a 3-us gather: under 20 us, whatever the host does
        (0.019, None, None, True),
        (0.021, None, None, False),  # just over 20 us, nothing measured back to back
        (0.060, 0.050, 0.055, False),  # the host issues a call faster than the GPU runs it
        (0.060, 0.070, 0.055, True),  # the host needs longer to issue a call than the GPU
        (1.000, 0.050, 0.400, True),  # back-to-back calls 2.5x faster than one alone
        (1.000, 0.050, 0.700, False),  # 1.43x: within the ratio
        (1.000, 0.050, 0.0, False),  # no usable back-to-back time: only the 20-us rule
        (0.020, None, None, False),  # exactly 20 us is not under 20 us
        (0.060, 0.055, 0.055, True),  # issuing takes as long as running: the GPU may wait
        (0.750, 0.050, 0.500, False),  # exactly 1.5x is within the ratio
        (0.800, 0.050, 0.500, True),  # 1.6x: past the ratio
    ],
    ids=["3us", "19us", "21us", "host-ahead", "host-behind", "amortized-fast",
         "amortized-near", "no-amortized", "20us-exact", "issue-equal", "ratio-exact",
         "ratio-past"],
)  # fmt: skip
def test_host_bound_flags_timings_that_may_be_host_time(event_ms, issue_ms, amortized_ms, expected):
    assert measure.host_bound(event_ms, issue_ms, amortized_ms) is expected


class _FakeEvent:
    """A CUDA event stand-in on the CPU clock (what a host-bound GPU timing reduces to)."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


@pytest.fixture
def host_clock_cuda(monkeypatch) -> list[int]:
    """torch.cuda's events, synchronisation and sleep kernel on the host clock; returns the
    list of sleep lengths (cycles) requested."""
    slept: list[int] = []
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "_sleep", slept.append, raising=False)
    return slept


def test_cuda_timing_skips_the_back_to_back_batch_for_a_long_call(host_clock_cuda, monkeypatch):
    """A call estimated above AMORTIZE_MAX_MS is timed without the amortised batch: the
    host's launch overhead cannot be what its timing measures."""
    monkeypatch.setattr(measure, "AMORTIZE_MAX_MS", 0.1)  # a 0.5-ms call is long here
    calls = []

    def fn(i):
        calls.append(i)
        time.sleep(0.0005)

    t = measure.cuda_timing(fn, warmup_ms=1, rep_ms=5, min_reps=3, amortize=4)
    assert t.n >= 3 and t.host_ms is not None
    assert t.amortized_ms is None and t.issue_ms is None and not t.host_bound
    assert host_clock_cuda == []  # no sleep kernel queued for a batch
    # 1 untimed and 3 estimate calls, at most 2 warm-up calls (1 ms of >= 0.5-ms calls), the
    # timed ones; a batch would add min(4, n) >= 3 more
    assert len(calls) <= 1 + 3 + 2 + t.n


def test_cuda_timing_keeps_a_slow_first_call_out_of_its_estimate(host_clock_cuda):
    # A first call that does one-time work (here 60 ms, as an autotuning search) must not set
    # the number of timed calls: 10 ms of 0.5-ms calls is about 20 (10 at 1 ms on a loaded
    # machine, 5 where a sleep there oversleeps to 2 ms), not the minimum of 3 that an
    # estimate of (60 + 0.5 + 0.5) / 3 ms would give.
    calls = []

    def fn(i):
        calls.append(i)
        time.sleep(0.06 if i == 0 else 0.0005)

    t = measure.cuda_timing(fn, warmup_ms=1, rep_ms=10, min_reps=3, amortize=0)
    assert calls[0] == 0 and t.n > 3
    assert t.median_ms < 30  # the slow call is not among the timed ones


def test_cuda_timing_records_host_and_amortized_time(host_clock_cuda, monkeypatch):
    slept = host_clock_cuda
    calls = []
    # a 0.5-ms sleep is a short call, also on a loaded machine where it oversleeps past 1 ms
    monkeypatch.setattr(measure, "AMORTIZE_MAX_MS", 50.0)

    def fn(i):
        calls.append(i)
        time.sleep(0.0005)

    t = measure.cuda_timing(fn, warmup_ms=1, rep_ms=5, min_reps=3, amortize=4)
    assert t.clock == "cuda-events" and t.n >= 3
    assert calls == list(range(len(calls)))  # indices keep rotating through the inputs
    assert len(calls) > 3 + t.n + 4  # estimate, warm-up, timed and amortised calls
    assert t.host_ms is not None and t.host_ms >= 0.4
    assert t.amortized_ms is not None and t.amortized_ms >= 0.4
    assert t.issue_ms is not None and t.issue_ms >= 0.4
    # per call, not per batch: each measures about one 0.5-ms call
    assert t.amortized_ms < 8 * t.host_ms and t.issue_ms < 8 * t.host_ms
    # the GPU sleeps 1.5x the host's time to queue the batch: amortize=4 calls, or as many as
    # were timed where fewer were (a loaded machine's slower estimate leaves min_reps=3)
    batch = min(4, t.n)
    assert len(slept) == 1 and slept[0] >= int(1.5 * batch * t.host_ms * 2_000_000) - 1
    assert t.host_bound is True  # fake events run on the host: issuing takes the call's time
    assert measure.Timing(**t.to_dict()) == t


def test_cuda_timing_without_a_sleep_kernel_skips_the_amortized_batch(host_clock_cuda, monkeypatch):
    monkeypatch.delattr(torch.cuda, "_sleep")
    t = measure.cuda_timing(lambda i: None, warmup_ms=0.1, rep_ms=0.5, min_reps=2, max_reps=7)
    assert t.amortized_ms is None and t.host_bound is True and 2 <= t.n <= 7
    with pytest.raises(ValueError, match="amortize"):
        measure.cuda_timing(lambda i: None, amortize=-1)
    for min_reps, max_reps in [(0, 5), (4, 3)]:
        with pytest.raises(ValueError, match="min_reps"):
            measure.cuda_timing(lambda i: None, min_reps=min_reps, max_reps=max_reps)


def test_cuda_timing_edge_counts_are_accepted(host_clock_cuda):
    """One timed call; no batch at amortize=0; a batch of one at amortize=1."""
    slept = host_clock_cuda
    t = measure.cuda_timing(lambda i: None, rep_ms=0.0, min_reps=1, max_reps=1, amortize=0)
    assert t.n == 1 and t.amortized_ms is None and slept == []
    t = measure.cuda_timing(lambda i: None, rep_ms=0.0, min_reps=1, max_reps=1, amortize=1)
    assert t.amortized_ms is not None and len(slept) == 1


def test_cuda_timing_skips_the_batch_for_calls_over_a_millisecond(host_clock_cuda):
    slept = host_clock_cuda
    t = measure.cuda_timing(lambda i: time.sleep(0.0015), warmup_ms=1, rep_ms=5, min_reps=2)
    assert slept == [] and t.amortized_ms is None and t.issue_ms is None
    assert t.host_bound is False  # over 20 us, and nothing to compare against


def test_cpu_timing_is_unchanged_by_the_gpu_fields():
    t = measure.cpu_timing(lambda i: None, warmup=0, repeats=2)
    assert (t.host_ms, t.amortized_ms, t.host_bound) == (None, None, None)


def test_fill_row_adds_host_columns_only_for_gpu_timings():
    from bench import cases

    case, impl = cases.find("calibration", "gemm-256", "torch_mm@cpu", "smoke")
    prepared = cases.Prepared([("op", lambda i: None)], torch.device("cpu"), flops=1.0)
    cpu = measure.summarize([1.0, 2.0], "perf_counter")
    row = cases.fill_row({}, prepared, {"op": cpu}, impl)
    assert "host_bound" not in row and "amortized_ms" not in row
    gpu = measure.Timing(0.003, 0.003, 0.004, 0.002, 50, "cuda-events", 0.05, 0.002, True, 0.01)
    row = cases.fill_row({}, prepared, {"op": gpu}, impl)
    assert (row["host_bound"], row["host_ms"], row["amortized_ms"]) == (True, 0.05, 0.002)
    assert row["issue_ms"] == 0.01


# -- the kernel loader's launch-path caches ------------------------------------------------------


class _FakeModule:
    def __init__(self):
        self.lookups = []

    def get_function(self, name):
        self.lookups.append(name)
        return f"kernel:{name}"


def test_loader_looks_up_each_kernel_function_once(monkeypatch):
    import contextlib
    import sys
    import types

    from impl.cuda import loader

    loader.clear_caches()
    module = _FakeModule()
    devices = []  # the device each lookup ran under: CuPy loads onto the current one

    def device(index):
        devices.append(index)
        return contextlib.nullcontext()

    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=device))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setattr(loader, "_environment_error", lambda: None)
    monkeypatch.setitem(loader._loaded, ("pattern.cu", 0), module)
    try:
        for _ in range(5):
            assert loader.get_function("pattern.cu", "pdt_csr_gather_f32", 0) == (
                "kernel:pdt_csr_gather_f32"
            )
        loader.get_function("pattern.cu", "pdt_csr_scatter_f32", 0)
        assert module.lookups == ["pdt_csr_gather_f32", "pdt_csr_scatter_f32"]
        assert devices == [0, 0]
    finally:
        loader.clear_caches()
    assert loader._functions == {} and loader._loaded == {}


def test_loader_wraps_torchs_current_stream_afresh_each_time(monkeypatch):
    # A CuPy stream wrapper keeps state while entered: one shared wrapper entered twice at
    # once (nested launches) would restore the wrong stream, so each call makes its own.
    import sys
    import types

    from impl.cuda import loader

    made = []
    fake_cupy = types.ModuleType("cupy")
    fake_cupy.cuda = types.SimpleNamespace(
        ExternalStream=lambda handle, index: made.append((handle, index)) or object()
    )
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    handles = iter([111, 111, 222])
    monkeypatch.setattr(
        torch.cuda,
        "current_stream",
        lambda index=None: types.SimpleNamespace(cuda_stream=next(handles)),
    )
    first, second = loader.torch_stream(0), loader.torch_stream(0)
    loader.torch_stream(0)
    assert first is not second and made == [(111, 0), (111, 0), (222, 0)]


def test_cpu_timing_adds_calls_until_the_minimum_time_within_the_cap():
    seen = []

    def fn(i):
        seen.append(i)
        time.sleep(0.01)

    t = measure.cpu_timing(fn, warmup=1, repeats=2, min_time_s=0.05, max_repeats=40)
    assert 5 <= t.n <= 7 and seen == list(range(t.n + 1))  # ~10 ms each: 5 reach 50 ms
    seen.clear()
    capped = measure.cpu_timing(fn, warmup=0, repeats=2, min_time_s=10.0, max_repeats=4)
    assert capped.n == 4 and seen == [0, 1, 2, 3]
    assert measure.cpu_timing(fn, warmup=0, repeats=3, min_time_s=10.0).n == 3  # no cap: none
    for bad in ({"max_repeats": 1}, {"min_time_s": -1.0}, {"min_time_s": float("nan")}):
        with pytest.raises(ValueError):
            measure.cpu_timing(fn, warmup=0, repeats=2, **bad)


def test_a_fast_kernel_at_cpu_scale_is_timed_for_a_quarter_second_and_once_at_smoke():
    import torch

    from bench import cases

    def prepared(calls):
        return cases.Prepared([("op", calls.append)], torch.device("cpu"))

    at_cpu, at_smoke = [], []
    fast = cases.measure_prepared(prepared(at_cpu), "cpu")["op"]  # ~1 us a call
    assert fast.n == 50 and len(at_cpu) == 51  # the cap (one warm-up call untimed)
    assert cases.measure_prepared(prepared(at_smoke), "smoke")["op"].n == 3  # CI: no minimum


def test_summarize_takes_the_median_of_skewed_times():
    assert measure.summarize([1.0, 1.0, 1.0, 1.0, 100.0], "x").median_ms == 1.0


def test_cpu_rounds_reach_the_minimum_time():
    # 0.25 s at 30 ms a call needs 9 calls (8.33 rounded up), not 8
    assert measure.cpu_rounds(0.03, 5, 0.25, 50) * 0.03 >= 0.25


def test_cuda_timing_counts_one_warm_up_call_at_least_and_no_batch_over_the_timed_calls(
    host_clock_cuda, monkeypatch
):
    """1 untimed call, 3 for the estimate, at least 1 warm-up even at warmup_ms=0, the timed
    calls, and a back-to-back batch of min(amortize, timed calls): 1 + 3 + 1 + 2 + 2."""
    monkeypatch.setattr(measure, "AMORTIZE_MAX_MS", 1e9)  # every call counts as short
    calls = []
    t = measure.cuda_timing(calls.append, warmup_ms=0.0, rep_ms=0.0, min_reps=2, max_reps=2,
                            amortize=20)  # fmt: skip
    assert t.n == 2 and t.amortized_ms is not None
    assert len(calls) == 1 + 3 + 1 + 2 + 2


def test_rotated_is_capped_by_count_and_its_span_is_in_mib():
    made = []

    def make(j):
        made.append(j)
        return torch.zeros(4)  # 16 bytes: the rotation wants many sets of it

    assert measure.rotation_sets(16, "cpu") > 3
    assert len(measure.rotated(make, count=3)) == 3 and made == [0, 1, 2]
    assert len(measure.rotated(make)) == measure.rotation_sets(16, "cpu")
    # a cap, not a count: never more sets than the rotation needs
    big = measure.rotation_sets(4 * 2**22, "cpu")
    assert len(measure.rotated(lambda j: torch.zeros(2**22), count=big + 5)) == big
    assert measure.rotated_mib(2**20, 3) == 3.0  # MiB, not MB (3 * 1.048576)
    assert measure.rotated_mib(1_000_000, 1) == 0.95


def test_cpu_rounds_of_an_unknown_call_time():
    """A call time of 0 (unmeasurable): as many rounds as allowed where a minimum time is
    asked (nothing says the minimum is reached sooner), else the plain repeats."""
    assert measure.cpu_rounds(0.0, 5, 0.25, 50) == 50
    assert measure.cpu_rounds(0.0, 5, 0.0, 50) == 5


class _TwoClockGpu:
    """A GPU stand-in whose calls take ``host_s`` seconds of the host's clock
    (``time.perf_counter``) and ``device_ms`` of the device's, the clock CUDA events read.
    Both steps are powers of two, so that every sum of them is exact."""

    def __init__(self, host_s: float, device_ms: float) -> None:
        self.host_s, self.device_ms = host_s, device_ms
        self.host = self.device = 0.0
        self.calls: list[int] = []
        gpu = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = gpu.device

            def elapsed_time(self, end):
                return end.t - self.t

        self.Event = Event

    def __call__(self, i: int) -> None:
        self.calls.append(i)
        self.host += self.host_s
        self.device += self.device_ms


@pytest.fixture
def two_clock_gpu(host_clock_cuda, monkeypatch):
    """:func:`host_clock_cuda` with a :class:`_TwoClockGpu`'s events and host clock in place of
    the host's: returns the installer and the list of sleep lengths (cycles) requested."""

    def install(host_s: float, device_ms: float) -> _TwoClockGpu:
        gpu = _TwoClockGpu(host_s, device_ms)
        monkeypatch.setattr(torch.cuda, "Event", gpu.Event)
        monkeypatch.setattr(time, "perf_counter", lambda: gpu.host)
        return gpu

    return install, host_clock_cuda


@pytest.mark.parametrize(
    ("host_s", "host_bound"),
    [(2**-14, True), (2**-16, False)],
    ids=["host-slower", "host-faster"],
)
def test_cuda_timing_counts_and_per_call_figures_on_exact_clocks(two_clock_gpu, host_s, host_bound):
    """Each call takes 1/32 ms of device time: the estimate is 1/32 ms, so 0.25 ms of warm-up
    is 8 calls and 0.5 ms of timing 16; the batch is amortize=4 calls. host_ms, issue_ms and
    amortized_ms are per call; the sleep kernel lasts 1.5x the host's time to queue the batch
    plus 0.1 ms, at 2e6 cycles a ms; host-bound where issuing a call takes at least as long
    as running it (here 0.061 ms against 0.031 ms), not where the host is faster (0.015 ms)."""
    install, slept = two_clock_gpu
    gpu = install(host_s, 2**-5)
    t = measure.cuda_timing(gpu, warmup_ms=0.25, rep_ms=0.5, min_reps=5, amortize=4)
    assert gpu.calls == list(range(1 + 3 + 8 + 16 + 4))
    assert (t.n, t.median_ms, t.min_ms, t.p20_ms, t.p80_ms) == (16, 2**-5, 2**-5, 2**-5, 2**-5)
    host_ms = host_s * 1e3  # 0.061 ms or 0.015 ms
    assert t.host_ms == pytest.approx(host_ms) and t.issue_ms == pytest.approx(host_ms)
    assert t.amortized_ms == 2**-5
    assert slept == [pytest.approx(int((1.5 * 4 * host_ms + 0.1) * 2e6), abs=1)]
    assert t.host_bound is host_bound


def test_cuda_timing_batches_a_call_of_exactly_the_amortize_limit(two_clock_gpu, monkeypatch):
    """A call estimated at AMORTIZE_MAX_MS ("at most") gets the back-to-back batch; one
    estimated just above it does not."""
    install, slept = two_clock_gpu
    monkeypatch.setattr(measure, "AMORTIZE_MAX_MS", 2**-5)
    t = measure.cuda_timing(install(2**-14, 2**-5), warmup_ms=0.0, rep_ms=0.0, min_reps=2)
    assert t.amortized_ms == 2**-5 and len(slept) == 1
    monkeypatch.setattr(measure, "AMORTIZE_MAX_MS", 2**-5 - 2**-20)
    t = measure.cuda_timing(install(2**-14, 2**-5), warmup_ms=0.0, rep_ms=0.0, min_reps=2)
    assert t.amortized_ms is None and len(slept) == 1


def test_the_sleep_kernel_is_sized_at_two_million_cycles_a_ms_up_to_50_ms(host_clock_cuda):
    """2 GHz: 0.5 ms is 1e6 cycles; a longer sleep than 50 ms is cut to 50 ms (1e8 cycles)."""
    assert measure._sleep_kernel(0.5) is True and measure._sleep_kernel(200.0) is True
    assert host_clock_cuda == [1_000_000, 100_000_000]
