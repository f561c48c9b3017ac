"""Time accounting of SDGP: per-conv forward, data-gradient and weight-gradient times.

The SDGP paper never measured a speed-up; it estimated one (Sec. IV-C, Fig. 9): time each
convolution's three passes (forward, dL/dD, dL/dW) separately, sum them, and divide the
data-gradient share by the sparsity ratio m/n. Here the three passes are timed as three
separate calls on each layer's real shapes (captured by a forward hook on one batch):
``F.conv2d``, then :func:`impl.methods.sdgp.conv_grad` for dL/dD and for dL/dW (the
convolution backward of dense training, one gradient at a time, on the layer's real input
and weight); the pruning (:func:`impl.ops.nm.nm_prune`) is timed too, since the
estimate ignores it. Times are medians over ``repeats`` after ``warmup`` calls, in
milliseconds: CUDA events on a GPU, ``time.perf_counter`` on the CPU. Inputs are random
normal, never zeros.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from impl.methods.sdgp import (
    _explicit_padding,
    conv_grad,
    conv_memory_format,
    sdgp_plan,
    sdgp_restore,
)
from impl.ops.nm import check_method, check_nm, nm_prune


def time_ms(
    fn: Callable[[], Any], device: torch.device | str, repeats: int = 3, warmup: int = 1
) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``repeats`` calls after ``warmup``.

    CUDA events bracket each call on a GPU (one sync per call, after its end event);
    ``time.perf_counter`` on the CPU.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0; got {repeats}, {warmup}")
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        stream = torch.cuda.current_stream(device)  # ``device``'s, whatever the current GPU
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            fn()
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return float(statistics.median(times))


def layout_of(t: torch.Tensor) -> str:
    """The layout a convolution given ``t`` computes in
    (:func:`impl.methods.sdgp.conv_memory_format`), by name: ``"channels_last"`` or
    ``"contiguous"``."""
    return "channels_last" if conv_memory_format(t) == torch.channels_last else "contiguous"


def _laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``t`` in ``layout`` (:func:`layout_of`'s names)."""
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    return t.contiguous(memory_format=fmt)


def capture_conv_shapes(
    model: nn.Module, input_shape: tuple[int, ...], batch_size: int
) -> dict[str, dict[str, Any]]:
    """Input and output shapes of every ``nn.Conv2d`` on one random batch.

    The model runs once in eval mode (no BatchNorm statistic changes) with autograd on, so
    that ``data_grad_needed`` is whether the conv's input requires a gradient, as in
    training: False for a conv fed the network's input and for one behind frozen layers only
    (training never computes that data gradient); its training flag is restored. Returns
    ``{name: {"input_shape", "output_shape", "data_grad_needed", "input_layout",
    "output_layout"}}``, where a layout is ``"channels_last"`` for a tensor laid out NHWC (a
    model trained ``channels_last``: its convolutions pass NHWC tensors on), else
    ``"contiguous"``.
    """
    param = next(model.parameters())
    x = torch.randn((batch_size, *input_shape), device=param.device, dtype=param.dtype)
    shapes: dict[str, dict[str, Any]] = {}
    hooks = []

    def hook(name: str) -> Callable[..., None]:
        def fn(mod: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            shapes[name] = {
                "input_shape": list(inputs[0].shape),
                "output_shape": list(output.shape),
                "data_grad_needed": inputs[0].requires_grad,
                "input_layout": layout_of(inputs[0]),
                "output_layout": layout_of(output),
            }

        return fn

    for name, mod in model.named_modules():
        if isinstance(mod, nn.Conv2d):
            hooks.append(mod.register_forward_hook(hook(name)))
    was_training = model.training
    try:
        model.eval()
        with torch.enable_grad():
            model(x)  # the graph is dropped at once
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    return shapes


def profile_conv_layers(
    model: nn.Module,
    input_shape: tuple[int, ...],
    batch_size: int,
    n: int,
    m: int,
    repeats: int = 3,
    *,
    method: str = "rescaled",
    rescale: str = "plane",
    nondivisible: str = "pad",
    warmup: int = 1,
    amp_dtype: torch.dtype | None = None,
) -> list[dict[str, Any]]:
    """Per-conv times of the three passes and of the pruning, on the layer's real shapes.

    SDGP Fig. 9. For every ``nn.Conv2d`` of ``model`` (converted or not) returns a dict with
    ``name``, channels, kernel, stride, ``input_shape``, ``output_shape``, ``layout`` (the
    input's, :func:`layout_of`), ``sparse`` (SDGP prunes its dL/dO), ``data_grad_density``
    (kept fraction of dL/dO), ``data_grad_needed``, ``fwd_ms``, ``dgrad_ms``, ``wgrad_ms``,
    ``prune_ms`` (0.0 for dense layers) and ``est_saved_ms`` = ``dgrad_ms * (1 - density)``
    (the paper's estimate, Sec. IV-C; 0.0 when the layer is dense or its data gradient is
    never computed). Times in ms.
    The input and the output gradient are laid out as the layer's input and output were in
    the captured forward pass (NHWC in a model trained ``channels_last``), so that each call
    computes in the layout training does, without a reorder training never makes.
    ``amp_dtype``: the dtype a run's autocast gives its convolutions (``bf16`` / ``fp16``
    runs): inputs, weights and gradients are timed in it, as training ran them.
    """
    check_nm(n, m)
    check_method(method, rescale)
    param = next(model.parameters())
    device, dtype = param.device, amp_dtype or param.dtype
    shapes = capture_conv_shapes(model, input_shape, batch_size)
    plans = {p.name: p for p in sdgp_plan(model, n, m, nondivisible)}
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    rows = []
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Conv2d) or name not in shapes:
            continue
        shp = shapes[name]
        plan = plans[name]
        x = _laid_out(
            torch.randn(shp["input_shape"], device=device, dtype=dtype), shp["input_layout"]
        )
        if mod.padding_mode != "zeros":
            x = F.pad(x, mod._reversed_padding_repeated_twice, mode=mod.padding_mode)
            padding: tuple[int, int] | None = (0, 0)
        else:
            padding = _explicit_padding(mod)
        if padding is None:  # asymmetric 'same': only the forward can be timed as written
            continue
        w = mod.weight.detach().to(dtype)
        b = None if mod.bias is None else mod.bias.detach().to(dtype)
        g = _laid_out(
            torch.randn(shp["output_shape"], device=device, dtype=dtype), shp["output_layout"]
        )
        args = (mod.stride, padding, mod.dilation, mod.groups)
        with torch.no_grad():
            fwd = time_ms(lambda: F.conv2d(x, w, b, *args), device, repeats, warmup)  # noqa: B023
            dgrad = time_ms(
                lambda: conv_grad("input", g, x, w, args),  # noqa: B023
                device,
                repeats,
                warmup,
            )
            wgrad = time_ms(
                lambda: conv_grad("weight", g, x, w, args),  # noqa: B023
                device,
                repeats,
                warmup,
            )
            prune = 0.0
            if plan.sparse:
                prune = time_ms(
                    lambda: nm_prune(g, n, m, method, 1, rescale, gen),  # noqa: B023
                    device,
                    repeats,
                    warmup,
                )
        saves = plan.sparse and shp["data_grad_needed"]
        rows.append(
            {
                "name": name,
                "in_channels": mod.in_channels,
                "out_channels": mod.out_channels,
                "kernel_size": list(mod.kernel_size),
                "stride": list(mod.stride),
                "input_shape": shp["input_shape"],
                "output_shape": shp["output_shape"],
                "layout": shp["input_layout"],
                "sparse": plan.sparse,
                "data_grad_density": plan.data_grad_density,
                "data_grad_needed": shp["data_grad_needed"],
                "fwd_ms": fwd,
                "dgrad_ms": dgrad,
                "wgrad_ms": wgrad,
                "prune_ms": prune,
                "est_saved_ms": dgrad * (1.0 - plan.data_grad_density) if saves else 0.0,
            }
        )
    return rows


def time_iteration(
    model: nn.Module,
    input_shape: tuple[int, ...],
    batch_size: int,
    repeats: int = 3,
    *,
    dense: bool = False,
    amp_dtype: torch.dtype | None = None,
) -> float:
    """Median ms of one training iteration's forward + backward (cross-entropy on random labels).

    Runs on a deep copy in train mode, so neither the weights nor the BatchNorm statistics nor
    any generator of ``model`` change. ``dense``: with the copy's SDGP convs made plain convs
    again (:func:`impl.methods.sdgp.sdgp_restore`), the iteration dense training runs.
    ``amp_dtype``: the forward runs under autocast to it, as a ``bf16`` / ``fp16`` run trains.
    """
    clone = copy.deepcopy(model).eval()  # eval for the probe: BatchNorm takes one sample
    if dense:
        sdgp_restore(clone)
    param = next(clone.parameters())
    x = torch.randn((batch_size, *input_shape), device=param.device, dtype=param.dtype)
    with torch.no_grad():
        classes = clone(x[:1]).shape[1]
    clone.train()
    y = torch.randint(0, classes, (batch_size,), device=param.device)

    def step() -> None:
        clone.zero_grad(set_to_none=True)
        with torch.autocast(param.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = F.cross_entropy(clone(x).float(), y)
        loss.backward()

    return time_ms(step, param.device, repeats, warmup=1)


def time_accounting(
    model: nn.Module,
    input_shape: tuple[int, ...],
    batch_size: int,
    n: int,
    m: int,
    *,
    method: str = "rescaled",
    rescale: str = "plane",
    repeats: int = 3,
    nondivisible: str = "pad",
    iteration_ms: float | None = None,
    amp_dtype: torch.dtype | None = None,
) -> dict[str, Any]:
    """Per-layer times and the paper's estimate of SDGP's saving (Sec. IV-C, Fig. 9, Fig. 10).

    Totals count only executed work (a conv fed the network input never computes its data
    gradient). ``est_saved_ms`` = sum over sparse layers of ``dgrad_ms * (1 - kept fraction)``
    (the paper's data-gradient time divided by the sparsity ratio is the time left, so the
    saving is the rest); it is set beside ``conv_total_ms``, beside
    ``iteration_ms_dense`` (forward + backward of the whole model as dense training runs it,
    timed here), ``iteration_ms_measured`` (the same with SDGP on, its pruning included) and
    ``iteration_ms_trainer`` (the Trainer's median fwd + bwd of the last epoch, when given).
    ``est_saved_fraction_of_iteration`` is ``est_saved_ms`` over the dense forward + backward
    (no optimizer step, no data loading); Fig. 10 rescales dense epoch times by it, which
    include both, so there it slightly overstates the share of the epoch it removes.
    ``est_saved_net_ms`` subtracts the measured pruning time, which the paper's estimate omits.
    ``amp_dtype``: the run's autocast dtype (``bf16`` / ``fp16``): every time is taken in it,
    so that the estimate and the Trainer's iteration speak of the same arithmetic; ``dtype``
    in the result names what was timed.
    """
    layers = profile_conv_layers(
        model,
        input_shape,
        batch_size,
        n,
        m,
        repeats,
        method=method,
        rescale=rescale,
        nondivisible=nondivisible,
        amp_dtype=amp_dtype,
    )
    fwd = sum(r["fwd_ms"] for r in layers)
    dgrad = sum(r["dgrad_ms"] for r in layers if r["data_grad_needed"])
    wgrad = sum(r["wgrad_ms"] for r in layers)
    prune = sum(r["prune_ms"] for r in layers if r["data_grad_needed"])
    saved = sum(r["est_saved_ms"] for r in layers)
    conv_total = fwd + dgrad + wgrad
    it_measured = time_iteration(model, input_shape, batch_size, repeats, amp_dtype=amp_dtype)
    it_dense = time_iteration(
        model, input_shape, batch_size, repeats, dense=True, amp_dtype=amp_dtype
    )

    def frac(a: float, b: float | None) -> float | None:
        return a / b if b else None

    return {
        "device": str(next(model.parameters()).device),
        "dtype": str(amp_dtype or next(model.parameters()).dtype).removeprefix("torch."),
        "batch_size": batch_size,
        "repeats": repeats,
        "layers": layers,
        "fwd_ms": fwd,
        "dgrad_ms": dgrad,
        "wgrad_ms": wgrad,
        "prune_ms": prune,
        "conv_total_ms": conv_total,
        "dgrad_fraction_of_conv": frac(dgrad, conv_total),
        "est_saved_ms": saved,
        "est_saved_fraction_of_conv": frac(saved, conv_total),
        "est_saved_net_ms": saved - prune,
        "iteration_ms_dense": it_dense,
        "iteration_ms_measured": it_measured,
        "iteration_ms_trainer": iteration_ms,
        "est_saved_fraction_of_iteration": frac(saved, it_dense),
        "est_saved_net_fraction_of_iteration": frac(saved - prune, it_dense),
    }


__all__ = [
    "capture_conv_shapes",
    "layout_of",
    "profile_conv_layers",
    "time_accounting",
    "time_iteration",
    "time_ms",
]
