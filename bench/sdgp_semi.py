"""SDGP measured, not estimated: the data gradient of every conv on 2:4 sparse tensor cores.

    python -m bench.sdgp_semi --out reports/sdgp-semi/<device> [--models resnet18 resnet50]
        [--dtypes bf16 fp16] [--batch 256] [--resolution 224] [--backend auto]
        [--prune-method rescaled] [--memory-format channels_last] [--no-iteration]

The SDGP paper (Sec. IV-C, Fig. 9: ResNet-18, B=256, 3x224x224) timed each conv's dense
data gradient and *estimated* SDGP's as that time times n/m. This script measures, for every
distinct conv layer of ResNet-18 and ResNet-50 (ImageNet stem, ``impl.models``) at the paper's
batch and resolution, in bf16 and fp16, channels-last (the authors' layout, Sec. III-A):

* ``dense_dgrad_ms``: cuDNN's data gradient (``impl.methods.sdgp.conv_grad``, cudnn.benchmark);
* ``sparse_dgrad_ms``: SDGP's data gradient on sparse tensor cores
  (:mod:`impl.methods.sdgp_semi`: 2:4 pruning, compression, sparse GEMM, fold) in one timed
  call, and its phases ``prune_ms``, ``compress_ms``, ``spmm_ms``, ``assemble_ms``;
* ``est_sparse_ms = dense_dgrad_ms * n / m``: the paper's estimate (Sec. IV-C);
* ``reference_ms``: the reference SDGP backend (``nm_prune`` then cuDNN's ``conv_grad``);
* ``dense_mm_ms`` / ``spmm_ms``: the GEMM alone, dense ``torch.mm`` against the sparse product
  of the same shapes (what sparse tensor cores buy, without the fold around them);
  ``dense_gemm_ms``: the whole column path with a dense GEMM;
* ``tile_prune_compress_ms``: torch's fused prune-and-compress (``prune_dense_static_sort``,
  ``largest_abs_values_greedy``), which prunes 4x4 tiles 2:4 along rows *and* columns and
  builds both orientations: not SDGP's per-row rule and not a lower bound (it does more than
  SDGP needs), listed as what the library's own fused routine costs on the same matrix.

Derived columns (formulas): ``measured_saved_ms = dense_dgrad_ms - sparse_dgrad_ms``,
``est_saved_ms = dense_dgrad_ms * (1 - n/m)``, ``speedup = dense_dgrad_ms / sparse_dgrad_ms``,
``gemm_speedup = dense_mm_ms / spmm_ms``, ``flops = 2 * M * K * C*R*S`` (the dense data-gradient
GEMM, M = N*Ho*Wo), ``dense_tflops = flops / dense_dgrad_ms`` and ``sparse_tflops_equiv =
flops / sparse_dgrad_ms`` (dense-equivalent rate). Iteration rows sum ``count *`` each layer
value over the convs whose data gradient SDGP prunes (the stem's is never computed), and time
whole training iterations (forward, backward, SGD step under autocast) of the dense model, the
reference SDGP backend and the semi-structured one; ``est_iter_ms = dense_iter_ms -
est_saved_ms`` is the paper's way of turning the estimate into an iteration time (Sec. IV-C).
Epoch figures multiply by ``ceil(1,281,167 / batch)`` iterations (the ImageNet-1k training
set) and are in seconds.

Every timing rotates through copies of its operands (the output gradient and what each phase
derives from it: ``rotation_sets`` per row, :func:`rotated`), so that a call does not find
them in the L2 cache the previous call filled: the small layers' gradients (ResNet-50's last
stage: 12.8 MB in 16-bit at batch 256) would otherwise be read from cache, flattering
whichever path reads them more often.

Each sparse row is first checked against cuDNN on the same pruned gradient
(``check_rel_max_err``, the largest error over the largest value); above
:data:`CHECK_REL_TOL` the row is an error ("sparse result differs from cuDNN") and is not
timed: a wrong product is never reported as a sparse timing. Every timed value ``x_ms`` has
the host's wall time per call beside it (``x_host_ms``, GPU only): where it reaches ``x_ms``
the launch overhead, not the kernel, sets the time. cuSPARSELt runs its default algorithm
(torch does not search), while cuDNN picks its algorithm by timing (cudnn.benchmark): the
comparison leans, if anything, against the sparse path.

Where the library cannot run (here: every row on a CPU) a row has ``status = "fallback"``, its
``reason``, the reference path's time in ``fallback_ms`` and no sparse time: a fallback is
never reported as a sparse timing. ``PDTBENCH_BENCH_SMALL=1`` runs small sizes (batch 2,
32x32, bf16) as a smoke test of the pipeline on the CPU. Every row carries the provenance of
:func:`bench.cases.provenance`. Writes ``rows.csv``, ``rows.json`` and ``summary.md``.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bench import measure
from bench.cases import ENV_SMALL, provenance
from bench.measure import rotated
from bench.run import (
    PartialRows,
    columns,
    cut_reason,
    ignoring_sigterm,
    quiet_print,
    terminate_gracefully,
)
from impl.messages import first_line

N_KEEP, M_GROUP = 2, 4
#: Training images of ImageNet-1k (ILSVRC2012), for iterations per epoch.
IMAGENET_TRAIN_IMAGES = 1_281_167
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
MODELS = ("resnet18", "resnet50")
#: GPU timing budgets (ms) of one layer measurement and of one training iteration.
LAYER_WARMUP_MS, LAYER_REP_MS = 25.0, 100.0
ITER_WARMUP_MS, ITER_REP_MS = 200.0, 1000.0
#: Largest relative error (max |sparse - cuDNN| / max |cuDNN|, same pruned gradient) a sparse
#: row may show and still be timed. fp16/bf16 rounding of the column path stays near 1e-2 of
#: the largest value; a wrong layout or compression gives errors of order 1. It flags wrong
#: products, not numerics: the GPU tests judge those with the tolerance table.
CHECK_REL_TOL = 0.05


@dataclass(frozen=True)
class BenchConfig:
    """Sizes and options of one run.

    Args:
        models: ``impl.models`` names (ImageNet stem, 1000 classes).
        dtypes: keys of :data:`DTYPES`.
        batch, resolution: input batch and square image size.
        backend: ``auto``, ``cusparselt`` or ``cutlass`` (:mod:`impl.methods.sdgp_semi`).
        prune_method, rescale: SDGP's pruning function and rescale rule.
        memory_format: ``channels_last`` (the authors' layout) or ``contiguous``.
        iteration: also time whole training iterations.
        small: the smoke sizes (CPU timing with few repeats).
    """

    models: tuple[str, ...] = MODELS
    dtypes: tuple[str, ...] = ("bf16", "fp16")
    batch: int = 256
    resolution: int = 224
    backend: str = "auto"
    prune_method: str = "rescaled"
    rescale: str = "plane"
    memory_format: str = "channels_last"
    iteration: bool = True
    small: bool = False


def small_enabled() -> bool:
    """Whether ``PDTBENCH_BENCH_SMALL`` asks for the smoke sizes."""
    return (os.environ.get(ENV_SMALL) or "").strip().lower() in ("1", "true", "yes", "on")


def default_config(small: bool | None = None) -> BenchConfig:
    """The paper's sizes (Fig. 9: batch 256, 224x224), or the smoke sizes when ``small``."""
    if small is None:
        small = small_enabled()
    if small:
        return BenchConfig(dtypes=("bf16",), batch=2, resolution=32, small=True)
    return BenchConfig()


def iterations_per_epoch(batch: int) -> int:
    """ImageNet-1k training iterations per epoch at ``batch`` (the last partial batch counts)."""
    return math.ceil(IMAGENET_TRAIN_IMAGES / batch)


# -- layers ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerShape:
    """One distinct conv of a model: shapes, hyper-parameters and the layers that have it."""

    names: tuple[str, ...]
    input_shape: tuple[int, int, int, int]
    out_channels: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int

    @property
    def count(self) -> int:
        """How many convs of the model have this shape."""
        return len(self.names)


def model_layers(model: str, batch: int, resolution: int) -> list[LayerShape]:
    """The distinct convs of ``model`` whose data gradient SDGP prunes (shapes on ``meta``).

    The convs :func:`impl.methods.sdgp.sdgp_plan` converts and whose input is not the network's
    (the stem's data gradient is never computed), grouped by shape in order of appearance.
    """
    from impl.methods.sdgp import _explicit_padding, sdgp_plan
    from impl.methods.sdgp_timing import capture_conv_shapes
    from impl.models import create

    with torch.device("meta"):
        net = create(model, num_classes=1000, stem="imagenet")
    shapes = capture_conv_shapes(net, (3, resolution, resolution), 1)
    plan = {p.name: p for p in sdgp_plan(net, N_KEEP, M_GROUP)}
    found: dict[tuple[Any, ...], list[str]] = {}
    for name, mod in net.named_modules():
        if not isinstance(mod, torch.nn.Conv2d) or name not in shapes:
            continue
        if not (plan[name].sparse and shapes[name]["data_grad_needed"]):
            continue
        _, c, h, w = shapes[name]["input_shape"]
        key = (
            (batch, c, h, w),
            mod.out_channels,
            tuple(mod.kernel_size),
            tuple(mod.stride),
            _explicit_padding(mod),
            tuple(mod.dilation),
            mod.groups,
        )
        found.setdefault(key, []).append(name)
    return [LayerShape(tuple(names), *key) for key, names in found.items()]  # type: ignore[arg-type]


# -- timing ----------------------------------------------------------------------------------
def _release() -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _timed(
    fn: Callable[[int], Any], device: torch.device, cfg: BenchConfig, *, iteration: bool = False
) -> measure.Timing:
    """Median of calls ``fn(i)`` (``i``: the call's index, for rotating inputs)."""
    if device.type == "cuda":
        warm, rep = (ITER_WARMUP_MS, ITER_REP_MS) if iteration else (LAYER_WARMUP_MS, LAYER_REP_MS)
        # amortize=0: these rows keep only the median (layers of a ResNet at batch 256 take
        # far longer than a launch), so a back-to-back batch would be time spent for nothing.
        return measure.cuda_timing(fn, warmup_ms=warm, rep_ms=rep, min_reps=3, amortize=0)
    repeats = 2 if cfg.small else 3
    return measure.cpu_timing(fn, warmup=1, repeats=repeats)


def _pick(sets: Sequence[Any], i: int) -> Any:
    return sets[i % len(sets)]


def _attempt(row: dict[str, Any], key: str, fn: Callable[[], measure.Timing]) -> bool:
    """Time into ``row[key + '_ms']``; on failure record it (OOM as a value) and return False."""
    try:
        t = fn()
    except Exception as exc:  # noqa: BLE001 - a row records the failure, the run goes on
        kind = "oom" if measure.is_out_of_memory(exc) else "error"
        row.setdefault("errors", []).append(f"{key}: {kind}: {type(exc).__name__}: {exc}"[:300])
        row[f"{key}_ms"] = None
        return False
    row[f"{key}_ms"] = t.median_ms
    if t.host_ms is not None:
        row[f"{key}_host_ms"] = t.host_ms
    row.setdefault("clock", t.clock)
    row.setdefault("n_runs", t.n)
    return True


def _memory_format(cfg: BenchConfig) -> torch.memory_format:
    return torch.channels_last if cfg.memory_format == "channels_last" else torch.contiguous_format


def _tile_prune_compress(a: torch.Tensor, backend: str) -> Any:
    """torch's fused 4x4-tile prune and compress (not SDGP's rule; timed for reference)."""
    import warnings

    from impl.methods import sdgp_semi as semi

    cls = semi._semi_class(semi.resolve_backend(backend))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=semi._PROTOTYPE_WARNING)
        return cls.prune_dense_static_sort(a, algorithm="largest_abs_values_greedy")


def measure_layer(
    layer: LayerShape, dtype_name: str, device: torch.device, cfg: BenchConfig
) -> dict[str, Any]:
    """One row: the dense, reference, estimated and sparse data-gradient times of ``layer``."""
    from impl.methods import sdgp_semi as semi
    from impl.methods.sdgp import conv_grad, nm_prune

    dtype = DTYPES[dtype_name]
    fmt = _memory_format(cfg)
    n, c, h, w = layer.input_shape
    k = layer.out_channels
    r, s = layer.kernel
    ho, wo = semi.conv_output_hw((h, w), layer.kernel, layer.stride, layer.padding, layer.dilation)
    rows_m, cols = n * ho * wo, c * r * s // layer.groups
    backend = semi.resolve_backend(cfg.backend)
    kernel_prune = device.type == "cuda" and semi._nm_kernel(device) is not None
    if (r, s) == (1, 1) and layer.padding == (0, 0):
        path = "1x1" if layer.stride == (1, 1) else "1x1-strided"
    else:
        path = "fold"
    row: dict[str, Any] = {
        "kind": "layer",
        "layer": layer.names[0],
        "layers": ";".join(layer.names),
        "count": layer.count,
        "dtype": dtype_name,
        "memory_format": cfg.memory_format,
        "backend": backend,
        "prune_method": cfg.prune_method,
        "rescale": cfg.rescale if cfg.prune_method == "rescaled" else "",
        "prune_impl": "nm_cuda kernel" if kernel_prune else "reference (torch ops)",
        "N": n,
        "C": c,
        "K": k,
        "H": h,
        "W": w,
        "Ho": ho,
        "Wo": wo,
        "kernel": f"{r}x{s}",
        "stride": "x".join(map(str, layer.stride)),
        "padding": "x".join(map(str, layer.padding)),
        "path": path,
        "gemm_m": rows_m,
        "gemm_k": k,
        "gemm_n": cols,
        "flops": 2 * rows_m * k * cols,
        "status": "",
        "reason": "",
    }
    shape4 = (n, c, h, w)
    args = (layer.stride, layer.padding, layer.dilation, layer.groups)
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    weight = torch.randn(k, c // layer.groups, r, s, device=device, dtype=dtype) / math.sqrt(cols)
    weight = weight.contiguous(memory_format=fmt)
    # the output gradients each timing rotates through (the weight is read once per call and
    # is small beside them; the input is not read by the data gradient)
    grads = rotated(
        lambda j: torch.randn(n, k, ho, wo, device=device, dtype=dtype).contiguous(
            memory_format=fmt
        )
    )
    row["rotation_sets"] = len(grads)
    # the layer's input: the data gradient is timed as training computes it, on the real input
    x = torch.randn(shape4, device=device, dtype=dtype).contiguous(memory_format=fmt)
    rows_sets = [semi.grad_rows(g) for g in grads]
    a_sets = [r.reshape(rows_m, k) for r in rows_sets]
    w2 = weight.reshape(k, -1)
    method, rescale = cfg.prune_method, cfg.rescale

    def prune(i: int) -> torch.Tensor:
        return semi.prune_rows(_pick(rows_sets, i), N_KEEP, M_GROUP, method, rescale, gen)

    with torch.no_grad():
        _attempt(
            row,
            "dense_dgrad",
            lambda: _timed(
                lambda i: conv_grad("input", _pick(grads, i), x, weight, args), device, cfg
            ),
        )
        _attempt(
            row,
            "reference",
            lambda: _timed(
                lambda i: conv_grad(
                    "input",
                    nm_prune(_pick(grads, i), N_KEEP, M_GROUP, method, 1, rescale, gen),
                    x,
                    weight,
                    args,
                ),
                device,
                cfg,
            ),
        )
        if layer.groups == 1:
            _attempt(
                row,
                "dense_mm",
                lambda: _timed(lambda i: torch.mm(_pick(a_sets, i), w2), device, cfg),
            )
            _attempt(
                row,
                "dense_gemm",
                lambda: _timed(
                    lambda i: semi.data_grad_from_rows(
                        _pick(a_sets, i),
                        weight,
                        shape4,
                        layer.stride,
                        layer.padding,
                        layer.dilation,
                    ).contiguous(memory_format=fmt),
                    device,
                    cfg,
                ),
            )
        reason = semi.unsupported_reason(
            n=N_KEEP,
            m=M_GROUP,
            device=device,
            dtype=dtype,
            groups=layer.groups,
            out_channels=k,
            rows=rows_m,
            cols=cols,
            backend=cfg.backend,
        )
        if reason:
            row.update(status="fallback", reason=reason, fallback_ms=row.get("reference_ms"))
        else:
            _sparse_phases(row, layer, weight, w2, a_sets, prune, device, cfg, fmt)
    _derive(row)
    if row.get("errors"):
        row["errors"] = " | ".join(row["errors"])
    return row


def _sparse_phases(
    row: dict[str, Any],
    layer: LayerShape,
    weight: torch.Tensor,
    w2: torch.Tensor,
    a_sets: Sequence[torch.Tensor],
    prune: Callable[[int], torch.Tensor],
    device: torch.device,
    cfg: BenchConfig,
    fmt: torch.memory_format,
) -> None:
    """Time the sparse path whole and by phase; record a library failure as the row's error.

    ``a_sets``: the rotated dense output gradients as (rows, K) matrices; ``prune(i)`` prunes
    the ``i``-th of them (modulo their number). Each phase rotates through its own inputs,
    derived from those."""
    from impl.methods import sdgp_semi as semi

    n, c, h, w = layer.input_shape
    shape4 = (n, c, h, w)
    geo = (layer.stride, layer.padding, layer.dilation)
    m = a_sets[0].shape[0]
    backend = cfg.backend
    try:
        pruned = prune(0)
        a = pruned.reshape(m, -1)
        sa = semi.compress(a, backend)
        col = semi.semi_matmul(sa, w2, m)
        got = semi.assemble_data_grad(col, shape4, layer.kernel, *geo)
        # sanity: the sparse result against cuDNN on the same pruned gradient (relative max)
        ref = torch.nn.grad.conv2d_input(
            shape4, weight, semi.rows_to_nchw(pruned, (layer_out(layer))), *geo, layer.groups
        )
        scale = float(ref.abs().max()) or 1.0
        row["check_rel_max_err"] = float((got.float() - ref.float()).abs().max()) / scale
    except Exception as exc:  # noqa: BLE001 - a library failure is a row, not a crash
        kind = "oom" if measure.is_out_of_memory(exc) else "error"
        row.update(status=kind, reason=f"{type(exc).__name__}: {str(exc)[:300]}")
        return
    if not row["check_rel_max_err"] <= CHECK_REL_TOL:  # NaN included
        row.update(
            status="error",
            reason=(
                f"sparse result differs from cuDNN on the same pruned gradient: relative max "
                f"error {row['check_rel_max_err']:.3g} > {CHECK_REL_TOL} (not timed)"
            ),
        )
        return
    ok = _attempt(
        row,
        "sparse_dgrad",
        lambda: _timed(
            lambda i: semi.sparse_data_grad(prune(i), weight, shape4, *geo, backend).contiguous(
                memory_format=fmt
            ),
            device,
            cfg,
        ),
    )
    _attempt(row, "prune", lambda: _timed(prune, device, cfg))
    try:  # the other copies (each call's own operands); a failure keeps the first alone
        pruned_sets = [a] + [prune(j).reshape(m, -1) for j in range(1, len(a_sets))]
        sa_sets = [sa] + [semi.compress(p, backend) for p in pruned_sets[1:]]
        col_sets = rotated(
            lambda j: col if j == 0 else semi.semi_matmul(sa_sets[j], w2, m), len(sa_sets)
        )
    except Exception as exc:  # noqa: BLE001 - fewer copies is a note, not a lost row
        kind = "oom" if measure.is_out_of_memory(exc) else "error"
        row.setdefault("errors", []).append(f"rotation copies: {kind}: {exc}"[:300])
        pruned_sets, sa_sets, col_sets = [a], [sa], [col]
    row["rotation_sets_columns"] = len(col_sets)  # the column matrices: fewer where large
    _attempt(
        row,
        "compress",
        lambda: _timed(lambda i: semi.compress(_pick(pruned_sets, i), backend), device, cfg),
    )
    _attempt(
        row,
        "spmm",
        lambda: _timed(lambda i: semi.semi_matmul(_pick(sa_sets, i), w2, m), device, cfg),
    )
    pruned_sets.clear()  # the column matrices can be large: free what is timed already
    sa_sets.clear()
    _attempt(
        row,
        "assemble",
        lambda: _timed(
            lambda i: semi.assemble_data_grad(
                _pick(col_sets, i), shape4, layer.kernel, *geo
            ).contiguous(memory_format=fmt),
            device,
            cfg,
        ),
    )
    col_sets.clear()
    try:
        _tile_prune_compress(a_sets[0], backend)
    except Exception as exc:  # noqa: BLE001
        row["tile_reason"] = f"{type(exc).__name__}: {first_line(exc, 200)}"
    else:
        _attempt(
            row,
            "tile_prune_compress",
            lambda: _timed(lambda i: _tile_prune_compress(_pick(a_sets, i), backend), device, cfg),
        )
    row["status"] = "ok" if ok else "error"
    if not ok:
        row["reason"] = "the timed sparse call failed (see errors)"


def layer_out(layer: LayerShape) -> tuple[int, int]:
    """Output height and width of ``layer``."""
    from impl.methods.sdgp_semi import conv_output_hw

    _, _, h, w = layer.input_shape
    return conv_output_hw((h, w), layer.kernel, layer.stride, layer.padding, layer.dilation)


def _derive(row: dict[str, Any]) -> None:
    """The derived columns of one layer row (formulas in the module docstring)."""
    dense = row.get("dense_dgrad_ms")
    sparse = row.get("sparse_dgrad_ms") if row.get("status") == "ok" else None
    density = N_KEEP / M_GROUP
    row["est_sparse_ms"] = dense * density if dense is not None else None
    row["est_saved_ms"] = dense * (1 - density) if dense is not None else None
    row["measured_saved_ms"] = dense - sparse if dense is not None and sparse else None
    row["speedup"] = dense / sparse if dense and sparse else None
    row["sparse_faster"] = (sparse < dense) if dense and sparse else None
    mm, sp = row.get("dense_mm_ms"), row.get("spmm_ms")
    row["gemm_speedup"] = mm / sp if mm and sp else None
    flops = row["flops"]
    row["dense_tflops"] = flops / (dense * 1e-3) / 1e12 if dense else None
    row["sparse_tflops_equiv"] = flops / (sparse * 1e-3) / 1e12 if sparse else None


# -- whole iterations ------------------------------------------------------------------------
def training_iteration_times(
    model_name: str, variant: str, dtype_name: str, device: torch.device, cfg: BenchConfig
) -> dict[str, Any]:
    """Median ms of one training iteration (forward, backward, SGD step, autocast ``dtype``).

    ``variant``: ``dense``, ``sdgp_reference`` (``sdgp_convert``) or ``sdgp_semi``
    (``sdgp_semi_convert``); the latter also returns its call and fallback counts.
    """
    from impl.methods.sdgp import sdgp_convert
    from impl.methods.sdgp_semi import sdgp_semi_convert, semi_summary
    from impl.models import create

    fmt = _memory_format(cfg)
    torch.manual_seed(0)
    model = create(model_name, num_classes=1000, stem="imagenet").to(device)
    model = model.to(memory_format=fmt)
    if variant == "sdgp_reference":
        sdgp_convert(model, N_KEEP, M_GROUP, cfg.prune_method, cfg.rescale)
    elif variant == "sdgp_semi":
        sdgp_semi_convert(
            model, N_KEEP, M_GROUP, cfg.prune_method, cfg.rescale, sparse_backend=cfg.backend
        )
    elif variant != "dense":
        raise ValueError(f"unknown variant {variant!r}; valid: dense, sdgp_reference, sdgp_semi")
    # A small learning rate keeps fp16 weights finite without a GradScaler over the few steps.
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    x = torch.randn(cfg.batch, 3, cfg.resolution, cfg.resolution, device=device)
    x = x.contiguous(memory_format=fmt)
    y = torch.randint(0, 1000, (cfg.batch,), device=device)
    dtype = DTYPES[dtype_name]

    def step(i: int = 0) -> None:
        with torch.autocast(device.type, dtype=dtype):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    out: dict[str, Any] = {}
    _attempt(out, variant + "_iter", lambda: _timed(step, device, cfg, iteration=True))
    if variant == "sdgp_semi":
        s = semi_summary(model)
        out["semi_calls"] = s["sdgp_semi_calls"]
        out["semi_fallback_calls"] = s["sdgp_semi_fallback_calls"]
        reasons = sorted({r["reason"] for r in s["sdgp_semi_fallback_reasons"]})
        out["semi_fallback_reasons"] = json.dumps(reasons)
    return out


def iteration_row(
    model_name: str,
    dtype_name: str,
    layer_rows: Sequence[dict[str, Any]],
    device: torch.device,
    cfg: BenchConfig,
) -> dict[str, Any]:
    """Per-iteration and per-epoch sums of the layer rows, and measured whole iterations."""
    ipe = iterations_per_epoch(cfg.batch)
    ok = [r for r in layer_rows if r["status"] == "ok"]
    fallback = [r for r in layer_rows if r["status"] != "ok"]

    def total(key: str, rows: Sequence[dict[str, Any]] = layer_rows) -> float | None:
        vals = [(r["count"], r.get(key)) for r in rows]
        if not rows or any(v is None for _, v in vals):
            return None
        return float(sum(cnt * v for cnt, v in vals))

    # What the semi-structured backend spends: sparse where it runs, the reference path
    # (pruning + cuDNN) where it falls back; unknown when either part lacks a timing (a
    # fallback layer whose reference failed must not count as 0 ms, a saving never measured).
    sparse_part = total("sparse_dgrad_ms", ok) if ok else 0.0
    fallback_part = total("reference_ms", fallback) if fallback else 0.0
    row: dict[str, Any] = {
        "kind": "iteration",
        "layer": "(all)",
        "model": model_name,
        "dtype": dtype_name,
        "memory_format": cfg.memory_format,
        "batch": cfg.batch,
        "resolution": cfg.resolution,
        "iterations_per_epoch": ipe,
        "distinct_layers": len(layer_rows),
        "convs": sum(r["count"] for r in layer_rows),
        "convs_sparse": sum(r["count"] for r in ok),
        "convs_fallback": sum(r["count"] for r in fallback),
        "status": "ok" if not fallback else ("fallback" if not ok else "partial"),
        "reason": "; ".join(sorted({r["reason"] for r in fallback if r["reason"]})),
        "dense_dgrad_ms": total("dense_dgrad_ms"),
        "est_sparse_ms": total("est_sparse_ms"),
        "est_saved_ms": total("est_saved_ms"),
        "reference_ms": total("reference_ms"),
        "semi_backend_dgrad_ms": (
            None if sparse_part is None or fallback_part is None else sparse_part + fallback_part
        ),
        "sparse_dgrad_ms_sparse_layers": total("sparse_dgrad_ms", ok) if ok else None,
        "dense_dgrad_ms_sparse_layers": total("dense_dgrad_ms", ok) if ok else None,
    }
    if ok and row["dense_dgrad_ms"] is not None and row["semi_backend_dgrad_ms"] is not None:
        # Only a saving where some conv really ran on sparse tensor cores.
        row["measured_saved_ms"] = row["dense_dgrad_ms"] - row["semi_backend_dgrad_ms"]
    if cfg.iteration:
        errors: list[str] = []  # each variant's, kept together (each names its variant)
        for variant in ("dense", "sdgp_reference", "sdgp_semi"):
            print(f"  iteration {model_name} {dtype_name} {variant}", flush=True)
            times = training_iteration_times(model_name, variant, dtype_name, device, cfg)
            errors += times.pop("errors", [])
            row.update(times)
            _release()  # the model, its optimizer and activations are gone with the call
        if errors:
            row["errors"] = " | ".join(errors)
        dense_iter = row.get("dense_iter_ms")
        if dense_iter and row.get("est_saved_ms") is not None:
            row["est_iter_ms"] = dense_iter - row["est_saved_ms"]
            row["est_saved_fraction"] = row["est_saved_ms"] / dense_iter
        if dense_iter and row.get("sdgp_semi_iter_ms") and row.get("semi_calls"):
            row["measured_saved_fraction"] = (dense_iter - row["sdgp_semi_iter_ms"]) / dense_iter
        if row.get("semi_fallback_calls"):
            row["semi_iteration_note"] = (
                "every conv took the reference path"
                if not row.get("semi_calls")
                else "some convs took the reference path (see semi_fallback_reasons)"
            )
    for key in (
        "dense_dgrad_ms",
        "est_sparse_ms",
        "semi_backend_dgrad_ms",
        "dense_iter_ms",
        "est_iter_ms",
        "sdgp_reference_iter_ms",
        "sdgp_semi_iter_ms",
    ):
        if row.get(key) is not None:
            row[key.replace("_ms", "_epoch_s")] = row[key] * ipe / 1e3
    return row


# -- the run ---------------------------------------------------------------------------------
def run(
    cfg: BenchConfig, device: torch.device, out: Path | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every layer row and iteration row of ``cfg`` on ``device``, and the run's metadata.

    With ``out``, rows are written as they come: each to ``out/rows.partial.jsonl`` when it
    is measured, and ``rows.csv``, ``rows.json`` and ``summary.md`` after every model and
    dtype; a run stopped early (SIGTERM under :func:`bench.run.terminate_gracefully`, Ctrl-C,
    an error) writes them once more with ``meta["complete"] = False`` and ``meta["cut_at"]``
    (model, dtype, layer, reason) before the exception goes on.
    """
    scale = "smoke" if cfg.small else ("gpu" if device.type == "cuda" else "cpu")
    prov = provenance(scale)
    from impl.methods.sdgp_semi import library_status

    meta: dict[str, Any] = {
        "config": cfg.__dict__,
        "device": str(device),
        "library": library_status(),
        "provenance": prov,
        "n": N_KEEP,
        "m": M_GROUP,
        "complete": False,
        "cut_at": None,
        "wall_seconds": None,
    }
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    partial = PartialRows(out) if out is not None else None
    at: dict[str, Any] = {"model": None, "dtype": None, "layer": None}

    def finish_row(r: dict[str, Any]) -> None:
        r.setdefault("model", "")
        r.update({k: v for k, v in prov.items() if k not in r})
        r.update({k: v for k, v in meta.get("flags", {}).items() if k not in r})  # TF32 etc.
        r.setdefault("device_name", prov.get("gpu_name") or prov.get("cpu_model"))
        rows.append(r)
        if partial is not None:
            partial.append(r)

    def write_now() -> None:
        meta["wall_seconds"] = round(time.perf_counter() - start, 1)
        if out is not None:
            write(rows, meta, out)

    completed = False
    try:
        with measure.pinned_flags(cudnn_benchmark=device.type == "cuda") as flags:
            meta["flags"] = flags
            for model_name in cfg.models:
                at["model"] = model_name
                layers = model_layers(model_name, cfg.batch, cfg.resolution)
                for dtype_name in cfg.dtypes:
                    at["dtype"] = dtype_name
                    layer_rows = []
                    said = ""  # a reason is printed once, until it changes
                    for layer in layers:
                        at["layer"] = layer.names[0]
                        r = measure_layer(layer, dtype_name, device, cfg)
                        _release()  # the layer's tensors are gone with the call
                        r["model"] = model_name
                        layer_rows.append(r)
                        finish_row(r)
                        dense, sparse = r.get("dense_dgrad_ms"), r.get("sparse_dgrad_ms")
                        reason = r["reason"]
                        shown = "(same reason)" if reason and reason == said else reason[:60]
                        said = reason or said
                        quiet_print(
                            f"{model_name} {dtype_name} {r['layer']:<22} x{r['count']:<2} "
                            f"{r['status']:<8} dense {_fmt(dense)} ms, est "
                            f"{_fmt(r['est_sparse_ms'])} ms, sparse {_fmt(sparse)} ms {shown}"
                        )
                    at["layer"] = "iteration"
                    finish_row(iteration_row(model_name, dtype_name, layer_rows, device, cfg))
                    write_now()
        completed = True
    except BaseException as exc:
        meta["cut_at"] = {**at, "reason": cut_reason(exc), "rows": len(rows)}
        raise
    finally:
        meta["complete"] = completed
        with ignoring_sigterm():  # a second SIGTERM must not cut the last write
            write_now()
            if partial is not None:
                partial.close(remove=completed)
        if not completed and out is not None:
            reason = (meta.get("cut_at") or {}).get("reason", "stopped")
            quiet_print(
                f"cut ({reason}) at {at}: wrote {len(rows)} rows to {out} (complete: false)"
            )
    return rows, meta


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if math.isfinite(value) else "-"
    return str(value)


def _saves(ms: Any) -> str:
    """``"saves X"`` for a saving, ``"slower by X"`` for a negative one (ms)."""
    if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms < 0:
        return f"slower by {_fmt(-float(ms))}"
    return f"saves {_fmt(ms)}"


def phase_verdict(layer_rows: Sequence[dict[str, Any]]) -> str | None:
    """Which phase alone already loses to dense, layer by layer: on how many of the measured
    layers the sparse GEMM alone is slower than a dense GEMM of its shape (``spmm_ms`` >
    ``dense_mm_ms``), and pruning alone or compression alone takes longer than the whole dense
    data gradient (``prune_ms`` / ``compress_ms`` > ``dense_dgrad_ms``). A verdict that one of
    them reaches on every layer does not hang on the others (the fold, say). None when no layer
    has the phase times."""
    timed = [
        r
        for r in layer_rows
        if all(
            r.get(k) is not None
            for k in ("spmm_ms", "dense_mm_ms", "prune_ms", "compress_ms", "dense_dgrad_ms")
        )
    ]
    if not timed:
        return None
    n = len(timed)
    gemm = sum(r["spmm_ms"] > r["dense_mm_ms"] for r in timed)
    prune = sum(r["prune_ms"] > r["dense_dgrad_ms"] for r in timed)
    compress = sum(r["compress_ms"] > r["dense_dgrad_ms"] for r in timed)
    return (
        f"Phase by phase: the sparse GEMM alone is slower than a dense GEMM of its shape on "
        f"{gemm} of {n} layers; pruning alone takes longer than the whole dense data gradient "
        f"on {prune} of {n}, compression alone on {compress} of {n}."
    )


def summary(rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    """Markdown: per model and dtype, the side-by-side layer table and the iteration totals."""
    prov = meta["provenance"]
    lib = meta["library"]
    lines = [
        "# SDGP on 2:4 sparse tensor cores: measured against the paper's estimate",
        "",
        f"commit `{prov.get('commit')}` (dirty: {prov.get('dirty')}), {prov.get('date')}; "
        f"device `{meta['device']}` ({prov.get('gpu_name') or prov.get('cpu_model')}); "
        f"torch {lib['torch']}, CUDA {prov.get('cuda')}, cuSPARSELt "
        f"{lib['cusparselt_version'] if lib['cusparselt_available'] else 'absent'}; "
        f"batch {meta['config']['batch']}, {meta['config']['resolution']}x"
        f"{meta['config']['resolution']}, {meta['config']['memory_format']}, pruning "
        f"{meta['config']['prune_method']}; {meta['wall_seconds']} s.",
        "",
        "Times are medians in ms. `est` = dense x n/m (the paper's estimate, Sec. IV-C); "
        "`sparse` = pruning + compression + sparse GEMM + fold, measured in one call. A "
        "`fallback` row did not run on sparse tensor cores (reason given) and has no sparse "
        "time. Generated by `python -m bench.sdgp_semi`; see docs/sdgp_semi.md.",
        "",
    ]
    if not meta.get("complete", True):
        cut = meta.get("cut_at") or {}
        lines += [
            f"**Incomplete**: the run was cut ({cut.get('reason', 'unknown')}) at "
            f"{cut.get('model')} {cut.get('dtype')} {cut.get('layer')}; the rows below are "
            "those measured before.",
            "",
        ]
    gpu_seen = prov.get("gpu_available")
    if not (prov.get("gpu_name") if gpu_seen is None else gpu_seen):
        lines += ["**CPU only**: every sparse row is a fallback; the times are a smoke test.", ""]
    blocks = list(dict.fromkeys((r["model"], r["dtype"]) for r in rows if "dtype" in r))
    for model, dtype in blocks:
        block = [r for r in rows if (r.get("model"), r.get("dtype")) == (model, dtype)]
        its = [r for r in block if r["kind"] == "iteration"]
        it = its[0] if its else None
        layer_rows = [
            r for r in rows if r["kind"] == "layer" and r["model"] == model and r["dtype"] == dtype
        ]
        lines += [f"## {model}, {dtype}", ""]
        head = [
            "layer",
            "x",
            "shape (C->K, k, s, HxW)",
            "dense",
            "est",
            "sparse",
            "speedup",
            "prune",
            "compress",
            "spmm",
            "fold",
            "mm dense",
            "status",
        ]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for r in layer_rows:
            shape = f"{r['C']}->{r['K']}, {r['kernel']}, s{r['stride']}, {r['H']}x{r['W']}"
            vals = [
                r["layer"],
                r["count"],
                shape,
                r.get("dense_dgrad_ms"),
                r.get("est_sparse_ms"),
                r.get("sparse_dgrad_ms"),
                r.get("speedup"),
                r.get("prune_ms"),
                r.get("compress_ms"),
                r.get("spmm_ms"),
                r.get("assemble_ms"),
                r.get("dense_mm_ms"),
                r["status"] + (f": {r['reason']}" if r["status"] != "ok" else ""),
            ]
            lines.append("| " + " | ".join(_fmt(v) for v in vals) + " |")
        if it is None:
            lines += ["", "The run was cut before this model and dtype's iteration row.", ""]
            continue
        slower = [r for r in layer_rows if r.get("sparse_faster") is False]
        measured = [r for r in layer_rows if r.get("sparse_faster") is not None]
        lines += [""]
        if measured:
            lines.append(
                f"Sparse slower than dense on {len(slower)} of {len(measured)} distinct layers"
                + (f": {', '.join(r['layer'] for r in slower)}." if slower else ".")
            )
            phases = phase_verdict(measured)
            if phases:
                lines.append(phases)
        if it["convs_sparse"]:
            semi_text = (
                f"semi-structured backend {_fmt(it.get('semi_backend_dgrad_ms'))} ms "
                f"({_saves(it.get('measured_saved_ms'))}; {it['convs_fallback']} convs on the "
                "reference path)"
            )
        else:
            semi_text = (
                "semi-structured backend: every conv took the reference path "
                f"({it['reason']}), so no sparse time"
            )
        lines += [
            "",
            f"Per iteration ({it['convs']} convs, {it['convs_sparse']} on sparse tensor cores): "
            f"dense data gradients {_fmt(it.get('dense_dgrad_ms'))} ms; paper's estimate "
            f"{_fmt(it.get('est_sparse_ms'))} ms ({_saves(it.get('est_saved_ms'))}); "
            f"{semi_text}; reference SDGP backend {_fmt(it.get('reference_ms'))} ms.",
        ]
        if it.get("dense_iter_ms") is not None:
            lines.append(
                f"Whole training iteration: dense {_fmt(it.get('dense_iter_ms'))} ms, estimated "
                f"SDGP {_fmt(it.get('est_iter_ms'))} ms, SDGP semi-structured backend "
                f"{_fmt(it.get('sdgp_semi_iter_ms'))} ms ({_fmt(it.get('semi_calls'))} sparse "
                f"calls, {_fmt(it.get('semi_fallback_calls'))} reference-path calls), reference "
                f"SDGP {_fmt(it.get('sdgp_reference_iter_ms'))} ms."
            )
        lines.append(
            f"Per epoch ({it['iterations_per_epoch']} iterations): dense data gradients "
            f"{_fmt(it.get('dense_dgrad_epoch_s'))} s, estimate "
            f"{_fmt(it.get('est_sparse_epoch_s'))} s, semi-structured backend "
            f"{_fmt(it.get('semi_backend_dgrad_epoch_s'))} s; whole epoch "
            f"dense {_fmt(it.get('dense_iter_epoch_s'))} s, estimated "
            f"{_fmt(it.get('est_iter_epoch_s'))} s, semi-structured backend "
            f"{_fmt(it.get('sdgp_semi_iter_epoch_s'))} s."
        )
        lines.append("")
    return "\n".join(lines) + "\n"


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write(rows: Sequence[dict[str, Any]], meta: dict[str, Any], out: Path) -> None:
    """``rows.csv``, ``rows.json`` (``{"meta": ..., "rows": [...]}``) and ``summary.md``."""
    out.mkdir(parents=True, exist_ok=True)
    cols = columns(rows)
    with open(out / "rows.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in cols})
    payload = {
        "meta": meta,
        "rows": [{k: _json_value(v) for k, v in r.items()} for r in rows],
    }
    (out / "rows.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    (out / "summary.md").write_text(summary(rows, meta))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line of ``python -m bench.sdgp_semi``; returns the exit status."""
    base = default_config()
    p = argparse.ArgumentParser(
        prog="python -m bench.sdgp_semi", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", type=Path, required=True, help="directory for rows.csv/json, summary")
    p.add_argument("--models", nargs="+", default=list(base.models))
    p.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=list(base.dtypes))
    p.add_argument("--batch", type=int, default=base.batch)
    p.add_argument("--resolution", type=int, default=base.resolution)
    p.add_argument("--backend", choices=("auto", "cusparselt", "cutlass"), default=base.backend)
    p.add_argument(
        "--prune-method", choices=("random", "magnitude", "rescaled"), default=base.prune_method
    )
    p.add_argument("--rescale", choices=("plane", "channel"), default=base.rescale)
    p.add_argument(
        "--memory-format", choices=("channels_last", "contiguous"), default=base.memory_format
    )
    p.add_argument("--no-iteration", action="store_true", help="skip whole-iteration timings")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    args = p.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda" and not base.small:
        print(
            f"the full sizes need a GPU; set {ENV_SMALL}=1 for the CPU smoke run", file=sys.stderr
        )
        return 2
    if device.type == "cuda" and device.index is not None:
        # the CUDA events and synchronisations of the timing, and the GPU the provenance
        # names, are the current GPU's: make it the one measured
        torch.cuda.set_device(device)
    cfg = BenchConfig(
        models=tuple(args.models),
        dtypes=tuple(args.dtypes),
        batch=args.batch,
        resolution=args.resolution,
        backend=args.backend,
        prune_method=args.prune_method,
        rescale=args.rescale,
        memory_format=args.memory_format,
        iteration=not args.no_iteration,
        small=base.small,
    )
    with terminate_gracefully():
        rows, meta = run(cfg, device, args.out)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"wrote {len(rows)} rows to {args.out} ({counts}) in {meta['wall_seconds']} s")
    errors = [r for r in rows if r["status"] in ("error",)]
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
