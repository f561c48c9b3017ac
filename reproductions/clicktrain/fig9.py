"""ClickTrain Fig. 9: time to convert the 256 x 1152 filter matrix to CSR, cuSPARSE's
dense2csr against ClickTrain's conversion with predefined nonzero positions (Sec. 5.1).

Scales: smoke times a 32 x 144 matrix; cpu times the paper's 256 x 1152 matrix on the CPU
(generic ``to_sparse_csr`` against :func:`impl.ops.pattern_csr`'s reference path); gpu and
paper time it on the GPU (cuSPARSE's denseToSparse through CuPy, the paper's dense2csr,
against the CUDA kernel; torch's ``to_sparse_csr``, named so, where CuPy is missing).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from impl.report.results import FigureSpec
from reproductions.clicktrain.kernels import (
    PAPER_SHAPE,
    SCALE_SHAPES,
    conversion_note,
    filter_matrix,
)
from reproductions.common import TIMING_SWEEPS, Row, RowResult, Target, described, reproduce

MEASURE = "reproductions.clicktrain.kernels:csr_conversion"


def _spaced(dims: str) -> str:
    """``"256x1152"`` as ``"256 x 1152"``."""
    return dims.replace("x", " x ")


def matrix_shape(results: list[RowResult], scale: str) -> str:
    """The filter matrix timed, "rows x columns": as the measurement recorded it (a reused
    one keeps its own), else the scale's shape (:data:`kernels.SCALE_SHAPES`)."""
    for r in results:
        shape = (r.measured or {}).get("shape")
        if shape:
            return _spaced(str(shape))
    return _spaced(filter_matrix(SCALE_SHAPES[scale]))


def heading(results: list[RowResult], scale: str) -> tuple[str, str]:
    """The title and a description naming the matrix this scale timed (the paper's is
    256 x 1152, Sec. 5.1)."""
    shape, paper = matrix_shape(results, scale), _spaced(filter_matrix(PAPER_SHAPE))
    which = "the paper's shape" if shape == paper else f"the paper's is {paper}"
    return TARGET.title, (
        f"ClickTrain Fig. 9: time to convert the {shape} filter matrix ({which}) to CSR, "
        "cuSPARSE's dense2csr against ClickTrain's conversion with predefined nonzero "
        "positions (Sec. 5.1)."
    )


def rows(scale: str) -> list[Row]:
    """One measurement, compared with the paper's two numbers."""
    sweeps = {"sweeps": TIMING_SWEEPS[scale]}
    return [
        Row("generic dense->CSR", measure=MEASURE, params=sweeps,
            paper={"method": "cusparse_dense2csr"}, metrics=("conversion_time",)),
        Row("pattern CSR with predefined positions", measure=MEASURE, params=sweeps,
            paper={"method": "clicktrain_convert2csr"},
            metrics=("pattern_conversion_time", "speedup_vs_cusparse")),
    ]  # fmt: skip


#: The paper's GPU (Sec. 5.1).
PAPER_GPU = "Quadro RTX 5000"


def _mean_us(value: float | list[float]) -> float:
    """A time as saved: one value, or one per sweep (their mean)."""
    return statistics.fmean(value) if isinstance(value, list) else float(value)


def figures(results: list[RowResult], scale: str, paper: Any) -> list[FigureSpec]:
    """Bars of the two conversion times (us), ours beside the paper's: its cuSPARSE dense2csr
    (about 800 us) and its conversion, derived as that time over its 4x speedup (Sec. 5.1)."""
    data = []
    for r in results:
        if r.measured:
            ours = f"ours ({scale}, {r.measured.get('device') or '?'})"
            data = [
                {"converter": "generic dense-to-CSR",
                 "time_us": _mean_us(r.measured["conversion_time"]), "source": ours},
                {"converter": "pattern CSR",
                 "time_us": _mean_us(r.measured["pattern_conversion_time"]), "source": ours},
            ]  # fmt: skip
            break
    published = {(p["method"], p["metric"]): float(p["value"]) for p in paper.to_dict("records")}
    generic = published.get(("cusparse_dense2csr", "conversion_time"))
    speedup = published.get(("clicktrain_convert2csr", "speedup_vs_cusparse"))
    if generic is not None:
        source = f"paper ({PAPER_GPU})"
        data.append({"converter": "generic dense-to-CSR", "time_us": generic, "source": source})
        if speedup:
            data.append({"converter": "pattern CSR", "time_us": generic / speedup,
                         "source": source})  # fmt: skip
    return [FigureSpec(kind="bar", x="converter", y="time_us", hue="source", data=data,
                       title=f"CSR conversion time ({scale} scale)", ylabel="time (us)",
                       xlabel="", caption=f"{matrix_shape(results, scale)} filter matrix; ours "
                       f"the mean over {TIMING_SWEEPS[scale]} sweeps of each sweep's median of 20 "
                       "calls, after warm-up (generic: cuSPARSE's dense2csr through CuPy on a "
                       "GPU, torch.Tensor.to_sparse_csr on a CPU or where CuPy is missing, as "
                       "each row's note names it; pattern: impl.ops.pattern_csr). The paper's "
                       "generic bar is its "
                       "cuSPARSE dense2csr (about 800 us, 256 x 1152); its pattern bar is "
                       "derived, that time over its stated 4x speedup (Sec. 5.1, Fig. 9). "
                       "Different devices: compare each source's two bars.")]  # fmt: skip


TARGET = Target(
    key="clicktrain.fig9",
    title="ClickTrain Fig. 9: CSR conversion time",
    description=described(__doc__),
    rows=rows,
    metrics=("conversion_time", "pattern_conversion_time", "speedup_vs_cusparse"),
    figures=figures,
    metric_units={
        "conversion_time": "us",
        "pattern_conversion_time": "us",
        "speedup_vs_cusparse": "x",
    },  # fmt: skip
    row_note=conversion_note,
    heading=heading,
    notes=lambda scale: [
        "The paper's numbers are from an NVIDIA Quadro RTX 5000; each row's note names the "
        "routines we timed and the device they ran on.",
        "Where the device is a CPU (each row's note names it), the generic converter is "
        "torch's, not cuSPARSE: the comparison is of the same two algorithms, not of the "
        "paper's libraries.",
    ],
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run ClickTrain Fig. 9 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
