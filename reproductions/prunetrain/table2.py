"""PruneTrain Table 2: inference throughput (images per second) of the dense and the
PruneTrain-trained models at batch sizes 10 and 100, and PruneTrain's speedup.

Scales: smoke/cpu/gpu time the Table 1 models (ResNet-20 or -32 trained on digits) on this
machine; paper times ResNet-32 trained on CIFAR-100 (the paper's other rows, ResNet-50 and
VGG-11/13 on CIFAR-100 and the three ImageNet ResNet-50 models, are shown as published).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from impl.report.results import FigureSpec
from reproductions.common import Row, RowResult, Target, described, reproduce
from reproductions.prunetrain import pair

MEASURE = "reproductions.prunetrain.measure:inference_throughput"


def rows(scale: str) -> list[Row]:
    """The trained pair, then one throughput measurement per batch size."""
    model, dataset = ("resnet32", "cifar100") if scale == "paper" else ("resnet32", "cifar10")
    dense, pt = pair(scale, model, dataset)
    dense.paper, pt.paper = {}, {}
    dense.metrics = pt.metrics = ("top1",)
    out = [dense, pt]
    for batch in (10, 100):
        params = {"row": pt.label, "dense_row": dense.label, "batch": batch}
        sel = {"model": "resnet32", "dataset": "cifar100"}
        out.append(
            Row(
                f"dense, batch {batch}",
                measure=MEASURE,
                params=params,
                paper={**sel, "method": "dense"},
                measure_keys={f"images_per_second_bs{batch}": "dense"},
                metrics=(f"images_per_second_bs{batch}",),
                group={"batch": batch},
            )
        )
        out.append(Row(f"PruneTrain, batch {batch}", measure=MEASURE, params=params,
                       paper={**sel, "method": "prunetrain"},
                       measure_keys={f"images_per_second_bs{batch}": "prunetrain",
                                     f"speedup_bs{batch}": "speedup"},
                       metrics=(f"images_per_second_bs{batch}", f"speedup_bs{batch}"),
                       group={"batch": batch}))  # fmt: skip
    return out


def figures(results: list[RowResult], scale: str, paper: Any) -> list[FigureSpec]:
    """Images per second per model and batch size; then PruneTrain's speedup over dense per
    batch size, ours beside the paper's CIFAR-100 models (Table 2)."""
    data = []
    for r in results:
        if r.measured is None:
            continue
        key = "dense" if r.row.label.startswith("dense") else "prunetrain"
        data.append({"model": key, "batch": r.row.group["batch"],
                     "images_per_second": r.measured[key]})  # fmt: skip
    speedups = [
        {"batch": r.row.group["batch"], "speedup": r.measured["speedup"],
         "source": f"ours ({scale})"}
        for r in results
        if r.measured is not None and not r.row.label.startswith("dense")
    ]  # fmt: skip
    for p in paper.to_dict("records"):
        if str(p.get("metric", "")).startswith("speedup_bs") and p["dataset"] == "cifar100":
            speedups.append({"batch": int(p["metric"].removeprefix("speedup_bs")),
                             "speedup": float(p["value"]),
                             "source": f"paper {p['model']}"})  # fmt: skip
    return [FigureSpec(kind="bar", x="batch", y="images_per_second", hue="model", data=data,
                       title=f"Inference throughput ({scale} scale)", xlabel="batch size",
                       ylabel="images / s"),
            FigureSpec(kind="bar", x="batch", y="speedup", hue="source", data=speedups,
                       title=f"Inference speedup over dense ({scale} scale)",
                       xlabel="batch size", ylabel="PruneTrain / dense (x)",
                       caption="PruneTrain's throughput over the dense model's at each batch "
                       "size: ours beside the paper's CIFAR-100 models (Table 2; its GPU, "
                       "its models). A speedup below 1 is a slowdown.")]  # fmt: skip


TARGET = Target(
    key="prunetrain.table2",
    title="PruneTrain Table 2: inference throughput of the trained models",
    description=described(__doc__),
    rows=rows,
    metrics=(
        "images_per_second_bs10",
        "speedup_bs10",
        "images_per_second_bs100",
        "speedup_bs100",
    ),  # fmt: skip
    figures=figures,
    metric_units={
        "images_per_second_bs10": "images/s",
        "images_per_second_bs100": "images/s",
        "speedup_bs10": "x",
        "speedup_bs100": "x",
    },  # fmt: skip
    notes=lambda scale: [
        "The paper measures mixed precision on one TITAN Xp; ours run on the device in the "
        "footer (float16 autocast on a GPU, float32 on a CPU).",
        "Ours at small scales stand beside the paper's ResNet-32 CIFAR-100 row.",
        "Every scale measures one model (paper: ResNet-32 on CIFAR-100); the paper's other "
        "rows (ResNet-50, VGG-11/13, three ImageNet ResNet-50s) are shown as published only.",
    ],
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run PruneTrain Table 2 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
