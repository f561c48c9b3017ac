"""Campfire Table 3: top-1 of the Table 2 runs after 90 of their 100 epochs (before the last
learning-rate drop's effect is complete).

Reads the Table 2 runs at every scale (their test top-1 at 90% of the run).
"""

from __future__ import annotations

from pathlib import Path

from reproductions.campfire import epoch_90_is_the_last, top1_at
from reproductions.campfire.table2 import combined_start_20_note
from reproductions.campfire.table2 import rows as table2_rows
from reproductions.common import Row, RunRecord, Target, bar_vs_paper, described, reproduce


def delta_at_90(run: RunRecord, base: RunRecord | None) -> float:
    """Top-1 at 90% of the run minus the dense run's at the same point."""
    return top1_at(0.9)(run) - top1_at(0.9)(base)


def rows(scale: str) -> list[Row]:
    """The Table 2 rows."""
    return table2_rows(scale)


TARGET = Target(
    key="campfire.table3",
    title="Campfire Table 3: top-1 after 90 epochs (ResNet-50 v1.5, ImageNet)",
    description=described(__doc__),
    rows=rows,
    metrics=("top1", "delta_top1"),
    figures=bar_vs_paper(
        "delta_top1", "Top-1 change vs dense at 90% of the run", "top-1 - dense (points)"
    ),
    extra_metrics={"top1": ("%", top1_at(0.9)), "delta_top1": ("pp", delta_at_90)},
    notes=lambda scale: [
        "Top-1 read at 90% of each run (epoch 90 of 100 at paper scale).",
        *combined_start_20_note(scale),
        *(
            [
                f"At {scale} scale 90% of the run is its last epoch: this table reads what Table 2 "
                "reads, and compares nothing of its own."
            ]
            if epoch_90_is_the_last(scale)
            else []
        ),
    ],
)


def main(scale: str = "cpu", runs_root: str | Path = "runs/reproductions",
         reports_root: str | Path = "reports") -> Path:  # fmt: skip
    """Run Campfire Table 3 at ``scale`` (reuses Table 2's runs); return the report's path."""
    return reproduce(TARGET, scale, runs_root, reports_root)
