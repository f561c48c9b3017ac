"""Measurements behind ClickTrain Figs. 9, 10 and 13 (called by the reproductions through
:func:`reproductions.common.measure_or_reuse`; each returns plain values)."""

from __future__ import annotations

import contextlib
import math
import re
import statistics
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from reproductions.common import check_sweeps, device_name, per_sweep, time_ms

# The paper's reference shape (Sec. 5.1): filter matrix 256 x 1152 (256 filters, 128 channels,
# 3x3) and input 1152 x 50176 (a 128 x 224 x 224 feature map after im2col).
PAPER_SHAPE = {"filters": 256, "channels": 128, "columns": 50176}
SCALE_SHAPES = {
    "smoke": {"filters": 32, "channels": 16, "columns": 784},
    "cpu": {"filters": 256, "channels": 128, "columns": 3136},
    "gpu": PAPER_SHAPE,
    "paper": PAPER_SHAPE,
}


@contextlib.contextmanager
def _quiet_csr_beta() -> Iterator[None]:
    """Silence torch's "sparse CSR is beta" warning (given on the first construction): the
    conversions and products timed here are stable since torch 2.0, so it says nothing to a
    reader. Entered once around a timing loop: no cost per timed call."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        yield


def pattern_mask(filters: int, channels: int, sparsity: float, seed: int = 0) -> torch.Tensor:
    """A ClickTrain-like ``[F, C, 3, 3]`` mask: each filter keeps the same number of kernels
    (so rows have equal lengths, Sec. 5.2), each kernel a 4-of-9 pattern from a pool of 12.
    The achieved sparsity is ``1 - 4 k / (9 C)`` for ``k`` kept kernels per filter."""
    if not 5 / 9 - 1e-9 <= sparsity < 1:
        raise ValueError(f"a 4-of-9 pattern mask has sparsity in [5/9, 1), got {sparsity}")
    gen = torch.Generator().manual_seed(seed)
    keep = min(channels, max(1, round((1 - sparsity) * 9 * channels / 4)))
    pool = []
    while len(pool) < 12:
        idx = torch.randperm(9, generator=gen)[:4]
        p = torch.zeros(9, dtype=torch.bool)
        p[idx] = True
        if not any(bool((p == q).all()) for q in pool):
            pool.append(p)
    pool_t = torch.stack(pool).view(12, 3, 3)
    kept = torch.zeros(filters, channels, dtype=torch.bool)
    order = torch.rand(filters, channels, generator=gen).argsort(dim=1)[:, :keep]
    kept.scatter_(1, order, True)
    choice = torch.randint(0, 12, (filters, channels), generator=gen)
    return pool_t[choice] & kept[:, :, None, None]


def filter_matrix(shape: dict[str, int]) -> str:
    """The filter matrix of a shape of :data:`SCALE_SHAPES`, ``"FxK"`` (K = C*3*3, im2col)."""
    return f"{shape['filters']}x{9 * shape['channels']}"


def _shape(scale: str) -> dict[str, int]:
    return SCALE_SHAPES[scale]


#: Fig. 9's baseline on a GPU: cuSPARSE's dense-to-CSR, the paper's dense2csr (Sec. 5.1).
CUSPARSE_IMPL = "cuSPARSE denseToSparse (CuPy)"


def generic_converter(flat: torch.Tensor) -> tuple[Callable[[], Any], str]:
    """Fig. 9's generic dense -> CSR conversion of ``flat`` and what it is: on a GPU
    cuSPARSE's (:func:`bench.cases.cusparse_dense_to_csr`, the paper's dense2csr), else, and
    on a GPU without CuPy, torch's own ``to_sparse_csr`` (a gather of the nonzeros, not
    cuSPARSE's routine), named so."""
    if flat.device.type == "cuda":
        from bench import Unavailable
        from bench.cases import cusparse_dense_to_csr

        try:
            return cusparse_dense_to_csr(flat), CUSPARSE_IMPL
        except Unavailable as err:
            return flat.to_sparse_csr, f"torch.Tensor.to_sparse_csr (not cuSPARSE: {err})"
    return flat.to_sparse_csr, "torch.Tensor.to_sparse_csr"


def csr_conversion(
    *, scale: str, context: dict, sparsity: float = 0.75, repeats: int = 20, sweeps: int = 1
) -> dict[str, Any]:
    """Fig. 9: dense -> CSR conversion time of the filter matrix, generic
    (:func:`generic_converter`: cuSPARSE's on a GPU, torch's ``to_sparse_csr`` on a CPU)
    against predefined positions (:func:`impl.ops.pattern_csr`, Sec. 5.1). Each sweep times
    both conversions ``repeats`` times, one after the other; the times (microseconds, the
    median of a sweep's calls) and the speedup (the ratio of those medians) are one value per
    sweep, so the report carries their spread and n, and a claim its confidence interval."""
    from impl.ops import pattern_csr
    from impl.ops.pattern import pattern_index

    check_sweeps(sweeps)
    s = _shape(scale)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mask = pattern_mask(s["filters"], s["channels"], sparsity).to(dev)
    w = torch.randn(mask.shape, device=dev) * mask
    flat = w.reshape(s["filters"], -1)
    idx = pattern_index(mask)
    convert, generic_impl = generic_converter(flat)
    generic, ours, speedups = [], [], []
    with _quiet_csr_beta():
        for _ in range(sweeps):
            g = statistics.median(time_ms(convert, repeats=repeats))
            o = statistics.median(
                time_ms(
                    lambda: pattern_csr(w, idx.row_ptr, idx.col_ind, index=idx), repeats=repeats
                )
            )
            generic.append(g * 1e3)
            ours.append(o * 1e3)
            speedups.append(g / o)
    return {
        "conversion_time": per_sweep(generic),
        "pattern_conversion_time": per_sweep(ours),
        "speedup_vs_cusparse": per_sweep(speedups),
        "sweeps": sweeps,
        "shape": filter_matrix(s),
        "sparsity": float(1 - mask.float().mean()),
        "device": device_name(),
        "device_type": dev.type,
        "generic_impl": generic_impl,
        "pattern_impl": "impl.ops.pattern_csr (" + ("cuda" if dev.type == "cuda" else "ref") + ")",
    }


csr_conversion.measure_version = 2  # 2: the two times one value per sweep, as the speedup


def csr_mm(csr: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``csr @ b`` by the library's sparse kernel (cuSPARSE on a GPU, MKL on a CPU) into a new
    result, as the dense GEMM and the pattern SpMM write theirs: ``torch.sparse.mm`` would
    also zero-fill that result and copy it into another, two passes over the output that are
    not the sparse product (ClickTrain Fig. 10 compares products)."""
    out = torch.empty(csr.shape[0], b.shape[1], dtype=b.dtype, device=b.device)
    return torch.addmm(out, csr, b, beta=0.0, alpha=1.0, out=out)


def pattern_beats_dense(times: dict[tuple[str, float], float], sparsity: float) -> bool:
    """Whether the pattern SpMM took less time at ``sparsity`` than both dense ways of the
    layer, the GEMM and the convolution (``times``: ms by (implementation, sparsity), as
    :func:`spmm_sweep` keys them): ClickTrain Sec. 5.2's "faster than cuBLAS's GEMM and
    cuDNN's convolution"."""
    dense = min(times[("dense GEMM", sparsity)], times[("dense conv", sparsity)])
    return times[("pattern SpMM", sparsity)] < dense


#: ClickTrain Sec. 5.2: the pattern SpMM "is faster than cuBLAS's GEMM and cuDNN's convolution
#: when the sparsity ratio is higher than 65%" (Fig. 10), in %.
PAPER_CROSSOVER = 65.0


def wins_above(
    times: dict[tuple[str, float], float], sparsities: list[float], bound: float = PAPER_CROSSOVER
) -> float:
    """1.0 where the pattern SpMM beats both dense ways (:func:`pattern_beats_dense`) at every
    swept sparsity above ``bound`` (%), 0.0 where it loses at one of them, NaN where none of
    ``sparsities`` lies above ``bound``: Sec. 5.2's claim, tested on one sweep's ``times``."""
    above = [sp for sp in sparsities if sp > bound]
    if not above:
        return math.nan
    return 1.0 if all(pattern_beats_dense(times, sp) for sp in above) else 0.0


def spmm_sweep(
    *,
    scale: str,
    context: dict,
    sparsities: tuple[float, ...] = (0.56, 0.65, 0.75, 0.85, 0.9),
    repeats: int = 5,
    sweeps: int = 1,
) -> dict[str, Any]:
    """Fig. 10: time of the filter-matrix product at each sparsity, for dense GEMM
    (``torch.mm``: cuBLAS on a GPU), the dense 3x3 convolution it stands for (``conv2d`` of
    the ``channels`` x sqrt(columns)^2 map, padding 1: cuDNN on a GPU, which may take another
    algorithm than a GEMM), generic sparse CSR (:func:`csr_mm`: cuSPARSE) and the pattern
    SpMM (:func:`impl.ops.pattern_spmm`). Times in ms: medians over every timed call of
    ``sweeps`` passes over the grid. Also the pattern SpMM's speedup over generic CSR near
    75% sparsity and the lowest swept sparsity where it beats both dense ways ("faster than
    cuBLAS's GEMM and cuDNN's convolution", Sec. 5.2), each one value per sweep (so they
    carry their spread; a crossover is NaN in a sweep where the pattern SpMM beat them at no
    swept sparsity), and that crossover from the medians over all sweeps
    (``crossover_sparsity_pooled``, what the figure shows); per sweep too, whether it beat
    both at every swept sparsity above the paper's 65% (``beats_dense_above_65``, 1 or 0:
    :func:`wins_above`), which the claim of Sec. 5.2 is judged on."""
    from impl.ops import pattern_spmm
    from impl.ops.pattern import pattern_index

    check_sweeps(sweeps)
    s = _shape(scale)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    b = torch.randn(9 * s["channels"], s["columns"], device=dev)
    side = math.isqrt(s["columns"])  # the feature map whose im2col matrix b stands for
    x = torch.randn(1, s["channels"], side, side, device=dev)
    grid = []
    for sp in sparsities:
        mask = pattern_mask(s["filters"], s["channels"], sp).to(dev)
        w = (torch.randn(mask.shape, device=dev) * mask).reshape(s["filters"], -1)
        idx = pattern_index(mask)
        values = w[mask.reshape(s["filters"], -1)]
        with _quiet_csr_beta():
            csr = w.to_sparse_csr()
        achieved = round(100 * float(1 - mask.float().mean()), 1)
        w4 = w.reshape(s["filters"], s["channels"], 3, 3)
        cases = {
            "dense GEMM": lambda w=w: torch.mm(w, b),
            "dense conv": lambda w4=w4: F.conv2d(x, w4, padding=1),
            "generic CSR SpMM": lambda csr=csr: csr_mm(csr, b),
            "pattern SpMM": lambda v=values, i=idx: pattern_spmm(
                v, i.row_ptr, i.col_ind, b, index=i
            ),
        }
        grid.append((achieved, cases))
    times: dict[tuple[str, float], list[float]] = {}
    sweep_medians: list[dict[tuple[str, float], float]] = []
    for _ in range(sweeps):
        this: dict[tuple[str, float], float] = {}
        for achieved, cases in grid:
            for impl, fn in cases.items():
                t = time_ms(fn, repeats=repeats)
                times.setdefault((impl, achieved), []).extend(t)
                this[(impl, achieved)] = statistics.median(t)
        sweep_medians.append(this)
    points = [
        {"sparsity": sp, "impl": impl, "time_ms": statistics.median(t)}
        for (impl, sp), t in times.items()
    ]
    at = {(p["impl"], p["sparsity"]): p["time_ms"] for p in points}
    sps = sorted({p["sparsity"] for p in points})
    near75 = min(sps, key=lambda x: abs(x - 75))
    cross = [sp for sp in sps if pattern_beats_dense(at, sp)]
    # the crossover of each sweep (NaN: the pattern SpMM beat dense at no swept sparsity)
    cross_per_sweep = [
        min((sp for sp in sps if pattern_beats_dense(t, sp)), default=math.nan)
        for t in sweep_medians
    ]
    speedups = [
        t[("generic CSR SpMM", near75)] / t[("pattern SpMM", near75)] for t in sweep_medians
    ]
    return {
        "points": points,
        "speedup_vs_cusparse": per_sweep(speedups),
        "speedup_sparsity": near75,
        "crossover_sparsity_vs_cublas_cudnn": per_sweep(cross_per_sweep),
        "beats_dense_above_65": per_sweep([wins_above(t, sps) for t in sweep_medians]),
        "crossover_sparsity_pooled": min(cross) if cross else math.nan,
        "sweeps": sweeps,
        "shape": f"{filter_matrix(s)} times {9 * s['channels']}x{s['columns']}",
        "device": device_name(),
        "device_type": dev.type,
    }


# 4: beats_dense_above_65 per sweep (a file without it read back would drop that row and
# leave the claim to the crossovers, which can only fail it); 3: the dense convolution timed
# too, the crossover against it and the GEMM (2: the GEMM alone; the crossover per sweep, 1:
# one pooled number)
spmm_sweep.measure_version = 4


# names of GPUs as torch.cuda.get_device_name gives them (a CPU model names none of them)
_GPU_NAMES = re.compile(r"NVIDIA|Tesla|Quadro|GeForce|RTX|TITAN|Radeon|Instinct", re.IGNORECASE)


def measured_on_gpu(measured: dict[str, Any]) -> bool:
    """Whether a measurement of this module ran on a GPU: its ``device_type``, else (files
    saved before it was recorded) the generic converter it names (cuSPARSE's) or the
    device's name (a GPU's, not a CPU model)."""
    if measured.get("device_type"):
        return measured["device_type"] == "cuda"
    if measured.get("generic_impl"):
        return "cuSPARSE" in str(measured["generic_impl"])
    return bool(_GPU_NAMES.search(str(measured.get("device") or "")))


PAPER_DEVICE = "an NVIDIA Quadro RTX 5000"  # ClickTrain Sec. 5 and 6.1


def conversion_note(result: Any) -> str:
    """Fig. 9's note for a row of :func:`csr_conversion`: which routines were timed, on which
    device (the measurement's own), beside the paper's cuSPARSE dense2csr on its GPU."""
    m = result.measured or {}
    device = m.get("device") or "?"
    if measured_on_gpu(m):
        impl = str(m.get("generic_impl") or "")
        generic = (
            "cuSPARSE dense2csr (denseToSparse, through CuPy)"
            if impl == CUSPARSE_IMPL
            else f"torch's GPU dense-to-CSR converter ({impl or 'torch.Tensor.to_sparse_csr'})"
        )
        pattern = "impl.ops.pattern_csr's CUDA kernel"
    else:
        generic = "torch's CPU dense-to-CSR converter (torch.Tensor.to_sparse_csr, not cuSPARSE)"
        pattern = (
            "impl.ops.pattern_csr's reference path (a gather at the positions of the pattern's "
            "index, checked once when the pattern was fixed, not on every call)"
        )
    if "pattern_conversion_time" in (result.row.metrics or ()):
        return f"measured on {device}: {pattern}; speedup over {generic}"
    return f"measured on {device}: {generic}; the paper's: cuSPARSE dense2csr on {PAPER_DEVICE}"


def spmm_note(result: Any) -> str:
    """Fig. 10's note for :func:`spmm_sweep`'s row: the routines timed on the measurement's
    device (dense GEMM and convolution, generic CSR SpMM) beside the paper's cuBLAS, cuDNN
    and cuSPARSE, and the sparsity at which the speedup is read (achieved by the 4-of-9
    pattern mask)."""
    m = result.measured or {}
    device = m.get("device") or "?"
    if measured_on_gpu(m):
        dense = "cuBLAS GEMM (torch.mm) and cuDNN convolution (conv2d)"
        generic = "cuSPARSE SpMM (torch.addmm of the CSR matrix into a new result, beta 0)"
    else:
        dense = "the CPU's BLAS GEMM (torch.mm, not cuBLAS) and oneDNN convolution (conv2d)"
        generic = (
            "torch's CPU CSR SpMM (MKL; torch.addmm of the CSR matrix into a new result, "
            "beta 0; not cuSPARSE)"
        )
    at = m.get("speedup_sparsity")
    where = f" at {at:g}% achieved sparsity" if isinstance(at, (int, float)) else ""
    cross = m.get("crossover_sparsity_vs_cublas_cudnn")
    found = ""
    if isinstance(cross, list) and cross:  # per sweep: a sparsity, or None/NaN where none
        hits = [c for c in cross if isinstance(c, (int, float)) and math.isfinite(c)]
        found = (
            f"; the pattern SpMM beat dense at some swept sparsity in {len(hits)} of "
            f"{len(cross)} sweeps"
        )
    return (
        f"measured on {device}: impl.ops.pattern_spmm; speedup{where} over {generic}; "
        f"dense: {dense}{found}; the paper's: cuSPARSE and cuBLAS/cuDNN on {PAPER_DEVICE}"
    )


def comm_projection(
    *,
    scale: str,
    context: dict,
    row: str = "ClickTrain (higher compression)",
    dense_row: str = "dense",
    gpus: tuple[int, ...] = (4, 8, 16),
) -> dict[str, Any]:
    """Fig. 13 (projected, not measured): bytes one rank all-reduces per iteration with the
    pattern Allreduce (only the kept weights' gradients of the pruned convs) against dense,
    and the projected time of a hierarchical ring Allreduce
    (:func:`impl.comm_model.hierarchical_ring_allreduce`) at each GPU count, dense and
    pattern (``comm_ms_dense_<g>``, ``comm_ms_clicktrain_<g>``, ms per iteration), with the
    saving (``comm_time_saved_<g>``, %)."""
    from impl.comm_model import hierarchical_ring_allreduce
    from impl.rundir import read_json
    from impl.train import load_trained_model

    runs = context["runs"].get(row) or []
    if not runs:
        raise ValueError(f"row {row!r} has no finished run to project")
    out: dict[str, Any] = {"device": "model (impl.comm_model), not measured"}
    for g in gpus:
        out[f"comm_time_saved_{g}"] = []
        out[f"comm_ms_dense_{g}"] = []
        out[f"comm_ms_clicktrain_{g}"] = []
    dense_b, sparse_b = [], []
    for path in runs:
        model, _ = load_trained_model(path)
        summary = read_json(f"{path}/summary.json")
        pruned = set((summary.get("clicktrain") or {}).get("pruned_layers") or [])
        dense = sparse = 0
        for name, p in model.named_parameters():
            n = p.numel()
            dense += n * p.element_size()
            module = name.rsplit(".", 1)[0]
            kept = int(torch.count_nonzero(p)) if module in pruned else n
            sparse += kept * p.element_size()
        dense_b.append(dense)
        sparse_b.append(sparse)
        for g in gpus:
            td = hierarchical_ring_allreduce(dense, g).seconds
            ts = hierarchical_ring_allreduce(sparse, g).seconds
            out[f"comm_time_saved_{g}"].append(100.0 * (1 - ts / td))
            out[f"comm_ms_dense_{g}"].append(1e3 * td)
            out[f"comm_ms_clicktrain_{g}"].append(1e3 * ts)
    out["dense_bytes_per_iter"] = statistics.fmean(dense_b)
    out["pattern_bytes_per_iter"] = statistics.fmean(sparse_b)
    out["bytes_saved"] = 100.0 * (1 - statistics.fmean(sparse_b) / statistics.fmean(dense_b))
    return out


comm_projection.measure_version = 2  # 2: the projected times themselves (ms), for the figure
