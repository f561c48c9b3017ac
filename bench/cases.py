"""The one module of benchmark cases: a grid of cases times a dict of implementations.

Both suites (asv: ``bench/asv_*.py``; pytest-benchmark: ``bench/pytest_suite/``) and the
runner (``python -m bench.run``) take their cases from here, so they measure the same thing.

Suites (``SUITES``) and what a case of each holds:

* ``calibration``: a device copy (GB/s) and a square float32 GEMM (TFLOP/s) on this
  machine: the *measured* bandwidth and peak the other rows are a fraction of.
* ``csr``: conversion of a layer's filter matrix ``F x C*R*S`` to CSR (ClickTrain Sec. 5.1):
  ``pattern_csr`` at predefined positions against cuSPARSE dense2csr (CuPy), torch
  ``to_sparse_csr`` and scipy.sparse; the paper's 256 x 1152 and the conv layers of
  ResNet-18/50 and VGG-16; sparsity 50..95%.
* ``spmm``: sparse filter matrix times dense im2col matrix (Sec. 5.2): ``pattern_spmm``
  against torch CSR SpMM (cuSPARSE / MKL), dense GEMM (cuBLAS fp32 with TF32 off, and
  TF32); the paper's 256 x 1152 times 1152 x 50176 (smaller N off the GPU scale).
* ``conv``: the paper's layer (128 -> 256 channels, 3x3) as ``pattern_conv2d`` against cuDNN
  (benchmark mode; TF32 off and on) or torch's dense CPU convolution; forward, and forward
  plus backward.
* ``nm_prune``: SDGP's N:M pruning of an output gradient, kernel against the torch
  reference and a device copy of the same bytes, m in 4, 8, 16, 32 (n = m / 2).
* ``pack``: the sparse Allreduce's gradient pack (gather at a mask's kept positions) and
  unpack (the bucket zeroed except the values scattered back) of ClickTrain Sec. 5.3, kernel
  against torch's index_select / zero_ + scatter_, masks at 50% (random, the same count per
  row) and 75% (pattern) sparsity; at the gpu scale a 72 MiB float32 gradient (the
  issue's bandwidth target is for tensors of 64 MB or more).
* ``iteration``: forward, backward and step time of one training iteration for each method
  in its post-pruning state (:mod:`bench.method_states`), ResNet-18/34/50 and VGG-16.
* ``allreduce``: bytes a data-parallel step all-reduces per method (deterministic).

Implementations are named ``"<name>@<device>"``; an implementation that cannot run here
raises :class:`bench.Unavailable` with the reason from :func:`prepare`.

Derived figures and their formulas (next to each benchmark, as a row's columns):

* ``tflops = flops / (median_ms * 1e-3) / 1e12``, ``flops`` the FLOPs the implementation
  executes (one multiply-add = 2 FLOPs): SpMM ``2 * nnz * N`` (sparse) or ``2 * F * K * N``
  (dense); conv forward ``2 * B * P * Q * nnz`` (sparse) or ``2 * B * P * Q * F * C * R *
  S`` (dense), three times that with the backward (data and weight gradient), a gradient
  that ran on the dense cuBLAS/cuDNN path counted dense; an iteration the executed count of
  :func:`impl.flops.training_flops` times the batch, plus :func:`dense_gradient_flops` where
  every call of a pattern layer's gradient ran dense (``flops`` empty, and
  ``flops_unknown`` saying why, where the calls were mixed). ``flops_nominal``
  is the useful (sparse) work, the same for every implementation of a case.
* ``gbps = bytes / (median_ms * 1e-3) / 1e9``, ``bytes`` the least traffic the operation
  needs (each operand read once, each result written once).
* ``frac_peak_spec = tflops / peak`` (:mod:`bench.peaks`, data sheet; GPU only),
  ``frac_peak_measured = tflops / calibration GEMM``; ``frac_bw_spec``, ``frac_bw_measured``
  the same for ``gbps``; ``speedup_vs_<impl> = median_ms(<impl>) / median_ms`` for every
  baseline of the same case on the same device.
* GPU kernel rows also carry ``host_ms`` (host wall time per call), ``amortized_ms``
  (per-call time of back-to-back calls), ``issue_ms`` (the host's time to queue one of them)
  and ``host_bound`` (:func:`bench.measure.host_bound`):
  a host-bound row times launch overhead, not the kernel.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import math
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from bench import Unavailable, measure
from bench.sparsity import benchmark_mask

SUITES: tuple[str, ...] = (
    "calibration",
    "csr",
    "spmm",
    "conv",
    "nm_prune",
    "pack",
    "iteration",
    "allreduce",
)
SCALES: tuple[str, ...] = ("smoke", "cpu", "gpu")
#: Set to 1 for the small sizes of a CI smoke run (the same as PDTBENCH_BENCH_SCALE=smoke).
ENV_SMALL = "PDTBENCH_BENCH_SMALL"
#: "smoke", "cpu" or "gpu": the sizes of the cases.
ENV_SCALE = "PDTBENCH_BENCH_SCALE"
#: The paper's filter matrix: 256 filters of 128 channels, 3x3 (ClickTrain Sec. 5.1, Fig. 9).
PAPER_WEIGHT = (256, 128, 3, 3)
PAPER_SPARSITIES = (0.5, 0.65, 0.75, 0.8, 0.9, 0.95)
SPMM_SPARSITIES = (0.0, 0.5, 0.65, 0.75, 0.8, 0.9, 0.95)
NM_MS = (4, 8, 16, 32)
#: Sparsities of the pack / unpack masks: half and a quarter of the gradients kept.
PACK_SPARSITIES = (0.5, 0.75)
CSR_MODELS = ("resnet18", "resnet50", "vgg16")
ITERATION_METHODS = ("dense", "clicktrain", "prunetrain", "sdgp", "campfire")


# -- scales -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScaleConfig:
    """Sizes and repeat counts of one scale.

    Args:
        name: ``"smoke"``, ``"cpu"`` or ``"gpu"``.
        devices: devices whose implementations enter the grid.
        csr_models: models whose conv layer shapes join the paper's in the CSR grid.
        csr_sparsities: sparsities of the paper's shape; ``layer_sparsities`` of the others.
        extra_shapes: odd weight shapes ``(F, C, R, S)`` added to the CSR and SpMM grids.
        spmm_n: columns of the dense operand (the paper: 50176 = 224 * 224).
        sparsities: sparsities of the SpMM and conv grids.
        conv_input: ``(B, C, H, W)`` of the conv input (the paper: 1 x 128 x 224 x 224).
        conv_passes: ``"forward"`` and/or ``"forward+backward"``.
        nm_shape: shape of the gradient pruned by N:M (NCHW).
        iteration: ``(model, stem, resolution, batch)`` per iteration case.
        allreduce: ``(model, stem, num_classes)`` per Allreduce case.
        copy_bytes: bytes of the calibration copy; ``gemm_n``: size of the calibration GEMM.
        cpu_warmup, cpu_repeats: CPU timing of a kernel; ``cpu_min_time_s``,
            ``cpu_max_repeats``: more calls while the timed ones sum to less than that time
            (:func:`bench.measure.cpu_timing`).
        cuda_warmup_ms, cuda_rep_ms: GPU timing budget of a kernel (do_bench style).
        iter_warmup, iter_repeats: iterations before and during timing of the iteration suite.
        pytest_cuda_rounds: rounds of a GPU kernel in the pytest-benchmark suite.
        pack_weight: the conv weight ``(F, C, R, S)`` whose gradient the pack suite packs.
    """

    name: str
    devices: tuple[str, ...]
    csr_models: tuple[str, ...]
    csr_sparsities: tuple[float, ...]
    layer_sparsities: tuple[float, ...]
    extra_shapes: tuple[tuple[int, int, int, int], ...]
    spmm_n: int
    sparsities: tuple[float, ...]
    conv_input: tuple[int, int, int, int]
    conv_passes: tuple[str, ...]
    nm_shape: tuple[int, ...]
    iteration: tuple[tuple[str, str, int, int], ...]
    allreduce: tuple[tuple[str, str, int], ...]
    copy_bytes: int
    gemm_n: int
    cpu_warmup: int = 1
    cpu_repeats: int = 5
    cpu_min_time_s: float = 0.0
    cpu_max_repeats: int | None = None
    cuda_warmup_ms: float = 25.0
    cuda_rep_ms: float = 100.0
    iter_warmup: int = 1
    iter_repeats: int = 3
    pytest_cuda_rounds: int = 20
    pack_weight: tuple[int, int, int, int] = (64, 32, 3, 3)


_ALLREDUCE_MODELS = tuple(
    (m, stem, classes)
    for m in ("resnet18", "resnet34", "resnet50", "vgg16")
    for stem, classes in (("cifar", 10), ("imagenet", 1000))
)

SCALE_CONFIGS: dict[str, ScaleConfig] = {
    "smoke": ScaleConfig(
        name="smoke",
        devices=("cpu", "cuda"),
        csr_models=(),
        csr_sparsities=(0.5, 0.95),
        layer_sparsities=(),
        extra_shapes=((37, 13, 3, 3),),
        spmm_n=196,
        sparsities=(0.0, 0.75, 0.95),
        conv_input=(1, 128, 14, 14),
        conv_passes=("forward", "forward+backward"),
        nm_shape=(4, 64, 8, 8),
        iteration=(("resnet20", "cifar", 32, 4),),
        allreduce=(("resnet20", "cifar", 10),),
        copy_bytes=16 * 2**20,
        gemm_n=256,
        cpu_warmup=1,
        cpu_repeats=3,
        cuda_warmup_ms=5.0,
        cuda_rep_ms=20.0,
        iter_warmup=1,
        iter_repeats=2,
    ),
    "cpu": ScaleConfig(
        name="cpu",
        devices=("cpu", "cuda"),
        csr_models=CSR_MODELS,
        csr_sparsities=PAPER_SPARSITIES,
        layer_sparsities=(0.5, 0.75, 0.95),
        extra_shapes=((37, 13, 3, 3),),
        spmm_n=3136,
        sparsities=SPMM_SPARSITIES,
        conv_input=(1, 128, 56, 56),
        conv_passes=("forward", "forward+backward"),
        nm_shape=(16, 256, 28, 28),
        pack_weight=(512, 256, 3, 3),
        iteration=(
            ("resnet18", "cifar", 32, 8),
            ("resnet34", "cifar", 32, 4),
            ("resnet50", "imagenet", 64, 4),
            ("vgg16", "cifar", 32, 8),
        ),
        allreduce=_ALLREDUCE_MODELS,
        copy_bytes=64 * 2**20,
        gemm_n=1024,
        cpu_warmup=1,
        cpu_repeats=5,
        cpu_min_time_s=0.25,
        cpu_max_repeats=50,
        iter_warmup=1,
        iter_repeats=3,
    ),
    # The layer shapes of the CSR grid at one sparsity at the gpu scale (the paper's shape
    # keeps all six): 174 pairs (29 cases x 6 implementations), not 864, so that the rows
    # fit one device call of scripts/gpu/bench.sh (docs/gpu-session.md).
    "gpu": ScaleConfig(
        name="gpu",
        devices=("cuda",),
        csr_models=CSR_MODELS,
        csr_sparsities=PAPER_SPARSITIES,
        layer_sparsities=(0.95,),
        extra_shapes=(),
        spmm_n=50176,
        sparsities=SPMM_SPARSITIES,
        conv_input=(1, 128, 224, 224),
        conv_passes=("forward", "forward+backward"),
        nm_shape=(128, 256, 56, 56),
        pack_weight=(1024, 2048, 3, 3),
        iteration=tuple(
            (m, stem, res, batch)
            for m in ("resnet18", "resnet34", "resnet50", "vgg16")
            for stem, res, batch in (("cifar", 32, 128), ("imagenet", 224, 64))
        ),
        allreduce=_ALLREDUCE_MODELS,
        copy_bytes=1024 * 2**20,
        gemm_n=8192,
        iter_warmup=3,
        iter_repeats=10,
    ),
}


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@functools.lru_cache(maxsize=1)
def _gpu_visible() -> bool:
    # torch's own answer (a CUDA build that finds a device; it creates no CUDA context), not
    # NVML's: NVML may be missing (no pynvml) where torch has a GPU.
    return torch.version.cuda is not None and torch.cuda.is_available()


def resolve_scale(scale: str | None = None) -> str:
    """The scale to run: ``scale`` if given, else the environment, else by the machine.

    ``PDTBENCH_BENCH_SMALL=1`` selects ``"smoke"`` (the small-sizes switch of CI);
    otherwise ``PDTBENCH_BENCH_SCALE``; otherwise ``"gpu"`` where
    ``torch.cuda.is_available()``, ``"cpu"`` elsewhere. Raises ValueError naming the valid scales.
    """
    if scale is None:
        if _truthy(os.environ.get(ENV_SMALL)):
            scale = "smoke"
        else:
            scale = os.environ.get(ENV_SCALE) or ("gpu" if _gpu_visible() else "cpu")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; valid: {', '.join(SCALES)}")
    return scale


def scale_config(scale: str | None = None) -> ScaleConfig:
    """The :class:`ScaleConfig` of :func:`resolve_scale` ``(scale)``."""
    return SCALE_CONFIGS[resolve_scale(scale)]


# -- cases and implementations ----------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One point of a suite's grid.

    Args:
        suite: one of :data:`SUITES`.
        name: unique within the suite and scale (used as the asv parameter and pytest id).
        params: what the case is (shapes, sparsity, model, ...), plain JSON-able values.
    """

    suite: str
    name: str
    params: dict[str, Any] = field(hash=False, compare=False)


@dataclass(frozen=True)
class Impl:
    """One implementation of a suite's operation.

    Args:
        name: ``"<name>@<device>"``, unique within the suite.
        label: what it is, in words (library and mode).
        device: ``"cpu"`` or ``"cuda"``.
        math: the arithmetic it runs, for the peak it is a fraction of: ``"fp32"``,
            ``"tf32"`` or ``"memory"`` (bandwidth-bound), or ``"none"``.
        baseline: rows of other implementations get a ``speedup_vs_<name>`` column.
        kinds: the case kinds it applies to (``case.params["kind"]``); None: every case.
        options: implementation options (``impl`` of the pattern ops, flags, method).
    """

    name: str
    label: str
    device: str
    math: str = "fp32"
    baseline: bool = False
    kinds: tuple[str, ...] | None = None
    options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def accepts(self, case: Case) -> bool:
        """Whether this implementation applies to ``case``."""
        return self.kinds is None or case.params.get("kind") in self.kinds


@dataclass
class Prepared:
    """A case ready to run on one implementation.

    Args:
        phases: ``(name, fn)`` run in order per iteration; ``fn(i)`` gets the call index
            (inputs rotate with it). Kernels have one phase, ``"op"``.
        device: where it runs.
        flops: executed FLOPs of one call (all phases), or None.
        flops_nominal: useful FLOPs of the case (the same for every implementation).
        phase_flops: executed FLOPs per phase (iteration suite).
        bytes: least bytes one call must move, or None.
        flags: TF32 and cuDNN flags to pin while it runs (:func:`bench.measure.pinned_flags`).
        info: extra columns for the row (nnz, achieved sparsity, method settings).
        values: for value-only suites (``allreduce``): name -> value; no phases.
        units: unit of each of ``values``.
        timed_phases: the phases whose medians sum to the row's ``median_ms``.
    """

    phases: list[tuple[str, Callable[[int], Any]]]
    device: torch.device
    flops: float | None = None
    flops_nominal: float | None = None
    phase_flops: dict[str, float] = field(default_factory=dict)
    bytes: float | None = None
    flags: dict[str, bool] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)
    timed_phases: tuple[str, ...] = ("op",)

    def call(self, i: int) -> None:
        """Run every phase once with call index ``i`` (no synchronisation)."""
        for _, fn in self.phases:
            fn(i)


def _impl(name, label, device, math="fp32", baseline=False, kinds=None, **options) -> Impl:
    return Impl(f"{name}@{device}", label, device, math, baseline, kinds, options)


def implementations(suite: str, scale: str | None = None) -> dict[str, Impl]:
    """The implementations of ``suite`` whose device is in the scale's ``devices`` (the CPU
    for ``allreduce``, whose byte counts need no GPU)."""
    cfg = scale_config(scale)
    # Allreduce bytes are deterministic: counted on the CPU at every scale.
    devices = ("cpu",) if _check_suite(suite) == "allreduce" else cfg.devices
    impls: list[Impl] = []
    for dev in devices:
        impls += _IMPLS[suite](dev)
    return {i.name: i for i in impls}


def _check_suite(suite: str) -> str:
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; valid: {', '.join(SUITES)}")
    return suite


def _calibration_impls(dev: str) -> list[Impl]:
    copy = _impl(
        "copy", "torch Tensor.copy_ (device memory to memory)", dev, "memory", kinds=("copy",)
    )
    if dev == "cpu":
        gemm = [_impl("torch_mm", "torch.mm float32 (CPU BLAS)", dev, "fp32", kinds=("gemm",))]
    else:
        gemm = [
            _impl(
                "cublas_fp32",
                "torch.mm float32, TF32 off (cuBLAS)",
                dev,
                "fp32",
                kinds=("gemm",),
                tf32=False,
            ),
            _impl(
                "cublas_tf32",
                "torch.mm float32 inputs, TF32 on (cuBLAS)",
                dev,
                "tf32",
                kinds=("gemm",),
                tf32=True,
            ),
        ]
    return [copy, *gemm, *_launch_impls(dev)]


#: The launch levels of the ``launch`` calibration case, from torch's own launch to the whole
#: op: where the host time of a short CUDA call goes (the first H200 run found 0.08-0.16 ms per
#: call of the project's ops, docs/gpu-results.md).
LAUNCH_LEVELS: dict[str, str] = {
    "torch_launch": "one torch kernel on a 1-element tensor (Tensor.add_): torch's own launch",
    "cupy_raw_launch": "CuPy RawKernel call of pdt_csr_gather_f32 (a 1 x 9 matrix) on torch's "
    "stream, the kernel and arguments prepared once",
    "loader_launch": "impl.cuda.loader.launch of the same kernel: arguments converted and "
    "checked, CuPy's device and torch's stream entered, per call",
    "pattern_csr_op": "impl.ops.pattern_csr(impl='cuda') of the same 1 x 9 matrix: the whole "
    "op (its custom op, checks and launch)",
}


def _launch_impls(dev: str) -> list[Impl]:
    levels = ["torch_launch"] if dev == "cpu" else list(LAUNCH_LEVELS)
    return [
        _impl(name, LAUNCH_LEVELS[name], dev, "memory", kinds=("launch",), level=name)
        for name in levels
    ]


def _csr_impls(dev: str) -> list[Impl]:
    out = [
        _impl(
            "pattern_csr[ref]",
            "impl.ops.pattern_csr, torch reference (gather)",
            dev,
            "memory",
            impl="ref",
        ),
        _impl("torch_to_sparse_csr", "torch Tensor.to_sparse_csr", dev, "memory", baseline=True),
        _impl(
            "copy", "device copy of the nnz values (bandwidth bound)", dev, "memory", baseline=True
        ),
        _impl(
            "copy_moved",
            "device copy of as many bytes as pattern_csr moves (values, columns, row pointers)",
            dev,
            "memory",
            baseline=True,
        ),
    ]
    if dev == "cpu":
        out.append(
            _impl("scipy_csr", "scipy.sparse.csr_matrix(dense)", dev, "memory", baseline=True)
        )
    else:
        out += [
            _impl(
                "pattern_csr[cuda]", "impl.ops.pattern_csr, CUDA kernel", dev, "memory", impl="cuda"
            ),
            _impl(
                "cusparse_dense2csr",
                "cuSPARSE denseToSparse via CuPy: csc_matrix(W^T), W's CSR arrays, no copy",
                dev,
                "memory",
                baseline=True,
            ),
        ]
    return out


def _spmm_impls(dev: str) -> list[Impl]:
    out = [
        _impl("pattern_spmm[ref]", "impl.ops.pattern_spmm, torch reference", dev, impl="ref"),
        _impl(
            "torch_csr_spmm",
            f"torch.addmm(out, CSR, dense, beta=0) ({'MKL' if dev == 'cpu' else 'cuSPARSE'})",
            dev,
            baseline=True,
        ),
    ]
    if dev == "cpu":
        out.append(_impl("torch_mm", "torch.mm float32, dense (CPU BLAS)", dev, baseline=True))
    else:
        out += [
            _impl(
                "pattern_spmm[cuda]",
                "impl.ops.pattern_spmm, CUDA kernel (the fastest of the proven ones, timed once)",
                dev,
                impl="cuda",
            ),
            _impl(
                "pattern_spmm[cuda,warp_row]",
                "impl.ops.pattern_spmm, CUDA kernel, one warp per row (Sec. 5.2's design)",
                dev,
                impl="cuda",
                paths={"spmm": "warp_row"},
            ),
            _impl(
                "pattern_spmm[cuda,row_tiled]",
                "impl.ops.pattern_spmm, CUDA kernel, several rows per warp",
                dev,
                impl="cuda",
                paths={"spmm": "row_tiled"},
            ),
            _impl(
                "pattern_spmm[cuda,pipelined]",
                "impl.ops.pattern_spmm, CUDA kernel, several rows per warp, B's next tile "
                "copied in (cp.async) during the current one (not in the automatic choice)",
                dev,
                impl="cuda",
                paths={"spmm": "pipelined"},
            ),
            _impl(
                "cublas_fp32", "torch.mm float32, TF32 off (cuBLAS)", dev, baseline=True, tf32=False
            ),
            _impl(
                "cublas_tf32",
                "torch.mm float32 inputs, TF32 on (cuBLAS)",
                dev,
                "tf32",
                baseline=True,
                tf32=True,
            ),
        ]
    return out


def _conv_impls(dev: str) -> list[Impl]:
    out = [
        _impl(
            "pattern_conv2d[ref]",
            "impl.ops.pattern_conv2d, torch reference (unfold + CSR)",
            dev,
            impl="ref",
        ),
    ]
    if dev == "cpu":
        out += [
            _impl(
                "pattern_conv2d[cpu]",
                "impl.ops.pattern_conv2d, compiled direct sparse conv (on torch's threads)",
                dev,
                impl="cpu",
            ),
            _impl("torch_conv2d", "torch conv2d float32, dense (oneDNN)", dev, baseline=True),
        ]
    else:
        out += [
            _impl(
                "pattern_conv2d[cuda]",
                "impl.ops.pattern_conv2d, CUDA kernels (gradient paths timed with cuDNN's)",
                dev,
                impl="cuda",
            ),
            _impl(
                "pattern_conv2d[cuda,sparse_grads]",
                "impl.ops.pattern_conv2d, CUDA kernels, transposed SpMM and SDDMM gradients",
                dev,
                kinds=("conv_backward",),
                impl="cuda",
                paths={"input_grad": "spmm", "weight_grad": "sddmm"},
            ),
            _impl(
                "cudnn_fp32",
                "cuDNN conv2d float32, TF32 off, benchmark mode",
                dev,
                baseline=True,
                tf32=False,
            ),
            _impl(
                "cudnn_tf32",
                "cuDNN conv2d float32 inputs, TF32 on, benchmark mode",
                dev,
                "tf32",
                baseline=True,
                tf32=True,
            ),
        ]
    return out


def _nm_impls(dev: str) -> list[Impl]:
    out = [
        _impl(
            "nm_prune[ref]",
            "impl.ops.nm_prune, torch reference",
            dev,
            "memory",
            baseline=True,
            impl="ref",
        ),
        _impl("copy", "device copy of the same bytes", dev, "memory", baseline=True),
    ]
    if dev == "cuda":
        out.append(
            _impl(
                "nm_prune[cuda]",
                "impl.ops.nm_prune, CUDA kernel",
                dev,
                "memory",
                impl="cuda",
            )
        )
    else:
        out.append(
            _impl(
                "nm_prune[cpu]",
                "impl.ops.nm_prune, compiled CPU kernel (on torch's threads)",
                dev,
                "memory",
                impl="cpu",
            )
        )
    return out


def _pack_impls(dev: str) -> list[Impl]:
    out = []
    for op in ("pack", "unpack"):
        what = (
            "torch.index_select: gather at the kept positions (int32 positions)"
            if op == "pack"
            else "torch zero_ then scatter_ to the kept positions (int64 positions: torch's "
            "scatter takes no int32)"
        )
        out.append(
            _impl(
                f"grad_{op}[ref]",
                what,
                dev,
                "memory",
                baseline=True,
                kinds=(op,),
                impl="ref",
            )
        )
        if dev == "cuda":
            out.append(
                _impl(
                    f"grad_{op}[cuda]",
                    "impl.ops.pack_cuda.pack, CUDA kernel"
                    if op == "pack"
                    else "impl.ops.pack_cuda.expand, CUDA kernel: zeros and values in one pass",
                    dev,
                    "memory",
                    kinds=(op,),
                    impl="cuda",
                )
            )
    if dev == "cuda":
        out.append(
            _impl(
                "grad_unpack[cuda,scatter]",
                "torch zero_ then impl.ops.pack_cuda.unpack, CUDA scatter kernel",
                dev,
                "memory",
                kinds=("unpack",),
                impl="cuda",
                variant="scatter",
            )
        )
    return out


def _iteration_impls(dev: str) -> list[Impl]:
    from bench.method_states import METHOD_STATES

    return [
        _impl(m, f"{m} (bench.method_states)", dev, "fp32", baseline=(m == "dense"), method=m)
        for m in METHOD_STATES
    ]


def _allreduce_impls(dev: str) -> list[Impl]:
    from bench.method_states import METHOD_STATES

    return [
        _impl(
            m,
            f"{m}: gradient payload (bench.method_states.allreduce_payload)",
            dev,
            "none",
            baseline=(m == "dense"),
            method=m,
        )
        for m in METHOD_STATES
    ]


_IMPLS: dict[str, Callable[[str], list[Impl]]] = {
    "calibration": _calibration_impls,
    "csr": _csr_impls,
    "spmm": _spmm_impls,
    "conv": _conv_impls,
    "nm_prune": _nm_impls,
    "pack": _pack_impls,
    "iteration": _iteration_impls,
    "allreduce": _allreduce_impls,
}


@functools.cache
def conv_shapes(model: str) -> tuple[tuple[tuple[int, int, int, int], tuple[str, ...]], ...]:
    """Distinct conv weight shapes ``(F, C, R, S)`` of ``model`` (ImageNet stem, groups 1,
    more than 3 input channels), each with the names of the layers that have it."""
    from impl.models import create

    with torch.device("meta"):
        net = create(model, num_classes=1000, stem="imagenet")
    found: dict[tuple[int, int, int, int], list[str]] = {}
    for name, m in net.named_modules():
        if isinstance(m, torch.nn.Conv2d) and m.groups == 1 and m.in_channels > 3:
            found.setdefault(tuple(m.weight.shape), []).append(name)
    return tuple((shape, tuple(names)) for shape, names in found.items())


def _shape_name(shape: Sequence[int]) -> str:
    f, c, r, s = shape
    return f"{f}x{c}x{r}x{s}"


def _pct(s: float) -> str:
    return f"s{round(100 * s):02d}"


def grid(suite: str, scale: str | None = None) -> list[Case]:
    """The cases of ``suite`` at ``scale`` (see the module docstring), in a stable order."""
    cfg = scale_config(scale)
    suite = _check_suite(suite)
    cases: list[Case] = []
    if suite == "calibration":
        cases.append(
            Case(
                suite,
                f"copy-{cfg.copy_bytes // 2**20}MiB",
                {"kind": "copy", "bytes": cfg.copy_bytes},
            )
        )
        cases.append(Case(suite, f"gemm-{cfg.gemm_n}", {"kind": "gemm", "n": cfg.gemm_n}))
        cases.append(Case(suite, "launch-1x9", {"kind": "launch"}))
    elif suite == "csr":
        shapes: list[tuple[tuple[int, ...], str, tuple[float, ...]]] = [
            (PAPER_WEIGHT, "paper", cfg.csr_sparsities)
        ]
        shapes += [(s, "odd", cfg.csr_sparsities) for s in cfg.extra_shapes]
        users: dict[tuple[int, ...], list[str]] = {}
        for model in cfg.csr_models:
            for shape, _names in conv_shapes(model):
                users.setdefault(shape, []).append(model)
        for shape, models in users.items():
            if shape not in {PAPER_WEIGHT, *cfg.extra_shapes}:
                shapes.append((shape, "+".join(models), cfg.layer_sparsities))
        for shape, source, sparsities in shapes:
            for s in sparsities:
                name = f"{'paper-' if source == 'paper' else ''}{_shape_name(shape)}-{_pct(s)}"
                cases.append(
                    Case(
                        suite,
                        name,
                        {
                            "kind": "csr",
                            "weight_shape": list(shape),
                            "sparsity": s,
                            "source": source,
                        },
                    )
                )
    elif suite == "spmm":
        for shape, source in [(PAPER_WEIGHT, "paper")] + [(s, "odd") for s in cfg.extra_shapes]:
            n = cfg.spmm_n if source == "paper" else 101
            for s in cfg.sparsities:
                k = math.prod(shape[1:])
                name = f"{'paper-' if source == 'paper' else ''}{shape[0]}x{k}x{n}-{_pct(s)}"
                cases.append(
                    Case(
                        suite,
                        name,
                        {
                            "kind": "spmm",
                            "weight_shape": list(shape),
                            "n": n,
                            "sparsity": s,
                            "source": source,
                        },
                    )
                )
    elif suite == "conv":
        b, c, h, w = cfg.conv_input
        for p in cfg.conv_passes:
            for s in cfg.sparsities:
                name = f"paper-{b}x{c}x{h}x{w}-{'fwd' if p == 'forward' else 'fwdbwd'}-{_pct(s)}"
                cases.append(
                    Case(
                        suite,
                        name,
                        {
                            "kind": "conv" if p == "forward" else "conv_backward",
                            "weight_shape": list(PAPER_WEIGHT),
                            "input_shape": list(cfg.conv_input),
                            "padding": 1,
                            "stride": 1,
                            "sparsity": s,
                            "pass": p,
                        },
                    )
                )
    elif suite == "nm_prune":
        # rescaled magnitude (statistics, then the selection; its cases keep the names they
        # had before magnitude was timed too) and magnitude (the selection alone), NCHW at
        # every m; and 2:4 channels-last, the SDGP authors' layout (groups contiguous)
        shape = "x".join(map(str, cfg.nm_shape))
        grid = [(meth, m, "nchw") for meth in ("rescaled", "magnitude") for m in NM_MS]
        grid += [(meth, 4, "channels_last") for meth in ("rescaled", "magnitude")]
        for method, m, layout in grid:
            n = m // 2
            suffix = "" if method == "rescaled" else f"-{method}"
            suffix += "" if layout == "nchw" else "-nhwc"
            cases.append(
                Case(
                    suite,
                    f"{shape}-{n}of{m}{suffix}",
                    {
                        "kind": "nm",
                        "shape": list(cfg.nm_shape),
                        "n": n,
                        "m": m,
                        "method": method,
                        "dim": 1,
                        "layout": layout,
                    },
                )
            )
    elif suite == "pack":
        shape = list(cfg.pack_weight)
        for op in ("pack", "unpack"):
            for s in PACK_SPARSITIES:
                cases.append(
                    Case(
                        suite,
                        f"{op}-{'x'.join(map(str, shape))}-{_pct(s)}",
                        {"kind": op, "weight_shape": shape, "sparsity": s},
                    )
                )
    elif suite == "iteration":
        for model, stem, res, batch in cfg.iteration:
            cases.append(
                Case(
                    suite,
                    f"{model}-{stem}{res}-b{batch}",
                    {
                        "kind": "iteration",
                        "model": model,
                        "stem": stem,
                        "resolution": res,
                        "batch": batch,
                        "num_classes": 10 if stem == "cifar" else 1000,
                    },
                )
            )
    else:
        for model, stem, classes in cfg.allreduce:
            cases.append(
                Case(
                    suite,
                    f"{model}-{stem}-c{classes}",
                    {"kind": "allreduce", "model": model, "stem": stem, "num_classes": classes},
                )
            )
    return cases


def pairs(suite: str, scale: str | None = None) -> list[tuple[Case, Impl]]:
    """Every (case, implementation) of ``suite`` at ``scale`` that applies (the grid)."""
    impls = implementations(suite, scale)
    return [(c, i) for c in grid(suite, scale) for i in impls.values() if i.accepts(c)]


def find(suite: str, case_name: str, impl_name: str, scale: str | None = None) -> tuple[Case, Impl]:
    """The case and implementation of these names (ValueError listing the valid ones)."""
    cases = {c.name: c for c in grid(suite, scale)}
    impls = implementations(suite, scale)
    if case_name not in cases:
        raise ValueError(f"no case {case_name!r} in suite {suite!r}; valid: {', '.join(cases)}")
    if impl_name not in impls:
        raise ValueError(f"no implementation {impl_name!r}; valid: {', '.join(impls)}")
    return cases[case_name], impls[impl_name]


# -- preparing --------------------------------------------------------------------------------
def _device(impl: Impl) -> torch.device:
    # torch marks sparse CSR as beta on every construction; the ops used here are stable.
    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
    if impl.device == "cuda":
        if not torch.cuda.is_available():
            raise Unavailable(f"{impl.name} needs a CUDA GPU; none is available here")
        return torch.device("cuda")
    return torch.device("cpu")


def _gen(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _randn(shape: Sequence[int], device: torch.device, seed: int) -> torch.Tensor:
    # Never zeros: normal values, seeded.
    return torch.randn(tuple(shape), generator=_gen(seed, device), device=device)


def _rotated(shape: Sequence[int], device: torch.device, seed: int) -> list[torch.Tensor]:
    return measure.rotated(lambda k: _randn(shape, device, seed + k))


def _outputs_like(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """One output per rotated input, for a copy baseline: a copy writing every call into one
    buffer finds it in the cache, and read 1.2-2.2x the calibration copy's bandwidth on a CPU
    (46 GB/s into one 12.8 MB output against 28-33 GB/s rotating outputs and 30-36 GB/s for
    the 64 MiB calibration copy); rotating outputs as well as inputs times memory both ways.
    Each output is written once here (a clone), so no timed call pays the first touch of its
    pages (uninitialised outputs read 4-8 GB/s on a CPU: page faults, not copying)."""
    return [x.clone() for x in inputs]


def _holding_outputs(
    fn: Callable[[int], torch.Tensor], out_bytes: float, device: torch.device
) -> tuple[Callable[[int], torch.Tensor], int]:
    """``fn`` (an op that allocates its result) with its last results held, so that each call
    writes memory of its own, as the copy baselines' rotated outputs are (a result freed at
    once gets the same block from the allocator next call, and is found in the cache); and
    how many are held (:func:`bench.measure.rotation_sets` of ``out_bytes``). Allocating is
    part of such an op, so it stays in the timing."""
    sets = measure.rotation_sets(out_bytes, device)
    held: list[torch.Tensor | None] = [None] * sets

    def run(i: int) -> torch.Tensor:
        out = fn(i)
        held[i % sets] = out  # the result of ``sets`` calls ago is freed after this one's
        return out

    return run, sets


def _cuda_kernels_check(impl: Impl, source: str = "pattern.cu") -> None:
    """Refuse an ``impl=cuda`` row whose kernels of ``source`` cannot run.

    ``Unavailable`` (a skipped row, with the reason) where this machine runs no kernel at all
    (no CUDA GPU, no CuPy); ``RuntimeError`` (an error row, a failed run) where the GPU and CuPy
    are there and ``source`` fails to compile or load: a broken kernel is a failure to report,
    not a case to skip. The message carries the loader's reason (the compiler's log)."""
    if impl.options.get("impl") != "cuda":
        return
    _require_kernels(source)


def _require_kernels(source: str) -> None:
    """:func:`_cuda_kernels_check`'s refusal, for a row that runs ``source``'s kernels."""
    from impl.cuda import cuda_kernels_error, has_cuda_kernels, kernels_environment_error

    if has_cuda_kernels(sources=(source,)):
        return
    environment = kernels_environment_error()
    if environment is not None:
        raise Unavailable(f"the CUDA kernels cannot run here: {environment}")
    raise RuntimeError(f"the CUDA kernels of {source} fail to load: {cuda_kernels_error()}")


#: Suites whose GPU rows run with cuDNN's benchmark mode on (their preparations pin it).
_CUDNN_SUITES = ("conv", "iteration")


def _flag_options(impl: Impl, *, cudnn: bool = False) -> dict[str, bool]:
    tf32 = bool(impl.options.get("tf32", False))
    return {"tf32_matmul": tf32, "tf32_cudnn": tf32, "cudnn_benchmark": cudnn}


def _masked_weight(shape, sparsity, device, seed):
    mask, kind = benchmark_mask(tuple(shape), sparsity, seed)
    mask = mask.to(device)
    w = _randn(shape, device, seed) * mask
    return w, mask, kind


def _prepare_launch(impl: Impl) -> Prepared:
    """One short call at the launch level ``impl.options["level"]`` (:data:`LAUNCH_LEVELS`):
    its ``issue_ms`` is the host time of a call, ``amortized_ms`` the per-call time of calls
    back to back."""
    dev = _device(impl)
    level = impl.options["level"]
    if level == "torch_launch":
        x = torch.zeros(1, device=dev)
        return Prepared([("op", lambda i: x.add_(1.0))], dev, bytes=8.0, info={"level": level})
    _cuda_kernels_check(impl)
    import numpy as np

    from impl.cuda import loader
    from impl.ops import pattern_csr, pattern_index

    w = _randn((1, 1, 3, 3), dev, 0)
    index = pattern_index(torch.ones(1, 1, 3, 3, dtype=torch.bool, device=dev))
    val = torch.empty(9, device=dev)
    name, grid, block = "pdt_csr_gather_f32", (1, 1, 1), (128, 1, 1)
    args = [w, np.int64(9), index.row_ptr, index.col_ind, val, np.int64(1)]
    if level == "pattern_csr_op":

        def fn(i):
            return pattern_csr(w, index.row_ptr, index.col_ind, impl="cuda", index=index)

    elif level == "loader_launch":

        def fn(i):
            loader.launch("pattern.cu", name, grid, block, args, dev)
            return val

    elif level == "cupy_raw_launch":
        cupy = _cupy()[0]
        device_index = loader._device_index(dev)
        kernel = loader.get_function("pattern.cu", name, device_index)
        cargs = loader.kernel_args(args, device_index, name)
        stream = loader.torch_stream(device_index)

        def fn(i):
            with cupy.cuda.Device(device_index), stream:
                kernel(grid, block, cargs)
            return val

    else:  # pragma: no cover - guarded by implementations()
        raise ValueError(f"unknown launch level {level}")
    return Prepared([("op", fn)], dev, bytes=2.0 * 9 * 4, info={"level": level})


def _prepare_calibration(case: Case, impl: Impl, cfg: ScaleConfig) -> Prepared:
    dev = _device(impl)
    if case.params["kind"] == "launch":
        return _prepare_launch(impl)
    if case.params["kind"] == "copy":
        n = case.params["bytes"] // 4
        src, dst = _randn((n,), dev, 0), torch.empty(n, device=dev)
        return Prepared(
            [("op", lambda i: dst.copy_(src))], dev, bytes=2.0 * n * 4, flags=_flag_options(impl)
        )
    n = case.params["n"]
    a, b = _randn((n, n), dev, 0), _randn((n, n), dev, 1)
    out = torch.empty(n, n, device=dev)
    return Prepared(
        [("op", lambda i: torch.mm(a, b, out=out))],
        dev,
        flops=2.0 * n**3,
        flops_nominal=2.0 * n**3,
        bytes=3.0 * n * n * 4,
        flags=_flag_options(impl),
    )


def _prepare_csr(case: Case, impl: Impl, cfg: ScaleConfig) -> Prepared:
    dev = _device(impl)
    _cuda_kernels_check(impl)
    from impl.ops import pattern_csr, pattern_index
    from impl.ops.pattern import csr_rows

    shape, s = case.params["weight_shape"], case.params["sparsity"]
    w, mask, kind = _masked_weight(shape, s, dev, 0)
    f, k = shape[0], math.prod(shape[1:])
    n_sets = measure.rotation_sets(f * k * 4, dev)
    ws = [w] + [_randn(shape, dev, j) * mask for j in range(1, n_sets)]
    index = pattern_index(mask)  # the positions, fixed and checked once, as the method has them
    row_ptr, col_ind = index.row_ptr, index.col_ind
    nnz = int(col_ind.numel())
    # the positions rotate by their own size too (a cached index would flatter the gather)
    index_bytes = (nnz + f + 1) * 8.0
    n_index = measure.rotation_sets(index_bytes, dev)
    indexes = [index] + [
        index._replace(row_ptr=row_ptr.clone(), col_ind=col_ind.clone()) for _ in range(1, n_index)
    ]
    info = {
        "nnz": nnz,
        "mask": kind,
        "sparsity_actual": round(1 - nnz / (f * k), 4),
        "rows": f,
        "cols": k,
        "rotated_mib": measure.rotated_mib(f * k * 4, n_sets),  # the dense inputs' span
    }
    name = impl.name.split("@")[0]
    dense_read = f * k * 4.0
    if name.startswith("pattern_csr"):
        mode = impl.options["impl"]

        def convert(i):
            ix = indexes[i % n_index]
            return pattern_csr(ws[i % n_sets], ix.row_ptr, ix.col_ind, impl=mode, index=ix)

        fn, n_out = _holding_outputs(convert, nnz * 4.0, dev)
        info["rotated_index_mib"] = measure.rotated_mib(index_bytes, n_index)
        info["rotated_out_mib"] = measure.rotated_mib(nnz * 4.0, n_out)
        nbytes = nnz * (4 + 4 + 8) + (f + 1) * 8.0
        # the value reads as whole sectors: the least the gather reads from memory
        positions = csr_rows(row_ptr, nnz) * k + col_ind
        info["bytes_sectors"] = (
            nbytes - nnz * 4 + measure.sector_bytes(positions, 4, measure.fetch_bytes(dev))
        )
    elif name == "torch_to_sparse_csr":
        w2 = [x.reshape(f, k) for x in ws]

        def fn(i):
            return w2[i % n_sets].to_sparse_csr()

        nbytes = dense_read + nnz * (4 + 8) + (f + 1) * 8.0
    elif name == "copy":
        # the kept values alone, rotated by their own size: sized by the dense matrix, as the
        # conversions' inputs are, 95%-sparse values spanned 6.5 MB on a GPU, in its L2
        vals = _rotated((nnz,), dev, 1)
        outs = _outputs_like(vals)

        def fn(i):
            return outs[i % len(outs)].copy_(vals[i % len(vals)])

        nbytes = 2.0 * nnz * 4
        info["rotated_mib"] = measure.rotated_mib(nnz * 4, len(vals))
    elif name == "copy_moved":
        # pattern_csr reads a value and a column and writes a value per kept position, and
        # reads the row pointers: 2x the kept values' copy. A copy moving the same bytes
        # (half read, half written) is the bound "within 2x of a copy" is read against.
        moved = nnz * (4 + 4 + 8) + (f + 1) * 8.0
        vals = _rotated((math.ceil(moved / 8),), dev, 1)
        outs = _outputs_like(vals)

        def fn(i):
            return outs[i % len(outs)].copy_(vals[i % len(vals)])

        nbytes = 2.0 * vals[0].numel() * 4
        info["rotated_mib"] = measure.rotated_mib(vals[0].numel() * 4, len(vals))
    elif name == "scipy_csr":
        try:
            import scipy.sparse as sp
        except ImportError as exc:
            raise Unavailable(f"scipy is not installed ({exc})") from exc
        arrays = [x.reshape(f, k).numpy() for x in ws]

        def fn(i):
            return sp.csr_matrix(arrays[i % n_sets])

        nbytes = dense_read + nnz * (4 + 4) + (f + 1) * 4.0
    elif name == "cusparse_dense2csr":
        converts = [cusparse_dense_to_csr(x.reshape(f, k)) for x in ws]

        def fn(i):
            return converts[i % n_sets]()

        nbytes = dense_read + nnz * (4 + 4) + (f + 1) * 4.0
    else:  # pragma: no cover - guarded by implementations()
        raise ValueError(f"unknown csr implementation {impl.name}")
    return Prepared([("op", fn)], dev, bytes=nbytes, info=info, flags=_flag_options(impl))


def cusparse_dense_to_csr(matrix: torch.Tensor) -> Callable[[], Any]:
    """A call that converts the CUDA ``matrix`` (``[F, K]``) to CSR with cuSPARSE's
    denseToSparse (through CuPy), on torch's current stream: the baseline ClickTrain Sec. 5.1
    names "dense2csr() from cuSPARSE" (torch's ``to_sparse_csr`` is torch's own conversion).

    CuPy's conversion first makes its input Fortran-ordered, a full transposed copy of a
    C-ordered matrix. The transposed view W^T is Fortran-ordered already, and its CSC arrays
    (indptr, indices, data) are exactly W's CSR ones: called so, a timing measures
    cuSPARSE's conversion, not CuPy's copy. Raises :class:`Unavailable` without CuPy."""
    cp, csp = _cupy()
    if matrix.dim() != 2 or matrix.device.type != "cuda":
        raise ValueError(f"need a 2-D CUDA matrix, got {tuple(matrix.shape)} on {matrix.device}")
    transposed = cp.from_dlpack(matrix.contiguous()).T
    stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    def convert() -> Any:
        with stream:
            return csp.csc_matrix(transposed)

    return convert


def _cupy():
    try:
        import cupy as cp
        import cupyx.scipy.sparse as csp
    except Exception as exc:  # ImportError, or a CUDA mismatch raised at import
        raise Unavailable(
            f"CuPy is not usable here ({type(exc).__name__}: {exc}); install pdtbench[cuda]"
        ) from exc
    return cp, csp


def _forced_paths(paths: dict[str, str] | None) -> contextlib.ExitStack:
    """A context pinning each op's path in ``paths`` (:func:`impl.ops.pattern_cuda.forced_path`);
    nothing pinned (the timed choice) for None."""
    stack = contextlib.ExitStack()
    if paths:
        from impl.ops import pattern_cuda

        for op, path in paths.items():
            stack.enter_context(pattern_cuda.forced_path(op, path))
    return stack


def _path_columns(
    impl: Impl, problem_part: str | Mapping[str, str], ran: dict[str, int]
) -> dict[str, Any]:
    """Row columns naming the CUDA path each op of one call ran (``ran``: :func:`_uses_since`
    of the call) and how it was chosen (:func:`impl.ops.timed_choice.how_chosen`):
    ``path_<op>`` = ``forced: p``, ``fallback: p`` (a forced path that cannot run the
    problem), ``timed: p`` or ``default: p``; for a timed op whose problem name contains
    ``problem_part`` (or, a mapping, the part given for that op: the ops of one call name
    their problems apart, and a part of one op's problem can name another suite's problem of
    another op), each candidate's milliseconds in that one timing (``path_<op>_ms_<path>``)."""
    from impl.ops import timed_choice

    how = timed_choice.how_chosen()
    timed: dict[str, dict[str, Any]] = {}
    for key, choice in timed_choice.timed_choices().items():
        op, problem = key.split(": ", 1)
        part = problem_part if isinstance(problem_part, str) else problem_part.get(op)
        if part is not None and part in problem:
            timed.setdefault(op, choice)
    cols: dict[str, Any] = {}
    for key in ran:
        op, path = key.split(" ", 1)
        label = how.get(key, "default")
        if label == "timed" and op in timed and timed[op]["path"] == path:
            for p, ms in timed[op]["ms"].items():
                cols[f"path_{op}_ms_{p}"] = ms
        entry = f"{label}: {path}"
        cols[f"path_{op}"] = f"{cols[f'path_{op}']}, {entry}" if f"path_{op}" in cols else entry
    return cols


def _conv_problem_parts(
    input_shape: Sequence[int], weight_shape: Sequence[int], nnz: int, positions: int
) -> dict[str, str]:
    """Parts of the problem names a pattern conv's ops time under, per op (for
    :func:`_path_columns`): the conv's own (forward and gradient paths), the SDDMM's on the
    im2col matrix (filters x C*R*S x ``positions`` output positions, batch N) and the input
    gradient's transposed SpMM (C*R*S x filters x positions)."""
    fo, k, b = weight_shape[0], math.prod(weight_shape[1:]), input_shape[0]
    own = f"x{list(input_shape)} w{list(weight_shape)} nnz {nnz} "
    return {
        "conv_forward": own,
        "input_grad": own,
        "weight_grad": own,
        "sddmm": f" {fo}x{k}x{positions} batch {b} nnz {nnz} ",
        "spmm": f" {k}x{fo}x{positions} batch {b} nnz {nnz} ",
    }


def _nm_problem_part(x: torch.Tensor, dim: int, n: int, m: int, method: str) -> dict[str, str]:
    """The parts of ``nm_prune``'s problem names (:mod:`impl.ops.nm_cuda`) that tell one
    benchmark case from another, per op (for :func:`_path_columns`): the dtype, the
    [O, C, I] view of ``x`` grouped along ``dim`` with its strides (NCHW and channels-last
    cases of one shape apart), n:m, and for the selection the method's mode (a rescaled case
    times the selection too)."""
    from impl.ops import nm_cuda

    view = nm_cuda.nm_view(x.shape, x.stride(), dim)
    if view is None:  # a layout the op copies to contiguous first
        view = nm_cuda.nm_view(x.shape, x.contiguous().stride(), dim)
    base = nm_cuda.problem_key(x.dtype, view, n, m)
    return {"nm_rescaled": base, "nm_select": f"{base}mode {nm_cuda.METHODS[method]} "}


def _path_uses() -> dict[str, int]:
    """:func:`impl.ops.timed_choice.uses` now (a reading for :func:`_uses_since`)."""
    from impl.ops import timed_choice

    return timed_choice.uses()


def _uses_since(before: dict[str, int]) -> dict[str, int]:
    """The picks made since the reading ``before``, ``{"op path": calls}``."""
    now = _path_uses()
    return {k: n - before.get(k, 0) for k, n in now.items() if n > before.get(k, 0)}


def _dense_gradient_calls(ran: dict[str, int]) -> int:
    """Gradient computations of pattern ops that took a dense path (``"weight_grad dense"``,
    ``"input_grad dense"``) in the picks ``ran`` of :func:`_uses_since`."""
    return sum(n for key, n in ran.items() if key in ("weight_grad dense", "input_grad dense"))


def dense_gradient_flops(
    report: Any, pattern_layers: set[str], ran: dict[str, int]
) -> float | None:
    """FLOPs per sample that the pattern layers' gradients executed beyond what ``report``
    (:func:`impl.flops.training_flops`, which counts them sparse whichever path ran) counts,
    from the picks ``ran`` of one iteration (:func:`_uses_since`): for each gradient op
    (``input_grad`` -> data gradient, ``weight_grad``) whose every call ran dense (cuBLAS /
    cuDNN), each pattern layer's dense count less its sparse one; 0.0 where none ran dense.
    None where some calls of an op ran dense and others sparse: which layers did is not
    known, so the executed FLOPs are not either."""
    extra = 0.0
    for op, part in (("input_grad", "data_grad"), ("weight_grad", "weight_grad")):
        dense = ran.get(f"{op} dense", 0)
        calls = sum(n for key, n in ran.items() if key.split(" ", 1)[0] == op)
        if dense == 0:
            continue
        if dense != calls:
            return None
        for layer in report.layers:
            if layer.name in pattern_layers:
                extra += getattr(layer.dense, part) - getattr(layer.executed, part)
    return extra


def _prepare_spmm(case: Case, impl: Impl, cfg: ScaleConfig) -> Prepared:
    dev = _device(impl)
    _cuda_kernels_check(impl)
    from impl.ops import pattern_index, pattern_spmm

    shape, s, n = case.params["weight_shape"], case.params["sparsity"], case.params["n"]
    f, k = shape[0], math.prod(shape[1:])
    w, mask, kind = _masked_weight(shape, s, dev, 0)
    a = w.reshape(f, k)
    index = pattern_index(mask.reshape(f, k))
    nnz = int(index.col_ind.numel())
    bs = _rotated((k, n), dev, 1)
    n_sets = len(bs)
    info = {
        "nnz": nnz,
        "mask": kind,
        "sparsity_actual": round(1 - nnz / (f * k), 4),
        "rows": f,
        "cols": k,
    }
    name = impl.name.split("@")[0]
    io_bytes = (k * n + f * n) * 4.0
    if name.startswith("pattern_spmm"):
        mode = impl.options["impl"]
        values = a[mask.reshape(f, k)].contiguous()
        paths = impl.options.get("paths")

        def fn(i):
            before = _path_uses() if i == 0 else {}
            with torch.no_grad(), _forced_paths(paths):
                out = pattern_spmm(
                    values, index.row_ptr, index.col_ind, bs[i % n_sets], impl=mode, index=index
                )
            if i == 0:
                problem = f" {f}x{k}x{n} batch 1 nnz {nnz} "
                info.update(_path_columns(impl, problem, _uses_since(before)))
            return out

        flops, nbytes = 2.0 * nnz * n, io_bytes + nnz * (4 + 8) + (f + 1) * 8.0
    elif name == "torch_csr_spmm":
        a_csr = a.to_sparse_csr()
        # torch.sparse.mm allocates a zero-filled result and copies it into another: addmm into
        # a preallocated ``out`` with beta=0 is the bare library product (no allocation in
        # the timed call, as the pattern kernel and the cuBLAS rows).
        out = torch.empty(f, n, device=dev)

        def fn(i):
            return torch.addmm(out, a_csr, bs[i % n_sets], beta=0.0, alpha=1.0, out=out)

        flops, nbytes = 2.0 * nnz * n, io_bytes + nnz * (4 + 8) + (f + 1) * 8.0
    else:  # dense GEMM
        out = torch.empty(f, n, device=dev)

        def fn(i):
            return torch.mm(a, bs[i % n_sets], out=out)

        flops, nbytes = 2.0 * f * k * n, io_bytes + f * k * 4.0
    return Prepared(
        [("op", fn)],
        dev,
        flops=flops,
        flops_nominal=2.0 * nnz * n,
        bytes=nbytes,
        info=info,
        flags=_flag_options(impl),
    )


def _prepare_conv(case: Case, impl: Impl, cfg: ScaleConfig) -> Prepared:
    dev = _device(impl)
    _cuda_kernels_check(impl)
    from impl.ops import pattern_conv2d, pattern_index

    p = case.params
    shape, s = p["weight_shape"], p["sparsity"]
    fo, c, r, q = shape
    b, _, h, wd = p["input_shape"]
    pad, stride = p["padding"], p["stride"]
    ho = (h + 2 * pad - r) // stride + 1
    wo = (wd + 2 * pad - q) // stride + 1
    w, mask, kind = _masked_weight(shape, s, dev, 0)
    nnz = int(mask.sum())
    xs = _rotated(p["input_shape"], dev, 1)
    n_sets = len(xs)
    backward = p["pass"] != "forward"
    name = impl.name.split("@")[0]
    sparse = name.startswith("pattern_conv2d")
    if sparse:
        index = pattern_index(mask)
        mode = impl.options["impl"]
        if mode == "cpu":
            from impl.ops import pattern_cpu

            reason = pattern_cpu.unavailable_reason()
            if reason is not None:
                raise Unavailable(f"the compiled CPU pattern conv is not available: {reason}")

        def conv(x, weight):
            return pattern_conv2d(x, weight, index, stride=stride, padding=pad, impl=mode)

    else:

        def conv(x, weight):
            return F.conv2d(x, weight, stride=stride, padding=pad)

    problem = _conv_problem_parts(p["input_shape"], shape, nnz, ho * wo)
    if backward:
        weight = w.clone().requires_grad_(True)
        xs = [x.requires_grad_(True) for x in xs]
        grad_out = _randn((b, fo, ho, wo), dev, 2)

        def fn(i):
            x = xs[i % n_sets]
            x.grad = None
            weight.grad = None
            before = _path_uses() if i == 0 else {}
            with _forced_paths(paths):
                conv(x, weight).backward(grad_out)
            if i == 0:
                cols = _path_columns(impl, problem, _uses_since(before))
                info.update(cols)
                if sparse:  # a gradient computed densely (cuBLAS / cuDNN) executes dense FLOPs
                    dense_grads = sum(
                        str(cols.get(f"path_{op}", "")).endswith(": dense")
                        for op in ("weight_grad", "input_grad")
                    )
                    executed = (sparse_flops * (3 - dense_grads) + dense_flops * dense_grads) / 3
                    prepared.flops = executed

    else:

        def fn(i):
            before = _path_uses() if i == 0 else {}
            with torch.no_grad():
                out = conv(xs[i % n_sets], w)
            if i == 0:
                info.update(_path_columns(impl, problem, _uses_since(before)))
            return out

    passes = 3.0 if backward else 1.0
    dense_flops = 2.0 * b * ho * wo * fo * c * r * q * passes
    sparse_flops = 2.0 * b * ho * wo * nnz * passes
    info = {"nnz": nnz, "mask": kind, "sparsity_actual": round(1 - nnz / w.numel(), 4)}
    paths = impl.options.get("paths")
    prepared = Prepared(
        [("op", fn)],
        dev,
        flops=sparse_flops if sparse else dense_flops,
        flops_nominal=sparse_flops,
        info=info,
        flags=_flag_options(impl, cudnn=dev.type == "cuda"),
    )
    return prepared


def _prepare_nm(case: Case, impl: Impl, cfg: ScaleConfig) -> Prepared:
    dev = _device(impl)
    p = case.params
    xs = _rotated(p["shape"], dev, 0)
    if p.get("layout") == "channels_last":
        xs = [x.to(memory_format=torch.channels_last) for x in xs]
    n_sets = len(xs)
    numel = math.prod(p["shape"])
    info: dict[str, Any] = {"numel": numel}
    name = impl.name.split("@")[0]
    if name.startswith("nm_prune"):
        try:
            from impl.ops.nm import nm_prune
        except ImportError as exc:
            raise Unavailable(f"impl.ops.nm_prune is not in this build ({exc})") from exc
        mode = impl.options["impl"]
        _cuda_kernels_check(impl, "nm_prune.cu")
        if mode == "cpu":
            try:
                nm_prune(xs[0][:1], p["n"], p["m"], p["method"], p["dim"], impl=mode)
            except RuntimeError as exc:
                raise Unavailable(f"nm_prune's {mode} kernel is not available: {exc}") from exc

        dim = p["dim"]
        problem = _nm_problem_part(xs[0], dim, p["n"], p["m"], p["method"])

        def fn(i):
            before = _path_uses() if i == 0 else {}
            out = nm_prune(xs[i % n_sets], p["n"], p["m"], p["method"], p["dim"], impl=mode)
            if i == 0:
                info.update(_path_columns(impl, problem, _uses_since(before)))
            return out

    else:
        outs = _outputs_like(xs)

        def fn(i):
            return outs[i % len(outs)].copy_(xs[i % n_sets])

    return Prepared([("op", fn)], dev, bytes=2.0 * numel * 4, flags=_flag_options(impl), info=info)


def _prepare_pack(case: Case, impl: Impl, cfg: ScaleConfig) -> Prepared:
    dev = _device(impl)
    from impl.ops import pack_cuda

    p = case.params
    shape, op = p["weight_shape"], p["kind"]
    mask = _masked_weight(shape, p["sparsity"], dev, 0)[1]
    index = pack_cuda.mask_index(mask)  # int32 below 2^31 elements
    nnz = int(index.numel())
    cuda = impl.options["impl"] == "cuda"
    if cuda:
        _cuda_kernels_check(impl, "pack.cu")
    # torch's fastest ways (index_select 3-4x faster than advanced indexing on the CPU):
    # index_select reads the kernel's int32 positions; scatter_ takes int64 only.
    read_index = index if cuda or op == "pack" else index.to(torch.int64)
    # Every operand rotates by its own size, the positions and the unpack's bucket too: one
    # index (18.9 MB at 75% here) would stay in a GPU's 50 MB L2 and a CPU's L3.
    indexes = measure.rotated(lambda j: read_index.clone() if j else read_index)
    if op == "pack":
        grads = _rotated(shape, dev, 1)

        def gather(i):
            g, ix = grads[i % len(grads)], indexes[i % len(indexes)]
            return pack_cuda.pack(g, ix) if cuda else g.reshape(-1).index_select(0, ix)

        out_bytes = nnz * 4.0
        fn, n_out = _holding_outputs(gather, out_bytes, dev)
    else:
        # the sparse Allreduce's unpack (impl.comm.unpack): the bucket zeroed except the
        # reduced values at the kept positions
        buffers = _rotated((nnz,), dev, 1)
        outs = measure.rotated(lambda j: torch.zeros(tuple(shape), device=dev))
        out_bytes, n_out = math.prod(shape) * 4.0, len(outs)
        expand = cuda and impl.options.get("variant") != "scatter"
        # the tile table of the positions (the same for every copy of them), built once
        starts = pack_cuda.expand_starts(index, math.prod(shape)) if expand else None

        def fn(i):
            b, ix, out = buffers[i % len(buffers)], indexes[i % len(indexes)], outs[i % len(outs)]
            if expand:
                return pack_cuda.expand(b, ix, starts, out)
            out.zero_()
            if cuda:
                return pack_cuda.unpack(b, ix, out)
            out.view(-1).scatter_(0, ix, b)
            return out

    # index_dtype: the positions this row's implementation reads
    numel = math.prod(shape)
    info = {"nnz": nnz, "numel": numel, "index_dtype": str(read_index.dtype)}
    info["rotated_index_mib"] = measure.rotated_mib(nnz * read_index.element_size(), len(indexes))
    info["rotated_out_mib"] = measure.rotated_mib(out_bytes, n_out)
    # pack: read value and index (the one this implementation reads), write value; unpack:
    # read value and index, write the whole bucket (zeros included)
    if op == "pack":
        nbytes = nnz * (4.0 + read_index.element_size() + 4.0)
        # the value reads as whole sectors: the least the gather reads from memory
        info["bytes_sectors"] = (
            nbytes - nnz * 4.0 + measure.sector_bytes(index, 4, measure.fetch_bytes(dev))
        )
    else:
        nbytes = nnz * (4.0 + read_index.element_size()) + numel * 4.0
    return Prepared([("op", fn)], dev, bytes=nbytes, flags=_flag_options(impl), info=info)


#: The kernels a method's layers run in the iteration suite on a GPU: without them its
#: layers would fall back to the torch reference ("auto") under the method's name.
_ITERATION_KERNELS = {"clicktrain": "pattern.cu", "sdgp": "nm_prune.cu"}


def _prepare_iteration(case: Case, impl: Impl, cfg: ScaleConfig) -> Prepared:
    dev = _device(impl)
    source = _ITERATION_KERNELS.get(impl.options["method"])
    if dev.type == "cuda" and source is not None:
        _require_kernels(source)
    from bench.method_states import build_state

    p = case.params
    state = build_state(
        impl.options["method"], p["model"], stem=p["stem"], num_classes=p["num_classes"], device=dev
    )
    model = state.model
    shape = (3, p["resolution"], p["resolution"])
    xs = [_randn((p["batch"], *shape), dev, j) for j in range(2)]
    gen = _gen(7, dev)
    ys = [
        torch.randint(0, p["num_classes"], (p["batch"],), generator=gen, device=dev)
        for _ in range(2)
    ]
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)
    held: dict[str, Any] = {}
    info: dict[str, Any] = {}

    def forward(i):
        if i == 0:
            held["uses"] = _path_uses()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xs[i % 2]), ys[i % 2])
        if state.regularizer is not None:
            loss = loss + state.regularizer(model)
        held["loss"] = loss

    def backward(i):
        held.pop("loss").backward()

    def step(i):
        if state.after_backward is not None:
            state.after_backward(opt)
        opt.step()
        if state.after_step is not None:
            state.after_step(opt)
        if i == 0:  # the CUDA paths one iteration ran (impl.ops.timed_choice), if any
            ran = _uses_since(held.pop("uses"))
            if ran:
                info["paths_per_iteration"] = "; ".join(f"{k} x{n}" for k, n in ran.items())
                # impl.flops counts a pattern layer's gradients as sparse whichever path ran:
                # the gradients that ran dense (cuBLAS / cuDNN) executed dense FLOPs
                info["dense_gradient_calls"] = _dense_gradient_calls(ran)
                if report is not None and info["dense_gradient_calls"]:
                    extra = dense_gradient_flops(report, _pattern_layer_names(model), ran)
                    if extra is None:
                        prepared.flops = None
                        prepared.phase_flops.pop("backward", None)
                        info["flops_unknown"] = (
                            "some pattern layers' gradients ran dense and others sparse; "
                            "which did is not recorded, so neither is the executed work"
                        )
                    elif prepared.flops is not None:
                        prepared.flops += extra * p["batch"]
                        prepared.phase_flops["backward"] += extra * p["batch"]

    phase_flops: dict[str, float] = {}
    flops = nominal = report = None
    try:
        from impl.flops import training_flops

        report = training_flops(model, shape, state.cost or None)
        ex, nom = report.executed, report.nominal
        phase_flops = {
            "forward": ex.forward * p["batch"],
            "backward": (ex.data_grad + ex.weight_grad) * p["batch"],
        }
        flops = ex.total * p["batch"]
        nominal = nom.total * p["batch"]
    except Exception as exc:  # the counter may not know a module of some build
        state.info["flops_error"] = f"{type(exc).__name__}: {exc}"
    info.update({f"state_{k}": v for k, v in state.info.items()})
    prepared = Prepared(
        [("forward", forward), ("backward", backward), ("step", step)],
        dev,
        flops=flops,
        flops_nominal=nominal,
        phase_flops=phase_flops,
        flags=_flag_options(impl, cudnn=dev.type == "cuda"),
        info=info,
        timed_phases=("forward", "backward"),
    )
    return prepared


def _pattern_layer_names(model: torch.nn.Module) -> set[str]:
    """Names of the pattern convolutions (:class:`impl.ops.PatternConv2d`) of ``model``."""
    from impl.ops import PatternConv2d

    return {name for name, m in model.named_modules() if isinstance(m, PatternConv2d)}


@functools.lru_cache(maxsize=16)
def _dense_payload(model: str, stem: str, classes: int) -> int:
    from impl.models import create

    with torch.device("meta"):
        net = create(model, num_classes=classes, stem=stem)
    return int(sum(p.numel() * 4 for p in net.parameters() if p.requires_grad))


def _prepare_allreduce(case: Case, impl: Impl, cfg: ScaleConfig) -> Prepared:
    from bench.method_states import allreduce_payload, build_state

    p = case.params
    state = build_state(
        impl.options["method"],
        p["model"],
        stem=p["stem"],
        num_classes=p["num_classes"],
        device="cpu",
    )
    out = allreduce_payload(state)
    dense = _dense_payload(p["model"], p["stem"], p["num_classes"])
    values = {
        "payload_bytes": float(out["payload_bytes"]),
        "dense_bytes": float(dense),
        "payload_fraction": out["payload_bytes"] / dense,
        "ring_bytes_per_rank_p8": out["payload_bytes"] * 2 * 7 / 8,
    }
    units = {
        "payload_bytes": "bytes",
        "dense_bytes": "bytes",
        "payload_fraction": "fraction",
        "ring_bytes_per_rank_p8": "bytes",
    }
    info = {f"state_{k}": v for k, v in state.info.items()}
    info["source"] = "analytic: gradients at kept positions (bench.method_states)"
    try:  # the project's own accounting, where this build has it
        from impl.comm import payload_bytes

        values["comm_payload_bytes"] = float(payload_bytes(state.model, state.masks))
        units["comm_payload_bytes"] = "bytes"
    except ImportError as exc:
        info["comm_note"] = f"impl.comm.payload_bytes not in this build ({exc})"
    return Prepared([], torch.device("cpu"), values=values, units=units, info=info, timed_phases=())


_PREPARE: dict[str, Callable[[Case, Impl, ScaleConfig], Prepared]] = {
    "calibration": _prepare_calibration,
    "csr": _prepare_csr,
    "spmm": _prepare_spmm,
    "conv": _prepare_conv,
    "nm_prune": _prepare_nm,
    "pack": _prepare_pack,
    "iteration": _prepare_iteration,
    "allreduce": _prepare_allreduce,
}


def prepare(case: Case, impl: Impl, scale: str | None = None) -> Prepared:
    """Build the inputs of ``case`` for ``impl`` (untimed).

    Raises :class:`bench.Unavailable` (the reason: no GPU, kernel or library missing) and
    ValueError for an implementation that does not apply to the case.
    """
    if not impl.accepts(case):
        raise ValueError(f"{impl.name} does not apply to case {case.name} ({case.params['kind']})")
    return _PREPARE[case.suite](case, impl, scale_config(scale))


# -- measuring and rows -----------------------------------------------------------------------
def measure_prepared(prepared: Prepared, scale: str | None = None) -> dict[str, measure.Timing]:
    """Time ``prepared``'s phases with the scale's budget, its flags pinned; Timing per phase."""
    cfg = scale_config(scale)
    if not prepared.phases:
        return {}
    with measure.pinned_flags(**prepared.flags) as effective:
        # The flags read back inside the block: a row records the requested ones, so say so
        # where torch reports others (e.g. a mix of its legacy and fp32_precision settings).
        requested = {**dict.fromkeys(effective, False), **prepared.flags}
        differ = {k: v for k, v in effective.items() if requested[k] != v}
        if differ:
            prepared.info["flags_read_back"] = json.dumps(differ, sort_keys=True)
        if len(prepared.phases) > 1:
            warm, reps = cfg.iter_warmup, cfg.iter_repeats
            cuda = prepared.device.type == "cuda"

            def reset_peak() -> None:  # the timed iterations' peak: parameters, optimizer
                # state, activations (not the warm-up's algorithm searches and path trials)
                torch.cuda.reset_peak_memory_stats(prepared.device)

            out = measure.phase_timing(
                prepared.phases,
                prepared.device,
                warmup=warm,
                repeats=reps,
                after_warmup=reset_peak if cuda else None,
            )
            if cuda:
                peak = torch.cuda.max_memory_allocated(prepared.device)
                prepared.info["peak_memory_mib"] = peak / 2**20
            return out
        fn = prepared.phases[0][1]
        if prepared.device.type == "cuda":
            return {
                "op": measure.cuda_timing(fn, warmup_ms=cfg.cuda_warmup_ms, rep_ms=cfg.cuda_rep_ms)
            }
        timing = measure.cpu_timing(
            fn,
            warmup=cfg.cpu_warmup,
            repeats=cfg.cpu_repeats,
            min_time_s=cfg.cpu_min_time_s,
            max_repeats=cfg.cpu_max_repeats,
        )
        return {"op": timing}


@functools.lru_cache(maxsize=1)
def _env() -> dict[str, Any]:
    from impl.env import collect

    return collect()


def provenance(scale: str | None = None) -> dict[str, Any]:
    """What every row carries about where and how it was measured (docs/benchmarks.md).

    Commit (and whether the tree was dirty), UTC date, GPU and driver (and where the name was
    read: ``gpu_source``), whether torch sees a GPU (``gpu_available``), CUDA, cuDNN, torch,
    CuPy, NumPy and Python versions, CPU model and threads, the scale, the thread and
    device environment variables, and the 1-minute load average (other work on the machine
    slows CPU timings). Collected once per process, except the load average.
    """
    e = _env()
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {
        "commit": e.get("commit"),
        "dirty": e.get("dirty"),
        "date": e.get("date"),
        "gpu_name": e.get("gpu_name"),
        "gpu_source": e.get("gpu_source"),
        "gpu_available": _gpu_visible(),
        "gpu_driver": e.get("gpu_driver"),
        "cuda": e.get("cuda"),
        "cudnn": e.get("cudnn"),
        "torch": e.get("torch"),
        "cupy": e.get("cupy"),
        "numpy": e.get("numpy"),
        "python": e.get("python"),
        "cpu_model": e.get("cpu_model"),
        "torch_threads": torch.get_num_threads(),
        "platform": e.get("platform"),
        "env_vars": json.dumps(e.get("env_vars") or {}, sort_keys=True),
        "load_avg_1m": load,
        "scale": resolve_scale(scale),
    }


def _flatten(params: dict[str, Any]) -> dict[str, Any]:
    return {
        k: ("x".join(map(str, v)) if isinstance(v, list | tuple) else v) for k, v in params.items()
    }


def base_row(case: Case, impl: Impl, scale: str | None = None) -> dict[str, Any]:
    """The columns every row of ``(case, impl)`` has: identity, parameters and provenance."""
    prov = provenance(scale)
    device_name = prov["gpu_name"] if impl.device == "cuda" else prov["cpu_model"]
    row: dict[str, Any] = {
        "suite": case.suite,
        "case": case.name,
        "impl": impl.name,
        "impl_label": impl.label,
        "device": impl.device,
        "device_name": device_name,
        "math": impl.math,
        "baseline": impl.baseline,
        "dtype": "float32",
        "status": "",
        "reason": "",
    }
    row.update(_flatten(case.params))
    row.update(prov)
    # the flags this pair runs under, on every row (a skipped or failed one too); fill_row
    # sets them again from what the preparation pinned
    row.update(_flag_options(impl, cudnn=case.suite in _CUDNN_SUITES and impl.device == "cuda"))
    return row


def _peak_columns(row: dict[str, Any], impl: Impl) -> None:
    from bench import peaks

    row["frac_peak_spec"] = row["frac_bw_spec"] = None
    if impl.device != "cuda":
        return
    try:
        spec = peaks.lookup(row.get("gpu_name") or "")
    except peaks.UnknownGPUError as exc:
        row["peak_note"] = str(exc)
        return
    row["peak_source"] = spec.source
    if row.get("tflops") is not None and impl.math in peaks.MATHS:
        try:
            row["frac_peak_spec"] = row["tflops"] / spec.tflops(impl.math)
        except ValueError as exc:
            row["peak_note"] = str(exc)
    if row.get("gbps") is not None:
        row["frac_bw_spec"] = row["gbps"] / spec.mem_gbps


def fill_row(
    row: dict[str, Any], prepared: Prepared, timings: dict[str, measure.Timing], impl: Impl
) -> dict[str, Any]:
    """Add the measured and derived columns of one run to ``row`` (see the module docstring)."""
    row["status"] = "ok"
    row.update(prepared.info)
    row.update(prepared.flags)
    for key, value in prepared.values.items():
        row[key] = value
        row[f"{key}_unit"] = prepared.units.get(key, "")
    if timings:
        if set(timings) == {"op"}:
            t = timings["op"]
            row.update(
                median_ms=t.median_ms,
                p20_ms=t.p20_ms,
                p80_ms=t.p80_ms,
                min_ms=t.min_ms,
                n_runs=t.n,
                clock=t.clock,
            )
            if t.host_bound is not None:  # GPU timings: see bench.measure.host_bound
                row.update(
                    host_ms=t.host_ms,
                    amortized_ms=t.amortized_ms,
                    issue_ms=t.issue_ms,
                    host_bound=t.host_bound,
                )
        else:
            for phase, t in timings.items():
                row[f"{phase}_ms"] = t.median_ms
                row[f"{phase}_p20_ms"], row[f"{phase}_p80_ms"] = t.p20_ms, t.p80_ms
            first = next(iter(timings.values()))
            row["median_ms"] = sum(timings[p].median_ms for p in prepared.timed_phases)
            row.update(n_runs=first.n, clock=first.clock)
            row["timed_phases"] = "+".join(prepared.timed_phases)
            if "step" in timings:  # the whole iteration, the method's per-step work included
                row["iteration_ms"] = sum(t.median_ms for t in timings.values())
    row["flops"] = prepared.flops
    row["flops_nominal"] = prepared.flops_nominal
    row["bytes"] = prepared.bytes
    ms = row.get("median_ms")
    row["tflops"] = row["gbps"] = None
    if ms and ms > 0:
        if prepared.flops is not None:
            flops = prepared.flops
            if prepared.phase_flops:  # the timed phases only
                flops = sum(prepared.phase_flops.get(p, 0.0) for p in prepared.timed_phases)
            row["tflops"] = flops / (ms * 1e-3) / 1e12
        if prepared.bytes is not None:
            row["gbps"] = prepared.bytes / (ms * 1e-3) / 1e9
        if row.get("bytes_sectors") is not None:  # gathers: bytes counted in whole sectors
            row["gbps_sectors"] = row["bytes_sectors"] / (ms * 1e-3) / 1e9
    for phase, f in prepared.phase_flops.items():
        t = timings.get(phase)
        if t is not None and t.median_ms > 0:
            row[f"{phase}_tflops"] = f / (t.median_ms * 1e-3) / 1e12
    _peak_columns(row, impl)
    return row


def _release() -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def run_pair(case: Case, impl: Impl, scale: str | None = None) -> dict[str, Any]:
    """Prepare, time and describe one (case, implementation): one tidy row.

    Never raises for a case that cannot run: ``status`` is ``"ok"``, ``"skipped"`` (with the
    reason), ``"oom"`` (out of memory, recorded as a value) or ``"error"`` (with the error).
    """
    row = base_row(case, impl, scale)
    prepared = None
    try:
        prepared = prepare(case, impl, scale)
        timings = measure_prepared(prepared, scale)
        fill_row(row, prepared, timings, impl)
    except Unavailable as exc:
        row.update(status="skipped", reason=str(exc))
    except Exception as exc:
        if measure.is_out_of_memory(exc):
            row.update(status="oom", reason=f"out of memory: {str(exc)[:300]}")
        else:
            row.update(status="error", reason=f"{type(exc).__name__}: {str(exc)[:500]}")
    finally:
        del prepared
        _release()
    return row


def add_derived(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add, in place, the columns that compare rows: speedups and fractions of measured limits.

    ``speedup_vs_<b> = median_ms(b) / median_ms`` for every baseline ``b`` of the same suite,
    case and device (also ``<phase>_speedup_vs_<b>`` for the iteration suite's forward,
    backward and step, and ``iteration_speedup_vs_<b>`` over all three: ``median_ms`` there is
    forward + backward, which leaves out the per-step work of a method such as Campfire's
    masking and the cheaper optimizer step of PruneTrain's smaller model);
    ``frac_bw_measured = gbps / gbps(calibration copy)`` (and ``frac_bw_measured_sectors``
    from ``gbps_sectors``, a gather's bytes counted in whole 32-byte sectors) and
    ``frac_peak_measured = tflops / tflops(calibration GEMM of the same math)`` on the same
    device, where this row set holds the calibration rows.
    """
    ok = [r for r in rows if r.get("status") == "ok"]
    calib_bw: dict[str, float] = {}
    calib_peak: dict[tuple[str, str], float] = {}
    for r in ok:
        if r["suite"] != "calibration":
            continue
        if r.get("kind") == "copy" and r.get("gbps"):
            calib_bw[r["device"]] = r["gbps"]
        if r.get("kind") == "gemm" and r.get("tflops"):
            calib_peak[(r["device"], r["math"])] = r["tflops"]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in ok:
        groups.setdefault((r["suite"], r["case"], r["device"]), []).append(r)
    for members in groups.values():
        baselines = [b for b in members if b.get("baseline") and b.get("median_ms")]
        for r in members:
            for b in baselines:
                short = b["impl"].split("@")[0]
                if r.get("median_ms"):
                    r[f"speedup_vs_{short}"] = b["median_ms"] / r["median_ms"]
                for phase in ("forward", "backward", "step", "iteration"):
                    if r.get(f"{phase}_ms") and b.get(f"{phase}_ms"):
                        r[f"{phase}_speedup_vs_{short}"] = b[f"{phase}_ms"] / r[f"{phase}_ms"]
    for r in ok:
        if r["suite"] == "calibration":
            continue
        bw = calib_bw.get(r["device"])
        if bw and r.get("gbps") is not None:
            r["frac_bw_measured"] = r["gbps"] / bw
        if bw and r.get("gbps_sectors") is not None:
            r["frac_bw_measured_sectors"] = r["gbps_sectors"] / bw
        peak = calib_peak.get((r["device"], r["math"]))
        if peak and r.get("tflops") is not None:
            r["frac_peak_measured"] = r["tflops"] / peak
    return rows


def select_pairs(
    suite: str,
    scale: str | None = None,
    *,
    match: str | None = None,
    case_names: Sequence[str] | None = None,
) -> list[tuple[Case, Impl]]:
    """The pairs of ``suite`` that :func:`run_suites` runs, in the order it runs them.

    ``match`` keeps only pairs whose ``"<suite>/<case>/<impl>"`` contains it; ``case_names``
    keeps only the cases of these names, in the order given (names no case of the suite
    has are ignored, so one list may name cases of several suites). Calibration is never
    filtered, so that fractions of measured limits can be computed.
    """
    selected = pairs(suite, scale)
    if suite == "calibration":
        return selected
    if match:
        selected = [(c, i) for c, i in selected if match in f"{suite}/{c.name}/{i.name}"]
    if case_names:
        order = {name: k for k, name in enumerate(case_names)}
        selected = [(c, i) for c, i in selected if c.name in order]
        selected.sort(key=lambda ci: order[ci[0].name])  # stable: impl order kept per case
    return selected


def run_suites(
    suites: Iterable[str] = SUITES,
    scale: str | None = None,
    *,
    match: str | None = None,
    case_names: Sequence[str] | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every (case, implementation) of ``suites`` at ``scale``; tidy rows with derived columns.

    ``match`` and ``case_names`` select pairs as :func:`select_pairs` does (calibration
    always runs, so that fractions of measured limits can be computed).
    """
    rows = []
    for suite in suites:
        for case, impl in select_pairs(suite, scale, match=match, case_names=case_names):
            row = run_pair(case, impl, scale)
            rows.append(row)
            if progress is not None:
                progress(row)
    return add_derived(rows)


__all__ = [
    "ENV_SCALE",
    "ENV_SMALL",
    "SCALES",
    "SCALE_CONFIGS",
    "SUITES",
    "Case",
    "Impl",
    "Prepared",
    "ScaleConfig",
    "add_derived",
    "base_row",
    "conv_shapes",
    "fill_row",
    "find",
    "grid",
    "measure_prepared",
    "implementations",
    "pairs",
    "prepare",
    "provenance",
    "resolve_scale",
    "run_pair",
    "run_suites",
    "scale_config",
    "select_pairs",
]
