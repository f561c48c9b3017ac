"""Memory and time of one training iteration, and PruneTrain's dynamic mini-batch rule.

Lym et al., SC 2019, Sec. 4.3 and Sec. 5.3 (Fig. 9): after each reconfiguration the
mini-batch grows in steps of 32 samples while one training iteration still fits the memory
budget, and the learning rate grows by the same ratio (the Trainer rescales it when a method
sets ``ctx.batch_size``). For CIFAR the paper keeps "similar device memory capacity
utilization" as at the start (128 -> 320 over training, Fig. 9b); for ImageNet the budget is
the device's capacity (Fig. 9a). Both are :func:`choose_batch` with a different budget.

Two ways to know the memory of an iteration at batch ``B``:

* analytic (any device): ``3 * parameter bytes`` (weights, gradients, SGD momentum) plus
  ``B *`` the bytes autograd saves for backward per sample, counted exactly by running
  batches of 2 and 3 under ``torch.autograd.graph.saved_tensors_hooks`` (distinct storages,
  parameters excluded). Workspace and transient gradients are not in it.
* measured (CUDA): the peak allocated bytes of one forward + backward on a copy of the model,
  plus resident weights and momentum.

:func:`probe_iteration_ms` times one forward and one backward of the current model as the
minimum over repetitions: on a shared CPU, where other processes inflate per-epoch medians,
the minimum is the figure least disturbed by them.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from impl.distributed import unsync_batchnorm

T = TypeVar("T")


def _param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _num_outputs(model: nn.Module, x: torch.Tensor) -> int:
    with torch.no_grad():
        was = model.training
        model.eval()
        n = model(x[:1]).shape[1]
        model.train(was)
    return int(n)


def _saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if ptr not in params and ptr != 0:
            storages[ptr] = max(storages.get(ptr, 0), s.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
        y = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        F.cross_entropy(out.float(), y)
    return sum(storages.values())


def _probe_copy(model: nn.Module) -> nn.Module:
    """A training-mode copy of ``model`` with plain BatchNorm: under ``--nproc`` the model's
    BatchNorm takes global statistics (:func:`impl.distributed.sync_batchnorm`), whose
    collectives and saved tensors a copy would keep; the probes measure the model itself,
    the same before and after the job wraps it (the budget is read before, the later figures
    after)."""
    probe = copy.deepcopy(model).train()
    unsync_batchnorm(probe)
    return probe


def activation_bytes_per_sample(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Bytes autograd keeps for backward per training sample (the analytic estimate above).

    Runs on a copy of ``model`` in training mode (the model's BatchNorm statistics are not
    touched), on the model's device and dtype, with zero inputs of shape ``(B, *input_shape)``
    for B = 2 and 3 (not 1: BatchNorm in training mode refuses one value per channel, as a
    1x1 feature map of one sample gives); the difference is the per-sample cost.
    """
    probe = _probe_copy(model)
    p = next(probe.parameters())
    x2 = torch.zeros((2, *input_shape), device=p.device, dtype=p.dtype)
    x3 = torch.zeros((3, *input_shape), device=p.device, dtype=p.dtype)
    return max(_saved_bytes(probe, x3) - _saved_bytes(probe, x2), 0)


def estimate_iteration_bytes(model: nn.Module, input_shape: tuple[int, ...], batch: int) -> int:
    """Analytic memory of one SGD-with-momentum iteration at ``batch``, in bytes."""
    return 3 * _param_bytes(model) + batch * activation_bytes_per_sample(model, input_shape)


def _keeps_rng(fn: Callable[..., T]) -> Callable[..., T]:
    """Run a probe of ``model`` (its first argument) with the random state of the CPU and of
    the model's GPU saved and restored: its random data and dropout draw nothing the run
    itself would draw (a resumed run probes again where the uninterrupted one did not)."""

    @functools.wraps(fn)
    def wrapper(model: nn.Module, *args: Any, **kwargs: Any) -> T:
        dev = next(model.parameters()).device
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            return fn(model, *args, **kwargs)

    return wrapper


@_keeps_rng
def measure_iteration_bytes(model: nn.Module, input_shape: tuple[int, ...], batch: int) -> int:
    """Measured memory of one iteration on CUDA at ``batch``, in bytes (see the module doc).

    Runs one forward + backward of random data through a copy of ``model`` (which must be on
    a CUDA device) and reads ``torch.cuda.max_memory_allocated``.
    """
    p = next(model.parameters())
    if p.device.type != "cuda":
        raise ValueError(f"measured memory needs a model on a CUDA device, not {p.device}")
    probe = _probe_copy(model)
    x = torch.randn((batch, *input_shape), device=p.device, dtype=p.dtype)
    y = torch.randint(0, _num_outputs(probe, x), (batch,), device=p.device)
    torch.cuda.synchronize(p.device)
    base = torch.cuda.memory_allocated(p.device)
    torch.cuda.reset_peak_memory_stats(p.device)
    F.cross_entropy(probe(x).float(), y).backward()
    torch.cuda.synchronize(p.device)
    peak = torch.cuda.max_memory_allocated(p.device) - base
    del probe, x, y
    # resident weights (probe's copy was in ``base``) and the momentum buffers
    return int(peak + 2 * _param_bytes(model))


def choose_batch(
    current: int,
    initial: int,
    budget: float,
    memory: Callable[[int], float],
    step: int = 32,
    max_batch: int = 512,
) -> int:
    """The largest batch ``initial + k * step`` (k >= 0) with ``memory(batch) <= budget``.

    Never below ``current`` (the batch only grows) nor above ``max(max_batch, current)``.
    ``memory(batch)`` is the bytes of one iteration at ``batch`` (analytic or measured); the
    search stops at the first candidate over the budget (memory grows with the batch).
    """
    if step < 1 or initial < 1 or current < 1:
        raise ValueError(
            f"step, initial and current must be >= 1, got {step}, {initial}, {current}"
        )
    best = current
    candidate = initial
    while candidate <= max_batch:
        if candidate > best:
            if memory(candidate) > budget:
                break
            best = candidate
        candidate += step
    return best


@_keeps_rng
def probe_iteration_ms(
    model: nn.Module,
    input_shape: tuple[int, ...],
    batch: int,
    repeats: int = 3,
    clock: str = "wall",
    amp_dtype: torch.dtype | None = None,
) -> tuple[float, float]:
    """(forward ms, backward ms) of one training iteration at ``batch``: minimum over
    ``repeats`` after one warm-up, on a copy of ``model`` in training mode with random data
    (the model itself and its BatchNorm statistics are untouched).

    ``clock="wall"``: elapsed time (``time.perf_counter``, the GPU synchronised);
    ``clock="cpu"``: CPU time of the process, all threads (``time.process_time``), which other
    processes competing for the cores do not inflate: with one intra-op thread it is the
    time the iteration takes on an idle core (CPU models only). ``amp_dtype``: the forward
    runs under autocast to it, as a ``bf16`` / ``fp16`` run trains.
    """
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    if repeats < 1 or batch < 1:
        raise ValueError(f"repeats and batch must be >= 1, got {repeats}, {batch}")
    p = next(model.parameters())
    probe = _probe_copy(model)
    gen = torch.Generator(device=p.device).manual_seed(0)
    x = torch.randn((batch, *input_shape), device=p.device, dtype=p.dtype, generator=gen)
    y = torch.randint(0, _num_outputs(probe, x), (batch,), device=p.device, generator=gen)

    def sync() -> None:
        if p.device.type == "cuda":
            torch.cuda.synchronize(p.device)

    if clock == "cpu" and p.device.type != "cpu":
        raise ValueError("clock='cpu' times CPU models only")
    now = time.process_time if clock == "cpu" else time.perf_counter
    fwd, bwd = [], []
    for i in range(repeats + 1):
        probe.zero_grad(set_to_none=True)
        sync()
        t0 = now()
        with torch.autocast(p.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = F.cross_entropy(probe(x).float(), y)
        sync()
        t1 = now()
        loss.backward()
        sync()
        t2 = now()
        if i:  # the first run warms up allocators and caches
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
    return min(fwd), min(bwd)


__all__ = [
    "activation_bytes_per_sample",
    "choose_batch",
    "estimate_iteration_bytes",
    "measure_iteration_bytes",
    "probe_iteration_ms",
]
