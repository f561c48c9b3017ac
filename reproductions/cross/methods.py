"""Every method on equal terms: a table no paper has.

Dense, ClickTrain, PruneTrain, SDGP, Campfire and every registered plug-in method train the
same model on the same data for the same epochs with the same optimizer, learning-rate
schedule, batch size, seeds and hardware, each with its paper's default hyper-parameters
scaled to the run's length. The table reports, per method: top-1 (mean and standard
deviation over the seeds), the conv compression ratio, training FLOPs of the whole run and
inference FLOPs (nominal: what the method's sparsity would save on hardware that exploits
it; executed: what this implementation runs), the measured time per iteration, the time to a
target accuracy, and the bytes a data-parallel step all-reduces.

Scales: smoke (pipeline, one seed), cpu (ResNet-20 on digits, 8 epochs, 5 seeds), gpu
(ResNet-32 on digits, 30 epochs, 5 seeds), paper (ResNet-32 on CIFAR-10, 182 epochs with
the step schedule from epochs 91 and 136 counted from 1, 3 seeds).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from impl.report.labels import seeds_text
from impl.report.results import FigureSpec
from impl.report.runs import time_to_accuracy
from reproductions.common import (
    SCALE_TRAIN,
    Row,
    RowResult,
    RunRecord,
    Target,
    epoch_curves,
    figure_rows,
    reproduce,
    row_metric,
)
from reproductions.settings import SETUP_FIELDS, setup_text

METHOD_ORDER: tuple[str, ...] = ("dense", "clicktrain", "prunetrain", "sdgp", "campfire")
SEEDS: dict[str, tuple[int, ...]] = {
    "smoke": (0,),
    "cpu": (0, 1, 2, 3, 4),
    "gpu": (0, 1, 2, 3, 4),
    "paper": (0, 1, 2),
}
TRAIN: dict[str, dict[str, Any]] = {
    "smoke": {"model": "resnet20", "data": "digits"},
    "cpu": {"model": "resnet20", "data": "digits", "epochs": 8},
    "gpu": {"model": "resnet32", "data": "digits", "epochs": 30},
    "paper": {"model": "resnet32", "data": "cifar10", "epochs": 182},
}
# Accuracy at which time-to-accuracy is read, per scale (top-1 %).
TTA_TARGET: dict[str, float] = {"smoke": 10.0, "cpu": 90.0, "gpu": 95.0, "paper": 92.0}


def method_options(method: str, scale: str) -> dict[str, Any]:
    """Each method's options at ``scale``: its paper's defaults, with PruneTrain's mapped onto
    the short runs (:func:`reproductions.prunetrain.options`)."""
    if method == "prunetrain":
        from reproductions.prunetrain import options

        return options(scale, 0.2)
    if method == "sdgp":
        return {"n": 2, "m": 4, "prune_method": "rescaled", "profile": True}
    if method == "campfire":
        return {"final_sparsity": 0.7, "mask": "combined"}
    if method == "clicktrain":
        return {}
    return {}


def registered_methods() -> tuple[str, ...]:
    """Methods registered beside the built-in ones (``docs/new-method.md``) through an entry
    point or ``PDTBENCH_METHODS``: the table gives each a row, with its default options."""
    from impl.methods import available_methods

    return tuple(m for m in available_methods() if m not in METHOD_ORDER)


def rows(scale: str) -> list[Row]:
    """One row per method (the five of :data:`METHOD_ORDER`, then every registered one), same
    training config, :data:`SEEDS` of the scale."""
    return [
        Row(
            m,
            m,
            options=method_options(m, scale),
            train=dict(TRAIN[scale]),
            seeds=SEEDS[scale],
            baseline=None if m == "dense" else "dense",
        )
        for m in METHOD_ORDER + registered_methods()
    ]


def tta_seconds(run: RunRecord, base: RunRecord | None = None) -> float:
    """Training seconds until the run's test top-1 first reaches the target of its scale
    (:data:`TTA_TARGET`); NaN when it never does."""
    import pandas as pd

    return time_to_accuracy(pd.DataFrame(run.metrics), TTA_TARGET[run.summary["scale"]])


METRICS_SHOWN: tuple[str, ...] = (
    "top1",
    "delta_top1",
    "compression_ratio",
    "train_flops_saved",
    "train_flops_executed_saved",
    "train_flops_per_sample",
    "train_flops_executed_per_sample",
    "inference_flops_per_sample",
    "inference_flops_executed_per_sample",
    "fwd_ms",
    "bwd_ms",
    "step_ms",
    "iter_ms",
    "run_iter_ms",
    "time_to_accuracy",
    "wall_seconds",
    "comm_bytes_per_iter",
    "peak_gpu_memory_mib",
)


def seed_pairs(results: list[RowResult], x: str, y: str, scale: str) -> list[dict[str, Any]]:
    """One record per run with both metrics ``x`` and ``y`` of that same run (its seed's
    baseline run for a delta): ``{"row", "seed", x, y, "source"}``; a run missing either
    metric is left out, never paired with another seed's value."""
    out = []
    for res in results:
        if not res.ok or res.measured is not None:
            continue
        base = next((r for r in results if r.row.label == res.row.baseline), None)
        for run in res.runs:
            one = dataclasses.replace(res, runs=[run])
            vx, vy = (row_metric(one, m, base, res.table) for m in (x, y))
            if vx and vy and math.isfinite(vx[0]) and math.isfinite(vy[0]):
                out.append({"row": res.row.label, "seed": run.seed, x: vx[0], y: vy[0],
                            "source": f"ours ({scale})"})  # fmt: skip
    return out


def _by_kind(
    results: list[RowResult], scale: str, y: str, kinds: dict[str, str]
) -> list[dict[str, Any]]:
    """The :func:`figure_rows` of each metric in ``kinds`` (``{kind: metric}``), its value
    under the one column ``y`` and its kind under ``"kind"``: one bar per kind in a figure."""
    out = []
    for kind, metric in kinds.items():
        for r in figure_rows(results, metric, scale):
            out.append({**{k: v for k, v in r.items() if k != metric}, y: r[metric], "kind": kind})
    return out


def figures(results: list[RowResult], scale: str, paper: Any) -> list[FigureSpec]:
    """Top-1 change against training FLOPs saved (one point per method), top-1 change against
    dense (with its 95% CI), FLOPs saved per method, time per iteration per method, and test
    top-1 per epoch."""
    acc = figure_rows(results, "delta_top1", scale)
    flops = _by_kind(
        results,
        scale,
        "train_flops_saved",
        {"nominal": "train_flops_saved", "executed": "train_flops_executed_saved"},
    )
    it = _by_kind(results, scale, "iter_ms", {"last epoch": "iter_ms", "whole run": "run_iter_ms"})
    cost = seed_pairs(results, "train_flops_saved", "delta_top1", scale)
    curves = epoch_curves(results, "test_top1")
    return [
        FigureSpec(kind="tradeoff", x="train_flops_saved", y="delta_top1", hue="row", data=cost,
                   title="Accuracy against training cost",
                   xlabel="training FLOPs saved over the run (%, nominal)",
                   ylabel="top-1 - dense (points)",
                   caption=f"one point per method: means over seeds with their 95% confidence "
                   f"intervals (Student's t); up and right is better; scale {scale}. The "
                   "savings are nominal (what hardware exploiting the sparsity would save): "
                   "the figure of training FLOPs saved shows what this implementation "
                   "executes"),
        FigureSpec(kind="interval", x="row", y="delta_top1", data=acc,
                   title="Top-1 change against dense", ylabel="top-1 - dense (points)", xlabel="",
                   caption=f"mean over seeds with its 95% confidence interval (Student's t), "
                   f"each seed against the dense run of the same seed; scale {scale}"),
        FigureSpec(kind="bar", x="row", y="train_flops_saved", hue="kind", data=flops,
                   title="Training FLOPs saved over the run", ylabel="saved vs dense (%)",
                   xlabel="", caption="nominal: if hardware exploited the sparsity; executed: "
                   "what this implementation runs"),
        FigureSpec(kind="bar", x="row", y="iter_ms", hue="kind", data=it,
                   title="Time per iteration", ylabel="fwd + bwd + step (ms)", xlabel="",
                   caption=f"last epoch: its median iteration; whole run: the epochs' medians "
                   f"weighted by their iterations; measured at scale {scale}"),
        FigureSpec(kind="line", x="epoch", y="test_top1", hue="row", style="row", data=curves,
                   title="Test top-1 per epoch", xlabel="epoch", ylabel="top-1 (%)",
                   caption="mean and sd over seeds"),
    ]  # fmt: skip


def shared_setup(scale: str) -> str:
    """The training setup every method of the table runs at ``scale``, in words (model, data
    and input size, epochs, batch size, optimizer and schedule: :func:`setup_text`)."""
    from impl.config import resolve

    values = {**SCALE_TRAIN[scale], **TRAIN[scale]}
    cfg = resolve(scale, method="dense", **values).to_dict()
    return setup_text({k: cfg[k] for k in SETUP_FIELDS if k in cfg})


def layout_note(scale: str) -> str:
    """Which memory layout each method trains in at ``scale`` (``TrainConfig.memory_format``;
    "auto" resolved per method on a CPU, :func:`impl.train.resolve_memory_format`)."""
    import torch

    from impl.config import resolve
    from impl.methods import method_class
    from impl.train import resolve_memory_format

    values = {**SCALE_TRAIN[scale], **TRAIN[scale]}
    fmt = resolve(scale, method="dense", **values).memory_format
    cpu = torch.device("cpu")
    if fmt != "auto":
        name = "NCHW" if fmt == "contiguous" else fmt
        return f"Memory layout: {name} (memory_format {fmt}) for every method."
    methods = (*METHOD_ORDER, *registered_methods())
    on_cpu = [
        m for m in methods if resolve_memory_format(fmt, method_class(m), cpu) != "contiguous"
    ]
    rest = [m for m in methods if m not in on_cpu]
    words = ", ".join(METHOD_NAMES.get(m, m) for m in on_cpu) or "no method"
    others = ", ".join(METHOD_NAMES.get(m, m) for m in rest) or "none"
    return (
        f"Memory layout: on a CPU {words} train channels_last, the layout measured faster "
        f"for them, and {others} NCHW (memory_format auto; each summary.json records its "
        "layout): times per iteration compare each method in its faster layout. On a GPU "
        "every method trains NCHW."
    )


def notes(scale: str) -> list[str]:
    """How the table is measured at ``scale``."""
    extra = registered_methods()
    return [
        *(
            [
                f"Registered methods beside the five (docs/new-method.md), with their default "
                f"options: {', '.join(extra)}."
            ]
            if extra
            else []
        ),
        f"Same setup for every method: {shared_setup(scale)}; seed"
        f"{'s' if len(SEEDS[scale]) > 1 else ''} {seeds_text(SEEDS[scale])}. "
        "Each method's options as run: the settings table under the results.",
        "Top-1 change vs dense: each seed's top-1 minus the dense run's of the same seed; the "
        "bracket is the 95% confidence interval of the mean difference (Student's t over the "
        "seeds). An interval that contains 0 says the method's accuracy differs from dense by "
        "no more than seed-to-seed noise."
        + (
            " On digits, one test image is 0.28 points (360 test images)."
            if TRAIN[scale]["data"] == "digits"
            else ""
        ),
        f"Time to accuracy: training seconds until test top-1 first reaches "
        f"{TTA_TARGET[scale]}% (the test passes left out, a method's work between epochs "
        "such as PruneTrain's reconfiguration counted); '-' when a method never reaches it.",
        "Training FLOPs saved: whole run, against the dense run of the same seed; nominal "
        "counts what the sparsity saves on hardware that exploits it, executed what this "
        "implementation runs (impl.flops).",
        "Executed inference FLOPs: the forward FLOPs the final model's modules run "
        "(summary.json's inference_flops_executed): a masked dense conv counts whole, a "
        "pattern conv (ClickTrain) only its kept weights, a reconfigured network (PruneTrain) "
        "its smaller shapes.",
        "Peak GPU memory (a row only where the runs trained on a GPU): the most memory "
        "tensors held while training (the allocator's statistics).",
        "Bytes per iteration: what one rank all-reduces per iteration, from summary.json "
        "(comm_bytes_per_iter: the gradients kept by the method's communication masks, all "
        "gradients for a method that declares none; ClickTrain's pattern Allreduce is "
        "projected in the ClickTrain Fig. 13 reproduction).",
        layout_note(scale),
        "Times (per iteration, to accuracy, wall) are measured on the machine of the run while "
        "`pdtbench reproduce` trains its runs side by side (--jobs processes, by default one "
        "per core, each with --threads torch threads, by default the cores divided among "
        "them; each run records its own in its environment): they compare methods as far as "
        "the load on the machine was the same for each run; the FLOPs and bytes columns are "
        "exact.",
    ]


# how the title and description name each built-in method (a plug-in: by its registered name)
METHOD_NAMES: dict[str, str] = {
    "dense": "dense",
    "clicktrain": "ClickTrain",
    "prunetrain": "PruneTrain",
    "sdgp": "SDGP",
    "campfire": "Campfire",
}
DESCRIPTION = __doc__.split("\n\n")[1].replace("\n", " ")
_SAME = "train the same model"


def heading(results: list[RowResult], scale: str) -> tuple[str, str]:
    """The result's title and description, counting and naming the methods the table shows
    (one row each: the five built-in ones and every registered plug-in that ran or was
    listed), e.g. "Cross-method table: 6 methods on equal terms (dense, ClickTrain, ...)"."""
    names = [METHOD_NAMES.get(r.row.method, r.row.method) for r in results]
    listed = ", ".join(names)
    plural = "s" if len(names) != 1 else ""
    title = f"Cross-method table: {len(names)} method{plural} on equal terms"
    if names:
        title += f" ({listed})"
    words = names[0].capitalize() if len(names) == 1 else ""
    if len(names) > 1:
        words = f"{', '.join(names[:-1])} and {names[-1]}"
        words = words[0].upper() + words[1:]
    verb = "trains" if len(names) == 1 else "train"
    rest = DESCRIPTION[DESCRIPTION.index(_SAME) + len("train") :]
    return title, f"{words} {verb}{rest}" if names else DESCRIPTION


TARGET = Target(
    key="cross.methods",
    title="Cross-method table: every method on equal terms",
    description=DESCRIPTION,
    heading=heading,
    rows=rows,
    metrics=METRICS_SHOWN,
    figures=figures,
    notes=notes,
    extra_metrics={"time_to_accuracy": ("s", tta_seconds)},
    wide=True,
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run the cross-method table at ``scale`` (reusing finished runs); return the report."""
    return reproduce(TARGET, scale, runs_root, reports_root)
