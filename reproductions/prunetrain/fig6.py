"""PruneTrain Fig. 6: inference FLOPs of channel union against channel gating for ResNet-32
and ResNet-50 on CIFAR-10 at different pruning intensities (the difference is 1-6%).

pdtbench reconfigures by channel union (impl.methods.prunetrain). Channel gating is counted,
not run: on each trained PruneTrain model of the penalty sweep (the Fig. 8 runs) every
convolution is reduced to its own dense input channels and filters
(impl.methods.prunetrain_gating), against the convolutions as union keeps them. Scales:
smoke/cpu ResNet-20 on digits, gpu ResNet-32 on digits, paper ResNet-50 on CIFAR-10.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from impl.report.results import FigureSpec
from reproductions.common import Row, RowResult, Target, described, reproduce
from reproductions.prunetrain import fig8

MEASURE = "reproductions.prunetrain.measure:union_vs_gating"


def sweep_model(scale: str) -> str:
    """The model and data of the Fig. 8 sweep this count reads at ``scale``, in words."""
    from reproductions.common import SCALE_TRAIN
    from reproductions.settings import setup_text

    cfg = {**SCALE_TRAIN[scale], **fig8.rows(scale)[0].train}
    return setup_text({k: cfg[k] for k in ("model", "data") if k in cfg})


def rows(scale: str) -> list[Row]:
    """The Fig. 8 sweep (dense and PruneTrain at each ratio), then the FLOPs count."""
    sweep = fig8.rows(scale)
    for r in sweep:
        r.paper, r.metrics = {}, ("top1",)
    dense, pruned = sweep[0], sweep[1:]
    count = Row(
        "channel union vs channel gating",
        measure=MEASURE,
        params={"rows": [r.label for r in pruned], "dense_row": dense.label},
        paper={"method": "channel union vs channel gating"},
        measure_keys={
            "inference_flops_difference_min": "difference_min",
            "inference_flops_difference_max": "difference_max",
        },
        metrics=("inference_flops_difference_min", "inference_flops_difference_max"),
    )
    return [*sweep, count]  # fmt: skip


def figures(results: list[RowResult], scale: str, paper: Any) -> list[FigureSpec]:
    """Inference conv FLOPs (% of dense) per penalty ratio, union beside gating."""
    measured = next((r.measured for r in results if r.measured), None) or {}
    ratio = {r.row.label: r.row.group.get("ratio") for r in results}
    data = [
        {"ratio": ratio.get(label, label), "scheme": scheme, "flops": v[scheme]}
        for label, v in measured.get("per_row", {}).items()
        for scheme in ("union", "gating")
    ]
    return [FigureSpec(kind="bar", x="ratio", y="flops", hue="scheme", data=data,
                       title=f"Inference conv FLOPs, union vs gating ({scale} scale)",
                       xlabel="penalty ratio (paper's)", ylabel="% of dense")]  # fmt: skip


TARGET = Target(
    key="prunetrain.fig6",
    title="PruneTrain Fig. 6: channel union vs channel gating (inference FLOPs)",
    description=described(__doc__),
    rows=rows,
    metrics=("inference_flops_difference_min", "inference_flops_difference_max"),
    metric_units={
        "inference_flops_difference_min": "%",
        "inference_flops_difference_max": "%",
    },  # fmt: skip
    figures=figures,
    notes=lambda scale: [
        "Gating is counted on the trained union model, not run: every conv reduced to the "
        "input channels and filters whose weights are not all zero (|w| above the run's "
        "threshold). The difference is union minus gating, in points of the dense model's "
        "conv FLOPs, smallest and largest over the penalty ratios.",
        f"Ours sweep {sweep_model(scale)} only; the paper's 1-6% range is over ResNet-32 "
        "and ResNet-50 on CIFAR-10 (Sec. 4.2).",
        "The paper's Fig. 7 times the two schemes: prunetrain.fig7 does too, with gating's "
        "select and scatter layers (impl.methods.prunetrain_gating.GatedConv).",
    ],
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run PruneTrain Fig. 6 at ``scale`` (reusing the Fig. 8 runs); return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
