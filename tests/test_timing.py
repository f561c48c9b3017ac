"""Per-phase timing of training iterations (impl.timing.PhaseTimer)."""

from __future__ import annotations

import math
import time

import pytest
import torch

from impl.timing import PhaseTimer


def test_cpu_phases_are_timed_apart_in_milliseconds():
    timer = PhaseTimer(torch.device("cpu"))
    for _ in range(3):
        timer.start("fwd")
        time.sleep(0.02)
        timer.stop("fwd")
        timer.start("bwd")
        timer.stop("bwd")
    fwd, bwd = timer.times("fwd"), timer.times("bwd")
    assert len(fwd) == 3 and len(bwd) == 3
    assert all(t >= 19.0 for t in fwd)  # slept 20 ms: milliseconds, not seconds
    assert all(t >= 0.0 for t in bwd) and min(bwd) < 19.0  # apart from fwd (min: robust to load)
    assert timer.median("fwd") == sorted(fwd)[1]


def test_median_of_an_unrecorded_phase_is_nan_and_reset_forgets():
    timer = PhaseTimer(torch.device("cpu"))
    assert math.isnan(timer.median("fwd"))
    timer.start("fwd")
    timer.stop("fwd")
    assert len(timer.times("fwd")) == 1
    timer.reset()
    assert timer.times("fwd") == [] and math.isnan(timer.median("fwd"))
    timer.start("bwd")  # a phase open at the reset is forgotten too: its time would span it
    timer.reset()
    with pytest.raises(ValueError, match="'bwd' was not started"):
        timer.stop("bwd")


def test_stop_without_start_names_the_phase_and_a_device_may_be_a_string():
    with pytest.raises(ValueError, match=r"phase 'fwd' was not started \(call start\('fwd'\)"):
        PhaseTimer(torch.device("cpu")).stop("fwd")
    timer = PhaseTimer("cpu")
    timer.start("fwd")
    timer.stop("fwd")
    assert len(timer.times("fwd")) == 1 and not timer.cuda


@pytest.mark.gpu
def test_cuda_phases_are_timed_by_events():
    timer = PhaseTimer(torch.device("cuda"))
    a = torch.randn(2048, 2048, device="cuda")
    for _ in range(2):
        timer.start("mm")
        for _ in range(10):
            a = a @ a / 2048
        timer.stop("mm")
    times = timer.times("mm")  # one synchronisation, then the events are read
    assert len(times) == 2 and all(t > 0 for t in times)
    assert timer.times("mm") == times  # read once, kept


def test_cpu_durations_are_the_clocks_seconds_times_1000(monkeypatch):
    """A phase's duration is exactly the clock's difference in ms (a fake clock, so that no
    load can blur a wrong factor); a phase stopped twice raises; the list handed out is a copy."""
    ticks = iter([10.0, 10.25, 20.0, 20.5])
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks))
    timer = PhaseTimer("cpu")
    timer.start("fwd")
    timer.stop("fwd")
    with pytest.raises(ValueError, match="'fwd' was not started"):
        timer.stop("fwd")  # one start, one duration
    timer.start("fwd")
    timer.stop("fwd")
    assert timer.times("fwd") == [250.0, 500.0]
    timer.times("fwd").append(1e9)  # a caller's change to the copy
    assert timer.times("fwd") == [250.0, 500.0] and timer.median("fwd") == 375.0


@pytest.fixture
def fake_cuda_events(monkeypatch) -> tuple[list, list]:
    """torch.cuda's events, streams and synchronisation on any machine: the n-th event made
    stands at 10 * n ms. Returns the streams events were recorded on and the devices
    synchronised."""
    recorded, synced = [], []

    class FakeEvent:
        made = 0

        def __init__(self, enable_timing: bool = False) -> None:
            FakeEvent.made += 1
            self.at = float(FakeEvent.made)

        def record(self, stream=None) -> None:
            recorded.append(stream)

        def elapsed_time(self, end: FakeEvent) -> float:
            return 10.0 * (end.at - self.at)

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"stream of {device}")
    return recorded, synced


def test_cuda_event_times_are_read_once_and_kept(fake_cuda_events):
    """On CUDA each phase's pair of events is read at the first ``times`` and kept: a second
    call returns the same durations, not them counted again (fake events on any machine).
    The events go on the timer's GPU's stream and its synchronisation waits for that GPU,
    whatever the current GPU is (they were the current GPU's)."""
    recorded, synced = fake_cuda_events
    timer = PhaseTimer("cuda:3")
    assert timer.cuda
    for _ in range(2):
        timer.start("mm")
        timer.stop("mm")
    assert timer.times("mm") == [10.0, 10.0]
    assert timer.times("mm") == [10.0, 10.0] and timer.median("mm") == 10.0
    timer.start("mm")
    timer.stop("mm")
    assert timer.times("mm") == [10.0, 10.0, 10.0]  # a later event added once
    assert set(recorded) == {"stream of cuda:3"} and len(recorded) == 6
    assert synced == [torch.device("cuda:3")] * 2


def test_a_device_other_than_cuda_is_timed_by_the_clock(monkeypatch):
    """Only a CUDA device is timed by events; any other (here ``meta``) reads the host clock."""
    ticks = iter([1.0, 1.125])
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks))
    timer = PhaseTimer("meta")
    assert not timer.cuda
    timer.start("fwd")
    timer.stop("fwd")
    assert timer.times("fwd") == [125.0]


def test_reset_forgets_cuda_events_not_yet_read(fake_cuda_events):
    """Events recorded on CUDA and not read yet are forgotten by ``reset`` like read times:
    the next ``times`` holds only what was recorded after it (fake events on any machine)."""
    timer = PhaseTimer("cuda")
    timer.start("mm")
    timer.stop("mm")
    timer.reset()
    assert timer.times("mm") == []
    timer.start("mm")
    timer.stop("mm")
    assert timer.times("mm") == [10.0]


def test_synchronize_waits_for_a_gpu_and_not_for_the_cpu(monkeypatch):
    from impl.timing import synchronize

    waited: list[object] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    synchronize("cpu")
    assert waited == []
    synchronize("cuda:1")
    assert waited == [torch.device("cuda", 1)]
