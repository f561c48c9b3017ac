"""Campfire Table 2: top-1 of ResNet-50 v1.5 on ImageNet after 100 epochs for CK, combined
and window pruning, first pruning epoch 20, 30 or 40 (window also 0), era 20 epochs (or
40-70), at 40-80% sparsity.

Scales map the paper's 100-epoch timeline (drops at 30, 60, 90) onto the run: smoke 4
epochs, cpu 10 (ResNet-20, digits), gpu 30 (ResNet-32, digits), paper 100 (ResNet-50 v1.5,
torchvision's ``resnet50``, on ImageNet).
"""

from __future__ import annotations

from pathlib import Path

from reproductions.campfire import NO_PAPER_COMBINED_START_20, campfire_row, dense_row
from reproductions.common import (
    Row,
    Target,
    bar_vs_paper,
    curves_per_epoch,
    described,
    figures_of,
    reproduce,
)

GRID = [("ck", 40), ("ck", 30), ("ck", 20), ("combined", 40), ("combined", 30),
        ("combined", 20), ("window", 0), ("window", 30)]  # fmt: skip


def grid(scale: str) -> list[tuple[str, int, int, int]]:
    """(mask, start, sparsity, era) run at ``scale``."""
    if scale == "smoke":
        return [("ck", 30, 70, 20), ("combined", 30, 70, 20)]
    if scale == "cpu":
        return [(m, s, 70, 20) for m, s in GRID] + [("ck", 40, 60, 20), ("combined", 40, 60, 20)]
    out = [
        (m, s, sp, 20)
        for m, s in GRID
        for sp in (40, 60, 70, 80)
        if not (m == "window" and sp == 40)
    ]
    return out + [(m, 40, sp, 30) for m in ("ck", "combined") for sp in (60, 70)]


def combined_start_20_note(scale: str) -> list[str]:
    """The note on the combined start-20 row at 70% (no paper number in Tables 3 and 8), where
    the scale's grid runs that row."""
    return [NO_PAPER_COMBINED_START_20] if ("combined", 20, 70, 20) in grid(scale) else []


def rows(scale: str) -> list[Row]:
    """Dense and one Campfire row per grid point."""
    return [dense_row(scale)] + [
        campfire_row(scale, m, s, sp, era=e) for m, s, sp, e in grid(scale)
    ]


def _start_30(row: Row) -> bool:
    """Fig. 4's top panels: dense and every mask pruning from paper epoch 30."""
    return row.label == "dense" or row.group.get("start") == 30


def _ck_starts(row: Row) -> bool:
    """Fig. 4's bottom-left panel: dense and CK pruning to 70% from each start epoch."""
    return row.label == "dense" or (row.group.get("mask") == "ck"
                                    and row.group.get("sparsity") == 70)  # fmt: skip


TARGET = Target(
    key="campfire.table2",
    title="Campfire Table 2: top-1 after 100 epochs (ResNet-50 v1.5, ImageNet)",
    description=described(__doc__),
    rows=rows,
    metrics=("top1", "delta_top1"),
    figures=figures_of(
        bar_vs_paper(
            "delta_top1", "Top-1 change vs dense after the full run", "top-1 - dense (points)"
        ),
        curves_per_epoch(
            "test_top1",
            "Fig. 4 (top left): top-1 per epoch, pruning from paper epoch 30",
            "test top-1 (%)",
            "Campfire Fig. 4",
            rows=_start_30,
        ),
        curves_per_epoch(
            "true_sparsity",
            "Fig. 4 (top right): sparsity per epoch, pruning from paper epoch 30",
            "zero weights of the pruned layers (fraction)",
            "Campfire Fig. 4",
            rows=_start_30,
        ),
        curves_per_epoch(
            "test_top1",
            "Fig. 4 (bottom left): CK pruning to 70% from different epochs",
            "test top-1 (%)",
            "Campfire Fig. 4",
            rows=_ck_starts,
        ),
    ),
    notes=lambda scale: [
        "Start epochs and era lengths are the paper's, scaled to the run's epochs "
        "(e.g. start 30 of 100 is epoch 3 of 10 at cpu scale).",
        "Rows the scale does not run are listed with the paper's numbers only.",
        "The paper prints no era for most rows (Sec. 3.1: 20 or 30 epochs); ours prune for "
        "20 of 100 epochs, the window start-0 row too (epochs 0-20, which Sec. 3.1 says "
        "cost much accuracy, as the paper's numbers in this table show; Table 5 labels its "
        "row 0-30).",
    ],
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run Campfire Table 2 at ``scale``; return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
