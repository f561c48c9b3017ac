"""PruneTrain Fig. 9: the mini-batch size over the epochs with dynamic mini-batch adjustment
(ResNet-50; CIFAR-100 from 128 up to 320, ImageNet from 64 to 128 per GPU).

Scales: smoke/cpu read the dynamic-batch run of Table 4 (ResNet-20 on digits); gpu ResNet-32
on digits; paper ResNet-50 on CIFAR-100 and ImageNet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from impl.report.results import FigureSpec
from reproductions.common import Row, RowResult, RunRecord, Target, described, reproduce
from reproductions.prunetrain import (
    IMAGENET_GPUS,
    PAPER_CIFAR_EPOCHS,
    UNCHANGED_BATCH_NOTES,
    epoch_batches,
)
from reproductions.prunetrain.table4 import rows as table4_rows


def final_batch(run: RunRecord, base: RunRecord | None = None) -> float:
    """The mini-batch size of the last epoch."""
    return epoch_batches(run)[-1] if run.metrics else float("nan")


def final_batch_per_gpu(run: RunRecord, base: RunRecord | None = None) -> float:
    """The last epoch's mini-batch per GPU of the paper's ImageNet setup (4 GPUs; Fig. 9a
    plots the batch per GPU): ours trains the global batch in one process."""
    return final_batch(run) / IMAGENET_GPUS


def rows(scale: str) -> list[Row]:
    """The dynamic mini-batch rows of Table 4 (with their dense baselines)."""
    out = []
    for r in table4_rows(scale):
        if "naive" in r.label:
            continue
        if "dynamic" in r.label:
            ds = r.paper.get("dataset", "cifar100")
            r.paper = ({"dataset": "cifar100", "setting": "from epoch 120"} if ds == "cifar100"
                       else {"dataset": "imagenet", "setting": "from epoch 30"})  # fmt: skip
            # the paper plots ImageNet's batch per GPU (4 GPUs), CIFAR-100's whole (one GPU)
            r.metrics = ("batch_size_per_gpu",) if ds == "imagenet" else ("batch_size",)
        out.append(r)
    return out


def figures(results: list[RowResult], scale: str, paper: Any) -> list[FigureSpec]:
    """The memory of one iteration against epoch (the paper's axis; ours only, with the
    budget), then the batch size against epoch (ours beside the paper's schedule)."""
    data = []
    for r in results:
        if "dynamic" not in r.row.label:
            continue
        for run in r.runs:
            epochs = run.config.get("epochs") or len(run.metrics)
            source = f"ours ({scale}), seed {run.seed}"
            batches = epoch_batches(run)
            for m, batch in zip(run.metrics, batches):  # 0-based, as the paper's
                data.append({"training_pct": 100.0 * m["epoch"] / epochs, "batch_size": batch,
                             "source": source})  # fmt: skip
            if batches:  # the last batch held to the end of training
                data.append({"training_pct": 100.0, "batch_size": batches[-1], "source": source})
    steps = sorted(
        (100.0 * int(p["setting"].split()[-1]) / PAPER_CIFAR_EPOCHS, float(p["value"]))
        for p in paper.to_dict("records")
        if p["dataset"] == "cifar100"
    )
    if steps:
        steps.append((100.0, steps[-1][1]))  # the last batch held to the end of training
    for pct, batch in steps:
        data.append({"training_pct": pct, "batch_size": batch, "source": "paper (CIFAR-100)"})
    memory = [
        {
            "epoch": m["epoch"] + 1,
            "mib": m[key] / 2**20,
            "source": f"{what} ({scale}), seed {run.seed}",
            "series": what,
        }
        for r in results
        if "dynamic" in r.row.label
        for run in r.runs
        for m in run.metrics
        for key, what in (("iteration_memory_bytes", "ours"), ("memory_budget_bytes", "budget"))
        if m.get(key) is not None
    ]
    return [FigureSpec(kind="line", x="epoch", y="mib", hue="source", style="series",
                       data=memory,
                       title="Memory of one training iteration", xlabel="epoch",
                       ylabel="MiB per iteration", y_from_zero=True,
                       caption="The paper's axis (Fig. 9): the memory one iteration of the "
                       "epoch's pruned model at the epoch's batch needs, beside the budget "
                       "the batch grows within; the paper prints no memory values, only the "
                       "batch sizes of the next figure."),
            FigureSpec(kind="line", x="training_pct", y="batch_size", hue="source", data=data,
                       title="Mini-batch size over training", xlabel="% of training (epochs)",
                       ylabel="samples per batch", steps=True,
                       caption="Each batch size holds from the epoch it is drawn at until the "
                       "next change (the paper's schedule changes in steps). The axis is the "
                       f"share of each run's epochs ({PAPER_CIFAR_EPOCHS} in the paper's, "
                       f"fewer in ours at {scale} scale), so that both span it.")]  # fmt: skip


TARGET = Target(
    key="prunetrain.fig9",
    title="PruneTrain Fig. 9: dynamic mini-batch size over epochs",
    description=described(__doc__),
    rows=rows,
    metrics=("batch_size", "batch_size_per_gpu"),
    figures=figures,
    extra_metrics={
        "batch_size": ("samples", final_batch),
        "batch_size_per_gpu": ("samples", final_batch_per_gpu),
    },
    **UNCHANGED_BATCH_NOTES,
    notes=lambda scale: [
        "The batch of the last epoch is compared with the paper's final batch (CIFAR-100: "
        "320 from epoch 120; ImageNet: 128 per GPU from epoch 30, ours the global batch "
        "over the paper's 4 GPUs).",
    ],
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run PruneTrain Fig. 9 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
