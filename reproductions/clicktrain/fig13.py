"""ClickTrain Fig. 13: communication time per iteration of dense training and of ClickTrain
with the pattern Allreduce on 4, 8 and 16 GPUs (ResNet-50, ResNet-101, VGG-16, ImageNet).

This machine has no 4-16 GPUs: at every scale the saving is projected, not measured, from
the bytes the pattern Allreduce sends (the kept weights' gradients of the pruned convs) and
the dense bytes, through the hierarchical ring Allreduce model of :mod:`impl.comm_model`.
Smoke/cpu/gpu project the Table 1 ClickTrain run; paper projects ImageNet ClickTrain runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from impl.report.results import FigureSpec
from reproductions.clicktrain import method_rows
from reproductions.common import Row, RowResult, Target, described, reproduce
from reproductions.settings import setup_name

GPUS = (4, 8, 16)


def rows(scale: str) -> list[Row]:
    """The ClickTrain run(s), then one projection per run."""
    models = ["resnet50", "resnet101", "vgg16"] if scale == "paper" else ["resnet50"]
    out = []
    for model in models:
        dataset = "imagenet" if scale == "paper" else "cifar10"
        ct = [r for r in method_rows(scale, model, dataset)
              if r.method == "clicktrain" and "higher" in r.label][0]  # fmt: skip
        ct.paper, ct.baseline, ct.metrics = {}, None, ("compression_ratio",)
        out.append(ct)
        # below paper scale the run is the scale's model, not the paper's: the label says so
        name = f"{model}: " if scale == "paper" else ""
        beside = "" if scale == "paper" else f" (paper: {model})"
        for g in GPUS:
            out.append(
                Row(f"{name}projection, {g} GPUs{beside}",
                    measure="reproductions.clicktrain.kernels:comm_projection",
                    params={"row": ct.label, "gpus": list(GPUS)},
                    paper={"model": model, "setting": f"{g} GPUs"}, group={"gpus": g},
                    measure_keys={"comm_time_saved": f"comm_time_saved_{g}"})
            )  # fmt: skip
    return out


def figures(results: list[RowResult], scale: str, paper: Any) -> list[FigureSpec]:
    """The paper's axes: communication time per iteration of dense and ClickTrain against
    GPU count (ours projected; the paper's times are not in its text); then the saving,
    ours projected and the paper's stated percentages."""
    times, data = [], []
    # the model our projections start from, named in the legend: at cpu scale it is not the
    # paper's ResNet-50, whose curve stands beside it
    cfg = next((run.config for r in results for run in r.runs if run.config), {})
    ours = f"ours, {setup_name(cfg.get('model'), cfg.get('data'))}" if cfg else "ours"
    for r in results:
        if r.measured is not None:
            g = r.row.group["gpus"]
            for v in r.measured[f"comm_time_saved_{g}"]:
                data.append({"gpus": g, "saved": v, "source": f"{ours}, projected ({scale})"})
            for method, key in (("dense", "dense"), ("ClickTrain", "clicktrain")):
                for v in r.measured.get(f"comm_ms_{key}_{g}", []):
                    times.append({"gpus": g, "ms": v,
                                  "source": f"{method}, {ours}, projected ({scale})"})  # fmt: skip
    for p in paper.to_dict("records"):
        data.append({"gpus": int(p["setting"].split()[0]), "saved": float(p["value"]),
                     "source": f"paper {p['model']}"})  # fmt: skip
    return [FigureSpec(kind="line", x="gpus", y="ms", hue="source", data=times,
                       title="Communication time per iteration (projected)", xlabel="GPUs",
                       ylabel="ms per iteration"),
            FigureSpec(kind="line", x="gpus", y="saved", hue="source", data=data,
                       title="Communication time saved per iteration", xlabel="GPUs",
                       ylabel="saved vs dense (%)")]  # fmt: skip


TARGET = Target(
    key="clicktrain.fig13",
    title="ClickTrain Fig. 13: communication time saved by the pattern Allreduce (projected)",
    description=described(__doc__),
    rows=rows,
    metrics=("comm_time_saved", "bytes_saved"),
    figures=figures,
    metric_units={"comm_time_saved": "%", "bytes_saved": "%"},
    notes=lambda scale: [
        "Projected with impl.comm_model (hierarchical ring Allreduce, its default links), "
        "not measured: no multi-GPU run happened here.",
        "The paper's measured saving includes PyTorch's overlap of communication with the "
        "backward pass, which a payload projection does not model.",
    ],
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run ClickTrain Fig. 13 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
