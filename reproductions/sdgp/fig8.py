"""SDGP Fig. 8: final top-1 of ResNet-9 on CIFAR-10 for N:M settings, by group size m
(columns) and sparsity ratio r = m/n (rows), all with rescaled magnitude pruning.

Scales: smoke trains 2:4 and 4:32 (ResNet-20, digits); cpu trains m in {4, 8, 16, 32} at
r = 2 and 4, plus 4:32 (r = 8), on ResNet-20 and digits; gpu and paper add r = 8 for every
m >= 8 (ResNet-9 on digits; on CIFAR-10 with the ffcv recipe at paper).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from impl.report.results import FigureSpec
from reproductions.common import (
    Row,
    RowResult,
    RunRecord,
    Target,
    described,
    figure_rows,
    reproduce,
)
from reproductions.sdgp.table1 import rows as table1_rows


def settings(scale: str) -> list[tuple[int, int]]:
    """(n, m) pairs run at ``scale``."""
    if scale == "smoke":
        return [(2, 4), (4, 32)]
    out = [(m // r, m) for m in (4, 8, 16, 32) for r in (2, 4)]
    if scale == "cpu":
        return out + [(4, 32)]
    return out + [(m // 8, m) for m in (8, 16, 32)]


def rows(scale: str) -> list[Row]:
    """One rescaled-magnitude run per (n, m); 2:4 is Table I's run."""
    t1 = table1_rows(scale)
    base = next(r for r in t1 if r.label == "SDGP rescaled 2:4")
    out = []
    for n, m in settings(scale):
        r = Row(f"{n}:{m}", "sdgp", options={**base.options, "n": n, "m": m}, train=base.train,
                group={"m": m, "ratio": f"r={m // n}"})  # fmt: skip
        if (n, m) == (4, 32):
            r.baseline = "2:4"
            r.paper = {"setting": "rescaled 4:32 vs 2:4"}
        out.append(r)
    return out


def top1_change(run: RunRecord, base: RunRecord | None) -> float:
    """Top-1 of this setting minus that of 2:4 (pp)."""
    return run.summary["top1"] - base.summary["top1"]


def figures(results: list[RowResult], scale: str, paper: Any) -> list[FigureSpec]:
    """Top-1 as a grid: group size m (columns) by sparsity ratio (rows), as the paper."""
    data = figure_rows(results, "top1", scale)
    return [FigureSpec(kind="heatmap", x="m", y="top1", hue="ratio", data=data,
                       title=f"Top-1 by group size and sparsity ratio ({scale} scale)",
                       xlabel="group size m", ylabel="sparsity ratio r = m/n")]  # fmt: skip


TARGET = Target(
    key="sdgp.fig8",
    title="SDGP Fig. 8: top-1 across N:M settings",
    description=described(__doc__),
    rows=rows,
    metrics=("top1", "top1_change"),
    figures=figures,
    extra_metrics={"top1_change": ("pp", top1_change)},
    notes=lambda scale: [
        "The paper's heat-map cells are not stated in its text; only the 4:32 against 2:4 "
        "change (Sec. V) is compared.",
        "Convs whose channels do not divide by m keep min(n, r) of the last r channels.",
    ],
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run SDGP Fig. 8 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
