"""PruneTrain Fig. 2: training FLOPs per iteration over the epochs, normalised to dense, for
different sparsification strengths (a), and the extra training FLOPs of reconfiguring only
once, at the best epoch, against PruneTrain's periodic reconfiguration (c).

Scales: smoke/cpu train ResNet-20 on digits at penalty ratios 0.1, 0.2 and 0.25; gpu
ResNet-32 on digits; paper ResNet-50 on CIFAR-10 (182 epochs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from impl.report.results import FigureSpec
from reproductions.common import Row, RowResult, RunRecord, Target, described, reproduce
from reproductions.prunetrain import pair, ratio_label

RATIOS = (0.1, 0.2, 0.25)


def one_time_overheads(run: RunRecord, dense: float) -> list[float]:
    """Extra training FLOPs (%) of a single reconfiguration after epoch e (index e) against
    PruneTrain's periodic one (Fig. 2c), from the per-epoch costs: the one-time model trains
    densely (``dense`` FLOPs per sample) until epoch e, then at the cost PruneTrain's model
    had after epoch e (pruned channels do not revive, Sec. 4.2); PruneTrain trains each
    epoch at the cost after the previous one."""
    costs = [float(m["train_flops_per_sample"]) for m in run.metrics]
    n = len(costs)
    periodic = sum(epoch_training_costs(run, dense))
    return [100.0 * (((e + 1) * dense + (n - e - 1) * costs[e]) / periodic - 1.0) for e in range(n)]


def epoch_training_costs(run: RunRecord, dense: float) -> list[float]:
    """Training FLOPs per sample each epoch trained at (Fig. 2a): the dense model's in the
    first, then the cost the previous epoch's reconfiguration left (a run's metrics record
    each epoch's cost after its reconfiguration, what the next epoch trains)."""
    costs = [float(m["train_flops_per_sample"]) for m in run.metrics]
    return [dense, *costs[:-1]] if costs else []


def one_time_extra(run: RunRecord, base: RunRecord | None) -> float:
    """Extra training FLOPs (%) of a single reconfiguration at the best epoch against
    PruneTrain's periodic one: the least of :func:`one_time_overheads`."""
    return min(one_time_overheads(run, float(base.summary["train_flops_nominal"])))


def rows(scale: str) -> list[Row]:
    """Dense, then PruneTrain at each penalty ratio."""
    model = "resnet50" if scale == "paper" else "resnet32"
    out = [pair(scale, model, "cifar10")[0]]
    out[0].paper = {}
    out[0].metrics = None
    for ratio in RATIOS:
        pt = pair(scale, model, "cifar10", ratio=ratio)[1]
        pt.paper = {"method": "one-time reconfiguration"} if ratio == 0.2 else {}
        pt.group = {"ratio": ratio_label(scale, ratio)}
        out.append(pt)
    return out


def figures(results: list[RowResult], scale: str, paper: Any) -> list[FigureSpec]:
    """Training FLOPs per sample, normalised to dense, against the epoch (Fig. 2a); the
    extra training FLOPs of reconfiguring once, after each epoch, against PruneTrain
    (Fig. 2c). Fig. 2b (the prunable FLOPs broken down over the epochs) is not drawn."""
    base = next((r for r in results if r.row.method == "dense" and r.runs), None)
    data, once = [], []
    for r in results:
        if r.row.method != "prunetrain" or base is None:
            continue
        dense = float(base.runs[0].summary["train_flops_nominal"])
        ratio = str(r.row.group["ratio"])
        for run in r.runs:
            for e, cost in enumerate(epoch_training_costs(run, dense)):
                data.append({"epoch": e + 1, "ratio": ratio, "flops": cost / dense})
            for e, extra in enumerate(one_time_overheads(run, dense)):
                once.append({"epoch": e + 1, "ratio": ratio, "extra": extra})
    return [FigureSpec(kind="line", x="epoch", y="flops", hue="ratio", data=data,
                       title="Training FLOPs per iteration (normalised to dense)",
                       xlabel="epoch", ylabel="FLOPs / dense FLOPs", y_from_zero=True,
                       caption=f"(a) the cost each epoch trains at: the model the previous "
                       f"epoch's reconfiguration left (dense in the first); scale {scale}"),
            FigureSpec(kind="line", x="epoch", y="extra", hue="ratio", data=once,
                       title="Extra training FLOPs of one reconfiguration vs PruneTrain",
                       xlabel="epoch of the one reconfiguration",
                       ylabel="extra training FLOPs (%)",
                       caption=f"(c) reconfiguring once, after the epoch shown, against "
                       f"PruneTrain's periodic reconfiguration; scale {scale}")]  # fmt: skip


TARGET = Target(
    key="prunetrain.fig2",
    title="PruneTrain Fig. 2: training FLOPs over epochs; one-time reconfiguration",
    description=described(__doc__),
    rows=rows,
    # by impl.flops, the per-epoch costs the figures draw, named apart from Table 1's and
    # Fig. 8's "train_flops" (the authors' formula) so that one run shows no two values of it
    metrics=("train_flops_impl", "extra_train_flops_vs_prunetrain"),
    figures=figures,
    notes=lambda scale: [
        "The one-time estimate uses PruneTrain's own per-epoch costs (the paper's Fig. 2c "
        "assumes the best reconfiguration epoch is known, as here).",
        "Fig. 2b (the prunable training FLOPs broken down over the epochs) is not drawn: the "
        "runs record each epoch's total, not its parts.",
    ],
    extra_metrics={"extra_train_flops_vs_prunetrain": ("%", one_time_extra)},
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run PruneTrain Fig. 2 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
