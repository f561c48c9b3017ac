"""PruneTrain Fig. 7: per-layer execution time of channel gating and channel union for
ResNet-50 on ImageNet (the last layer of each residual block), on a GPU.

Each scale times the last convolution of every residual block of its PruneTrain model
(penalty ratio 0.2, the Table 1 run) forward and backward: as the dense model has it, as
channel union reconfigured it, and under channel gating (select the dense input channels, a
smaller convolution, scatter: impl.methods.prunetrain_gating.GatedConv on the same weights).
smoke/cpu: ResNet-20 on digits on this machine, the Table 1 runs; gpu: the paper's shapes
without training (ResNet-50 at 224 x 224, batch 64, synthetic inputs; PruneTrain's state of
the benchmark suite, half of the channels inside each residual path removed and the model
reconfigured, and half of the shared channels each block's last convolution writes left at
zero: union computes them, gating does not); paper: ResNet-50 trained on ImageNet. The
paper's one stated number is union's 1.9x over dense (Sec. 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from impl.report.results import FigureSpec
from reproductions.common import Row, RowResult, Target, described, reproduce
from reproductions.prunetrain import pair

MEASURE = "reproductions.prunetrain.measure:union_gating_layer_times"
MEASURE_AT_SHAPE = "reproductions.prunetrain.measure:union_gating_layer_times_at_shape"
BATCH = {"smoke": 4, "cpu": 32, "gpu": 64, "paper": 64}
#: gpu scale: the paper's model and resolution (ImageNet ResNet-50), timed untrained.
GPU_SHAPE = {"model": "resnet50", "image": 224, "stem": "imagenet", "num_classes": 1000}
GPU_NOTE = (
    "At gpu scale the models are not trained: the model, resolution and batch are the "
    "paper's, the channel counts are chosen, not a run's: half of the channels inside each "
    "residual path removed at random (the shared nodes kept), and half of the shared channels "
    "each block's last convolution writes left at zero, which union computes and gating "
    "skips. Before this state had that second half (the H200 run of 8f916d6), gating kept "
    "the same channels as union there, and its 1.35x measured the select and scatter alone."
)


def rows(scale: str) -> list[Row]:
    """The dense and PruneTrain runs, then the per-layer timing (gpu: the timing alone, at
    the paper's shapes)."""
    if scale == "gpu":
        return [Row("channel union conv layers vs dense (ResNet-50, 224 x 224)",
                    measure=MEASURE_AT_SHAPE, params={**GPU_SHAPE, "batch": BATCH[scale]},
                    paper={"method": "channel union"},
                    metrics=("conv_speedup_vs_dense", "gating_over_union"))]  # fmt: skip
    model, dataset = ("resnet50", "imagenet") if scale == "paper" else ("resnet32", "cifar10")
    dense, pt = pair(scale, model, dataset)
    dense.paper, pt.paper = {}, {}
    dense.metrics = pt.metrics = ("top1",)
    timing = Row("channel union conv layers vs dense", measure=MEASURE,
                 params={"row": pt.label, "dense_row": dense.label, "batch": BATCH[scale]},
                 paper={"method": "channel union"},
                 metrics=("conv_speedup_vs_dense", "gating_over_union"))  # fmt: skip
    return [dense, pt, timing]


def figures(results: list[RowResult], scale: str, paper: Any) -> list[FigureSpec]:
    """Per-layer forward + backward time: dense, union and gating (the paper's bars)."""
    measured = next((r.measured for r in results if r.measured), None) or {}
    data = [
        {"layer": layer["name"], "ms": layer[f"{k}_ms"], "scheme": k}
        for layer in measured.get("layers", [])
        for k in ("dense", "union", "gating")
    ]
    return [FigureSpec(kind="bar", x="layer", y="ms", hue="scheme", data=data,
                       title=f"Last conv of each residual block, fwd + bwd ({scale} scale, "
                       f"batch {measured.get('batch', '?')})",
                       xlabel="", ylabel="ms (median)")]  # fmt: skip


TARGET = Target(
    key="prunetrain.fig7",
    title="PruneTrain Fig. 7: per-layer time, channel gating vs channel union",
    description=described(__doc__),
    rows=rows,
    metrics=("conv_speedup_vs_dense", "gating_over_union"),
    metric_units={"conv_speedup_vs_dense": "x", "gating_over_union": "x"},
    figures=figures,
    notes=lambda scale: (
        [
            "conv_speedup_vs_dense: summed dense time over summed union time of the timed layers; "
            "gating_over_union: summed gating time over summed union time (above 1: gating is "
            "slower, as the paper finds).",
            "Times at the smoke and cpu scales are CPU times of small layers; the paper's are a "
            "V100's at ImageNet shapes.",
        ]
        + ([GPU_NOTE] if scale == "gpu" else [])
    ),
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run PruneTrain Fig. 7 at ``scale`` (reusing the Table 1 runs); return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
