"""The run's training peak survives resets of torch's counter made between epochs."""

from __future__ import annotations

import pytest
import torch

from impl.memory import TrainingPeak


class FakeCounter:
    """A device peak counter: ``alloc`` raises it, ``reset`` drops it to what is held now."""

    def __init__(self) -> None:
        self.held = 0
        self.peak = 0
        self.resets = 0

    def alloc(self, n: int) -> None:
        self.held += n
        self.peak = max(self.peak, self.held)

    def free(self, n: int) -> None:
        self.held -= n

    def reset(self, device: torch.device) -> None:
        assert device.type == "cuda"
        self.peak = self.held
        self.resets += 1

    def read(self, device: torch.device) -> int:
        return self.peak


def _tracked(carried: int = 0) -> tuple[TrainingPeak, FakeCounter]:
    c = FakeCounter()
    return TrainingPeak(torch.device("cuda", 0), carried, reset=c.reset, read=c.read), c


def test_a_probe_that_resets_the_counter_between_epochs_does_not_hide_an_earlier_peak():
    peak, c = _tracked()
    c.alloc(100)  # resident weights
    peak.open()
    c.alloc(900)  # epoch 0's activations at its largest
    c.free(900)
    assert peak.close() == 1000
    c.reset(peak.device)  # a batch-size probe resets the counter ...
    c.alloc(5000)  # ... and allocates a copy of the model and a larger batch
    c.free(5000)
    peak.open()
    c.alloc(300)  # a smaller epoch after reconfiguration
    c.free(300)
    assert peak.close() == 400
    assert peak.bytes == 1000  # neither the probe's 5100 nor the last epoch's 400
    assert peak.mib == pytest.approx(1000 / 2**20)


def test_a_resumed_run_keeps_the_peak_its_checkpoint_carried():
    peak, c = _tracked(carried=7 * 2**20)
    peak.open()
    c.alloc(2**20)
    peak.close()
    assert peak.mib == pytest.approx(7.0)


def test_each_window_starts_from_what_is_held_when_it_opens():
    peak, c = _tracked()
    c.alloc(2000)
    c.free(1500)  # an earlier peak of 2000, before any window
    peak.open()
    assert c.resets == 1
    c.alloc(10)
    assert peak.close() == 510
    assert peak.bytes == 510


def test_closing_a_window_never_opened_is_an_error():
    peak, _ = _tracked()
    with pytest.raises(RuntimeError, match="without a matching open"):
        peak.close()
    peak.open()
    peak.close()
    with pytest.raises(RuntimeError, match="without a matching open"):
        peak.close()  # one open, one close


@pytest.mark.parametrize("device", ["meta", "mps"])
def test_only_a_cuda_device_has_a_peak_to_read(device):
    def fail(device):
        raise AssertionError("the CUDA counter must not be touched off CUDA")

    peak = TrainingPeak(torch.device(device), reset=fail, read=fail)
    peak.open()
    assert not peak.active and peak.close() is None and peak.mib is None


def test_off_cuda_nothing_is_read_and_the_peak_is_none():
    def fail(device):
        raise AssertionError("the counter must not be touched on the CPU")

    peak = TrainingPeak(torch.device("cpu"), reset=fail, read=fail)
    peak.open()
    assert peak.close() is None
    assert peak.mib is None


def test_a_negative_carried_peak_is_refused():
    with pytest.raises(ValueError, match=">= 0 bytes"):
        TrainingPeak(torch.device("cuda"), -1)
